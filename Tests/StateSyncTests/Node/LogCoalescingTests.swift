import Logging
import StateSyncTesting
import Synchronization
import Testing

@testable import StateSync

/// The node's host hands the log records of a round of inputs to storage in one write, and never
/// lets anything out (a reply, a DELTA, a watch event) before the records it depends on are
/// written.
@Suite("Log records coalesced per round")
struct LogCoalescingTests {
    /// Records what the node sent, with the octets the disk had taken when it was sent.
    final class RecordingTransport: NodeTransport, Sendable {
        let disk: SimulatedDisk
        let sent = Mutex<[(kind: String, appendedBytes: Int)]>([])
        init(disk: SimulatedDisk) { self.disk = disk }

        private func note(_ kind: String) { sent.withLock { $0.append((kind, disk.appendedBytes)) } }
        func publish(_ frames: [[UInt8]]) { note(frames[0] == PeerMessage.heartbeatTopic ? "heartbeat" : "delta") }
        func connectRepairLink(peer: String, endpoint: String) {}
        func sendRepairRequest(peer: String, frames: [[UInt8]]) -> Bool { true }
        func reply(client: [UInt8], frames: [[UInt8]]) -> ReplyOutcome {
            note("reply")
            return .sent
        }
        func sendWatchEvents(client: [UInt8], events: [[[UInt8]]]) -> (accepted: Int, clientGone: Bool) {
            note("watch")
            return (events.count, false)
        }
        func pauseIntake(_ paused: Bool) {}
        func resetPeerLink(_ endpoint: String) {}
        func connectPeer(endpoint: String, node: String) {}
        func disconnectPeer(endpoint: String) {}
        func refuseToRun(_ reason: String) {}
    }

    /// A node on a simulated disk, its first tick done, with what it sends recorded.
    struct Started {
        let disk = SimulatedDisk()
        let transport: RecordingTransport
        let node: StateSyncNode

        init(_ fsync: NodeConfiguration.FsyncPolicy) throws {
            var configuration = MachineRunner.configuration("n1", peers: ["n2"])
            configuration.fsync = fsync
            configuration.fsyncIntervalMilliseconds = 50
            transport = RecordingTransport(disk: disk)
            node = try StateSyncNode(
                configuration: configuration, storage: disk,
                clock: HybridLogicalClock(node: "n1", wallClock: { 1_800_000_000_000 }), monotonicNow: { 1 },
                incarnation: 7, observers: InlineObserverExecutor(),
                logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
            node.process(.tick(observerBacklog: 0), now: 1, via: transport)
        }

        /// A client's SET of `m<id>.x = id`.
        func set(_ id: UInt64) {
            let frames = ClientProtocol.encodeRequest(
                .set, id: id,
                body: ClientProtocol.encodeSet(
                    ModelAddress(channel: "c", model: "m\(id)"), [PropertyWrite(name: "x", value: .int(Int64(id)))]))
            node.process(.clientRequest(client: [9], frames: frames, identity: nil), now: 2, via: transport)
        }

        func process(_ input: NodeInput) { node.process(input, now: 2, via: transport) }
    }

    /// With `always`, the SETs drained in one round are written with one append before their
    /// sync, and each is acknowledged and published only after.
    @Test func aRoundOfSetsIsWrittenOnceThenSyncedAndAnswered() throws {
        let started = try Started(.always)
        let (disk, transport) = (started.disk, started.transport)
        let appendsBefore = disk.appendCount
        let bytesBefore = disk.appendedBytes
        for id in 1...5 as ClosedRange<UInt64> { started.set(id) }
        #expect(disk.appendCount == appendsBefore, "nothing written before the round ends")
        started.process(.tick(observerBacklog: 0))
        #expect(disk.appendCount == appendsBefore + 1, "the five records in one write")
        #expect(disk.unsyncedBytes == 0)
        let replies = transport.sent.withLock { $0.filter { $0.kind == "reply" } }
        #expect(replies.count == 5)
        #expect(replies.allSatisfy { $0.appendedBytes > bytesBefore })
        #expect(transport.sent.withLock { $0.contains { $0.kind == "delta" } })
    }

    /// A clean stop writes what the last round left pending (and syncs it) before the node ends.
    @Test func aStopWritesWhatIsPending() throws {
        let started = try Started(.always)
        let (disk, transport) = (started.disk, started.transport)
        let bytesBefore = disk.appendedBytes
        started.set(1)
        #expect(disk.appendedBytes == bytesBefore)
        started.process(.stop)
        #expect(disk.appendedBytes > bytesBefore, "the pending record was not written at stop")
        #expect(disk.unsyncedBytes == 0, "a stop syncs what it wrote")
        #expect(transport.sent.withLock { $0.contains { $0.kind == "reply" } }, "the SET was answered once durable")
    }

    /// With `interval`, a SET is acknowledged once written to the OS: its record is appended
    /// before its reply is sent, even in the middle of a round.
    @Test func anIntervalSetIsWrittenBeforeItsReply() throws {
        let started = try Started(.interval)
        let (disk, transport) = (started.disk, started.transport)
        var written = disk.appendedBytes
        for id in 1...3 as ClosedRange<UInt64> {
            started.set(id)
            let reply = try #require(transport.sent.withLock { $0.last { $0.kind == "reply" } })
            #expect(reply.appendedBytes > written, "SET \(id) answered before its record was written")
            written = reply.appendedBytes
        }
        #expect(disk.syncCount == 0, "acknowledged before the interval's sync")
    }
}
