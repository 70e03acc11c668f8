import Synchronization
import Testing

@testable import StateSync

/// What a model mirrored from a daemon needs of its registrar: a write made at a provisional
/// version takes the daemon's version when acknowledged, and is undone when refused.
@Suite("Client models: acknowledging and undoing writes")
struct ClientModelRegistrarTests {
    /// A counter bound like a client model: writes stamped by `clock`, emitted into `sent`.
    static func bound(_ clock: HybridLogicalClock, _ sent: Shared<[(Version, [PropertyWrite])]>) -> Counter {
        let counter = Counter()
        counter._$registrar.attach(
            counter, adopting: [:],
            binding: ModelBinding(
                address: ModelAddress(channel: "c", model: "m"), stamp: { clock.next() },
                emit: { _, version, writes in sent.withLock { $0.append((version, writes)) } },
                discard: { _ in }, reportEncodingFailure: { _, _ in }))
        return counter
    }

    @Test func anAcknowledgedWriteMergesByTheDaemonsVersion() throws {
        let clock = HybridLogicalClock(node: "client", wallClock: { 1_000 })
        let sent = Shared<[(Version, [PropertyWrite])]>([])
        let counter = Self.bound(clock, sent)
        counter.count = 5
        let provisional = try #require(sent.withLock { $0.first?.0 })
        let acknowledged = Version(timestamp: 5_000 << 16, node: "node1")
        counter._$registrar.acknowledge(provisional: provisional, as: acknowledged)
        #expect(counter.propertyVersions["count"] == acknowledged)

        // A change the daemon applied before the write (older than its version) loses; a later
        // one wins, with the written value as old.
        let seen = Shared<[Change<Int>]>([])
        counter.observe(\.count) { change in seen.withLock { $0.append(change) } }
        let older = ModelRegistrar.RemoteWriteSet(
            writes: [PropertyWrite(name: "count", value: 3)], version: Version(timestamp: 4_000 << 16, node: "node2"))
        let later = ModelRegistrar.RemoteWriteSet(
            writes: [PropertyWrite(name: "count", value: 9)], version: Version(timestamp: 6_000 << 16, node: "node2"))
        _ = counter._$registrar.applyRemote(counter, [older, later])
        #expect(counter.count == 9)
        #expect(seen.withLock { $0.map { [$0.old, $0.new] } } == [[5, 9]])
    }

    @Test func aRefusedWriteTakesBackWhatTheDaemonHolds() throws {
        let clock = HybridLogicalClock(node: "client", wallClock: { 1_000 })
        let sent = Shared<[(Version, [PropertyWrite])]>([])
        let counter = Self.bound(clock, sent)
        let held = Version(timestamp: 500 << 16, node: "node1")
        counter._$registrar.attach(
            counter, adopting: ["title": ReplicaStore.Register(value: "theirs", version: held)],
            binding: ModelBinding(
                address: ModelAddress(channel: "c", model: "m"), stamp: { clock.next() },
                emit: { _, version, writes in sent.withLock { $0.append((version, writes)) } },
                discard: { _ in }, reportEncodingFailure: { _, _ in }))
        let titles = Shared<[Change<String>]>([])
        let counts = Shared<[Change<Int>]>([])
        counter.observe(\.title) { change in titles.withLock { $0.append(change) } }
        counter.observe(\.count) { change in counts.withLock { $0.append(change) } }
        counter.transaction {
            $0.title = "mine"
            $0.count = 2
        }
        let provisional = try #require(sent.withLock { $0.first?.0 })
        counter._$registrar.revert(
            counter, provisional: provisional, to: ["title": ReplicaStore.Register(value: "theirs", version: held)])
        #expect(counter.title == "theirs" && counter.count == 0, "the daemon's value, or the initial one")
        #expect(counter.propertyVersions["title"] == held && counter.propertyVersions["count"] == nil)
        #expect(titles.withLock { $0.map { [$0.old, $0.new] } } == [["theirs", "mine"], ["mine", "theirs"]])
        #expect(titles.withLock { $0.last?.isRemote } == true)
        #expect(counts.withLock { $0.map { [$0.old, $0.new] } } == [[0, 2], [2, 0]])
    }

    /// A refused deletion of the whole model gives back every value the daemon holds, and the
    /// model is no longer deleted.
    @Test func aRefusedModelDeletionGivesEveryValueBack() throws {
        let clock = HybridLogicalClock(node: "client", wallClock: { 1_000 })
        let sent = Shared<[(Version, [PropertyWrite])]>([])
        let counter = Counter()
        let held = Version(timestamp: 500 << 16, node: "node1")
        let records: [String: ReplicaStore.Register] = [
            "title": ReplicaStore.Register(value: "theirs", version: held),
            "count": ReplicaStore.Register(value: 4, version: held),
        ]
        counter._$registrar.attach(
            counter, adopting: records,
            binding: ModelBinding(
                address: ModelAddress(channel: "c", model: "m"), stamp: { clock.next() },
                emit: { _, version, writes in sent.withLock { $0.append((version, writes)) } },
                discard: { _ in }, reportEncodingFailure: { _, _ in }))
        let counts = Shared<[Change<Int>]>([])
        counter.observe(\.count) { change in counts.withLock { $0.append(change) } }
        counter.delete()
        #expect(counter.isDeleted && counter.count == 0)
        let provisional = try #require(sent.withLock { $0.first?.0 })
        #expect(sent.withLock { $0.first?.1.first?.isModelDeletion } == true)
        counter._$registrar.revert(counter, provisional: provisional, to: records)
        #expect(!counter.isDeleted && counter.count == 4 && counter.title == "theirs")
        #expect(counts.withLock { $0.map { [$0.old, $0.new] } } == [[4, 0], [0, 4]])
        // Acknowledged instead, a deletion takes the daemon's version: an older write loses.
        counter.delete()
        let second = try #require(sent.withLock { $0.last?.0 })
        let acknowledged = Version(timestamp: 700 << 16, node: "node1")
        counter._$registrar.acknowledge(provisional: second, as: acknowledged)
        let older = ModelRegistrar.RemoteWriteSet(
            writes: [PropertyWrite(name: "count", value: 9)], version: Version(timestamp: 600 << 16, node: "node2"))
        _ = counter._$registrar.applyRemote(counter, [older])
        #expect(counter.isDeleted && counter.count == 0)
    }
}
