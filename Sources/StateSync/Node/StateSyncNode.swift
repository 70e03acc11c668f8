import Foundation
public import Logging
public import ServiceLifecycle
import Synchronization

/// A StateSync node: hosts replicated models, publishes every local write as a delta over
/// ZeroMQ PUB/SUB, applies its peers' deltas, and (with `network.api` set) serves clients.
///
/// The daemon `statesyncd` is a node; an app can embed one the same way:
/// ```swift
/// let node = try await StateSyncNode.start(configFile: "Config/node1.yaml")
/// let counter = try await node.model(Counter.self, channel: "counters", id: "room-1")
/// counter.count += 1          // replicated to every peer
/// await node.stop()
/// ```
///
/// Thread safety: all methods may be called from any thread or task. The node owns one I/O
/// thread, which applies remote changes; their observers run on the node's observer queue, in
/// apply order, so a slow observer never holds up replication (see ``ObserverExecutor``).
public final class StateSyncNode: Sendable {
    /// The configuration the node runs with.
    public let configuration: NodeConfiguration
    /// A random number chosen at every start, so peers and clients can tell restarts apart.
    public let incarnation: UInt64
    let clock: HybridLogicalClock
    let core: Mutex<NodeCore>
    let outbox = Mutex(Outbox())
    let logger: Logger
    let limiter = LogLimiter()
    let dataDirectory: DataDirectory
    /// The write-ahead log; used only by the I/O thread once the node has started.
    let log: DeltaLog
    /// Test-only fault injection, from `STATESYNC_TEST_DROP_REMOTE_DELTAS` (0 = off).
    let plantedDropShare: Double
    private let loop: NodeEventLoop
    /// Runs the observers of changes the I/O thread applies (see ``ObserverExecutor``).
    let observerExecutor: ObserverExecutor
    private let lifecycle = Mutex<Lifecycle>(.running(waiters: []))

    private enum Lifecycle: Sendable {
        case running(waiters: [CheckedContinuation<Void, Never>])
        case stopping(waiters: [CheckedContinuation<Void, Never>])
        case stopped
    }

    /// Starts a node from a YAML configuration file (see the README's configuration table).
    public static func start(configFile: String, logger: Logger? = nil) async throws -> StateSyncNode {
        let configuration = try NodeConfiguration.load(file: configFile)
        return try await start(configuration: configuration, logger: logger)
    }

    /// Starts a node: takes its data directory, loads its last snapshot, binds its sockets and
    /// connects to its peers. Returns once it is bound and ready.
    ///
    /// - Throws: ``StateSyncError`` when the data directory is unusable or in use, or an endpoint
    ///   cannot be bound (the message names which).
    public static func start(configuration: NodeConfiguration, logger: Logger? = nil) async throws -> StateSyncNode {
        var logger = logger ?? Logger(label: "statesync")
        logger[metadataKey: "node.id"] = .string(configuration.nodeID)
        let directory = try DataDirectory(path: configuration.dataDirectory)
        var core = NodeCore()
        core.historyLimit = configuration.historyDeltas
        var latestSequence: UInt64 = 0
        if let snapshot = directory.loadSnapshot(onCorrupt: { logger.error("\($0)") }) {
            core.store = snapshot.store
            latestSequence = snapshot.latestSequence
            for (origin, through) in snapshot.progress { core.coverWithoutHistory(origin: origin, through: through) }
            logger.info(
                "loaded snapshot",
                metadata: ["models": "\(snapshot.store.allModels.count)", "sequence": "\(latestSequence)"])
        }
        // Replay the write-ahead log: every delta applied since the snapshot, own and remote.
        let log = try directory.openLog()
        let recovery = try log.recover()
        var ownLatest = core.store.allModels.flatMap { $0.1.values.map(\.version) }.filter {
            $0.node == configuration.nodeID
        }.max()
        for delta in recovery.deltas where core.record(delta) {
            _ = core.store.apply(delta)
            if delta.origin == configuration.nodeID {
                latestSequence = max(latestSequence, delta.sequence)
                ownLatest = max(ownLatest ?? delta.version, delta.version)
            }
        }
        core.counters = NodeCounters()
        core.counters.logBytesCut = recovery.cutBytes
        if recovery.cutBytes > 0 {
            logger.warning(
                "cut a torn or corrupt tail from the log (a crash interrupted a write); it was never acknowledged",
                metadata: ["log.bytes_cut": "\(recovery.cutBytes)", "reason": "\(recovery.cutReason ?? "-")"])
        }
        if !recovery.deltas.isEmpty {
            logger.info("replayed the log", metadata: ["deltas": "\(recovery.deltas.count)"])
        }
        let node = StateSyncNode(
            configuration: configuration, directory: directory, log: log, core: core, logger: logger)
        // Never reuse a sequence number or issue a version below what this node already wrote.
        node.outbox.withLock { $0.nextSequence = latestSequence + 1 }
        if let ownLatest { node.clock.advance(past: ownLatest) }
        // Peers' versions it holds are followed as if just received (within the drift bound), so a
        // restart with a lagging wall clock does not stamp writes that lose at once.
        node.clock.observe(core.store.latestVersion)
        if node.plantedDropShare > 0 {
            logger.critical(
                "TEST FAULT INJECTION: silently dropping a share of remote deltas without repair",
                metadata: ["share": "\(node.plantedDropShare)"])
        }
        try await node.loop.start()
        logger.info(
            "node started",
            metadata: [
                "publish": "\(node.loop.boundPublishEndpoint)", "api": "\(node.loop.boundAPIEndpoint ?? "-")",
                "repair": "\(node.loop.boundRepairEndpoint)", "peers": "\(configuration.peers.joined(separator: ","))",
            ])
        return node
    }

    private init(
        configuration: NodeConfiguration, directory: DataDirectory, log: DeltaLog, core: NodeCore, logger: Logger
    ) {
        self.log = log
        let share = ProcessInfo.processInfo.environment["STATESYNC_TEST_DROP_REMOTE_DELTAS"].flatMap(Double.init) ?? 0
        self.plantedDropShare = min(max(share, 0), 1)
        self.configuration = configuration
        self.incarnation = UInt64.random(in: 1...UInt64.max)
        // Test-only: `STATESYNC_TEST_CLOCK_OFFSET_MS` skews this node's wall clock (the harness's
        // clock fault).
        let offset = ProcessInfo.processInfo.environment["STATESYNC_TEST_CLOCK_OFFSET_MS"].flatMap(Int64.init) ?? 0
        self.clock = HybridLogicalClock(
            node: configuration.nodeID, maximumDriftMilliseconds: UInt64(configuration.maximumClockDriftMilliseconds),
            wallClock: { UInt64(max(0, Int64(HybridLogicalClock.systemMilliseconds()) + offset)) })
        var core = core
        for peer in configuration.peers { core.peers[peer] = NodeCore.PeerProgress() }
        self.core = Mutex(core)
        self.logger = logger
        self.dataDirectory = directory
        self.loop = NodeEventLoop(configuration: configuration, logger: logger)
        self.observerExecutor = ObserverExecutor(label: "statesync-observers.\(configuration.nodeID)")
        loop.node = self
    }

    /// The endpoint the PUB socket is bound to (a `*` port resolved).
    public var publishEndpoint: String { loop.boundPublishEndpoint }
    /// The endpoint the client API is bound to (a `*` port resolved), if any.
    public var apiEndpoint: String? { loop.boundAPIEndpoint }
    /// Where peers send this node repair requests (a `*` port resolved): the client API, or
    /// without one the repair endpoint (``NodeConfiguration/repairServiceEndpoint``).
    public var repairEndpoint: String { loop.boundRepairEndpoint }

    // MARK: - Models

    /// The model of type `M` at `channel`/`id`, attached to this node.
    ///
    /// While an instance for this address is alive, the same instance is returned. A new
    /// instance adopts the state the node holds for the address (no reset to initial values and
    /// no delta from them); from then on its writes replicate and remote writes fire its
    /// observers.
    ///
    /// - Throws: ``StateSyncError`` when a name is invalid, the node is stopped, or a live
    ///   instance of another type holds the address.
    public func model<M: ReplicatedModel>(_ type: M.Type, channel: String, id: String) async throws -> M {
        try Names.validateChannel(channel)
        try Names.validateModel(id)
        guard isRunning else { throw StateSyncError(.stopped, "node \(configuration.nodeID) is stopped") }
        let address = ModelAddress(channel: channel, model: id)
        let fresh = M()
        let emitter = fresh._$registrar.instanceID
        let binding = ModelBinding(
            address: address, clock: clock,
            emit: { [weak self] address, version, writes in self?.enqueueLocalWrite(address, version, writes, emitter)
            },
            reportEncodingFailure: { [weak self] property, error in
                self?.reportEncodingFailure(address, property, error)
            })
        return try core.withLock { core throws(StateSyncError) -> M in
            if let existing = core.liveInstance(at: address) {
                guard let typed = existing as? M else {
                    throw StateSyncError(
                        .modelTypeMismatch,
                        "\(address) is already held by a live \(Swift.type(of: existing)), not \(M.self)")
                }
                return typed
            }
            fresh._$registrar.attach(fresh, adopting: core.store.properties(of: address), binding: binding)
            core.instances[address] = InstanceReference(fresh)
            return fresh
        }
    }

    // MARK: - Untyped access (what the client API and embedding apps without models use)

    /// The properties of a model as this node holds them.
    public func properties(of address: ModelAddress) -> [String: ReplicaStore.Register] {
        core.withLock { $0.store.properties(of: address) }
    }

    /// The node's status.
    public var status: NodeStatus {
        let now = monotonicMilliseconds()
        let staleAfter = UInt64(3 * configuration.heartbeatIntervalMilliseconds)
        let sequence = outbox.withLock { $0.latestSequence }
        let watchers = loop.watcherCount
        let lagging = loop.laggingWatchCount
        let published = loop.latestPublished
        var status = core.withLock { core in
            NodeStatus(
                node: configuration.nodeID, incarnation: incarnation, publishEndpoint: loop.boundPublishEndpoint,
                apiEndpoint: loop.boundAPIEndpoint,
                peers: configuration.peers.map { endpoint in
                    let progress = core.peers[endpoint] ?? NodeCore.PeerProgress()
                    let ago = progress.lastMessageAt.map { Int(now &- $0) }
                    return NodeStatus.Peer(
                        endpoint: endpoint, node: progress.node,
                        connected: progress.lastMessageAt.map { now &- $0 <= staleAfter } ?? false,
                        lastSeenMillisecondsAgo: ago, deltasReceived: progress.deltasReceived)
                },
                channels: core.store.channelModelCounts,
                latestVersion: core.store.latestVersion == .zero ? nil : core.store.latestVersion,
                latestSequence: sequence, stateDigest: core.store.digest,
                counters: Dictionary(uniqueKeysWithValues: core.counters.all), watchers: watchers,
                missingDeltas: core.missingDeltas, laggingWatches: lagging)
        }
        status.publishedSequence = published
        return status
    }

    // MARK: - Lifecycle

    var isRunning: Bool {
        lifecycle.withLock { if case .running = $0 { true } else { false } }
    }

    /// Stops the node: stops taking writes, publishes what is queued, closes its sockets within a
    /// bounded linger, writes its snapshot and releases its data directory. Idempotent; returns
    /// when the node is stopped.
    public func stop() async {
        enum Step { case doStop, wait, done }
        let step = lifecycle.withLock { state -> Step in
            switch state {
            case .running(let waiters):
                state = .stopping(waiters: waiters)
                return .doStop
            case .stopping: return .wait
            case .stopped: return .done
            }
        }
        switch step {
        case .done: return
        case .wait:
            await waitUntilStopped()
            return
        case .doStop: break
        }
        // Stop taking writes first: detached models stay local, so nothing is queued after the
        // I/O thread's last flush.
        let instances = core.withLock { core in core.instances.values.compactMap(\.model) }
        for instance in instances { instance._$registrar.detach() }
        await loop.stop()
        // Every change applied before the stop reaches its observers before stop() returns.
        await observerExecutor.flush()
        do {
            // Everything in the log is in the snapshot: write it durably, then empty the log.
            try compact()
            logger.info("node stopped; snapshot written")
        } catch {
            logger.error("node stopped but the snapshot could not be written; the log keeps every write: \(error)")
        }
        dataDirectory.unlock()
        let waiters = lifecycle.withLock { state -> [CheckedContinuation<Void, Never>] in
            defer { state = .stopped }
            switch state {
            case .running(let w), .stopping(let w): return w
            case .stopped: return []
            }
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns when the node has stopped.
    public func waitUntilStopped() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let resumeNow = lifecycle.withLock { state -> Bool in
                switch state {
                case .running(var w):
                    w.append(continuation)
                    state = .running(waiters: w)
                    return false
                case .stopping(var w):
                    w.append(continuation)
                    state = .stopping(waiters: w)
                    return false
                case .stopped: return true
                }
            }
            if resumeNow { continuation.resume() }
        }
    }

    /// Writes the whole state as the snapshot (durably), then empties the log. Called by the I/O
    /// thread when the log grows past `storage.compact_bytes`, and at stop.
    func compact() throws(StateSyncError) {
        try log.sync()
        let snapshot = core.withLock { core in
            // Own deltas are recorded when the I/O thread takes them, in the same turn as it logs
            // them: the recorded ones are exactly the logged ones.
            DataDirectory.Snapshot(
                store: core.store, latestSequence: core.origins[configuration.nodeID]?.contiguous ?? 0,
                progress: core.origins.mapValues(\.contiguous))
        }
        try dataDirectory.writeSnapshot(snapshot)
        try log.reset()
    }

    // MARK: - Local writes from models

    /// Called by an attached model, under its lock, for every local write.
    private func enqueueLocalWrite(
        _ address: ModelAddress, _ version: Version, _ writes: [PropertyWrite], _ emitter: UInt64
    ) {
        outbox.withLock { $0.enqueue(address: address, version: version, writes: writes, emitter: emitter) }
        loop.wake()
    }

    private func reportEncodingFailure(_ address: ModelAddress, _ property: String, _ error: any Error) {
        core.withLock { $0.counters.encodingFailures += 1 }
        logger.error(
            "a local write could not be encoded and was not replicated",
            metadata: ["model": "\(address)", "property": "\(property)", "error": "\(error)"])
    }
}

extension StateSyncNode: Service {
    /// Runs until graceful shutdown (SIGTERM/SIGINT in a `ServiceGroup`), then stops the node.
    public func run() async throws {
        await withGracefulShutdownHandler {
            await waitUntilStopped()
        } onGracefulShutdown: {
            Task { await self.stop() }
        }
    }
}

/// Milliseconds of a monotonic clock (for liveness, never for versions).
func monotonicMilliseconds() -> UInt64 {
    var spec = timespec()
    clock_gettime(CLOCK_MONOTONIC, &spec)
    return UInt64(spec.tv_sec) * 1000 + UInt64(spec.tv_nsec) / 1_000_000
}

/// Rate-limits logs of bad input: at most one line per kind per second, with the count of the
/// ones it suppressed.
final class LogLimiter: Sendable {
    private let state = Mutex<[String: (last: UInt64, suppressed: Int)]>([:])

    /// Returns the number of suppressed messages to report when `kind` may be logged now.
    func allow(_ kind: String) -> Int? {
        let now = monotonicMilliseconds()
        return state.withLock { table in
            var entry = table[kind] ?? (0, 0)
            if entry.last != 0 && now &- entry.last < 1000 {
                entry.suppressed += 1
                table[kind] = entry
                return nil
            }
            let suppressed = entry.suppressed
            table[kind] = (now, 0)
            return suppressed
        }
    }
}
