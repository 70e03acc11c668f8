import Foundation
import Logging
public import StateSync

#if canImport(Glibc)
    import Glibc
#endif

/// `statesync bench --path`: the CPU one change costs along the whole delta path, measured in one
/// thread. Two real nodes (each a ``StateSyncNode`` with its machine, a real data directory and
/// `storage.fsync: always`) in this process, and no sockets or threads between them: a live
/// model's writes on the writer, the writer's turn (number, merge, log, sync, publish), then the
/// reader's (decode, merge, log, apply to its live model, its observer). The messages the writer
/// publishes are handed to the reader as they are.
///
/// Each step is timed with the thread's CPU clock, so the figures leave out what the two-process
/// bench adds (sockets, wake-ups, the other process taking the core) and are far steadier than a
/// rate: the measure to compare two builds by. Under `valgrind --tool=callgrind` (with
/// `SWIFT_DETERMINISTIC_HASHING=1`) the same run counts the same instructions every time.
public enum PathBench {
    public enum Mode: String, Sendable, CaseIterable {
        /// One property set per change.
        case single
        /// Eight-property transactions.
        case tx
        /// A client's single-property SETs on a node with a client API, as node 1 of the peers
        /// workload takes them (`Benchmarks/peers`: 1,000 keys round-robin, 64-octet values, 16
        /// requests a turn), and a peer with a client API applying them and serving a batched
        /// watch of the channel (node 3 there). No setters: the requests are encoded before each
        /// turn, outside the measure.
        case client
    }

    public struct Figures: Sendable {
        public var mode: Mode
        /// Changes (single sets or transactions) measured.
        public var changes = 0
        /// Nanoseconds of CPU per change: the setters (the app's thread), the writer node's turn,
        /// the reader node's turn (with its observers, run inline).
        public var setNanoseconds = 0.0
        public var writerNanoseconds = 0.0
        public var readerNanoseconds = 0.0
        /// Of the writer's and the reader's figures, the CPU their log syncs took (the kernel's
        /// `fdatasync` work, most of it): what moves with the disk rather than with the node's
        /// code, so a build is compared by the figures without it.
        public var writerSyncNanoseconds = 0.0
        public var readerSyncNanoseconds = 0.0
        /// Messages the writer published (DELTA batches and heartbeats).
        public var messages = 0

        public var totalNanoseconds: Double { setNanoseconds + writerNanoseconds + readerNanoseconds }

        /// Counts one measured turn of `changes` changes and `messages` messages, from the
        /// thread's CPU clock at its start, after the setters, after the writer's turn and after
        /// the reader's, with the CPU the writer's and the reader's syncs took in the turn (sums:
        /// divided by the changes at the end).
        mutating func add(
            _ changes: Int, messages: Int, started: UInt64, set: UInt64, wrote: UInt64, read: UInt64,
            synced: (writer: UInt64, reader: UInt64)
        ) {
            self.changes += changes
            self.messages += messages
            setNanoseconds += Double(set - started)
            writerNanoseconds += Double(wrote - set)
            readerNanoseconds += Double(read - wrote)
            writerSyncNanoseconds += Double(synced.writer)
            readerSyncNanoseconds += Double(synced.reader)
        }

        /// The sums of ``add(_:messages:started:set:wrote:read:synced:)`` divided by the changes counted.
        func perChange() -> Figures {
            var figures = self
            let count = Double(max(changes, 1))
            figures.setNanoseconds /= count
            figures.writerNanoseconds /= count
            figures.readerNanoseconds /= count
            figures.writerSyncNanoseconds /= count
            figures.readerSyncNanoseconds /= count
            return figures
        }

        public var value: Value {
            let rounded = { (value: Double) in Value.double((value * 10).rounded() / 10) }
            return [
                "mode": .string(mode.rawValue), "changes": .int(Int64(changes)),
                "messages": .int(Int64(messages)),
                "set_ns_per_change": rounded(setNanoseconds), "writer_ns_per_change": rounded(writerNanoseconds),
                "reader_ns_per_change": rounded(readerNanoseconds), "total_ns_per_change": rounded(totalNanoseconds),
                "writer_sync_ns_per_change": rounded(writerSyncNanoseconds),
                "reader_sync_ns_per_change": rounded(readerSyncNanoseconds),
                "writer_ns_per_change_without_sync": rounded(writerNanoseconds - writerSyncNanoseconds),
                "reader_ns_per_change_without_sync": rounded(readerNanoseconds - readerSyncNanoseconds),
            ]
        }
    }

    /// The messages a node published, the replies it sent and the watch events it sent, kept
    /// until taken (every one is taken at once); everything else a transport does is not needed
    /// on this path (no repairs).
    final class CapturingTransport: NodeTransport {
        var published: [[[UInt8]]] = []
        var replies: [[[UInt8]]] = []
        var watchEvents: [[[UInt8]]] = []

        func publish(_ frames: [[UInt8]]) { published.append(frames) }
        func connectRepairLink(peer: String, endpoint: String) {}
        func sendRepairRequest(peer: String, frames: [[UInt8]]) -> Bool { false }
        func reply(client: [UInt8], frames: [[UInt8]]) -> ReplyOutcome {
            replies.append(frames)
            return .sent
        }
        func sendWatchEvents(client: [UInt8], events: [[[UInt8]]]) -> (accepted: Int, clientGone: Bool) {
            watchEvents.append(contentsOf: events)
            return (events.count, false)
        }
        func pauseIntake(_ paused: Bool) {}
        func resetPeerLink(_ endpoint: String) {}
        func connectPeer(endpoint: String, node: String) {}
        func disconnectPeer(endpoint: String) {}
        func refuseToRun(_ reason: String) {}

        func take() -> [[[UInt8]]] {
            defer { published = [] }
            return published
        }
    }

    /// Runs `changes` changes (a warm-up of about a tenth more first, not counted), `perTurn` of
    /// them per writer turn (the warm-up is whole turns).
    public static func run(mode: Mode, changes: Int, perTurn: Int = 1024) async throws -> Figures {
        if mode == .client { return try runClient(changes: changes) }
        let work = NSTemporaryDirectory() + "statesync-path-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: work) }
        let pair = try Pair(in: work, withAPI: false)
        let (writer, reader) = (pair.writer, pair.reader)
        let written = try await writer.model(BenchModel.self, channel: "bench", id: "m")
        let replica = try await reader.model(BenchModel.self, channel: "bench", id: "m")
        let seen = Counter()
        // (.client returned above.)
        if mode == .tx {
            replica.observe(\.f7) { _ in seen.count += 1 }
        } else {
            replica.observe(\.value) { _ in seen.count += 1 }
        }

        var figures = Figures(mode: mode)
        var value = 0
        let warmUp = max(changes / 10 / perTurn, 1) * perTurn
        var done = 0
        while done < warmUp + changes {
            let measured = done >= warmUp
            let turn = min(perTurn, warmUp + changes - done)
            let started = threadCPUNanoseconds()
            for _ in 0..<turn {
                value += 1
                if mode == .tx {
                    written.writeAllFields(value)
                } else {
                    written.value = value
                }
            }
            let set = threadCPUNanoseconds()
            let syncedBefore = pair.synced
            let (messages, wrote, read) = pair.turns()
            done += turn
            if measured {
                figures.add(
                    turn, messages: messages, started: started, set: set, wrote: wrote, read: read,
                    synced: pair.synced(since: syncedBefore))
            }
        }
        writer.detachModels()
        reader.detachModels()
        writer.finishStop()
        reader.finishStop()
        // Counted, not assumed: every change reached the reader's observer.
        guard seen.count == warmUp + changes else {
            throw StateSyncError(
                .timeout, "bench --path: the reader's observer saw \(seen.count) of \(warmUp + changes) changes")
        }
        return figures.perChange()
    }

    /// ``Mode/client``: `changes` SETs (after a warm-up of a tenth more, not counted), `perTurn`
    /// of them in each of the writer's turns, each turn then synced, answered and published, and
    /// its messages handed to the reader, which applies them and sends its watcher their events.
    /// Counted, not assumed: every SET is answered OK and every change reaches the watcher. The
    /// SETs ask for their OKs in OKS messages, as the peers workload's writer and
    /// `StateSyncClient` do (PROTOCOL.md 10.1.1).
    static func runClient(changes: Int, perTurn: Int = 16, keys: Int = 1000) throws -> Figures {
        let work = NSTemporaryDirectory() + "statesync-path-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: work) }
        let pair = try Pair(in: work, withAPI: true)
        let (writer, reader, toReader, toWriter) = (pair.writer, pair.reader, pair.toReader, pair.toWriter)
        let now = Pair.now
        let client: [UInt8] = [0, 0x6B, 0x8B, 0x45, 0x67]  // a routing id, as ZeroMQ's ROUTER makes them
        let watcher: [UInt8] = [0, 0x6B, 0x8B, 0x45, 0x68]
        reader.process(
            .clientRequest(
                client: watcher,
                frames: ClientProtocol.encodeRequest(
                    .watch, id: 1, body: ClientProtocol.encodeWatch(channel: "bench", from: nil, batchedEvents: true)),
                identity: nil),
            now: now(), via: toWriter)
        reader.process(.tick(observerBacklog: 0), now: now(), via: toWriter)

        var figures = Figures(mode: .client)
        let warmUp = max(changes / 10 / perTurn, 1) * perTurn
        let padding = String(repeating: "x", count: 48)
        var done = 0
        var answered = 0
        var watched = 0
        var requests: [[[UInt8]]] = []
        requests.reserveCapacity(perTurn)
        while done < warmUp + changes {
            let measured = done >= warmUp
            let turn = min(perTurn, warmUp + changes - done)
            requests.removeAll(keepingCapacity: true)
            for index in done..<(done + turn) {
                let value = String(String(format: "%015d", index).suffix(15)) + "-" + padding  // 64 octets
                let body = ClientProtocol.encodeSet(
                    ModelAddress(channel: "bench", model: "key-\(index % keys)"),
                    [PropertyWrite(name: "value", value: .string(value))])
                // As the peers workload's writer and StateSyncClient ask: OKs in OKS messages.
                requests.append(
                    ClientProtocol.encodeRequest(
                        .set, id: UInt64(index + 1), body: body, flags: ClientProtocol.RequestFlags.batchedReplies))
            }
            let started = threadCPUNanoseconds()
            let syncedBefore = pair.synced
            for frames in requests {
                writer.process(.clientRequest(client: client, frames: frames, identity: nil), now: now(), via: toReader)
            }
            let (messages, wrote, read) = pair.turns()
            let synced = pair.synced(since: syncedBefore)
            for frames in toReader.replies where frames.count == 2 {
                guard (try? ClientProtocol.decodeReplyHeader(frames[0]))?.kind == .oks,
                    let oks = try? ClientProtocol.decodeBatchedOKs(frames[1])
                else { continue }
                answered += oks.count
            }
            toReader.replies.removeAll(keepingCapacity: true)
            for message in toWriter.watchEvents where message.count >= 2 {
                guard (try? ClientProtocol.decodeReplyHeader(message[0]))?.kind == .event else { continue }
                for body in message.dropFirst() {
                    if case .delta? = try? ClientProtocol.decodeWatchEvent(body) { watched += 1 }
                }
            }
            toWriter.watchEvents.removeAll(keepingCapacity: true)
            done += turn
            if measured {
                figures.add(
                    turn, messages: messages, started: started, set: started, wrote: wrote, read: read, synced: synced)
            }
        }
        writer.finishStop()
        reader.finishStop()
        guard answered == warmUp + changes, watched == warmUp + changes else {
            throw StateSyncError(
                .timeout,
                "bench --path client: \(answered) of \(warmUp + changes) SETs answered OK, \(watched) changes reached the watcher"
            )
        }
        return figures.perChange()
    }

    /// The writer and the reader node, each with a real data directory, whose messages this
    /// thread carries between them (`toReader`: what the writer sends, `toWriter`: the reader's),
    /// each knowing the other from its heartbeats before the first write.
    struct Pair {
        static let endpoints = ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]
        /// Monotonic milliseconds, the nodes' time.
        static let now: @Sendable () -> UInt64 = { monotonicNanoseconds() / 1_000_000 }
        let writer: StateSyncNode
        let reader: StateSyncNode
        /// Their data directories, which count the CPU their syncs take.
        let writerStorage: TimedStorage
        let readerStorage: TimedStorage
        let toReader = CapturingTransport()
        let toWriter = CapturingTransport()

        /// `withAPI`: each node has a client API endpoint (never bound: there is no driver), so
        /// it keeps a watch journal and answers clients, as a daemon does.
        init(in work: String, withAPI: Bool) throws {
            var logger = Logger(label: "bench")
            logger.logLevel = .error
            let apis = ["tcp://127.0.0.1:3", "tcp://127.0.0.1:4"]
            func node(_ index: Int) throws -> (StateSyncNode, TimedStorage) {
                let id = index == 0 ? "writer" : "reader"
                let configuration = NodeConfiguration(
                    nodeID: id, dataDirectory: "\(work)/\(id)", publishEndpoint: Self.endpoints[index],
                    peers: [Self.endpoints[1 - index]], apiEndpoint: withAPI ? apis[index] : nil,
                    heartbeatIntervalMilliseconds: 50)
                let storage = try TimedStorage(path: configuration.dataDirectory)
                let node = try StateSyncNode(
                    configuration: configuration, storage: storage,
                    clock: HybridLogicalClock(node: id), monotonicNow: Self.now,
                    incarnation: UInt64.random(in: 1...UInt64.max), observers: InlineObserverExecutor(), logger: logger)
                return (node, storage)
            }
            (writer, writerStorage) = try node(0)
            (reader, readerStorage) = try node(1)
            let now = Self.now
            let repair = withAPI ? apis : ["inproc://writer", "inproc://reader"]
            writer.process(.endpointsBound(publish: Self.endpoints[0], repair: repair[0]), now: now(), via: toReader)
            reader.process(.endpointsBound(publish: Self.endpoints[1], repair: repair[1]), now: now(), via: toWriter)
            // Heartbeats both ways until each node knows the other (and what it takes) before the
            // writes: a node takes a peer's deltas once the peer's member list names it
            // (PROTOCOL.md 7.5), which takes a heartbeat interval or two (bounded: 4 s).
            for round in 0..<400 {
                if round >= 2, writer.status.peers.allSatisfy(\.meshed), reader.status.peers.allSatisfy(\.meshed) {
                    break
                }
                if round > 0 { Thread.sleep(forTimeInterval: 0.01) }
                writer.process(.tick(observerBacklog: 0), now: now(), via: toReader)
                reader.process(.tick(observerBacklog: 0), now: now(), via: toWriter)
                for frames in toReader.take() {
                    reader.process(.peerMessage(peer: Self.endpoints[0], frames: frames), now: now(), via: toWriter)
                }
                for frames in toWriter.take() {
                    writer.process(.peerMessage(peer: Self.endpoints[1], frames: frames), now: now(), via: toReader)
                }
            }
        }

        /// The CPU the writer's and the reader's syncs took so far, in nanoseconds.
        var synced: (writer: UInt64, reader: UInt64) {
            (writerStorage.syncedNanoseconds, readerStorage.syncedNanoseconds)
        }

        /// The CPU their syncs took since `before` (a ``synced`` read earlier).
        func synced(since before: (writer: UInt64, reader: UInt64)) -> (writer: UInt64, reader: UInt64) {
            let now = synced
            return (now.writer &- before.writer, now.reader &- before.reader)
        }

        /// The writer's tick (what it took is logged, synced and published), then the reader's
        /// turn (the writer's messages, then its tick); returns how many messages the writer
        /// sent, and the thread's CPU clock after each turn. (What the reader sends back is
        /// dropped: nothing on this path needs it.)
        func turns() -> (messages: Int, wrote: UInt64, read: UInt64) {
            writer.process(.tick(observerBacklog: 0), now: Self.now(), via: toReader)
            let messages = toReader.take()
            let wrote = threadCPUNanoseconds()
            for frames in messages {
                reader.process(.peerMessage(peer: Self.endpoints[0], frames: frames), now: Self.now(), via: toWriter)
            }
            reader.process(.tick(observerBacklog: 0), now: Self.now(), via: toWriter)
            let read = threadCPUNanoseconds()
            _ = toWriter.take()
            return (messages.count, wrote, read)
        }
    }

    /// The observer's count. The observer runs inline, on this thread.
    final class Counter: @unchecked Sendable {
        // Safe: only the bench's one thread touches it (observers run inline on it).
        var count = 0
    }
}

/// CPU nanoseconds (user + system) the calling thread has used.
func threadCPUNanoseconds() -> UInt64 {
    var spec = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &spec)
    return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
}
