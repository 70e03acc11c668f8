import Foundation
import StateSync
import Synchronization
import ZeroMQ

/// The client's I/O thread: owns the DEALER socket; tasks hand it requests through a command
/// queue and a wake-up pipe.
final class ClientIO: Sendable {
    typealias Reply = CheckedContinuation<[UInt8], any Error>

    /// Where a watch's events go: one element per event (the public stream); one element per
    /// round of received messages (``StateSyncClient/watchInBatches(channel:replica:onLag:filter:)``,
    /// whose consumer is woken once per round, not once per event); or its live changes only
    /// (``StateSyncClient/changes(channel:)``).
    enum Events: Sendable {
        case each(AsyncThrowingStream<WatchEvent, any Error>.Continuation)
        case batched(AsyncThrowingStream<[WatchEvent], any Error>.Continuation)
        case changes(AsyncThrowingStream<PropertyChange, any Error>.Continuation)

        func finish(throwing error: any Error) {
            switch self {
            case .each(let continuation): continuation.finish(throwing: error)
            case .batched(let continuation): continuation.finish(throwing: error)
            case .changes(let continuation): continuation.finish(throwing: error)
            }
        }
    }

    /// How many events a watch's consumer may leave untaken before the client lags the watch,
    /// by default: it stops applying the watch's events, ends the watch at the node (UNWATCH),
    /// and once the consumer has taken half of them watches again from the replica's cursor, so
    /// the node sends exactly what followed (or a resync past its history: PROTOCOL.md 10.5.4).
    /// Nothing waits behind the watch on the connection (other watches, replies, pings), and a
    /// consumer slower than its channel no longer grows the process without end. A snapshot
    /// being received is not cut (the replica holds the whole state anyway).
    static let defaultBacklogLimit = 16_384

    /// A watch's client-side state: its stream, its session (replica, snapshot being received),
    /// what its consumer has not taken, and whether it is lagged (ended at the node until its
    /// consumer catches up).
    struct WatchState {
        let events: Events
        var session: WatchSession
        let backlog: WatchBacklog
        let onLag: ClientProtocol.LagPolicy
        /// The request id its stream ends it by (the first one it had).
        let streamID: UInt64
        var lagged: Bool { backlog.lagged.load(ordering: .relaxed) }
        /// Watched again by the client after it lagged the watch, and nothing of the node's since
        /// but, perhaps, the start of a snapshot: with `onLag: .end`, a resync then ends the watch
        /// instead (the policy the node applies to a watch that falls behind while it holds it).
        var resumedByClient = false
    }

    enum Command: Sendable {
        case request(id: UInt64, command: ClientProtocol.Command, body: [UInt8], reply: Reply)
        case watch(
            id: UInt64, events: Events, backlog: WatchBacklog, replica: ChannelReplica, onLag: ClientProtocol.LagPolicy,
            filter: ClientProtocol.WatchFilter?, registered: Reply)
        case unwatch(id: UInt64)
    }

    private let endpoint: String
    private let timeoutMilliseconds: UInt64
    /// Whether this client uses CURVE (the hint of a timeout depends on it).
    private let secured: Bool
    private let wakeUp: WakeUp
    private let commands = Mutex<(queue: [Command], closed: Bool)>(([], false))
    private let nextID = Atomic<UInt64>(1)
    private let exited = Atomic<Bool>(false)
    /// Signalled once the I/O thread has exited (and passed on by every waiter).
    private let exitedSignal = DispatchSemaphore(value: 0)
    /// The I/O thread's id, once it runs (0 before).
    private let ioThread = Atomic<UInt>(0)
    /// Events a watch's consumer may leave untaken before the client lags the watch
    /// (``defaultBacklogLimit``).
    private let backlogLimit: Int

    init(
        endpoint: String, timeout: Duration, credentials: (serverKey: [UInt8], pair: Curve.KeyPair)? = nil,
        backlogLimit: Int = ClientIO.defaultBacklogLimit
    ) throws {
        self.endpoint = endpoint
        self.backlogLimit = max(2, backlogLimit)
        self.secured = credentials != nil
        let (seconds, attoseconds) = timeout.components
        self.timeoutMilliseconds = UInt64(max(1, seconds * 1000 + attoseconds / 1_000_000_000_000_000))
        self.wakeUp = try WakeUp()
        let context = try Context()
        let dealer = try context.socket(.dealer)
        // One routing id for the client's life: after a reconnect the node still knows it, and
        // PING can tell which of its watches the node dropped meanwhile.
        // (A leading zero byte is reserved by ZeroMQ for its own generated ids.)
        try dealer.setRoutingID([0x53] + (0..<15).map { _ in UInt8.random(in: 0...255) })
        try dealer.setSendHighWaterMark(1000)
        try dealer.setReceiveHighWaterMark(100_000)
        try dealer.setReconnectInterval(milliseconds: 100)
        if let credentials {
            try dealer.setCurveClient(
                serverKey: credentials.serverKey, publicKey: credentials.pair.publicKey,
                secretKey: credentials.pair.secretKey)
        }
        try dealer.connect(endpoint)
        // The socket moves to the I/O thread and is used only there from now on. The box is
        // needed because Socket is (rightly) not Sendable.
        let transfer = SocketTransfer(context: context, socket: dealer)
        let thread = Thread { [self] in self.main(transfer) }
        thread.name = "statesync-client"
        thread.stackSize = 4 << 20
        thread.start()
    }

    /// A number identifying the calling thread, never 0.
    private static var callingThread: UInt {
        #if canImport(Darwin)
            UInt(bitPattern: pthread_self())
        #else
            UInt(pthread_self())
        #endif
    }

    /// Stops the I/O thread and, unless called on it, returns once it has exited: after that no
    /// watch event is delivered and no replica changes.
    func close() {
        let wasClosed = commands.withLock { state -> Bool in
            defer { state.closed = true }
            return state.closed
        }
        if !wasClosed { wakeUp.signal() }
        guard ioThread.load(ordering: .acquiring) != Self.callingThread else { return }
        exitedSignal.wait()
        exitedSignal.signal()
    }

    private func enqueue(_ command: Command) -> Bool {
        let accepted = commands.withLock { state -> Bool in
            if state.closed { return false }
            state.queue.append(command)
            return true
        }
        if accepted { wakeUp.signal() }
        return accepted
    }

    private var closedError: StateSyncError { StateSyncError(.stopped, "the client for \(endpoint) is closed") }

    func request(_ command: ClientProtocol.Command, _ body: [UInt8]) async throws -> [UInt8] {
        guard body.count <= ClientProtocol.maximumFrameOctets else {
            // Sent, it would cost the connection (and every request on it) and answer nothing.
            throw StateSyncError(
                .tooLarge,
                "the request is \(body.count) octets, over the \(ClientProtocol.maximumFrameOctets) (64 MiB) a node takes in one message: write the data as several smaller properties or models"
            )
        }
        let id = nextID.add(1, ordering: .relaxed).newValue
        return try await withCheckedThrowingContinuation { (reply: Reply) in
            if !enqueue(.request(id: id, command: command, body: body, reply: reply)) {
                reply.resume(throwing: closedError)
            }
        }
    }

    func watch(
        replica: ChannelReplica, onLag: ClientProtocol.LagPolicy, filter: ClientProtocol.WatchFilter?
    ) async throws -> AsyncThrowingStream<WatchEvent, any Error> {
        try await open(replica: replica, onLag: onLag, filter: filter, as: Events.each) { _ in 1 }
    }

    /// ``watch(replica:onLag:filter:)`` with the events of each round of received messages as
    /// one element.
    func watchInBatches(
        replica: ChannelReplica, onLag: ClientProtocol.LagPolicy, filter: ClientProtocol.WatchFilter?
    ) async throws -> AsyncThrowingStream<[WatchEvent], any Error> {
        try await open(replica: replica, onLag: onLag, filter: filter, as: Events.batched) { $0.count }
    }

    /// ``watch(replica:onLag:filter:)`` with its live changes only: no markers, no initial state
    /// (the I/O thread drops them: no task between it and the consumer).
    func changes(replica: ChannelReplica) async throws -> AsyncThrowingStream<PropertyChange, any Error> {
        try await open(replica: replica, onLag: .resync, filter: nil, as: Events.changes) { _ in 1 }
    }

    /// Registers a watch whose stream's elements are `Element`s (`events` of them each), and
    /// returns the stream its consumer reads, which counts what it takes (``WatchBacklog``).
    private func open<Element: Sendable>(
        replica: ChannelReplica, onLag: ClientProtocol.LagPolicy, filter: ClientProtocol.WatchFilter?,
        as kind: (AsyncThrowingStream<Element, any Error>.Continuation) -> Events,
        events: @escaping @Sendable (Element) -> Int
    ) async throws -> AsyncThrowingStream<Element, any Error> {
        let id = nextID.add(1, ordering: .relaxed).newValue
        let (stream, continuation) = AsyncThrowingStream.makeStream(of: Element.self)
        continuation.onTermination = { [weak self] _ in _ = self?.enqueue(.unwatch(id: id)) }
        let backlog = WatchBacklog(limit: backlogLimit) { [weak self] in self?.wakeUp.signal() }
        _ = try await withCheckedThrowingContinuation { (registered: Reply) in
            if !enqueue(
                .watch(
                    id: id, events: kind(continuation), backlog: backlog, replica: replica, onLag: onLag,
                    filter: filter, registered: registered))
            {
                registered.resume(throwing: closedError)
            }
        }
        return backlog.counting(stream, events: events)
    }

    /// The WATCH request body for `replica`: a new watch while it holds nothing, else a resumption
    /// from its cursor with the deltas it holds above it. Batched events: a node sends a run of
    /// events as one message (one that predates them ignores the flag and sends one each; both
    /// are read alike).
    static func watchBody(
        replica: ChannelReplica, onLag: ClientProtocol.LagPolicy, filter: ClientProtocol.WatchFilter?
    ) -> [UInt8] {
        ClientProtocol.encodeWatch(
            channel: replica.channel, from: replica.isEmpty ? nil : replica.cursor, onLag: onLag, filter: filter,
            batchedEvents: true, takesResets: true, heldAbove: replica.heldAbove)
    }

    // MARK: - The thread

    private struct Pending {
        /// The task waiting for the answer; none for a watch the client itself asked again
        /// (after lagging it).
        let reply: Reply?
        let deadline: UInt64
        let command: ClientProtocol.Command
    }

    private struct State {
        var pending: [UInt64: Pending] = [:]
        /// By the request id the node knows the watch by (a lagged watch asked again gets a new one).
        var watches: [UInt64: WatchState] = [:]
        /// A watch asked again: its stream's request id → the one the node knows it by now.
        var renamed: [UInt64: UInt64] = [:]
        /// Watch ids this client ended at the node (UNWATCH) → when it last did, so a stray
        /// EVENT of one (still on its way, or sent because an UNWATCH was lost or a WATCH that
        /// timed out was registered after all) brings at most one more UNWATCH a second.
        var unwatched: [UInt64: UInt64] = [:]
        var lastUnwatchedSweep: UInt64 = 0
        /// Liveness while watching: the outstanding ping and the node's incarnation.
        var pingID: UInt64?
        var pingDeadline: UInt64 = 0
        var lastPing: UInt64 = 0
        var incarnation: String?
        /// Watch events of this round of received messages, yielded together at its end (or
        /// before anything else ends a watch or answers a request): a watcher that keeps up is
        /// woken once per round, not once per event. Kept as runs of one watch's events in
        /// order: a batched watch's run is handed over as it is, one element, its events neither
        /// copied nor released one by one (they were 9 % of a `statesync watch`'s samples).
        var ready: [ReadyRun] = []
        /// How many events `ready` holds.
        var readyEvents = 0

        struct ReadyRun {
            let watch: UInt64
            let events: Events
            var batch: [WatchEvent]
        }

        /// Queues `event` of watch `id` (whose stream is `events`) for the end of the round.
        mutating func queue(_ event: WatchEvent, of id: UInt64, to events: Events) {
            readyEvents += 1
            if let last = ready.indices.last, ready[last].watch == id {
                ready[last].batch.append(event)
            } else {
                ready.append(ReadyRun(watch: id, events: events, batch: [event]))
            }
        }

        mutating func deliverReady() {
            guard readyEvents > 0 else { return }
            for run in ready {
                switch run.events {
                case .each(let continuation):
                    for event in run.batch { continuation.yield(event) }
                case .batched(let continuation):
                    continuation.yield(run.batch)
                case .changes(let continuation):
                    for case .change(let change, _, _) in run.batch { continuation.yield(change) }
                }
            }
            ready.removeAll(keepingCapacity: true)
            readyEvents = 0
        }
    }

    private func main(_ transfer: SocketTransfer) {
        nameCurrentThread("statesync-cli")
        ioThread.store(Self.callingThread, ordering: .releasing)
        let dealer = transfer.socket
        var state = State()
        var poller = Poller([.fileDescriptor(wakeUp.fileDescriptor, .readable), .socket(dealer, .readable)])
        while true {
            let (queue, closed) = commands.withLock { state -> ([Command], Bool) in
                defer { state.queue = [] }
                return (state.queue, state.closed)
            }
            if closed { break }
            let now = monotonicMilliseconds()
            for command in queue { perform(command, state: &state, dealer: dealer, now: now) }
            watchAgainWhereCaughtUp(&state, dealer: dealer, now: now)
            expire(&state, dealer: dealer, now: now)
            sweepUnwatched(&state, now: now)
            keepAlive(&state, dealer: dealer, now: now)
            guard let ready = try? poller.poll(timeoutMilliseconds: 100) else { break }
            if ready[0].contains(.readable) { wakeUp.drain() }
            if ready[1].contains(.readable) {
                while let frames = try? dealer.receive(dontWait: true) {
                    handle(frames, state: &state, dealer: dealer)
                    // A long round is yielded in parts (counted in events: a message may hold 32).
                    if state.readyEvents >= 256 { state.deliverReady() }
                }
                state.deliverReady()
            }
        }
        state.deliverReady()
        let error = closedError
        for (_, pending) in state.pending { pending.reply?.resume(throwing: error) }
        for (_, watch) in state.watches { watch.events.finish(throwing: error) }
        let leftover = commands.withLock { state -> [Command] in
            defer { state.queue = [] }
            return state.queue
        }
        for command in leftover {
            switch command {
            case .request(_, _, _, let reply), .watch(_, _, _, _, _, _, let reply): reply.resume(throwing: error)
            case .unwatch: break
            }
        }
        dealer.close()
        transfer.release()
        exited.store(true, ordering: .releasing)
        exitedSignal.signal()
    }

    private func send(_ command: ClientProtocol.Command, id: UInt64, body: [UInt8], dealer: Socket) -> Bool {
        // A write's OK may come with others in one OKS message (10.1.1): one message, one
        // wake-up, for the writes of many tasks that a node made durable together.
        let flags = command == .set || command == .delete ? ClientProtocol.RequestFlags.batchedReplies : 0
        return
            (try? dealer.send(ClientProtocol.encodeRequest(command, id: id, body: body, flags: flags), dontWait: true))
            ?? false
    }

    private func perform(_ command: Command, state: inout State, dealer: Socket, now: UInt64) {
        switch command {
        case .request(let id, let kind, let body, let reply):
            // Not yet connected: the DEALER queues the request; the deadline covers both.
            _ = send(kind, id: id, body: body, dealer: dealer)
            state.pending[id] = Pending(reply: reply, deadline: now + timeoutMilliseconds, command: kind)
        case .watch(let id, let events, let backlog, let replica, let onLag, let filter, let registered):
            _ = send(
                .watch, id: id, body: Self.watchBody(replica: replica, onLag: onLag, filter: filter), dealer: dealer)
            state.pending[id] = Pending(reply: registered, deadline: now + timeoutMilliseconds, command: .watch)
            state.watches[id] = WatchState(
                events: events, session: WatchSession(replica: replica, filter: filter), backlog: backlog, onLag: onLag,
                streamID: id)
            if state.lastPing == 0 { state.lastPing = now }
        case .unwatch(let id):
            let current = state.renamed.removeValue(forKey: id) ?? id
            if let watch = state.watches.removeValue(forKey: current), !watch.lagged {
                sendUnwatch(current, state: &state, dealer: dealer, now: now)
            }
        }
    }

    /// Ends watch `id` at the node. The node answers OK whether or not it held the watch
    /// (PROTOCOL.md 10.5.9); the answer is not waited for: if this request is lost, the watch's
    /// next EVENT brings another (``unwatchStray(_:state:dealer:)``).
    private func sendUnwatch(_ id: UInt64, state: inout State, dealer: Socket, now: UInt64) {
        var body = WireWriter()
        body.uint64(id)
        let unwatchID = nextID.add(1, ordering: .relaxed).newValue
        // Also when the send failed (the DEALER's queue is full): the watch's next EVENT, a
        // second later or more, brings another.
        _ = send(.unwatch, id: unwatchID, body: body.bytes, dealer: dealer)
        state.unwatched[id] = now
    }

    /// An EVENT of watch `id`, which this client does not apply: one it ended or lagged (its
    /// events still on their way are expected, and dropped), or one the node holds without the
    /// client knowing: its UNWATCH failed to leave, or its WATCH timed out here and was
    /// registered at the node after all. Without this, the node would send such a watch every
    /// change of its channel, for the client to drop, for as long as the connection lasts. At
    /// most one UNWATCH a second per id, and none for a new id while ``strayUnwatchLimit`` are
    /// remembered (a broken node naming ever new ids).
    private func unwatchStray(_ id: UInt64, state: inout State, dealer: Socket) {
        let now = monotonicMilliseconds()
        if let last = state.unwatched[id] {
            if now &- last < 1000 { return }
        } else if state.unwatched.count >= Self.strayUnwatchLimit {
            return
        }
        sendUnwatch(id, state: &state, dealer: dealer, now: now)
    }

    /// While this many ids ended in the last ten seconds are remembered, an EVENT of another id
    /// brings no UNWATCH.
    static let strayUnwatchLimit = 1024

    /// Forgets the ids ended more than ten seconds ago (a stray EVENT of one brings an UNWATCH
    /// at once), at most once a second.
    private func sweepUnwatched(_ state: inout State, now: UInt64) {
        guard !state.unwatched.isEmpty, now &- state.lastUnwatchedSweep >= 1000 else { return }
        state.lastUnwatchedSweep = now
        state.unwatched = state.unwatched.filter { now &- $0.value < 10_000 }
    }

    /// Lags watch `id`, whose consumer left ``backlogLimit`` events untaken: ends it at the node
    /// and applies nothing more of it (what the node still sends under `id` is dropped) until the
    /// consumer caught up (``watchAgainWhereCaughtUp(_:dealer:now:)``).
    private func lag(_ id: UInt64, state: inout State, dealer: Socket) {
        guard let watch = state.watches[id] else { return }
        watch.backlog.lagged.store(true, ordering: .releasing)
        sendUnwatch(id, state: &state, dealer: dealer, now: monotonicMilliseconds())
    }

    /// Asks again, from its replica's cursor, for every lagged watch whose consumer took its
    /// backlog down to half: the node sends what followed the cursor exactly once, or a resync
    /// when its history no longer reaches back (PROTOCOL.md 10.5.4). The watch takes a new
    /// request id; its stream's stays the one to end it by.
    private func watchAgainWhereCaughtUp(_ state: inout State, dealer: Socket, now: UInt64) {
        for (id, watch) in state.watches where watch.lagged && watch.backlog.untaken <= watch.backlog.resumeAt {
            let replica = watch.session.replica
            let again = nextID.add(1, ordering: .relaxed).newValue
            _ = send(
                .watch, id: again,
                body: Self.watchBody(replica: replica, onLag: watch.onLag, filter: watch.session.filter),
                dealer: dealer)
            state.pending[again] = Pending(reply: nil, deadline: now + timeoutMilliseconds, command: .watch)
            var resumed = watch
            resumed.resumedByClient = true
            resumed.session = WatchSession(replica: replica, filter: watch.session.filter)
            resumed.backlog.lagged.store(false, ordering: .releasing)
            state.watches[id] = nil
            state.watches[again] = resumed
            state.renamed[watch.streamID] = again
        }
    }

    private func expire(_ state: inout State, dealer: Socket, now: UInt64) {
        let expired = state.pending.filter { $0.value.deadline <= now }
        for (id, pending) in expired {
            state.pending[id] = nil
            pending.reply?.resume(throwing: timeoutError(for: pending.command))
            if pending.command == .watch, let watch = state.watches.removeValue(forKey: id) {
                watch.events.finish(throwing: timeoutError())
                // The node may yet register it (a slow node, or a WATCH still queued until the
                // connection is made): it is ended there too, after it.
                sendUnwatch(id, state: &state, dealer: dealer, now: now)
            }
        }
        if state.pingID != nil, state.pingDeadline <= now {
            state.pingID = nil
            failWatches(
                &state,
                StateSyncError(
                    .connectionLost,
                    "lost the connection to \(endpoint): no answer to a liveness ping within \(timeoutMilliseconds) ms")
            )
        }
    }

    /// A request that got no answer in time. A write's outcome is then unknown: a node that is
    /// settling after a power loss holds writes until its peers answer, and applies them then.
    private func timeoutError(for command: ClientProtocol.Command? = nil) -> StateSyncError {
        let write = command == .set || command == .delete
        return StateSyncError(
            .timeout,
            "no answer from \(endpoint) within \(Double(timeoutMilliseconds) / 1000) s; "
                + (write
                    ? "the write may still be applied (a node settling after a power loss holds writes until its peers answer: see statesync status); "
                    : "")
                + "is statesyncd running there?"
                + (secured
                    ? " (with security: is this client's public key in its security.client_keys, and --server-key its key?)"
                    : " (a node with security answers only clients with an admitted key: --key, --server-key)"))
    }

    private func failWatches(_ state: inout State, _ error: StateSyncError) {
        for (_, watch) in state.watches { watch.events.finish(throwing: error) }
        state.watches = [:]
    }

    /// While watching, pings the node every second: a dead connection or a restarted node (whose
    /// watches are gone) ends the watches with an error instead of a silent gap.
    private func keepAlive(_ state: inout State, dealer: Socket, now: UInt64) {
        guard !state.watches.isEmpty, state.pingID == nil, now &- state.lastPing >= 1000 else { return }
        let id = nextID.add(1, ordering: .relaxed).newValue
        // A lagged watch is not at the node: it is not asked after.
        let atTheNode = state.watches.filter { !$0.value.lagged }.keys
        var body = WireWriter()
        body.varint(UInt64(atTheNode.count))
        for watchID in atTheNode { body.uint64(watchID) }
        _ = send(.ping, id: id, body: body.bytes, dealer: dealer)
        state.pingID = id
        state.pingDeadline = now + timeoutMilliseconds
        state.lastPing = now
    }

    private func handle(_ frames: [[UInt8]], state: inout State, dealer: Socket) {
        guard frames.count >= 2, let header = try? ClientProtocol.decodeReplyHeader(frames[0]) else { return }
        // Only an EVENT carries more than one body: a run of a batched watch's events (10.5.7).
        guard frames.count == 2 || header.kind == .event else { return }
        let id = header.requestID
        let body = frames[1]
        // A reply can end a watch or resume a task: the events received before it go first.
        if header.kind != .event { state.deliverReady() }
        switch header.kind {
        case .event:
            // A lagged watch's events still on their way are dropped (it is asked again later),
            // and those of a watch the client does not hold.
            guard var watch = state.watches[id], !watch.lagged else {
                unwatchStray(id, state: &state, dealer: dealer)
                return
            }
            // Its consumer left too many events untaken: lag it, at a message's start (all of a
            // message is applied or none) and not inside a snapshot, unless the replica holds
            // nothing yet to resume from.
            if watch.backlog.untaken >= backlogLimit, !watch.session.receivingSnapshot,
                !watch.session.replica.isEmpty
            {
                lag(id, state: &state, dealer: dealer)
                return
            }
            for body in frames[1...] {
                guard let event = try? ClientProtocol.decodeWatchEvent(body) else {
                    state.deliverReady()
                    state.watches[id] = nil
                    sendUnwatch(id, state: &state, dealer: dealer, now: monotonicMilliseconds())
                    watch.events.finish(
                        throwing: StateSyncError(.protocolError, "malformed watch event from \(endpoint)"))
                    return
                }
                if watch.resumedByClient {
                    switch event {
                    case .snapshotBegin(let reason) where watch.onLag == .end && reason != .reset:
                        // Watched again past the node's history: the policy is to end, as the node
                        // ends a watch that falls behind while it holds it (ERROR 6). Nothing of
                        // the snapshot is applied: the replica stays at its cursor.
                        state.deliverReady()
                        state.watches[id] = nil
                        sendUnwatch(id, state: &state, dealer: dealer, now: monotonicMilliseconds())
                        watch.events.finish(
                            throwing: StateSyncError(
                                .remote,
                                "this watch fell behind the node's history while its consumer caught up (the client had paused it: \(backlogLimit) events were not taken) and ended, its policy being to end on lag; watch again with its replica"
                            ))
                        return
                    case .snapshotBegin:
                        break
                    default:
                        watch.resumedByClient = false
                    }
                }
                guard handleWatchEvent(event, id: id, watch: &watch, state: &state) else {
                    // Ended here (a change it cannot apply, or the node stopping): the node may
                    // still hold it.
                    state.watches[id] = nil
                    sendUnwatch(id, state: &state, dealer: dealer, now: monotonicMilliseconds())
                    return
                }
            }
            state.watches[id] = watch
        case .ok:
            if id == state.pingID {
                state.pingID = nil
                guard case .map(let map)? = try? ClientProtocol.decodeValue(body) else { return }
                if case .string(let incarnation)? = map["incarnation"] {
                    if let known = state.incarnation, known != incarnation {
                        failWatches(
                            &state,
                            StateSyncError(.connectionLost, "the node at \(endpoint) restarted; its watches ended"))
                    }
                    state.incarnation = incarnation
                }
                if case .array(let lost)? = map["lost"] {
                    // A watch lagged since the PING was sent is not at the node by the client's
                    // choice: it resumes exactly from its cursor.
                    for case .int(let raw) in lost where state.watches[UInt64(bitPattern: raw)]?.lagged != true {
                        state.watches.removeValue(forKey: UInt64(bitPattern: raw))?.events.finish(
                            throwing: StateSyncError(
                                .connectionLost,
                                "the node at \(endpoint) dropped this watch while the connection was interrupted; changes may have been missed"
                            ))
                    }
                }
                return
            }
            guard let pending = state.pending.removeValue(forKey: id) else { return }
            pending.reply?.resume(returning: body)
        case .oks:
            // A malformed one is ignored, as any malformed message: its requests time out.
            guard let replies = try? ClientProtocol.decodeBatchedOKs(body) else { return }
            // Only writes ask for OKS messages: another request of the same id is not answered.
            for reply in replies {
                guard let command = state.pending[reply.id]?.command, command == .set || command == .delete
                else { continue }
                state.pending.removeValue(forKey: reply.id)?.reply?.resume(returning: reply.body)
            }
        case .error:
            let message = (try? ClientProtocol.decodeError(body))?.message ?? "malformed error reply"
            if id == state.pingID { state.pingID = nil }
            guard let pending = state.pending.removeValue(forKey: id) else {
                // An established watch ended by the node (e.g. it lagged with the "end" policy).
                state.watches.removeValue(forKey: id)?.events.finish(throwing: StateSyncError(.remote, message))
                return
            }
            if pending.command == .watch, let watch = state.watches.removeValue(forKey: id) {
                watch.events.finish(throwing: StateSyncError(.remote, message))
            }
            pending.reply?.resume(throwing: StateSyncError(.remote, message))
        }
    }
}

extension ClientIO {
    /// Applies one watch event to the watch's replica and queues what it means in `state.ready`.
    /// Returns `false` when the watch has ended (with an error, after what was queued).
    private func handleWatchEvent(
        _ event: ClientProtocol.WatchEventBody, id: UInt64, watch: inout WatchState, state: inout State
    ) -> Bool {
        do {
            let filter = watch.session.filter
            for meaning in try watch.session.handle(event, from: endpoint) {
                // A node older than filters sends everything: what does not pass is dropped here
                // (on this thread: no second stream and task per event).
                if let filter, case .change(let change, let kind, _) = meaning,
                    !filter.passes(model: change.model, property: change.property)
                        || (kind == .initial && !filter.initialState)
                {
                    continue
                }
                // ``StateSyncClient/changes(channel:)``: live changes (a resync's too), no markers.
                if case .changes = watch.events {
                    guard case .change(_, let kind, _) = meaning, kind != .initial else { continue }
                }
                watch.backlog.gave(1)
                state.queue(meaning, of: id, to: watch.events)
            }
            return true
        } catch {
            state.deliverReady()
            watch.events.finish(throwing: error)
            return false
        }
    }
}

/// Carries the DEALER socket and its context from the creating thread to the I/O thread.
// Safe: the creating thread never touches the socket after handing it over; from then on only
// the I/O thread uses it (the ownership rule of ZeroMQ sockets).
private final class SocketTransfer: @unchecked Sendable {
    private(set) var context: Context?
    let socket: Socket

    init(context: Context, socket: Socket) {
        self.context = context
        self.socket = socket
    }

    func release() {
        context?.terminate()
        context = nil
    }
}

func monotonicMilliseconds() -> UInt64 {
    var spec = timespec()
    clock_gettime(CLOCK_MONOTONIC, &spec)
    return UInt64(spec.tv_sec) * 1000 + UInt64(spec.tv_nsec) / 1_000_000
}

/// What a watch's consumer has not taken yet, in events: the I/O thread counts what it queues
/// for the stream, the stream's reader what it hands the consumer. Past the limit the client
/// lags the watch (``ClientIO/defaultBacklogLimit``); its reader wakes the I/O thread once it
/// took the count down to ``resumeAt`` (the thread also looks each turn, at least every 100 ms).
final class WatchBacklog: Sendable {
    private let count = Atomic<Int>(0)
    /// Whether the I/O thread lagged the watch (then a take down to ``resumeAt`` wakes it).
    let lagged = Atomic<Bool>(false)
    let resumeAt: Int
    private let wake: @Sendable () -> Void

    init(limit: Int, wake: @escaping @Sendable () -> Void) {
        self.resumeAt = limit / 2
        self.wake = wake
    }

    var untaken: Int { count.load(ordering: .acquiring) }

    func gave(_ events: Int) {
        count.add(events, ordering: .releasing)
    }

    func took(_ events: Int) {
        let left = count.subtract(events, ordering: .acquiringAndReleasing).newValue
        if left <= resumeAt, lagged.load(ordering: .acquiring) { wake() }
    }

    /// `stream` as its consumer reads it: each element counted as taken (`events` of it) once
    /// handed over.
    func counting<Element: Sendable>(
        _ stream: AsyncThrowingStream<Element, any Error>, events: @escaping @Sendable (Element) -> Int
    ) -> AsyncThrowingStream<Element, any Error> {
        let reader = StreamReader(stream)
        return AsyncThrowingStream {
            guard let element = try await reader.next() else { return nil }
            self.took(events(element))
            return element
        }
    }
}

/// The iterator of a watch's stream, behind the stream its consumer reads.
// Safe: `iterator` is touched only inside `next()`, and `reading` lets one call in at a time
// (a second concurrent reader traps: a watch's stream has one consumer).
private final class StreamReader<Element: Sendable>: @unchecked Sendable {
    private var iterator: AsyncThrowingStream<Element, any Error>.Iterator
    private let reading = Atomic<Bool>(false)

    init(_ stream: AsyncThrowingStream<Element, any Error>) {
        iterator = stream.makeAsyncIterator()
    }

    func next() async throws -> Element? {
        precondition(
            !reading.exchange(true, ordering: .acquiring), "a watch's stream is read by one task at a time")
        defer { reading.store(false, ordering: .releasing) }
        return try await iterator.next()
    }
}
