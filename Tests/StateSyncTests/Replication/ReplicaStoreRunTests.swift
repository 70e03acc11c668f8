import Testing

@testable import StateSync

/// A run of deltas of one model merges with one look-up of the model, and finds each register
/// where the delta before found the one at the same position (``ReplicaStore/SlotHints``). Those
/// slots move when a register is added or removed; the store's storage may be copied by the
/// run's first write: the result must be the same as merging the deltas one by one, whatever the
/// run holds.
@Suite("Merging runs of deltas")
struct ReplicaStoreRunTests {
    static let address = ModelAddress(channel: "c", model: "m")

    static func delta(_ sequence: UInt64, _ writes: [PropertyWrite]) -> Delta {
        Delta(
            channel: "c", model: "m", version: Version(milliseconds: 10 + sequence, counter: 0, node: "n2"),
            sequence: sequence, properties: writes)
    }

    /// Properties written in changing orders, new ones appearing mid-run, a property deleted and
    /// the whole model deleted mid-run, a stale write: against a store whose storage a copy
    /// shares (a snapshot holds one), so the run's first write copies it.
    @Test func aRunMergesAsItsDeltasOneByOneWhileSlotsMove() {
        var store = ReplicaStore()
        _ = store.apply(Self.delta(1, [PropertyWrite(name: "x", value: 1), PropertyWrite(name: "y", value: 1)]))
        let held = store
        var oneByOne = store
        let run: [Delta] = [
            Self.delta(2, [PropertyWrite(name: "x", value: 2), PropertyWrite(name: "y", value: 2)]),
            Self.delta(3, [PropertyWrite(name: "y", value: 3), PropertyWrite(name: "x", value: 3)]),
            Self.delta(4, [PropertyWrite(name: "x", value: 4), PropertyWrite(name: "z", value: 4)]),
            Self.delta(5, [PropertyWrite(name: "x", value: 5), PropertyWrite(name: "z", value: 5)]),
            Self.delta(6, [.deletion(of: "x"), PropertyWrite(name: "z", value: 6)]),
            Self.delta(7, [PropertyWrite(name: "x", value: 7), PropertyWrite(name: "z", value: 7)]),
            Self.delta(8, [.modelDeletion]),
            Self.delta(9, [PropertyWrite(name: "z", value: 9), PropertyWrite(name: "x", value: 9)]),
            Self.delta(10, [PropertyWrite(name: "z", value: 10), PropertyWrite(name: "x", value: 10)]),
        ]
        let won = store.applyWinning(run: run)
        var wonOneByOne: [Int] = []
        for delta in run {
            wonOneByOne.append(oneByOne.applyWinning(run: [delta])[0].count)
        }
        #expect(won.map(\.count) == wonOneByOne)
        #expect(store.properties(of: Self.address) == oneByOne.properties(of: Self.address))
        #expect(store.properties(of: Self.address)["x"]?.value == .int(10))
        // The model's deletion took y, which no later write gave a value.
        #expect(store.properties(of: Self.address)["y"] == nil)
        #expect(store.digest == oneByOne.digest)
        // The copy taken before the run kept what it held.
        #expect(held.properties(of: Self.address)["x"]?.value == .int(1))
        #expect(held.properties(of: Self.address)["z"] == nil)
        // A stale write in a run loses, and the run goes on.
        let stale = Self.delta(11, [PropertyWrite(name: "x", value: 99)])
        var older = stale
        older.version = Version(milliseconds: 1, counter: 0, node: "n2")
        let more = store.applyWinning(run: [older, Self.delta(12, [PropertyWrite(name: "x", value: 12)])])
        #expect(more.map(\.count) == [0, 1])
        #expect(store.properties(of: Self.address)["x"]?.value == .int(12))
    }

    /// Runs of deltas that all write the same properties (the run merged with each register
    /// written once, ``ReplicaStore/mergeRepeated``): versions from two origins in any order,
    /// some older than what is held, over registers that hold values, tombstones or an expired
    /// value, a model deleted at some version, and a digest kept eagerly or lazily. The store,
    /// its digest, counts and latest version, and each delta's winning writes are those of the
    /// one-by-one merge, for every seed (printed on failure).
    @Test(arguments: 1...40)
    func runsOfOneShapeMergeAsTheirDeltasOneByOne(seed: UInt64) {
        var random = SplitMix64(seed: seed)
        let names = ["a", "b", "c", "a-property-name-longer-than-sixteen-bytes"]
        func version(_ milliseconds: UInt64) -> Version {
            Version(milliseconds: milliseconds, counter: 0, node: random.next() % 2 == 0 ? "n1" : "n2")
        }
        var store = ReplicaStore()
        // What is held: each property a value, a tombstone, or an expired value; maybe the
        // model deleted in between.
        for name in names {
            let held = version(100 + random.next() % 100)
            switch random.next() % 3 {
            case 0: _ = store.apply(Self.delta(held, [PropertyWrite(name: name, value: .int(-1))]))
            case 1:
                _ = store.apply(Self.delta(held, [PropertyWrite(name: name, value: .int(-2))]))
                _ = store.apply(Self.delta(version(held.milliseconds + 1), [.deletion(of: name)]))
            default:
                _ = store.apply(Self.delta(held, [PropertyWrite(name: name, value: .int(-3), timeToLive: 5)]))
                _ = store.expire(through: held.milliseconds + 5)
            }
        }
        if random.next() % 3 == 0 { _ = store.apply(Self.delta(version(150), [.modelDeletion])) }
        if random.next() % 2 == 0 { store.foldDigests() }  // the next change keeps it lazily or not
        let width = Int(random.next() % 3) + 1
        let shape = Array(names.shuffled(using: &random).prefix(width))
        let run = (0..<(Int(random.next() % 12) + 2)).map { index in
            Self.delta(
                version(80 + random.next() % 200),
                shape.map { PropertyWrite(name: $0, value: .int(Int64(index))) })
        }
        let allHeld = shape.allSatisfy { store.records(of: Self.address)[$0] != nil }
        var oneByOne = store
        let won = store.applyWinning(run: run)
        let wonOneByOne = run.map { oneByOne.applyWinning(run: [$0])[0] }
        #expect(won == wonOneByOne, "seed \(seed)")
        #expect(store.properties(of: Self.address) == oneByOne.properties(of: Self.address), "seed \(seed)")
        #expect(store.records(of: Self.address) == oneByOne.records(of: Self.address), "seed \(seed)")
        #expect(store.digest == oneByOne.digest, "seed \(seed)")
        #expect(store.tombstones == oneByOne.tombstones, "seed \(seed)")
        #expect(store.channelModelCounts == oneByOne.channelModelCounts, "seed \(seed)")
        #expect(store.latestVersion == oneByOne.latestVersion, "seed \(seed)")
        #expect(store.isLive(Self.address) == oneByOne.isLive(Self.address), "seed \(seed)")
        // Merged with each register written once when every property written was held (the
        // model's deletion takes the registers below it).
        #expect(store.repeatedRunsMerged == (allHeld ? 1 : 0), "seed \(seed)")
    }

    static func delta(_ version: Version, _ writes: [PropertyWrite]) -> Delta {
        Delta(channel: "c", model: "m", version: version, sequence: version.milliseconds, properties: writes)
    }
}

extension ReplicaStore {
    /// Each delta's winning writes of a run merged with ``applyWinning(run:into:)``.
    fileprivate mutating func applyWinning(run deltas: [Delta]) -> [[PropertyWrite]] {
        var won: [PropertyWrites?] = []
        applyWinning(run: deltas, into: &won)
        return zip(deltas, won).map { ($1 ?? $0.writes).array }
    }
}
