import Synchronization
import Testing

@testable import StateSync

/// A model bound to a node in this process stamps a single-property write's version and queues
/// the write under one lock of the node's queue (`stampAndEnqueue`): what the driver takes, and
/// the floor it publishes, must be what the two steps (`stamp`, then `enqueue`) gave.
@Suite("Local writes queued with their version")
struct LocalWriteQueueTests {
    /// A counter bound to `queue` as a node binds its models; `stamps` counts the versions it
    /// drew through the binding's `stamp` (the two-step path).
    static func bound(to queue: LocalWriteQueue, stamps: Shared<Int> = Shared(0)) -> Counter {
        let counter = Counter()
        let emitter = counter._$registrar.instanceID
        counter._$registrar.attach(
            counter, adopting: [:],
            binding: ModelBinding(
                address: ModelAddress(channel: "c", model: "m"), localWrites: (queue, emitter),
                stamp: {
                    stamps.withLock { $0 += 1 }
                    return queue.stamp()
                },
                emit: { address, version, writes in
                    queue.enqueue(LocalWrite(address: address, version: version, writes: writes, emitter: emitter))
                },
                discard: { queue.release($0) }, reportEncodingFailure: { _, _ in }, pace: {}))
        return counter
    }

    @Test func aSetIsQueuedAtTheVersionItWasGivenAndTheFloorCoversIt() throws {
        let queue = LocalWriteQueue(clock: HybridLogicalClock(node: "n1", wallClock: { 1_000 }))
        let stamps = Shared(0)
        let counter = Self.bound(to: queue, stamps: stamps)
        counter.count = 7
        #expect(stamps.value == 0, "a single set takes its version and its place in one step")
        let taken = queue.take()
        let write = try #require(taken.rounds.first?.localWrites.first)
        #expect(taken.rounds.flatMap(\.localWrites).count == 1)
        #expect(write.writes == [PropertyWrite(name: "count", value: .int(7))])
        #expect(write.emitter == counter._$registrar.instanceID)
        #expect(counter.propertyVersions["count"] == write.version)
        // Nothing is in flight: the floor reaches the write.
        #expect(taken.writeFloor >= write.version.timestamp)
        // A transaction still stamps, then emits.
        counter.transaction { $0.count = 8 }
        #expect(stamps.value == 1)
        #expect(
            queue.take().rounds.flatMap(\.localWrites).map(\.writes) == [[PropertyWrite(name: "count", value: .int(8))]]
        )
    }

    @Test func aWriteThatIsInFlightKeepsTheFloorBelowItWhileLaterOnesAreQueued() throws {
        let queue = LocalWriteQueue(clock: HybridLogicalClock(node: "n1", wallClock: { 1_000 }))
        let counter = Self.bound(to: queue)
        // Another model's write between its stamp and its enqueue.
        let inFlight = queue.stamp()
        counter.count = 1
        let taken = queue.take()
        let write = try #require(taken.rounds.first?.localWrites.first)
        #expect(write.version > inFlight)
        #expect(taken.writeFloor < inFlight.timestamp, "a floor at or above a write not taken yet")
        queue.enqueue(LocalWrite(address: ModelAddress(channel: "c", model: "other"), version: inFlight, writes: []))
        #expect(queue.take().writeFloor >= write.version.timestamp)
    }

    @Test func aWriteUnderAFutureVersionQueuesNothingAndLeavesNothingInFlight() {
        let queue = LocalWriteQueue(clock: HybridLogicalClock(node: "n1", wallClock: { 1_000 }))
        let counter = Self.bound(to: queue)
        let future = Version(milliseconds: 1_000 + 3_600_000, counter: 0, node: "zeta")
        _ = counter._$registrar.applyRemote(counter, writes: [PropertyWrite(name: "count", value: 9)], version: future)
        counter.count = 1
        #expect(counter.count == 9, "last-writer-wins keeps the newer version")
        #expect(counter._$registrar.supersededWriteCount == 1)
        let taken = queue.take()
        #expect(taken.rounds.flatMap(\.localWrites).isEmpty)
        #expect(taken.writeFloor == queue.clock.lastTimestamp, "nothing left in flight")
    }

    @Test func onceTheQueueIsClosedAWriteStillGetsAVersionAndNothingIsQueued() {
        let queue = LocalWriteQueue(clock: HybridLogicalClock(node: "n1", wallClock: { 1_000 }))
        let counter = Self.bound(to: queue)
        queue.close()
        counter.count = 3
        #expect(counter.count == 3)
        #expect(counter.propertyVersions["count"] != nil)
        #expect(queue.take().rounds.flatMap(\.localWrites).isEmpty)
    }

    /// Single sets (into a round's shared array) and transactions (their own arrays), mixed,
    /// past one round's limit: two rounds, every write in the order it was queued, with its own
    /// properties and a version above the one before.
    @Test func singleSetsAndTransactionsMixedPastARoundKeepTheirOrderAndProperties() throws {
        let queue = LocalWriteQueue(clock: HybridLogicalClock(node: "n1", wallClock: { 1_000 }))
        let address = ModelAddress(channel: "c", model: "m")
        var expected: [[PropertyWrite]] = []
        let total = NodeMachine.localWritesPerRound + 100
        for index in 0..<total {
            let value = Value.int(Int64(index))
            if index % 7 == 3 {
                let writes = [PropertyWrite(name: "a", value: value), PropertyWrite(name: "b", value: value)]
                queue.enqueue(LocalWrite(address: address, version: queue.stamp(), writes: writes))
                expected.append(writes)
            } else {
                let write = PropertyWrite(name: "a", value: value)
                _ = try #require(queue.stampAndEnqueue(address, floor: nil, write: write, emitter: 5))
                expected.append([write])
            }
        }
        let rounds = queue.take().rounds
        #expect(rounds.map(\.count) == [NodeMachine.localWritesPerRound, 100])
        let writes = rounds.flatMap(\.localWrites)
        #expect(writes.map(\.writes) == expected)
        #expect(zip(writes, writes.dropFirst()).allSatisfy { $0.version < $1.version })
    }

    /// A round keeps room for the writes a take may bring; its deltas must not keep that room:
    /// a node written now and then makes rounds of one set, and each delta in the repair
    /// history would hold the whole round's array.
    @Test func theDeltasOfASmallRoundKeepNoMoreThanTheirProperties() throws {
        let queue = LocalWriteQueue(clock: HybridLogicalClock(node: "n1", wallClock: { 1_000 }))
        _ = try #require(
            queue.stampAndEnqueue(
                ModelAddress(channel: "c", model: "m"), floor: nil, write: PropertyWrite(name: "a", value: 1),
                emitter: 5))
        let round = try #require(queue.take().rounds.first)
        #expect(round.properties.capacity >= 64, "a round is made with room for 64 writes at least")
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        let applied = node.machine.applyLocal(round).deltas
        #expect(applied.map(\.properties) == [[PropertyWrite(name: "a", value: 1)]])
        let kept = try #require(applied.first).writes.sharedCapacity
        #expect(kept < 8, "the delta keeps an array with room for \(kept) properties")
    }

    /// A driver that counts its wake-ups.
    final class CountingDriver: NodeDriver {
        let wakes = Atomic<Int>(0)
        func wake() { wakes.add(1, ordering: .relaxed) }
        func stop() async {}
    }

    /// The write that finds the outbox empty wakes the driver; the writes after it, until the
    /// driver takes the outbox, go with it and wake no one. Attaching wakes the driver for what
    /// was queued before it came.
    @Test func onlyTheWriteThatFindsTheOutboxEmptyWakesTheDriver() throws {
        let queue = LocalWriteQueue(clock: HybridLogicalClock(node: "n1", wallClock: { 1_000 }))
        let counter = Self.bound(to: queue)
        counter.count = 1
        let driver = CountingDriver()
        queue.attach(driver: driver)
        #expect(driver.wakes.load(ordering: .relaxed) == 1, "attached to a queue holding a write: woken")
        counter.count = 2
        counter.count = 3
        #expect(driver.wakes.load(ordering: .relaxed) == 1, "the outbox held a write: no wake-up")
        #expect(queue.take().rounds.flatMap(\.localWrites).count == 3)
        counter.count = 4
        #expect(driver.wakes.load(ordering: .relaxed) == 2, "the first write after a take wakes the driver")
        // A transaction's write (stamped, then queued) likewise.
        _ = queue.take()
        counter.transaction { $0.count = 5 }
        counter.count = 6
        #expect(driver.wakes.load(ordering: .relaxed) == 3)
        #expect(queue.take().rounds.flatMap(\.localWrites).count == 2)
        // Nothing queued: nothing to wake for.
        counter.count = 6
        #expect(driver.wakes.load(ordering: .relaxed) == 3)
    }
}
