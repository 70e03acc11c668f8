import Foundation
package import Logging
package import StateSync
import Synchronization
import ZeroMQ

/// Drives a ``StateSyncNode`` over ZeroMQ: one I/O thread owns every socket of the node
/// (czmq's actor pattern — one thread, sockets never shared, other threads wake it through a
/// pipe), turns what arrives into ``NodeInput``s and performs the node's network actions.
///
/// Sockets: one PUB bound to `network.publish`; one SUB per peer, connected to its publish
/// endpoint and subscribed to everything; one ROUTER bound to `network.api` (or, without it, the
/// repair endpoint); one DEALER per peer that advertised a repair endpoint. Every socket is made
/// in ``SocketFactory`` with explicit linger and high-water marks.
///
/// A round of the loop: poll (until the node's next deadline, or a wake-up), feed the node every
/// message that arrived (at most ``batchLimit`` per socket, and for at most ``turnBudget``
/// nanoseconds when something waits for the tick or it is due), then a tick — which also makes the turn's
/// local writes durable and published (group commit; a long queue of a model's writes is taken
/// in full rounds, each synced at once).
package final class ZeroMQNodeDriver: NodeDriver {
    let configuration: NodeConfiguration
    let logger: Logger
    private let wakeUp: WakeUp
    private let stopRequested = Atomic<Bool>(false)
    private let exit = Mutex<(exited: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    /// How many messages one socket may deliver before the loop looks at the others.
    static let batchLimit = 512

    /// How long a turn may go on reading sockets once something waits for its tick
    /// (``StateSyncNode/awaitsTick``): past it, the turn ends after the message in hand. A count
    /// alone does not bound a turn: with `storage.fsync: interval` a SET is answered as it is
    /// taken, so a client with writes in flight sends the next ones while the turn goes on, and
    /// the socket never runs dry. The turn then took ``batchLimit`` SETs before its tick
    /// published any of them: at 15 k writes a second, 34 ms and more (the peers bench saw 43 ms
    /// silences on node 1's PUB socket while its acknowledgements went on). Not for a node that
    /// only applies peers' deltas: a tick after every millisecond of heavy batches cost the
    /// 8-property transactions of `statesync bench` about 4 %. Such a node's turn still ends
    /// once its tick is due (a heartbeat, the repair round): a catch-up of full batches (512 of
    /// up to `network.batch_max_deltas` deltas each per socket) can take longer than the peers'
    /// liveness window.
    static let turnBudget: UInt64 = 1_000_000

    package init(configuration: NodeConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        // A pipe cannot fail to open short of descriptor exhaustion, where nothing else works.
        do {
            self.wakeUp = try WakeUp()
        } catch {
            fatalError("cannot create the node's wake-up pipe: \(error)")
        }
    }

    package func wake() { wakeUp.signal() }

    /// The I/O thread's ``currentThreadID()`` while it runs (0 before and after).
    private let ioThread = Atomic<UInt>(0)

    package func mayWaitForOutbox() -> Bool {
        let io = ioThread.load(ordering: .relaxed)
        return io != 0 && io != currentThreadID()
    }

    /// Keys waiting to replace the transport's (``StateSyncNode/reloadSecurity(_:)``).
    private let pendingKeys = Mutex<NodeKeys?>(nil)

    /// The node's own public key, with security (set at start; a reload may not change it).
    private let ownKey = Mutex<[UInt8]?>(nil)
    var ownPublicKey: [UInt8]? { ownKey.withLock { $0 } }

    /// Hands the I/O thread new keys; it takes them at its next turn.
    func reload(_ keys: NodeKeys) {
        pendingKeys.withLock { $0 = keys }
        wakeUp.signal()
    }

    /// Starts the I/O thread driving `node`; returns once every socket is bound and connected,
    /// or throws why not.
    package func start(_ node: StateSyncNode) async throws {
        try await withCheckedThrowingContinuation { (ready: CheckedContinuation<Void, any Error>) in
            let thread = Thread { [self] in self.main(node, ready: ready) }
            thread.name = "statesync-io"
            thread.stackSize = 8 << 20
            thread.start()
        }
    }

    /// Asks the thread to publish what is queued, close its sockets and exit; returns when it has.
    package func stop() async {
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

    private func main(_ node: StateSyncNode, ready: CheckedContinuation<Void, any Error>) {
        nameCurrentThread("statesync-io")
        ioThread.store(currentThreadID(), ordering: .relaxed)
        defer { ioThread.store(0, ordering: .relaxed) }
        let transport: ZeroMQTransport
        do {
            let made = try SocketFactory.makeNodeSockets(configuration: configuration)
            transport = ZeroMQTransport(
                context: made.context, publisher: made.publisher, subscribers: made.subscribers, router: made.router,
                zap: made.zap, keys: made.keys, monitors: made.monitors, configuration: configuration, logger: logger)
        } catch {
            finish()
            ready.resume(throwing: error)
            return
        }
        let publish = (try? transport.publisher.lastEndpoint()) ?? configuration.publishEndpoint
        let router = (try? transport.router.lastEndpoint()) ?? configuration.repairServiceEndpoint
        node.process(
            .endpointsBound(publish: publish, repair: router), now: MonotonicClock.milliseconds(), via: transport)
        if let keys = transport.keys {
            ownKey.withLock { $0 = keys.pair.publicKey }
            node.process(
                .clientAccessChanged(keys.clientAccess, peers: Set(keys.peers.keys)),
                now: MonotonicClock.milliseconds(), via: transport)
        }
        ready.resume()
        run(node, transport)
        transport.close()
        finish()
    }

    private func run(_ node: StateSyncNode, _ transport: ZeroMQTransport) {
        var poller: ReadPoller
        do {
            poller = try transport.makePoller(wakeUp: wakeUp.fileDescriptor)
        } catch {
            logger.error("cannot poll the node's sockets; stopping the node's I/O", metadata: ["error": "\(error)"])
            return
        }
        var refusalHandled = false
        var turns = 0
        while true {
            if stopRequested.load(ordering: .acquiring) {
                node.process(.stop, now: MonotonicClock.milliseconds(), via: transport)
                return
            }
            if let keys = pendingKeys.withLock({ pending -> NodeKeys? in
                defer { pending = nil }
                return pending
            }) {
                transport.replaceKeys(keys)
                node.process(
                    .clientAccessChanged(keys.clientAccess, peers: Set(keys.peers.keys)),
                    now: MonotonicClock.milliseconds(), via: transport)
                logger.notice(
                    "reloaded the admitted keys",
                    metadata: ["peers": "\(keys.peers.count)", "clients": "\(keys.clientAccess.count)"])
            }
            if !refusalHandled, transport.refusedToRun != nil {
                // The node's own stop (observers flushed, waiters resumed) asks this loop to end.
                refusalHandled = true
                Task { await node.stop() }
            }
            node.process(
                .tick(observerBacklog: node.observers.backlog), now: MonotonicClock.milliseconds(), via: transport)
            let now = MonotonicClock.milliseconds()
            let deadline = node.nextDeadline()
            do {
                if transport.pollerChanged { poller = try transport.makePoller(wakeUp: wakeUp.fileDescriptor) }
                try poller.poll(timeoutMilliseconds: Int(min(deadline &- min(deadline, now), 1000)))
            } catch {
                logger.error(
                    "polling the node's sockets failed; stopping the node's I/O", metadata: ["error": "\(error)"])
                return
            }
            let ready = poller.readable
            if ready[0] { wakeUp.drain() }
            let sources = transport.polled
            // Each turn starts one source further than the last, so turns cut short by
            // ``turnBudget`` do not always leave the same sources unread.
            let first = sources.isEmpty ? 0 : turns % sources.count
            turns &+= 1
            let turnStarted = MonotonicClock.nanoseconds()
            var turnOver = false
            for step in sources.indices {
                let index = (first + step) % sources.count
                guard ready[index + 1] else { continue }
                // (Links changed while handling an earlier source: the next round re-polls.)
                if transport.pollerChanged || turnOver { break }
                let source = sources[index]
                if case .subscriber(let peer, _) = source { transport.heard(from: peer) }
                for _ in 0..<Self.batchLimit {
                    guard let (frames, userID) = transport.receive(from: source) else { break }
                    let input: NodeInput
                    switch source {
                    case .subscriber(let peer, _): input = .peerMessage(peer: peer, frames: frames)
                    case .router:
                        // [client routing id][header][body]; anything else is malformed. The
                        // routing id is taken off the received array (no new array built for
                        // the rest, unless the array is still shared).
                        var request = frames
                        let client = request.isEmpty ? [] : request.removeFirst()
                        input = .clientRequest(
                            client: client, frames: request.count == 2 ? request : [], identity: userID)
                    case .repairLink(let peer, _): input = .repairReply(peer: peer, frames: frames)
                    case .zap(let socket):
                        guard let refused = transport.authenticate(frames, on: socket) else { continue }
                        input = refused
                    case .monitor:
                        guard let event = MonitorEvent(frames: frames) else { continue }
                        if event.isOne(of: .handshakeSucceeded) {
                            // Only the publish socket reports these: a new subscriber.
                            input = .subscriberConnected
                        } else if event.isOne(of: .handshakeFailed) {
                            // A connection that failed its handshake before ZAP: no key to name.
                            input = .authenticationRefused(
                                fingerprint: NodeMachine.handshakeFailedKey, address: event.endpoint)
                        } else {
                            continue
                        }
                    }
                    node.process(input, now: MonotonicClock.milliseconds(), via: transport)
                    // A message can change the links (a member joined or left): its socket may
                    // be closed now, and the poll set is rebuilt before anything else is read.
                    if transport.pollerChanged { break }
                    if MonotonicClock.nanoseconds() &- turnStarted >= Self.turnBudget,
                        node.awaitsTick || MonotonicClock.milliseconds() >= node.nextDeadline()
                    {
                        turnOver = true
                        break
                    }
                }
            }
        }
    }
}

/// The node's sockets, owned by its I/O thread: what ``NodeTransport`` actions are performed on.
///
/// Not `Sendable`: it lives and dies on the I/O thread.
final class ZeroMQTransport: NodeTransport {
    /// A socket the loop reads.
    enum Source {
        case subscriber(peer: String, Socket)
        case router(Socket)
        case repairLink(peer: String, Socket)
        /// The ZAP handler (with security): libzmq's questions about connecting keys.
        case zap(Socket)
        /// A monitor of a server socket's connections: the publisher's new subscribers and, with
        /// security, failed handshakes of the publisher and the API.
        case monitor(Socket)

        var socket: Socket {
            switch self {
            case .subscriber(_, let socket), .router(let socket), .repairLink(_, let socket), .zap(let socket),
                .monitor(let socket):
                socket
            }
        }
    }

    let context: Context
    /// Replaced (closed and bound again) when a reload removes a peer key: libzmq cannot end
    /// one subscriber's connection, and a removed peer must stop receiving deltas.
    private(set) var publisher: Socket
    private(set) var subscribers: [(endpoint: String, socket: Socket)]
    let router: Socket
    let configuration: NodeConfiguration
    let logger: Logger
    /// Per peer, the DEALER to its repair endpoint and that endpoint.
    private var links: [String: (endpoint: String, socket: Socket)] = [:]
    private var intakePaused = false
    /// The sources in the order of the poll set after the wake-up pipe.
    private(set) var polled: [Source] = []
    /// The poll set must be rebuilt (a link changed, intake paused or resumed).
    private(set) var pollerChanged = false

    /// With security: the ZAP handler and the keys.
    let zap: Socket?
    private(set) var keys: NodeKeys?
    /// Which of each peer's trusted keys its links are dialled with.
    private var keyChoice: PeerKeyChoice
    /// Monitors of the server sockets: the publisher's first (always), then with security the
    /// API's.
    private var monitors: [Socket]
    /// Peer publish endpoints whose link delivered something since it was (re)connected.
    private var heardSinceConnect: Set<String> = []
    /// The node id expected at each peer publish endpoint: configured, or learned from the
    /// member list.
    private var peerNodes: [String: String]

    init(
        context: Context, publisher: Socket, subscribers: [(endpoint: String, socket: Socket)], router: Socket,
        zap: Socket?, keys: NodeKeys?, monitors: [Socket], configuration: NodeConfiguration, logger: Logger
    ) {
        self.zap = zap
        self.monitors = monitors
        self.keys = keys
        self.keyChoice = PeerKeyChoice(keys: keys?.peers ?? [:])
        self.peerNodes = configuration.peerNodeIDs
        self.configuration = configuration
        self.context = context
        self.publisher = publisher
        self.subscribers = subscribers
        self.router = router
        self.logger = logger
    }

    /// The poll set: the wake-up pipe, then (with security) the ZAP handler, then the monitors,
    /// then (unless intake is paused) every SUB socket, then the ROUTER, then (unless
    /// paused) every repair link.
    func makePoller(wakeUp: Int32) throws(ZeroMQError) -> ReadPoller {
        polled = []
        // ZAP first: a connecting peer or client waits for its answer.
        if let zap { polled.append(.zap(zap)) }
        polled += monitors.map { .monitor($0) }
        if !intakePaused { polled += subscribers.map { .subscriber(peer: $0.endpoint, $0.socket) } }
        polled.append(.router(router))
        if !intakePaused {
            polled += links.keys.sorted().map { .repairLink(peer: $0, links[$0]!.socket) }
        }
        pollerChanged = false
        return try ReadPoller([.fileDescriptor(wakeUp)] + polled.map { .socket($0.socket) })
    }

    /// The next message from `source`, and with security, for the client API, the user id its
    /// sender's ZAP admission gave it (who it is: what it may do).
    func receive(from source: Source) -> (frames: [[UInt8]], userID: String?)? {
        do {
            if case .router = source, keys != nil {
                return try source.socket.receive(dontWait: true, property: "User-Id").map { ($0.frames, $0.property) }
            }
            return try source.socket.receive(dontWait: true).map { ($0, nil) }
        } catch {
            logger.error("receive failed", metadata: ["socket": "\(source)", "error": "\(error)"])
            return nil
        }
    }

    func publish(_ frames: [[UInt8]]) {
        if let unbound = unboundPublishEndpoint {
            let now = MonotonicClock.milliseconds()
            if now &- unbound.triedAt >= 1000 { _ = bindReplacedPublisher(now: now) }
        }
        do {
            // PUB never blocks: past the high-water mark libzmq drops, and sequence numbers let
            // peers see the gap.
            _ = try publisher.send(frames, dontWait: true)
        } catch {
            logger.error("publish failed", metadata: ["error": "\(error)"])
        }
    }

    func connectRepairLink(peer: String, endpoint: String) {
        if let old = links.removeValue(forKey: peer) { old.socket.close() }
        pollerChanged = true
        do {
            let serverKey = peerNodes[peer].map { keyChoice.key(for: $0) }
            links[peer] = (
                endpoint,
                try SocketFactory.makeRepairLink(context: context, endpoint: endpoint, serverKey: serverKey, keys: keys)
            )
        } catch {
            logger.error("cannot open a repair link", metadata: ["peer.endpoint": "\(peer)", "error": "\(error)"])
        }
    }

    func sendRepairRequest(peer: String, frames: [[UInt8]]) -> Bool {
        guard let link = links[peer] else { return false }
        return (try? link.socket.send(frames, dontWait: true)) ?? false
    }

    func reply(client: [UInt8], frames: [[UInt8]]) -> ReplyOutcome {
        do {
            return try router.send([client] + frames, dontWait: true) ? .sent : .full
        } catch  where error.isHostUnreachable {
            return .gone  // the client left before its answer
        } catch {
            logger.error("sending a reply failed", metadata: ["error": "\(error)"])
            return .gone
        }
    }

    func sendWatchEvents(client: [UInt8], events: [[[UInt8]]]) -> (accepted: Int, clientGone: Bool) {
        for (index, frames) in events.enumerated() {
            switch reply(client: client, frames: frames) {
            case .sent: continue
            case .full: return (index, false)
            case .gone: return (index, true)
            }
        }
        return (events.count, false)
    }

    /// Answers one ZAP request: admits the keys of the configuration, refuses every other one.
    /// Returns the input that reports a refusal to the node (it counts and logs them).
    func authenticate(_ frames: [[UInt8]], on socket: Socket) -> NodeInput? {
        let reply: [[UInt8]]
        var refused: NodeInput?
        do {
            let request = try ZAP.Request(frames: frames)
            if let identity = keys?.identity(for: request) {
                reply = ZAP.reply(to: request, admit: true, userID: identity)
            } else {
                reply = ZAP.reply(to: request, admit: false, reason: "key not admitted")
                let fingerprint = request.curvePublicKey.map(CurveKeyFile.fingerprint) ?? request.mechanism
                refused = .authenticationRefused(fingerprint: fingerprint, address: request.address)
            }
        } catch {
            guard let answer = ZAP.replyToMalformed(frames) else { return nil }
            reply = answer
        }
        do {
            if try !socket.send(reply, dontWait: true) {
                logger.error("cannot answer a ZAP request now (its socket is busy); that handshake will time out")
            }
        } catch {
            logger.error("cannot answer a ZAP request", metadata: ["error": "\(error)"])
        }
        return refused
    }

    /// Notes that the link to the peer publishing at `endpoint` delivered a message.
    func heard(from endpoint: String) {
        if !heardSinceConnect.contains(endpoint) { heardSinceConnect.insert(endpoint) }
    }

    /// The node gave up on a silent peer link: make it again, and if it never delivered
    /// anything and the peer has several trusted keys (it is rotating), dial its next key.
    func resetPeerLink(_ endpoint: String) {
        if !heardSinceConnect.contains(endpoint), let node = peerNodes[endpoint],
            keyChoice.linkFailed(node: node)
        {
            logger.notice(
                "peer link silent since it was made; dialling the peer's next trusted key",
                metadata: ["peer": "\(node)", "key": "\(CurveKeyFile.fingerprint(keyChoice.key(for: node)))"])
        }
        remakeSubscriber(endpoint)
    }

    func connectPeer(endpoint: String, node: String) {
        guard !subscribers.contains(where: { $0.endpoint == endpoint }) else { return }
        peerNodes[endpoint] = node
        do {
            let subscriber = try SocketFactory.makeSubscriber(
                context: context, endpoint: endpoint, configuration: configuration, keys: keys,
                serverKey: keyChoice.key(for: node))
            subscribers.append((endpoint, subscriber))
            pollerChanged = true
        } catch {
            logger.error(
                "cannot subscribe to a member",
                metadata: ["member": "\(node)", "peer.endpoint": "\(endpoint)", "error": "\(error)"])
        }
    }

    /// The reason the node refused to run, once it did: the driver stops the node.
    private(set) var refusedToRun: String?

    func refuseToRun(_ reason: String) {
        if refusedToRun == nil { refusedToRun = reason }
    }

    func disconnectPeer(endpoint: String) {
        if let index = subscribers.firstIndex(where: { $0.endpoint == endpoint }) {
            subscribers[index].socket.close()
            subscribers.remove(at: index)
        }
        if let link = links.removeValue(forKey: endpoint) { link.socket.close() }
        heardSinceConnect.remove(endpoint)
        pollerChanged = true
    }

    private func remakeSubscriber(_ endpoint: String) {
        guard let index = subscribers.firstIndex(where: { $0.endpoint == endpoint }) else { return }
        heardSinceConnect.remove(endpoint)
        do {
            let fresh = try SocketFactory.makeSubscriber(
                context: context, endpoint: endpoint, configuration: configuration, keys: keys,
                serverKey: peerNodes[endpoint].map { keyChoice.key(for: $0) } ?? [])
            subscribers[index].socket.close()
            subscribers[index].socket = fresh
            pollerChanged = true
        } catch {
            logger.error("cannot replace a peer link", metadata: ["peer.endpoint": "\(endpoint)", "error": "\(error)"])
        }
    }

    /// Takes reloaded keys: links to a peer whose dialled key is no longer trusted are made
    /// again (with another of its keys, or none: then they cannot connect), and if a peer key
    /// was removed, the publish socket is bound afresh so that the removed key's open
    /// subscription ends; the peers that stay trusted reconnect within the reconnect interval
    /// and fetch what they missed meanwhile (a gap like any other).
    func replaceKeys(_ newKeys: NodeKeys) {
        let removedPeerKeys = (keys?.admitted ?? [:]).filter { key, identity in
            identity.hasPrefix("node:") && newKeys.admitted[key] != identity
        }
        keys = newKeys
        let redial = keyChoice.reload(newKeys.peers)
        for (endpoint, node) in peerNodes.sorted(by: { $0.key < $1.key }) where redial.contains(node) {
            remakeSubscriber(endpoint)
            if let link = links[endpoint] { connectRepairLink(peer: endpoint, endpoint: link.endpoint) }
        }
        if !removedPeerKeys.isEmpty {
            logger.notice(
                "a peer key was removed: binding the publish socket again to end its subscription",
                metadata: [
                    "keys": "\(removedPeerKeys.keys.map(CurveKeyFile.fingerprint).sorted().joined(separator: ","))"
                ])
            replacePublisher()
        }
    }

    /// The endpoint the publish socket could not be bound to again (after a replacement), and
    /// when that was last tried: ``publish(_:)`` tries again every second meanwhile.
    private var unboundPublishEndpoint: (endpoint: String, triedAt: UInt64)?

    /// Closes the publish socket and binds a new one on the same endpoint. libzmq releases the
    /// old listener on its own thread, so the bind is retried for up to a second, then once a
    /// second (nothing is lost meanwhile: deltas are durable, and peers fetch them once it is
    /// bound again).
    private func replacePublisher() {
        // Still unbound from an earlier replacement: its endpoint, not the unbound socket's ("").
        let bound = unboundPublishEndpoint?.endpoint ?? (try? publisher.lastEndpoint()) ?? ""
        let endpoint = bound.isEmpty ? configuration.publishEndpoint : bound
        let fresh: Socket
        do {
            fresh = try SocketFactory.makePublisher(context: context, configuration: configuration, keys: keys)
        } catch {
            logger.error("cannot make a new publish socket; keeping the old one", metadata: ["error": "\(error)"])
            return
        }
        // Watched before it is bound, as at the start. The old socket's monitor stops before its
        // reader closes: an event sent to no reader would stop libzmq's I/O thread for good (no
        // delta would leave, and the old socket would never release the port).
        do {
            let monitor = try SocketFactory.makePublisherMonitor(context: context, of: fresh, keyed: keys != nil)
            publisher.stopMonitoring()
            monitors[0].close()
            monitors[0] = monitor
        } catch {
            logger.error("cannot monitor the new publish socket", metadata: ["error": "\(error)"])
        }
        publisher.close()
        publisher = fresh
        unboundPublishEndpoint = (endpoint, 0)
        var attempts = 0
        while !bindReplacedPublisher(now: 0), attempts < 100 {
            attempts += 1
            usleep(10_000)
        }
        if let unbound = unboundPublishEndpoint {
            logger.critical(
                "cannot bind the publish socket again yet; peers receive no deltas until it is (retried every second)",
                metadata: ["endpoint": "\(unbound.endpoint)"])
        }
        pollerChanged = true
    }

    /// Binds a replaced publish socket; returns whether it is bound.
    private func bindReplacedPublisher(now: UInt64) -> Bool {
        guard let unbound = unboundPublishEndpoint else { return true }
        do {
            try SocketFactory.bindPublisher(publisher, unbound.endpoint)
            unboundPublishEndpoint = nil
            if now > 0 {
                logger.notice("bound the publish socket again", metadata: ["endpoint": "\(unbound.endpoint)"])
            }
            return true
        } catch {
            unboundPublishEndpoint = (unbound.endpoint, now)
            return false
        }
    }

    func pauseIntake(_ paused: Bool) {
        guard paused != intakePaused else { return }
        intakePaused = paused
        pollerChanged = true
    }

    /// Closes every socket and terminates the context (releasing the endpoints at once: a
    /// restart may bind them).
    func close() {
        // Monitors stop before their readers close (see `Socket.monitor`).
        publisher.stopMonitoring()
        router.stopMonitoring()
        for (_, link) in links { link.socket.close() }
        publisher.close()
        for (_, subscriber) in subscribers { subscriber.close() }
        // The last replies (a write's OK, the ERROR that ends each watch at a stop) get a moment
        // to leave: with linger 0 libzmq would drop what its I/O thread had not sent yet.
        try? router.setLinger(milliseconds: 200)
        router.close()
        zap?.close()
        for monitor in monitors { monitor.close() }
        context.terminate()
    }
}

/// Milliseconds of a monotonic clock (for liveness and timers, never for versions).
package enum MonotonicClock {
    package static func milliseconds() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return UInt64(spec.tv_sec) * 1000 + UInt64(spec.tv_nsec) / 1_000_000
    }

    /// The monotonic clock in nanoseconds (a turn's budget is under a millisecond).
    package static func nanoseconds() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
    }
}
