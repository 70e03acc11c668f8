import Foundation
import StateSyncZeroMQ
import Synchronization
import Testing

@testable import StateSync

/// A thread writing in a tight loop must not outrun its node without bound: past a number of
/// queued rounds of local writes it waits (outside the model's lock) for the I/O thread to take
/// them. Nothing is dropped, and a node that stops lets it go.
@Suite("Writers paced by their node")
struct WriterPacingTests {
    /// A writer on its own thread: `count` sets of `model.count`, noting the most rounds the
    /// node's outbox held after each.
    final class Writer: Sendable {
        let finished = Atomic<Bool>(false)
        let written = Atomic<Int>(0)
        let mostQueued = Atomic<Int>(0)

        func start(_ model: Counter, node: StateSyncNode, count: Int) {
            let thread = Thread { [self] in
                for value in 1...count {
                    model.count = value
                    written.store(value, ordering: .relaxed)
                    let queued = node.queuedLocalWriteRounds
                    if queued > mostQueued.load(ordering: .relaxed) { mostQueued.store(queued, ordering: .relaxed) }
                }
                finished.store(true, ordering: .releasing)
            }
            thread.start()
        }
    }

    @Test func aFastWriterWaitsForItsNodeAndEveryWriteArrives() async throws {
        let configs = meshConfigurations(2, label: "pacing")
        let node1 = try await StateSyncNode.start(configuration: configs[0])
        let node2 = try await StateSyncNode.start(configuration: configs[1])
        do {
            try await waitUntilMeshed([node1, node2])
            node1.setQueuedRoundsLimit(2)
            let local = try await node1.model(Counter.self, channel: "pacing", id: "m")
            let remote = try await node2.model(Counter.self, channel: "pacing", id: "m")
            let count = 150_000
            let writer = Writer()
            writer.start(local, node: node1, count: count)
            try await waitUntil("the writer to finish", timeout: .seconds(120)) {
                writer.finished.load(ordering: .acquiring)
            }
            try await waitUntil("node2 to hold the last write", timeout: .seconds(120)) { remote.count == count }
            // A round may be started past the limit before its writer looks.
            #expect(
                writer.mostQueued.load(ordering: .relaxed) <= 3,
                "the outbox held \(writer.mostQueued.load(ordering: .relaxed)) rounds; \(node1.writerWaitCount) waits")
            #expect(node1.status.counters["deltas_published"] ?? 0 >= UInt64(count))
        } catch {
            await node1.stop()
            await node2.stop()
            throw error
        }
        await node1.stop()
        await node2.stop()
    }

    /// A transaction on model A that writes model B many times holds A's lock all along. If B's
    /// writes waited for room in the outbox there, while the node's I/O thread waits for A's lock
    /// to apply a peer's write to A, neither would ever go on. They must not wait: the outbox
    /// grows past its bound for the length of the transaction instead.
    @Test func aWriteInsideAnotherModelsTransactionDoesNotWaitForTheNode() async throws {
        let configs = meshConfigurations(2, label: "pacing-nested")
        let node1 = try await StateSyncNode.start(configuration: configs[0])
        let node2 = try await StateSyncNode.start(configuration: configs[1])
        do {
            try await waitUntilMeshed([node1, node2])
            node1.setQueuedRoundsLimit(1)
            let a = try await node1.model(Counter.self, channel: "pacing", id: "a")
            let b = try await node1.model(Counter.self, channel: "pacing", id: "b")
            let remoteA = try await node2.model(Counter.self, channel: "pacing", id: "a")
            let remoteB = try await node2.model(Counter.self, channel: "pacing", id: "b")
            let writes = 40_000
            let peerMayWrite = Atomic<Bool>(false)
            let appliedWhileHeld = Atomic<Bool>(false)
            let finished = Atomic<Bool>(false)
            let writer = Thread {
                a.transaction { _ in
                    // Held: node2 writes A now, and node1's I/O thread, once it has taken that
                    // write (waited for, bounded), cannot hand it to `a` until this transaction
                    // ends.
                    let applied = node1.status.counters["deltas_applied"] ?? 0
                    peerMayWrite.store(true, ordering: .releasing)
                    for _ in 0..<20_000 where (node1.status.counters["deltas_applied"] ?? 0) <= applied {
                        usleep(1_000)
                    }
                    appliedWhileHeld.store(
                        (node1.status.counters["deltas_applied"] ?? 0) > applied, ordering: .relaxed)
                    for value in 1...writes { b.count = value }
                }
                finished.store(true, ordering: .releasing)
            }
            writer.start()
            try await waitUntil("node1's transaction on A to start") { peerMayWrite.load(ordering: .acquiring) }
            remoteA.title = "written by node2"
            try await waitUntil("the transaction writing B to end", timeout: .seconds(60)) {
                finished.load(ordering: .acquiring)
            }
            let tookPeerWrite = appliedWhileHeld.load(ordering: .relaxed)
            #expect(tookPeerWrite, "node1 took no write of node2's to A while the transaction held A")
            try await waitUntil("node2 to hold B's last write", timeout: .seconds(60)) { remoteB.count == writes }
            try await waitUntil("node1's A to hold node2's write") { a.title == "written by node2" }
        } catch {
            // Stopping releases a writer that waits (a node that stops takes no more rounds).
            await node1.stop()
            await node2.stop()
            throw error
        }
        await node1.stop()
        await node2.stop()
    }

    @Test func aWriterWaitingForRoomIsLetGoWhenItsNodeStops() async throws {
        let configs = meshConfigurations(1, label: "pacing-stop")
        let node = try await StateSyncNode.start(configuration: configs[0])
        node.setQueuedRoundsLimit(1)
        let model = try await node.model(Counter.self, channel: "pacing", id: "m")
        let writer = Writer()
        writer.start(model, node: node, count: 300_000)
        try await waitUntil("the writer to be under way") { writer.written.load(ordering: .relaxed) > 20_000 }
        await node.stop()
        // Stopped, its node takes no more rounds: the writer must not wait for them.
        try await waitUntil("the writer to finish after the node stopped", timeout: .seconds(120)) {
            writer.finished.load(ordering: .acquiring)
        }
        #expect(writer.written.load(ordering: .relaxed) == 300_000)
    }
}
