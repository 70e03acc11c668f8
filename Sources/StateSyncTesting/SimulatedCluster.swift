package import Logging
package import StateSync
import Synchronization

/// A whole cluster in one process and one thread: real ``StateSyncNode`` hosts (each a real
/// ``NodeMachine``) on a ``SimulatedNetwork``, each with a ``SimulatedDisk``, under one
/// ``ManualClock``. Nothing happens unless the cluster is run: time jumps from one due event to
/// the next (a message arrives, a node's timer is due, a client acts), so simulated hours cost
/// seconds and the same seed always gives the same run.
///
/// Nodes are `n1`…`nN`; their endpoints are `sim://nX/pub` and `sim://nX/api`. Peer traffic
/// (DELTA, HEARTBEAT, and repair requests and replies) travels on links with the conditions of
/// the peer network; clients are connected to one node at a time over reliable, in-order links
/// (a TCP connection), which a crash of the node breaks.
///
/// A SUB link's connection is modelled as libzmq makes it: the subscriber dials when it
/// subscribes (at its start, when it links a member, when it replaces a link), again each
/// reconnect interval while the link is cut, and again when the node it subscribes to comes
/// back after its process ended; each completed handshake is a monitor event on the publisher
/// (``NodeInput/subscriberConnected``). A connection made stays through a partition (a cut
/// drops packets; it resets no TCP connection); after a power loss of the publisher's host it
/// stays half-open (no FIN was sent) until the subscriber's node replaces the silent link.
/// A repair link (a DEALER to a peer's ROUTER) left half-open so loses the first request sent
/// on it once the peer's host is back (its kernel answers with a reset, and libzmq connects
/// again), and a reply reaches only the run of the requester that asked.
///
/// Not thread-safe: one thread runs a simulation.
package final class SimulatedCluster {
    /// What the cluster is made of.
    package struct Configuration: Sendable {
        package var nodes = 3
        package var seed: UInt64 = 1
        package var heartbeatMilliseconds = 100
        package var historyDeltas = 100_000
        package var compactBytes = 64 << 20
        package var clientHighWaterMark = 10_000
        package var batchMaximumDeltas = 256
        /// The pages snapshots are streamed in (small ones make every snapshot a stream).
        package var snapshotPageOctets = 4 << 20
        /// How many registers of a snapshot page are merged per step (small ones let deltas,
        /// requests and crashes come between a page's slices).
        package var snapshotMergeSliceRegisters = 4096
        /// How old a stable deletion must be before it is collected (simulated milliseconds).
        package var tombstoneGraceMilliseconds = 5000
        package var fsync: NodeConfiguration.FsyncPolicy = .always
        package var fsyncIntervalMilliseconds = 20
        /// With `fsync` always: publish own writes while their sync runs (`storage.publish:
        /// written`), acknowledging them once it ends.
        package var publishBeforeSync = false
        /// How long a sync of a node's log takes (simulated milliseconds). 0: at once, in the
        /// node's own step. Above 0, the node goes on while it runs — writes it takes meanwhile
        /// wait for the next one (group commit) — and a crash before it ends loses what it was
        /// syncing.
        package var diskSyncMilliseconds: UInt64 = 0
        /// The conditions of every peer link (until changed).
        package var peerLinks = SimulatedNetwork<Packet>.LinkConditions(delay: 1...3)
        /// The one-way delay between a client and its node.
        package var clientDelay: UInt64 = 1
        /// Faults planted in nodes (by index).
        package var faults: [Int: NodeFaults] = [:]
        /// Per node (by index), how far its wall clock is off, in milliseconds.
        package var clockSkew: [Int: Int64] = [:]
        /// Nodes (by index) that stand for nodes older than channel batches (PROTOCOL.md 7.6),
        /// and so than packed batches (7.7): they take and send neither.
        package var withoutChannelBatches: Set<Int> = []
        /// Nodes (by index) that stand for nodes with channel batches but older than packed
        /// batches (PROTOCOL.md 7.7).
        package var withoutPackedBatches: Set<Int> = []
        /// A node that restarts comes back as the other version: an older node as the newest,
        /// the newest as the oldest (a node older than packed batches as the newest, and back):
        /// a rolling upgrade, and downgrade, at the same endpoint.
        package var flipChannelBatchesOnRestart = false
        /// The last node is not started with the others and knows only the first node (its
        /// seed), and the others do not know it: it joins through membership when
        /// ``SimulatedCluster/join(_:)`` starts it (PROTOCOL.md 7.5).
        package var lateJoiner = false
        /// Nodes (by index) run under another node's id (the index given): a node added with a
        /// copied configuration whose `node.id` was left unchanged (PROTOCOL.md 7.5, "Two nodes
        /// under one id"). It keeps its own endpoints (`sim://nX/…`, X its index + 1); it has
        /// every other node as a peer, and they have it. It starts only when
        /// ``SimulatedCluster/join(_:)`` starts it. (The convergence checker knows nothing of
        /// it: a run with one makes no verdict.)
        package var copies: [Int: Int] = [:]
        /// A copy lists only the first node, and no node lists it: it joins through membership,
        /// and no peer links to it (a node links one endpoint per member id).
        package var copiesJoinThroughSeed = false
        /// Per node (by index), a heartbeat interval other than ``heartbeatMilliseconds``: a node
        /// configured with another `network.heartbeat_ms`.
        package var heartbeatOverrides: [Int: Int] = [:]
        /// Where nodes log (nothing, by default: a simulation makes many).
        package var logger = Logger(label: "statesync-sim", factory: { _ in SwiftLogNoOpLogHandler() })

        package init(nodes: Int = 3, seed: UInt64 = 1) {
            self.nodes = nodes
            self.seed = seed
        }
    }

    /// What travels between nodes and clients.
    package enum Packet: Sendable {
        /// A message from a node's PUB socket, on the connection of the receiver's SUB socket
        /// `socket` to the sender's run `generation`: gone with that connection.
        case peer(frames: [[UInt8]], socket: Int, generation: Int)
        /// A request to a node's ROUTER: from a client, or from a peer's repair link.
        case request(client: [UInt8], frames: [[UInt8]])
        /// A reply on a node's repair link, to the requester's run `generation` (a restarted
        /// requester has new links); `peer` is the answering node's publish endpoint.
        case repairReply(peer: String, frames: [[UInt8]], generation: Int)
        /// A reply or watch event to a client, from one incarnation of a node.
        case toClient(frames: [[UInt8]], generation: Int)
    }

    /// libzmq's reconnect interval, as the node's SUB sockets set it (`ZMQ_RECONNECT_IVL`).
    static let reconnectMilliseconds: UInt64 = 100

    /// One node of the cluster.
    package final class Node {
        package let index: Int
        /// `nX` (X its index + 1), in its endpoints: its node id, but for a copy
        /// (``Configuration/copies``), which runs under another's.
        package let id: String
        /// Its configuration (a restart may change what it takes: ``Configuration/flipChannelBatchesOnRestart``).
        package fileprivate(set) var configuration: NodeConfiguration
        package let disk = SimulatedDisk()
        /// The running node; `nil` while crashed.
        package fileprivate(set) var host: StateSyncNode?
        /// Counts restarts: a message or timer of an earlier run is ignored.
        package fileprivate(set) var generation = 0
        fileprivate var tickAt: UInt64?
        fileprivate var intakePaused = false
        fileprivate var held: [SimulatedNetwork<Packet>.Message] = []
        fileprivate var links: [String: RepairLink] = [:]
        /// The peers whose publish socket this node subscribes to (its SUB links), by node id:
        /// the configured ones at every start, then the members it learns.
        fileprivate var subscribedTo: [String: SubscriberLink] = [:]
        fileprivate let skew: Skew
        /// Set when a live model on this node wrote: the next instant feeds the write.
        fileprivate let woken = WakeFlag()

        init(index: Int, name: String, configuration: NodeConfiguration, skew: Int64) {
            self.index = index
            self.id = name
            self.configuration = configuration
            self.skew = Skew(skew)
        }

        package var isUp: Bool { host != nil }
        /// Why it refused to run, each time it did (it went down then), over all its runs.
        package fileprivate(set) var refusals: [String] = []
        /// Counter `name` of this node (``NodeCounters/all``) over all its runs: a restart's
        /// counters start at 0.
        package func counter(_ name: String) -> Int {
            (countersInEndedRuns[name] ?? 0) + (host?.status.counters[name] ?? 0)
        }
        fileprivate var countersInEndedRuns: [String: Int] = [:]
        /// Times this node dropped its state after a forget (its `resyncs`), over all its runs.
        package var resets: Int { counter("resyncs") }
        /// State digests it compared with its peers', and divergences it reported (PROTOCOL.md
        /// 11.4), over all its runs.
        package var digestComparisons: Int { counter("digest_comparisons") }
        package var stateDivergences: Int { counter("state_divergences") }
        /// How far this node's wall clock is off, in milliseconds.
        package var clockSkew: Int64 { skew.milliseconds }
    }

    /// One SUB link of a node: its socket (a replaced link is a new one), and the run
    /// (generation) of the publisher it is connected to once a handshake completed. A publisher
    /// sends nothing to a link that is not connected to its current run, as a PUB socket drops
    /// what no connected subscriber takes.
    struct SubscriberLink {
        let socket: Int
        var connectedTo: Int?
    }

    /// One repair link of a node: the node it is connected to, and whether the connection is
    /// half-open (that node's host lost power since: no FIN closed it).
    struct RepairLink {
        let target: Int
        var halfOpen = false
    }

    /// A node's driver in the simulation: a model's write raises the flag, the cluster feeds the
    /// write at its next instant (a wake-up costs no simulated time).
    final class WakeFlag: NodeDriver {
        private let raised = Atomic<Bool>(false)
        func wake() { raised.store(true, ordering: .releasing) }
        func take() -> Bool { raised.exchange(false, ordering: .acquiringAndReleasing) }
        /// Simulated nodes are crashed and restarted by the cluster, not stopped.
        func stop() async {}
    }

    /// How far a node's wall clock is off: read by its clock, moved by the clock fault.
    final class Skew: Sendable {
        private let value: Atomic<Int64>
        init(_ milliseconds: Int64) { value = Atomic(milliseconds) }
        var milliseconds: Int64 {
            get { value.load(ordering: .relaxed) }
            set { value.store(newValue, ordering: .relaxed) }
        }
    }

    /// A client of the cluster: it talks to one node at a time; its owner acts on what arrives.
    package final class Client {
        /// The ZeroMQ routing id it would have.
        package let routingID: [UInt8]
        package let name: String
        /// How many messages its queue holds before the node's sends to it fail (its
        /// `network.client_hwm`).
        package var capacity: Int
        /// Milliseconds it takes to process one message (0: at once). A slow client lags.
        package var processingDelay: UInt64 = 0
        /// The node it is connected to (index, generation), if any.
        package fileprivate(set) var connection: (node: Int, generation: Int)?
        fileprivate var queued = 0
        fileprivate var inbox: [[[UInt8]]] = []
        fileprivate var consuming = false

        package init(name: String, capacity: Int = 10_000) {
            self.name = name
            self.routingID = [0x53] + Array(name.utf8)
            self.capacity = capacity
        }

        /// Called with each message from its node (a reply or a watch event).
        package var onReceive: ([[UInt8]], SimulatedCluster) -> Void = { _, _ in }
        /// Called when its node crashed: the connection is gone, with whatever was on its way.
        package var onConnectionLost: (SimulatedCluster) -> Void = { _ in }
    }

    package let configuration: Configuration
    package let clock = ManualClock(start: 0)
    /// The wall clock of the simulation starts here (2027-01-15), plus each node's skew.
    package static let epoch: UInt64 = 1_800_000_000_000
    package private(set) var nodes: [Node] = []
    package let network: SimulatedNetwork<Packet>
    private let clientNetwork: SimulatedNetwork<Packet>
    private var timers = EventQueue<Timer>()
    private var clients: [[UInt8]: Client] = [:]
    private var random: SeededRandom
    private var touched: [Bool]
    /// A digest of everything that happened: every message delivered, with its time and bytes.
    package private(set) var trace = TraceDigest()
    /// How many inputs the nodes processed.
    package private(set) var steps = 0
    /// Messages of peers' live streams delivered to nodes (HEARTBEATs and DELTA messages).
    package private(set) var peerMessagesDelivered = 0
    /// Their frames' octets.
    package private(set) var peerBytesDelivered = 0
    /// Syncs of a slow disk that ended (``Configuration/diskSyncMilliseconds``).
    package private(set) var syncsEnded = 0
    /// Compactions a slow disk wrote later, as the daemon writes them in the background.
    package private(set) var compactionsEnded = 0
    /// Whether a crash finds a compaction under way with its snapshot written already.
    private var compactionCrashes: SeededRandom
    /// Where in its reconnect interval a subscriber is when the node it subscribes to restarts.
    private var reconnectPhases: SeededRandom
    /// The last SUB socket made (they are numbered across the cluster).
    private var socketsMade = 0

    private enum Timer {
        case tick(node: Int, generation: Int)
        /// A sync of the node's log ends: the first `octets` not synced when it began are
        /// durable now, the log through `position` (the node's count).
        case syncEnds(node: Int, generation: Int, position: UInt64, octets: Int, compactionsAtStart: Int)
        /// The compaction the node's slow disk took over is written.
        case compactionEnds(node: Int, generation: Int)
        case action((SimulatedCluster) -> Void)
        case consume(client: [UInt8])
        /// A SUB link's handshake completes (or, on a cut link, fails and is tried again): the
        /// ends' indices and generations when it was dialled.
        case handshake(subscriber: Int, generation: Int, socket: Int, publisher: Int, publisherGeneration: Int)
    }

    package init(_ configuration: Configuration) throws(StateSyncError) {
        self.configuration = configuration
        let root = SeededRandom(seed: configuration.seed)
        random = root.fork("cluster")
        compactionCrashes = root.fork("compaction-crash")
        reconnectPhases = root.fork("reconnect-phase")
        network = SimulatedNetwork(random: root.fork("network"), defaultConditions: configuration.peerLinks)
        clientNetwork = SimulatedNetwork(
            random: root.fork("client-network"), defaultConditions: .reliable(delay: configuration.clientDelay))
        touched = Array(repeating: false, count: configuration.nodes)
        // Nodes are named by their endpoints; a copy runs under another's node id.
        let ids = (1...configuration.nodes).map { "n\($0)" }
        let nodeIDs = ids.indices.map { ids[configuration.copies[$0] ?? $0] }
        let joiner = configuration.lateJoiner ? ids.last : nil
        for (index, id) in ids.enumerated() {
            // Each node's configured peers: all the others, but a late joiner knows only the
            // first node, and no one knows it.
            let hidden = Set(configuration.copiesJoinThroughSeed ? configuration.copies.keys.map { ids[$0] } : [])
            let known =
                id == joiner || hidden.contains(id)
                ? [ids[0]] : ids.filter { $0 != id && $0 != joiner && !hidden.contains($0) }
            var node = NodeConfiguration(
                nodeID: nodeIDs[index], dataDirectory: "sim://\(id)", publishEndpoint: Self.publishEndpoint(id),
                peers: known.map(Self.publishEndpoint), apiEndpoint: Self.apiEndpoint(id),
                heartbeatIntervalMilliseconds: configuration.heartbeatOverrides[index]
                    ?? configuration.heartbeatMilliseconds,
                fsync: configuration.fsync,
                fsyncIntervalMilliseconds: configuration.fsyncIntervalMilliseconds,
                compactBytes: configuration.compactBytes, historyDeltas: configuration.historyDeltas)
            node.publishBeforeSync = configuration.publishBeforeSync
            node.clientHighWaterMark = configuration.clientHighWaterMark
            node.batchMaximumDeltas = configuration.batchMaximumDeltas
            node.channelBatches = !configuration.withoutChannelBatches.contains(index)
            node.packedBatches = node.channelBatches && !configuration.withoutPackedBatches.contains(index)
            node.snapshotPageOctets = configuration.snapshotPageOctets
            node.snapshotMergeSliceRegisters = configuration.snapshotMergeSliceRegisters
            node.tombstoneGraceMilliseconds = configuration.tombstoneGraceMilliseconds
            // Links are authenticated as with CURVE keys: each peer's live stream is bound to its
            // node id (PROTOCOL.md 14). The machine reads no key; the simulated network is the
            // authentication, and only the forge fault sends in another node's name.
            node.peerNodeIDs = Dictionary(
                uniqueKeysWithValues: known.map { (Self.publishEndpoint($0), nodeIDs[ids.firstIndex(of: $0)!]) })
            // Clients are admitted as entry 0, which may read and write every channel.
            node.security = SecurityConfiguration(
                secretKeyFile: "sim://\(id)/key", peerKeys: [:], clients: [.init(key: "sim")])
            nodes.append(Node(index: index, name: id, configuration: node, skew: configuration.clockSkew[index] ?? 0))
        }
        for node in nodes where node.id != joiner && configuration.copies[node.index] == nil { try start(node) }
    }

    /// Gives node `index`, never started, what node `source` holds durably now (a copy made with
    /// its data directory: ``Configuration/copies``).
    package func copyDisk(of source: Int, to index: Int) {
        guard nodes[index].generation == 0, nodes[index].host == nil else { return }
        nodes[index].disk.copyDurableState(of: nodes[source].disk)
    }

    /// Starts a node that was never started (a late joiner, ``Configuration/lateJoiner``, or a
    /// copy, ``Configuration/copies``).
    package func join(_ index: Int) throws(StateSyncError) {
        let node = nodes[index]
        guard node.host == nil, node.generation == 0 else { return }
        record("join", node.id, [])
        try start(node)
    }

    package static func publishEndpoint(_ id: String) -> String { "sim://\(id)/pub" }
    package static func apiEndpoint(_ id: String) -> String { "sim://\(id)/api" }
    /// The node named in a simulated endpoint (`sim://nX/pub`): its node id, but for a copy
    /// (``Configuration/copies``).
    static func nodeID(ofEndpoint endpoint: String) -> String? {
        guard endpoint.hasPrefix("sim://"), let slash = endpoint.dropFirst(6).firstIndex(of: "/") else { return nil }
        return String(endpoint[endpoint.index(endpoint.startIndex, offsetBy: 6)..<slash])
    }

    // MARK: - Running

    /// The current simulated time, in milliseconds.
    package var now: UInt64 { clock.now }

    /// Runs until `time` (milliseconds), or until `stop` says so after an instant; returns
    /// whether `stop` did.
    @discardableResult
    package func run(until time: UInt64, stoppingWhen stop: (SimulatedCluster) -> Bool = { _ in false }) -> Bool {
        feedModelWrites()
        while let next = nextTime(), next <= time {
            clock.advance(to: next)
            runInstant()
            if stop(self) { return true }
            feedModelWrites()
        }
        clock.advance(to: max(clock.now, time))
        return stop(self)
    }

    /// Runs for `milliseconds` more.
    @discardableResult
    package func run(for milliseconds: UInt64, stoppingWhen stop: (SimulatedCluster) -> Bool = { _ in false }) -> Bool {
        run(until: now + milliseconds, stoppingWhen: stop)
    }

    /// Nodes whose live models wrote (from the test's code, or an observer) get a round now.
    private func feedModelWrites() {
        var any = false
        for node in nodes where node.woken.take() {
            touched[node.index] = true
            any = true
        }
        if any { runInstant() }
    }

    private func nextTime() -> UInt64? {
        [network.nextDueTime, clientNetwork.nextDueTime, timers.nextTime].compactMap { $0 }.min()
    }

    /// Everything due now: messages, then timers; then every node that got input ticks once
    /// (the end of its round).
    private func runInstant() {
        let time = clock.now
        var progressed = true
        while progressed {
            progressed = false
            for message in network.deliverDue(at: time) + clientNetwork.deliverDue(at: time) {
                progressed = true
                deliver(message)
            }
            while let due = timers.nextTime, due <= time, let (_, timer) = timers.pop() {
                progressed = true
                fire(timer)
            }
        }
        for index in touched.indices where touched[index] {
            touched[index] = false
            tick(nodes[index])
        }
    }

    private func fire(_ timer: Timer) {
        switch timer {
        case .tick(let index, let generation):
            let node = nodes[index]
            guard node.generation == generation, node.tickAt == now else { return }
            node.tickAt = nil
            tick(node)
        case .syncEnds(let index, let generation, let position, let octets, let compactionsAtStart):
            let node = nodes[index]
            guard node.generation == generation, node.host != nil else { return }
            node.disk.sync(prefix: octets, compactionsAtStart: compactionsAtStart)
            syncsEnded += 1
            record("synced", node.id, [])
            process(.logDurable(through: position), at: node)
        case .compactionEnds(let index, let generation):
            let node = nodes[index]
            guard node.generation == generation, node.host != nil, finishCompaction(of: node) else { return }
            process(.compactionWritten, at: node)
        case .action(let action):
            action(self)
        case .handshake(let subscriberIndex, let generation, let socket, let publisherIndex, let publisherGeneration):
            let (subscriber, publisher) = (nodes[subscriberIndex], nodes[publisherIndex])
            guard subscriber.generation == generation, subscriber.isUp,
                subscriber.subscribedTo[publisher.id]?.socket == socket, publisher.generation == publisherGeneration,
                publisher.isUp
            else { return }  // that socket is gone (a restarted publisher is dialled from its start)
            if network.isCut(from: subscriber.id, to: publisher.id)
                || network.isCut(from: publisher.id, to: subscriber.id)
            {
                timers.schedule(timer, at: now + Self.reconnectMilliseconds)
                return
            }
            subscriber.subscribedTo[publisher.id]?.connectedTo = publisherGeneration
            // (A real node reads its monitor while its intake is paused too.)
            record("subscribed", subscriber.id + ">" + publisher.id, [])
            process(.subscriberConnected, at: publisher)
        case .consume(let routingID):
            guard let client = clients[routingID] else { return }
            consumeOne(client)
        }
    }

    /// Runs `action` at `time` (not earlier than now).
    /// The wall clock of node `index` now (milliseconds since 1970), its skew included.
    package func wallMilliseconds(of index: Int) -> UInt64 {
        UInt64(max(0, Int64(Self.epoch &+ now) &+ nodes[index].clockSkew))
    }

    package func schedule(at time: UInt64, _ action: @escaping (SimulatedCluster) -> Void) {
        timers.schedule(.action(action), at: max(time, now))
    }

    // MARK: - Nodes

    private func start(_ node: Node) throws(StateSyncError) {
        let clock = self.clock
        let skew = node.skew
        let wallClock: @Sendable () -> UInt64 = {
            UInt64(max(0, Int64(Self.epoch &+ clock.now) &+ skew.milliseconds))
        }
        let host = try StateSyncNode(
            configuration: node.configuration, storage: node.disk,
            clock: HybridLogicalClock(
                node: node.configuration.nodeID,
                maximumDriftMilliseconds: UInt64(node.configuration.maximumClockDriftMilliseconds),
                wallClock: wallClock),
            monotonicNow: { clock.now }, incarnation: random.next() | 1, observers: InlineObserverExecutor(),
            faults: configuration.faults[node.index] ?? NodeFaults(), logger: configuration.logger)
        host.attach(driver: node.woken)
        node.host = host
        node.links = [:]
        node.subscribedTo = [:]
        for peer in Set(node.configuration.peers.compactMap(Self.nodeID(ofEndpoint:))).sorted() {
            subscribe(node, to: peer)
        }
        // Its subscribers that saw their connections close dial again at the end of their
        // reconnect interval (a half-open one waits for its node to replace the link).
        for subscriber in nodes where subscriber.index != node.index && subscriber.isUp {
            guard let link = subscriber.subscribedTo[node.id], link.connectedTo == nil else { continue }
            dial(from: subscriber, to: node.id, after: 1 + reconnectPhases.next() % Self.reconnectMilliseconds)
        }
        node.intakePaused = false
        node.held = []
        process(
            .endpointsBound(publish: Self.publishEndpoint(node.id), repair: Self.apiEndpoint(node.id)), at: node)
        // Its clients are admitted with one key that may read and write everything (the ZAP
        // user id a real node would give them).
        process(
            .clientAccessChanged(
                ["client:sim": .init(key: "sim")],
                peers: Set(nodes.map(\.configuration.nodeID)).subtracting([node.configuration.nodeID])),
            at: node)
        touched[node.index] = true
        // Its first tick (heartbeat, repair round) comes at once, whatever else happens.
        node.tickAt = now
        timers.schedule(.tick(node: node.index, generation: node.generation), at: now)
    }

    /// Feeds `input` to `node` (if it is up) and marks it for a tick at the end of the instant.
    private func process(_ input: NodeInput, at node: Node) {
        guard let host = node.host else { return }
        steps += 1
        host.process(input, now: now, via: Transport(cluster: self, node: node))
        touched[node.index] = true
    }

    /// `subscriber` makes a new SUB socket to node `id` (replacing any it had) and dials.
    private func subscribe(_ subscriber: Node, to id: String) {
        socketsMade += 1
        subscriber.subscribedTo[id] = SubscriberLink(socket: socketsMade)
        dial(from: subscriber, to: id)
    }

    /// `subscriber`'s SUB socket to node `id` dials (`after` milliseconds from now): its
    /// handshake completes after a round trip of the link, or is tried again each reconnect
    /// interval while the link is cut. A node that is down is dialled again from its start.
    private func dial(from subscriber: Node, to id: String, after delay: UInt64 = 0) {
        guard let socket = subscriber.subscribedTo[id]?.socket, let publisher = node(named: id) else { return }
        let roundTrip =
            network.conditions(from: subscriber.id, to: id).delay.upperBound
            + network.conditions(from: id, to: subscriber.id).delay.upperBound
        timers.schedule(
            .handshake(
                subscriber: subscriber.index, generation: subscriber.generation, socket: socket,
                publisher: publisher.index, publisherGeneration: publisher.generation),
            at: now + delay + roundTrip)
    }

    private func tick(_ node: Node) {
        guard let host = node.host else { return }
        steps += 1
        host.process(.tick(observerBacklog: 0), now: now, via: Transport(cluster: self, node: node))
        let deadline = max(host.nextDeadline(), now + 1)
        if node.tickAt.map({ deadline < $0 }) ?? true {
            node.tickAt = deadline
            timers.schedule(.tick(node: node.index, generation: node.generation), at: deadline)
        }
    }

    /// Crashes node `index`: its process is gone (what it had not synced is lost, but for a torn
    /// part of it when `tornBytes` > 0), its clients are disconnected. `powerLoss`: its OS went
    /// down too (it restarts in a new boot).
    /// `compactionWroteSnapshot`: whether a compaction under way had its snapshot renamed into
    /// place already (nil: drawn from the seed).
    package func crash(_ index: Int, tornBytes: Int = 0, powerLoss: Bool = false, compactionWroteSnapshot: Bool? = nil)
    {
        let node = nodes[index]
        guard let host = node.host else { return }
        let counters = host.status.counters
        node.countersInEndedRuns.merge(counters, uniquingKeysWith: +)
        node.host = nil
        node.generation += 1
        node.tickAt = nil
        node.disk.crash(
            keepingTorn: tornBytes, powerLoss: powerLoss,
            compactionWroteSnapshot: node.disk.isCompacting
                && (compactionWroteSnapshot ?? compactionCrashes.chance(0.5)))
        record("crash", node.id, [])
        // Its subscribers' connections: closed when its process ends (its kernel sends a FIN,
        // retransmitted until a cut heals): they dial again, and connect once it is back. After
        // a power loss of its host none is sent: the connections stay half-open, and a
        // subscriber hears nothing of its new run until its node replaces the silent link.
        if !powerLoss {
            for subscriber in nodes where subscriber.index != index && subscriber.subscribedTo[node.id] != nil {
                subscriber.subscribedTo[node.id]?.connectedTo = nil
            }
        } else {
            // So are the repair links to it (a DEALER whose connection saw a FIN dials again).
            for requester in nodes where requester.index != index {
                for (peer, link) in requester.links where link.target == index {
                    requester.links[peer]?.halfOpen = true
                }
            }
        }
        for routingID in clients.keys.sorted(by: { $0.lexicographicallyPrecedes($1) }) {
            guard let client = clients[routingID], client.connection?.node == index else { continue }
            disconnect(client)
            client.onConnectionLost(self)
        }
    }

    /// Stops node `index` cleanly, as SIGTERM stops `statesyncd`: it publishes what it has,
    /// says it leaves (PROTOCOL.md 7.5), writes its snapshot (compacting its log, as the daemon's
    /// last step does) and goes down with everything on its disk.
    package func stopCleanly(_ index: Int) {
        let node = nodes[index]
        guard let host = node.host else { return }
        record("stop", node.id, [])
        process(.stop, at: node)
        host.finishStop()
        crash(index, tornBytes: node.disk.unsyncedBytes)
    }

    /// Changes node `index`'s configuration from its next start (``restart(_:)``): one node
    /// unlike the others, as an operator may run it.
    package func reconfigure(_ index: Int, _ change: (inout NodeConfiguration) -> Void) {
        change(&nodes[index].configuration)
    }

    /// Restarts node `index` on its disk (recovering from its snapshot and log).
    package func restart(_ index: Int) throws(StateSyncError) {
        let node = nodes[index]
        guard node.host == nil else { return }
        record("restart", node.id, [])
        if configuration.flipChannelBatchesOnRestart {
            if configuration.withoutPackedBatches.contains(index) {
                node.configuration.packedBatches.toggle()
            } else {
                node.configuration.channelBatches.toggle()
                node.configuration.packedBatches = node.configuration.channelBatches
            }
        }
        // A restarted node has new sockets: its inbound links work again.
        brokenLinks = brokenLinks.filter { !$0.hasSuffix(">" + node.id) }
        try start(node)
    }

    /// Inbound peer links broken for good ("from>to"), as libzmq leaves a connection after a
    /// frame over its maximum message size: they drop everything until the receiving node
    /// replaces the link (``NodeAction/resetPeerLink(endpoint:)``) or restarts. Healing the
    /// network does not mend them.
    package fileprivate(set) var brokenLinks: Set<String> = []

    /// Delivers to node `to`, now, a HEARTBEAT in node `of`'s name that announces
    /// `latestSequence` (with `of`'s endpoints and no progress list): a peer announcing what it
    /// does not have.
    package func forgeHeartbeat(of: Int, to: Int, latestSequence: UInt64) {
        let forger = nodes[of]
        guard let node = node(named: nodes[to].id) else { return }
        let frames = PeerMessage.heartbeat(
            PeerMessage.Heartbeat(
                node: forger.id, latestSequence: latestSequence, clock: 0, incarnation: 1,
                api: Self.apiEndpoint(forger.id))
        ).encode()
        record("forged", forger.id + ">" + node.id, frames)
        process(.peerMessage(peer: Self.publishEndpoint(forger.id), frames: frames), at: node)
    }

    /// Delivers to node `to`, now, on node `from`'s live link, a DELTA in node `origin`'s name: a
    /// write of `model`'s `property` with a version an hour ahead (it would win everywhere) and a
    /// sequence number far above any `origin` used. A node bound to its peers' identities drops
    /// it.
    package func forgeDelta(from: Int, to: Int, origin: Int, channel: String, model: String, property: String) {
        guard let node = node(named: nodes[to].id) else { return }
        let delta = Delta(
            channel: channel, model: model,
            version: Version(milliseconds: Self.epoch + now + 3_600_000, counter: 0, node: nodes[origin].id),
            sequence: 1 << 40, properties: [PropertyWrite(name: property, value: .string("forged"))])
        let frames = PeerMessage.delta(delta).encode()
        record("forged", nodes[from].id + ">" + node.id, frames)
        process(.peerMessage(peer: Self.publishEndpoint(nodes[from].id), frames: frames), at: node)
    }

    /// Breaks the peer link from node `from` to node `to` for good (see ``brokenLinks``).
    package func breakLink(from: Int, to: Int) {
        brokenLinks.insert(nodes[from].id + ">" + nodes[to].id)
    }

    /// Moves node `index`'s wall clock: its skew becomes `skew` milliseconds.
    package func setClockSkew(_ index: Int, _ skew: Int64) {
        nodes[index].skew.milliseconds = skew
    }

    /// Cuts (or heals) every peer link between the nodes of `group` and the others, both ways.
    package func partition(_ group: Set<Int>, cut: Bool) {
        for a in nodes.indices where group.contains(a) {
            for b in nodes.indices where !group.contains(b) {
                network.setCut(cut, from: nodes[a].id, to: nodes[b].id)
                network.setCut(cut, from: nodes[b].id, to: nodes[a].id)
            }
        }
    }

    // MARK: - Clients

    /// Connects `client` to node `index` (replacing an earlier connection). `false` when the node
    /// is down.
    @discardableResult
    package func connect(_ client: Client, to index: Int) -> Bool {
        guard nodes[index].isUp else { return false }
        disconnect(client)
        clients[client.routingID] = client
        client.connection = (index, nodes[index].generation)
        return true
    }

    /// Closes `client`'s connection; what was on its way to it is dropped.
    package func disconnect(_ client: Client) {
        client.connection = nil
        client.queued = 0
        client.inbox = []
    }

    /// Sends a request from `client` to the node it is connected to.
    package func send(_ frames: [[UInt8]], from client: Client) {
        guard let connection = client.connection else { return }
        clientNetwork.send(
            .request(client: client.routingID, frames: frames), from: client.name, to: nodes[connection.node].id,
            at: now)
    }

    private func consumeOne(_ client: Client) {
        guard !client.inbox.isEmpty else {
            client.consuming = false
            return
        }
        let frames = client.inbox.removeFirst()
        client.queued = max(0, client.queued - 1)
        client.onReceive(frames, self)
        if client.inbox.isEmpty {
            client.consuming = false
        } else {
            timers.schedule(.consume(client: client.routingID), at: now + client.processingDelay)
        }
    }

    // MARK: - Delivery

    private func deliver(_ message: SimulatedNetwork<Packet>.Message) {
        switch message.payload {
        case .peer(let frames, let socket, let generation):
            // Only on the connection it was sent on: a receiver that restarted or replaced its
            // link since has another socket, a sender that restarted another run.
            guard let node = node(named: message.to), !brokenLinks.contains(message.from + ">" + message.to),
                let link = node.subscribedTo[message.from], link.socket == socket, link.connectedTo == generation
            else { return }
            if node.intakePaused {
                node.held.append(message)
                return
            }
            record("peer", message.from + ">" + message.to, frames)
            peerMessagesDelivered += 1
            for frame in frames { peerBytesDelivered += frame.count }
            process(.peerMessage(peer: Self.publishEndpoint(message.from), frames: frames), at: node)
        case .request(let client, let frames):
            guard let node = node(named: message.to) else { return }
            record("request", message.from + ">" + message.to, frames)
            // Who the sender authenticated as (the user id ZAP would give it): a peer's repair
            // link is its node, a client is `client:sim`.
            let identity =
                Self.repairRequester(client).map {
                    "node:" + (self.node(named: $0.node)?.configuration.nodeID ?? $0.node)
                }
                ?? "client:sim"
            process(.clientRequest(client: client, frames: frames, identity: identity), at: node)
        case .repairReply(let peer, let frames, let generation):
            guard let node = node(named: message.to), node.generation == generation else { return }
            if node.intakePaused {
                node.held.append(message)
                return
            }
            record("repair-reply", message.from + ">" + message.to, frames)
            process(.repairReply(peer: peer, frames: frames), at: node)
        case .toClient(let frames, let generation):
            guard let client = clients[Array([0x53] + message.to.utf8)],
                let connection = client.connection, nodes[connection.node].id == message.from,
                connection.generation == generation
            else { return }  // the connection it was sent on is gone
            record("to-client", message.from + ">" + message.to, frames)
            client.inbox.append(frames)
            if !client.consuming {
                client.consuming = true
                if client.processingDelay == 0 {
                    while client.consuming { consumeOne(client) }
                } else {
                    timers.schedule(.consume(client: client.routingID), at: now + client.processingDelay)
                }
            }
        }
    }

    /// The node and run of a repair link's routing id (`link:<node>@<generation>`), `nil` for a
    /// client's.
    static func repairRequester(_ routingID: [UInt8]) -> (node: String, generation: Int)? {
        let prefix = Array("link:".utf8)
        guard routingID.starts(with: prefix) else { return nil }
        let text = String(decoding: routingID.dropFirst(prefix.count), as: UTF8.self)
        guard let at = text.lastIndex(of: "@"), let generation = Int(text[text.index(after: at)...]) else {
            return nil
        }
        return (String(text[..<at]), generation)
    }

    private func node(named id: String) -> Node? {
        guard let node = nodes.first(where: { $0.id == id }), node.isUp else { return nil }
        return node
    }

    /// Writes the compaction `node`'s slow disk took over, if one is under way; returns whether
    /// there was one (its outcome is the caller's to feed).
    private func finishCompaction(of node: Node) -> Bool {
        guard node.disk.finishCompaction() else { return false }
        compactionsEnded += 1
        record("compacted", node.id, [])
        return true
    }

    /// Adds an event to the trace digest.
    package func record(_ kind: String, _ detail: String, _ frames: [[UInt8]]) {
        trace.add(now)
        trace.add(kind)
        trace.add(detail)
        for frame in frames { trace.add(frame) }
    }

    // MARK: - The transport a node's actions go through

    private struct Transport: NodeTransport {
        let cluster: SimulatedCluster
        let node: Node

        func syncLater(through position: UInt64) -> Bool {
            let duration = cluster.configuration.diskSyncMilliseconds
            guard duration > 0 else { return false }
            // The records through `position` are on the disk already (the host hands them over
            // before any sync): this sync covers what is unsynced now, not what comes after.
            cluster.timers.schedule(
                .syncEnds(
                    node: node.index, generation: node.generation, position: position,
                    octets: node.disk.unsyncedBytes, compactionsAtStart: node.disk.compactionsFinished),
                at: cluster.now + duration)
            return true
        }

        func finishCompactionsNow() -> Int {
            cluster.finishCompaction(of: node) ? 1 : 0
        }

        func compactLater(_ snapshot: StateSnapshot, keeping records: [UInt8]) -> Bool {
            let duration = cluster.configuration.diskSyncMilliseconds
            guard duration > 0 else { return false }
            // A snapshot takes longer to write than a sync: several syncs end while it runs.
            node.disk.startCompaction(snapshot, keeping: records)
            cluster.timers.schedule(
                .compactionEnds(node: node.index, generation: node.generation), at: cluster.now + 8 * duration)
            return true
        }

        func publish(_ frames: [[UInt8]]) {
            // Only to links connected to this run (a PUB socket drops what no connected
            // subscriber takes: a restarted node's first messages reach no one until its
            // subscribers have dialled it again).
            for peer in cluster.nodes where peer.index != node.index {
                guard let link = peer.subscribedTo[node.id], link.connectedTo == node.generation else { continue }
                cluster.network.send(
                    .peer(frames: frames, socket: link.socket, generation: node.generation), from: node.id, to: peer.id,
                    at: cluster.now)
            }
        }

        func connectRepairLink(peer: String, endpoint: String) {
            guard let target = cluster.nodes.firstIndex(where: { SimulatedCluster.apiEndpoint($0.id) == endpoint })
            else { return }
            node.links[peer] = RepairLink(target: target)
        }

        func sendRepairRequest(peer: String, frames: [[UInt8]]) -> Bool {
            guard let link = node.links[peer] else { return false }
            let target = cluster.nodes[link.target]
            if link.halfOpen {
                // Into a connection whose other end is gone: lost. A host that is back answers
                // with a reset, and the link connects again; one still down answers nothing.
                cluster.record("repair-half-open", node.id + ">" + target.id, frames)
                if target.isUp { node.links[peer]?.halfOpen = false }
                return true
            }
            cluster.network.send(
                .request(client: Array("link:\(node.id)@\(node.generation)".utf8), frames: frames), from: node.id,
                to: target.id, at: cluster.now)
            return true
        }

        func reply(client: [UInt8], frames: [[UInt8]]) -> ReplyOutcome {
            if let requester = SimulatedCluster.repairRequester(client) {
                cluster.network.send(
                    .repairReply(
                        peer: SimulatedCluster.publishEndpoint(node.id), frames: frames,
                        generation: requester.generation),
                    from: node.id, to: requester.node, at: cluster.now)
                return .sent
            }
            guard let target = cluster.clients[client], let connection = target.connection,
                connection.node == node.index, connection.generation == node.generation
            else { return .gone }
            guard target.queued < target.capacity else { return .full }
            target.queued += 1
            cluster.clientNetwork.send(
                .toClient(frames: frames, generation: node.generation), from: node.id, to: target.name,
                at: cluster.now)
            return .sent
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

        /// A new link: one broken for good works again (see ``SimulatedCluster/brokenLinks``).
        func resetPeerLink(_ endpoint: String) {
            guard let peer = cluster.nodes.first(where: { SimulatedCluster.publishEndpoint($0.id) == endpoint }) else {
                return
            }
            cluster.record("link-reset", peer.id + ">" + node.id, [])
            cluster.brokenLinks.remove(peer.id + ">" + node.id)
            // A new SUB socket: a new connection, whose handshake the peer's monitor reports.
            if node.subscribedTo[peer.id] != nil { cluster.subscribe(node, to: peer.id) }
        }

        /// A link the node has already is kept (as the real driver keeps it). The node is the one
        /// at `endpoint` (a copy runs under another's id).
        func connectPeer(endpoint: String, node nodeID: String) {
            let id = SimulatedCluster.nodeID(ofEndpoint: endpoint) ?? nodeID
            cluster.record("subscribe", node.id + "<" + id, [])
            guard node.subscribedTo[id] == nil else { return }
            cluster.subscribe(node, to: id)
        }

        /// A node that refuses to run goes down at once (the verdict then names it).
        func refuseToRun(_ reason: String) {
            cluster.record("refused", node.id, [])
            node.refusals.append(reason)
            let index = node.index
            cluster.schedule(at: cluster.now) { cluster in cluster.crash(index) }
        }

        func disconnectPeer(endpoint: String) {
            guard let id = SimulatedCluster.nodeID(ofEndpoint: endpoint) else { return }
            cluster.record("unsubscribe", node.id + "<" + id, [])
            node.subscribedTo[id] = nil
            node.links[endpoint] = nil
        }

        func pauseIntake(_ paused: Bool) {
            node.intakePaused = paused
            guard !paused else { return }
            let held = node.held
            node.held = []
            for message in held { cluster.deliver(message) }
        }
    }
}

/// FNV-1a 64 over a run's events, fed straight from their buffers (it sees every byte of every
/// message, so it must be cheap).
package struct TraceDigest: Sendable {
    package private(set) var hash: UInt64 = 0xcbf2_9ce4_8422_2325

    mutating func add(_ bytes: [UInt8]) {
        var hash = self.hash
        bytes.withUnsafeBufferPointer { buffer in
            for byte in buffer {
                hash ^= UInt64(byte)
                hash &*= 0x100_0000_01b3
            }
        }
        hash ^= 0xff  // a separator: ["ab"] and ["a", "b"] differ
        hash &*= 0x100_0000_01b3
        self.hash = hash
    }

    mutating func add(_ text: String) {
        var text = text
        text.withUTF8 { buffer in
            var hash = self.hash
            for byte in buffer {
                hash ^= UInt64(byte)
                hash &*= 0x100_0000_01b3
            }
            self.hash = hash
        }
        add([])
    }

    mutating func add(_ value: UInt64) {
        var hash = self.hash
        for shift in stride(from: 0, to: 64, by: 8) {
            hash ^= (value >> UInt64(shift)) & 0xff
            hash &*= 0x100_0000_01b3
        }
        self.hash = hash
    }
}
