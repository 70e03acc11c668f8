import Foundation
import Logging
import Synchronization
import ZeroMQ

/// The node's I/O thread: owns every ZeroMQ socket of the node (czmq's actor pattern — one
/// thread, sockets never shared, other threads wake it through a pipe).
///
/// Sockets: one PUB bound to `network.publish`; one SUB per peer, connected to its publish
/// endpoint and subscribed to everything; one ROUTER bound to `network.api` for clients. Every
/// socket is created in ``SocketFactory`` with explicit linger and high-water marks.
final class NodeEventLoop: Sendable {
    let configuration: NodeConfiguration
    let logger: Logger
    private let wakeUp: WakeUp
    private let stopRequested = Atomic<Bool>(false)
    /// The bound publish endpoint, and the bound ROUTER: the client API, or the repair endpoint.
    private let bound = Mutex<(publish: String, router: String)>(("", ""))
    private let watchers = Atomic<Int>(0)
    private let lagging = Atomic<Int>(0)
    private let publishedSequence = Atomic<UInt64>(0)
    private let exit = Mutex<(exited: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))
    // Set once by the node's initialiser, before `start()`; only read afterwards.
    nonisolated(unsafe) weak var node: StateSyncNode?

    /// How many messages one socket may deliver before the loop looks at the others.
    static let batchLimit = 512
    /// How often gaps are looked for and repairs (re)requested, in milliseconds.
    static let repairTick: UInt64 = 50

    init(configuration: NodeConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        // A pipe cannot fail to open short of descriptor exhaustion, where nothing else works.
        do {
            self.wakeUp = try WakeUp()
        } catch {
            fatalError("cannot create the node's wake-up pipe: \(error)")
        }
    }

    var boundPublishEndpoint: String { bound.withLock { $0.publish } }
    /// The client API's bound endpoint; `nil` when the node serves no clients.
    var boundAPIEndpoint: String? { configuration.apiEndpoint == nil ? nil : bound.withLock { $0.router } }
    /// Where peers send repair requests (advertised in heartbeats): the API or the repair endpoint.
    var boundRepairEndpoint: String { bound.withLock { $0.router } }
    var watcherCount: Int { watchers.load(ordering: .relaxed) }
    var laggingWatchCount: Int { lagging.load(ordering: .relaxed) }
    var latestPublished: UInt64 { publishedSequence.load(ordering: .relaxed) }
    func setLaggingWatchCount(_ count: Int) { lagging.store(count, ordering: .relaxed) }

    func wake() { wakeUp.signal() }

    func setWatcherCount(_ count: Int) { watchers.store(count, ordering: .relaxed) }

    /// Starts the thread; returns once every socket is bound and connected, or throws why not.
    func start() async throws {
        try await withCheckedThrowingContinuation { (ready: CheckedContinuation<Void, any Error>) in
            let thread = Thread { [self] in self.main(ready: ready) }
            thread.name = "statesync-io"
            thread.stackSize = 8 << 20
            thread.start()
        }
    }

    /// Asks the thread to publish what is queued, close its sockets and exit; returns when it has.
    func stop() async {
        stopRequested.store(true, ordering: .releasing)
        wakeUp.signal()
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = exit.withLock { state -> Bool in
                if state.exited { return true }
                state.waiters.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
    }

    private func finish() {
        let waiters = exit.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.exited = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    // MARK: - The thread

    private struct Sockets {
        let context: Context
        let publisher: Socket
        let subscribers: [(endpoint: String, socket: Socket)]
        let api: Socket?
    }

    private func main(ready: CheckedContinuation<Void, any Error>) {
        let sockets: Sockets
        do {
            let made = try SocketFactory.makeNodeSockets(configuration: configuration)
            sockets = Sockets(
                context: made.context, publisher: made.publisher, subscribers: made.subscribers, api: made.api)
            let publish = (try? made.publisher.lastEndpoint()) ?? configuration.publishEndpoint
            let router = (try? made.api.lastEndpoint()) ?? configuration.repairServiceEndpoint
            bound.withLock { $0 = (publish, router) }
        } catch {
            finish()
            ready.resume(throwing: error)
            return
        }
        ready.resume()
        run(sockets)
        sockets.publisher.close()
        for (_, subscriber) in sockets.subscribers { subscriber.close() }
        sockets.api?.close()
        // Release the endpoints before reporting the stop: a restart may bind them at once.
        sockets.context.terminate()
        finish()
    }

    /// Local writes logged but not yet durable: published (and, with fsync `always`, answered)
    /// once the log is synced.
    struct Staged {
        var applied: [StateSyncNode.Applied] = []
        var replies: [(client: [UInt8], id: UInt64, body: [UInt8])] = []
        var isEmpty: Bool { applied.isEmpty && replies.isEmpty }
    }

    private func run(_ sockets: Sockets) {
        guard let node else { return }
        var state = LoopState()
        let interval = UInt64(configuration.heartbeatIntervalMilliseconds)
        let syncInterval = UInt64(configuration.fsyncIntervalMilliseconds)
        var lastHeartbeat: UInt64 = 0
        var lastRepair: UInt64 = 0
        var lastSync = monotonicMilliseconds()
        var published = node.outbox.withLock { $0.latestSequence }
        publishedSequence.store(published, ordering: .relaxed)
        var repair = RepairState()
        // Backpressure: while the observer queue is too far behind, peer deltas are not read
        // (ZeroMQ queues them, drops past its high-water mark, and repair fetches those later);
        // heartbeats, local writes and clients go on.
        var intakePaused = false
        var pausedSince: UInt64 = 0
        var poller = makePoller(sockets, repair: repair, intake: true)

        /// Makes staged writes durable, then publishes them and sends their replies.
        func flush(force: Bool) {
            guard !state.staged.isEmpty else { return }
            let now = monotonicMilliseconds()
            if configuration.fsync == .interval {
                // Acknowledge at once (the write reached the OS); publish once durable.
                for reply in state.staged.replies { send(reply, api: sockets.api, node: node) }
                state.staged.replies = []
                guard force || now &- lastSync >= syncInterval else { return }
            }
            do {
                try node.log.sync()
            } catch {
                // After a failed fsync the kernel may have dropped the dirty pages: retrying can
                // "succeed" without the data on disk. Stop rather than acknowledge lost writes;
                // a restart recovers from what the log really holds.
                fatalError(
                    "statesyncd: cannot make the write-ahead log durable (\(error)); stopping before acknowledging writes"
                )
            }
            lastSync = now
            // Consecutive deltas of one model go out as one message (a DELTA batch).
            let deltas = state.staged.applied.map { $0.delta }
            for range in Self.batchRanges(of: deltas, limit: configuration.batchMaximumDeltas) {
                publish(batch: Array(deltas[range]), on: sockets.publisher)
            }
            for delta in deltas { published = max(published, delta.sequence) }
            publishedSequence.store(published, ordering: .relaxed)
            for reply in state.staged.replies { send(reply, api: sockets.api, node: node) }
            state.staged = Staged()
            pumpWatches(state: &state, api: sockets.api, node: node, published: published)
            if node.log.size > configuration.compactBytes {
                do {
                    try node.compact()
                } catch {
                    logger.error("log compaction failed; will retry", metadata: ["error": "\(error)"])
                }
            }
        }

        while true {
            let stopping = stopRequested.load(ordering: .acquiring)
            stage(node.takeLocalWrites(), state: &state, node: node)
            if stopping {
                flush(force: true)
                break
            }
            flush(force: false)

            let now = monotonicMilliseconds()
            if now &- lastHeartbeat >= interval {
                publish(node.heartbeat(published: published, api: boundRepairEndpoint), on: sockets.publisher)
                lastHeartbeat = now
            }
            if now &- lastRepair >= Self.repairTick {
                // Also lets lagging watches go on once their clients drained their queues, and
                // sends caught-up markers.
                pumpWatches(state: &state, api: sockets.api, node: node, published: published)
                if updateRepairLinks(&repair, context: sockets.context, node: node) {
                    poller = makePoller(sockets, repair: repair, intake: !intakePaused)
                }
                if !intakePaused { requestRepairs(&repair, node: node, now: now) }
                lastRepair = now
                if state.staged.isEmpty, node.log.size > configuration.compactBytes || repair.mergedSnapshot {
                    // Received deltas alone also grow the log; a merged snapshot is only durable
                    // once it is in the snapshot file.
                    do {
                        try node.compact()
                        repair.mergedSnapshot = false
                    } catch {
                        logger.error("log compaction failed; will retry", metadata: ["error": "\(error)"])
                    }
                }
            }
            let backlog = node.observerExecutor.backlog
            if !intakePaused, backlog > configuration.observerBacklogLimit {
                intakePaused = true
                pausedSince = now
                poller = makePoller(sockets, repair: repair, intake: false)
                node.core.withLock { $0.counters.observerBackpressurePauses += 1 }
                if let suppressed = node.limiter.allow("observer-backpressure") {
                    logger.warning(
                        "observers are more than \(configuration.observerBacklogLimit) changes behind; not taking peer deltas until they catch up",
                        metadata: ["suppressed": "\(suppressed)"])
                }
            } else if intakePaused, backlog <= configuration.observerBacklogLimit / 2 {
                intakePaused = false
                poller = makePoller(sockets, repair: repair, intake: true)
                let paused = Int(monotonicMilliseconds() &- pausedSince)
                node.core.withLock { $0.counters.observerBackpressureMilliseconds += paused }
            }
            var timeout = Int(interval &- min(interval, monotonicMilliseconds() &- lastHeartbeat))
            timeout = min(timeout, Int(Self.repairTick))
            if !state.staged.isEmpty { timeout = min(timeout, Int(syncInterval)) }
            if state.laggingWatches > 0 || intakePaused { timeout = min(timeout, 5) }
            let ready: [PollEvents]
            do {
                ready = try poller.poll(timeoutMilliseconds: timeout)
            } catch {
                logger.error("zmq_poll failed; stopping the node's I/O", metadata: ["error": "\(error)"])
                break
            }
            var index = 0
            if ready[index].contains(.readable) { wakeUp.drain() }
            index += 1
            for (endpoint, subscriber) in sockets.subscribers where !intakePaused {
                defer { index += 1 }
                guard ready[index].contains(.readable) else { continue }
                var records = DeltaLog.Batch()
                for _ in 0..<Self.batchLimit {
                    guard let frames = receive(from: subscriber, what: "peer \(endpoint)") else { break }
                    let fresh = node.receive(from: endpoint, frames: frames)
                    for index in fresh.indices { records.add(fresh[index].delta) }
                }
                logRemote(records, node: node)
                pumpWatches(state: &state, api: sockets.api, node: node, published: published)
            }
            if let api = sockets.api {
                if ready[index].contains(.readable) {
                    for _ in 0..<Self.batchLimit {
                        guard let frames = receive(from: api, what: "client API or repair endpoint") else { break }
                        handleClientMessage(frames, state: &state, api: api, node: node)
                    }
                    pumpWatches(state: &state, api: sockets.api, node: node, published: published)
                }
                index += 1
            }
            for link in repair.links.values where !intakePaused {
                defer { index += 1 }
                guard index < ready.count, ready[index].contains(.readable) else { continue }
                for _ in 0..<Self.batchLimit {
                    guard let frames = receive(from: link.socket, what: "repair link \(link.api)") else { break }
                    let (fresh, merged) = handleRepairReply(frames, from: link, repair: &repair, node: node)
                    var records = DeltaLog.Batch()
                    for index in fresh.indices { records.add(fresh[index].delta) }
                    logRemote(records, node: node)
                    if !merged.isEmpty { resyncWatches(of: merged, state: &state) }
                    // Own deltas fetched back (this node had lost them) were published long ago.
                    for applied in fresh where applied.delta.origin == configuration.nodeID {
                        published = max(published, applied.delta.sequence)
                    }
                }
                pumpWatches(state: &state, api: sockets.api, node: node, published: published)
            }
        }
        for link in repair.links.values { link.socket.close() }
    }

    /// Logs local writes and stages them for publishing once durable. Writes the log cannot take
    /// are neither published nor acknowledged: a write error stops the node (see `flush`).
    func stage(_ applied: [StateSyncNode.Applied], state: inout LoopState, node: StateSyncNode) {
        guard !applied.isEmpty else { return }
        var records = DeltaLog.Batch()
        for index in applied.indices { records.add(applied[index].delta) }
        do {
            try node.log.append(records)
        } catch {
            fatalError(
                "statesyncd: cannot append to the write-ahead log (\(error)); stopping before acknowledging writes")
        }
        guard !records.tooLarge.isEmpty else {
            state.staged.applied.append(contentsOf: applied)
            return
        }
        // A model's write too large for a record stays local (SETs are refused before this).
        for position in records.tooLarge {
            node.core.withLock { $0.counters.encodingFailures += 1 }
            logger.error(
                "a local write is too large to log and replicate; it stays local",
                metadata: [
                    "model": "\(applied[position].delta.channel)/\(applied[position].delta.model)",
                    "delta.version": "\(applied[position].delta.version)",
                ])
        }
        let skipped = Set(records.tooLarge)
        state.staged.applied.append(
            contentsOf: applied.indices.lazy.filter { !skipped.contains($0) }.map { applied[$0] })
    }

    /// Logs deltas received from peers (no fsync: a peer can always send them again). One too
    /// large for a record (possible only by a few bytes: frames are capped at the same size) is
    /// applied but not logged.
    private func logRemote(_ records: DeltaLog.Batch, node: StateSyncNode) {
        do {
            try node.log.append(records)
        } catch {
            logger.critical("cannot append to the log", metadata: ["error": "\(error)"])
        }
    }

    /// The poll set: the wake-up pipe, then (with `intake`) every SUB socket, then the client
    /// API, then (with `intake`) every repair link — the order the loop reads `ready` in.
    private func makePoller(_ sockets: Sockets, repair: RepairState, intake: Bool) -> Poller {
        var items: [Poller.Item] = [.fileDescriptor(wakeUp.fileDescriptor, .readable)]
        if intake { for (_, subscriber) in sockets.subscribers { items.append(.socket(subscriber, .readable)) } }
        if let api = sockets.api { items.append(.socket(api, .readable)) }
        if intake { for link in repair.links.values { items.append(.socket(link.socket, .readable)) } }
        return Poller(items)
    }

    private func receive(from socket: Socket, what: String) -> [[UInt8]]? {
        do {
            return try socket.receive(dontWait: true)
        } catch {
            logger.error("receive failed", metadata: ["socket": "\(what)", "error": "\(error)"])
            return nil
        }
    }

    /// How `deltas` go out as DELTA batches: runs of consecutive deltas of one model, of at most
    /// `limit` each, in order.
    static func batchRanges(of deltas: [Delta], limit: Int) -> [Range<Int>] {
        var ranges: [Range<Int>] = []
        var start = 0
        for index in deltas.indices.dropFirst() {
            if deltas[index].channel != deltas[start].channel || deltas[index].model != deltas[start].model
                || index - start >= limit
            {
                ranges.append(start..<index)
                start = index
            }
        }
        if !deltas.isEmpty { ranges.append(start..<deltas.count) }
        return ranges
    }

    func publish(batch: [Delta], on publisher: Socket) {
        do {
            try publisher.send(PeerMessage.encodeBatch(batch), dontWait: true)
        } catch {
            logger.error("publish failed", metadata: ["error": "\(error)"])
        }
    }

    func publish(_ message: PeerMessage, on publisher: Socket) {
        do {
            // PUB never blocks: past the high-water mark libzmq drops, and sequence numbers let
            // peers see the gap.
            try publisher.send(message.encode(), dontWait: true)
        } catch {
            logger.error("publish failed", metadata: ["error": "\(error)"])
        }
    }
}

/// The I/O thread's own state: the watches clients hold, writes waiting to be durable.
struct LoopState {
    var staged = NodeEventLoop.Staged()
    var watches: [NodeEventLoop.WatchKey: NodeEventLoop.Watch] = [:]
    var laggingWatches = 0
}
