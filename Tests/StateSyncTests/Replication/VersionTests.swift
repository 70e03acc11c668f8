import Synchronization
import Testing

@testable import StateSync

@Suite("Versions and the hybrid logical clock (PROTOCOL.md §Versions)")
struct VersionTests {
    @Test func orderIsMillisecondsThenCounterThenNode() {
        let a = Version(milliseconds: 10, counter: 5, node: "z")
        let b = Version(milliseconds: 11, counter: 0, node: "a")
        let c = Version(milliseconds: 11, counter: 1, node: "a")
        let d = Version(milliseconds: 11, counter: 1, node: "b")
        #expect(a < b && b < c && c < d)
        #expect([d, b, a, c].sorted() == [a, b, c, d])
    }

    @Test func textFormRoundTrips() {
        let v = Version(milliseconds: 1_763_769_600_123, counter: 7, node: "node-1.a")
        #expect(v.description == "1763769600123.7@node-1.a")
        #expect(Version(v.description) == v)
        #expect(Version("12@") == nil)
        #expect(Version("x.1@n") == nil)
        #expect(Version(timestamp: v.timestamp, node: v.node) == v)
    }

    @Test func clockNeverGoesBackwardsWhenTheWallClockSteps() {
        let wall = Shared<UInt64>(1_000_000)
        let clock = HybridLogicalClock(node: "n", wallClock: { wall.value })
        var last = clock.next()
        for step in [5, -500, 0, 0, -1, 1000] as [Int64] {
            wall.withLock { $0 = UInt64(Int64($0) + step) }
            let next = clock.next()
            #expect(next > last)
            last = next
        }
    }

    @Test func clockFollowsPeersButNotBeyondTheDriftBound() {
        let clock = HybridLogicalClock(node: "n", maximumDriftMilliseconds: 1000, wallClock: { 10_000 })
        #expect(clock.observe(Version(milliseconds: 10_500, counter: 3, node: "peer")))
        #expect(clock.next() > Version(milliseconds: 10_500, counter: 3, node: "peer"))
        #expect(!clock.observe(Version(milliseconds: 50_000, counter: 0, node: "liar")))
        #expect(clock.driftRejectionCount == 1)
        #expect(clock.next().milliseconds < 11_000, "a peer beyond the bound must not pull the clock")
    }

    @Test func concurrentCallersGetDistinctIncreasingVersions() async {
        let clock = HybridLogicalClock(node: "n")
        let seen = Shared<Set<UInt64>>([])
        await ConcurrentObserverTests.onThreads(4) { _ in
            var mine: [UInt64] = []
            for _ in 0..<5000 { mine.append(clock.next().timestamp) }
            #expect(mine == mine.sorted())
            seen.withLock { $0.formUnion(mine) }
        }
        #expect(seen.withLock { $0.count } == 20_000)
    }
}

@Suite("Replica store merge rules (PROTOCOL.md §Merge rules)")
struct ReplicaStoreTests {
    static func delta(_ ms: UInt64, _ node: String, _ properties: [(String, Value)]) -> Delta {
        Delta(
            channel: "c", model: "m", version: Version(milliseconds: ms, counter: 0, node: node), sequence: ms,
            properties: properties.map { PropertyWrite(name: $0.0, value: $0.1) })
    }

    @Test func newerWinsOlderLosesAndReportsNothing() {
        var store = ReplicaStore()
        let first = store.apply(Self.delta(10, "a", [("x", 1)]))
        #expect(first.count == 1 && first[0].old == nil && first[0].new == 1)
        let second = store.apply(Self.delta(20, "a", [("x", 2)]))
        #expect(second[0].old == 1 && second[0].new == 2)
        #expect(store.apply(Self.delta(15, "b", [("x", 9)])).isEmpty)
        #expect(store.properties(of: ModelAddress(channel: "c", model: "m"))["x"]?.value == 2)
    }

    @Test func equalTimestampsTieBreakOnNodeID() {
        var one = ReplicaStore()
        var two = ReplicaStore()
        let a = Self.delta(10, "a", [("x", "from a")])
        let b = Self.delta(10, "b", [("x", "from b")])
        _ = one.apply(a)
        _ = one.apply(b)
        _ = two.apply(b)
        _ = two.apply(a)
        #expect(one.digest == two.digest)
        #expect(one.properties(of: .init(channel: "c", model: "m"))["x"]?.value == "from b")
    }

    @Test func applyIsIdempotent() {
        var store = ReplicaStore()
        let d = Self.delta(10, "a", [("x", 1), ("y", 2)])
        #expect(store.apply(d).count == 2)
        let digest = store.digest
        #expect(store.apply(d).isEmpty)
        #expect(store.digest == digest)
    }

    @Test(arguments: ValueCodecTests.samples)
    func theStreamingRegisterHashEqualsFNVOfTheCanonicalBytes(_ value: Value) {
        let register = ReplicaStore.Register(value: value, version: Version(milliseconds: 77, counter: 3, node: "nodé"))
        let bytes = ReplicaStore.canonicalBytes(channel: "c", model: "m", property: "p", register: register)
        #expect(
            ReplicaStore.registerHash(channel: "c", model: "m", property: "p", register: register)
                == ReplicaStore.fnv1a(bytes))
    }

    @Test func aDeltaAppliesPerPropertyNotAllOrNothing() {
        var store = ReplicaStore()
        _ = store.apply(Self.delta(20, "a", [("x", 1)]))
        let changes = store.apply(Self.delta(15, "b", [("x", 5), ("y", 6)]))
        #expect(changes.map(\.property) == ["y"])
    }
}
