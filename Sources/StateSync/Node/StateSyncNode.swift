package import Logging
public import ServiceLifecycle
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A StateSync node: hosts replicated models, publishes every local write as a delta, applies
/// its peers' deltas, and (with `network.api` set) serves clients.
///
/// The daemon `statesyncd` is a node; an app embeds one the same way, over ZeroMQ with
/// `StateSyncZeroMQ`:
/// ```swift
/// import StateSync
/// import StateSyncZeroMQ
///
/// let node = try await StateSyncNode.start(configFile: "Config/node1.yaml")
/// let counter = try await node.model(Counter.self, channel: "counters", id: "room-1")
/// counter.count += 1          // replicated to every peer
/// await node.stop()
/// ```
///
/// The node is a host around a ``NodeMachine`` — every protocol decision — and it does what the
/// machine asks with what it was given: a driver's transport (ZeroMQ sockets on an I/O thread,
/// or the simulator's network), a ``NodeStorage`` (the data directory, or a simulated disk) and
/// an ``ObserverExecutor`` (a serial queue, or inline). It applies remote changes to the live
/// models it hosts and collects their local writes.
///
/// Locks, written down once. A model's lock (its ``ModelRegistrar``) may be held while taking
/// the outbox lock of the node's ``LocalWriteQueue`` (a model hands over its write), then, after
/// it, the queue's driver lock (the wake-up), and the node's state lock (a model's value that
/// cannot be encoded is counted). The state lock is never held
/// while calling into a model — deliveries are resolved under it and applied after it is
/// released — except that ``model(_:channel:id:)`` attaches a new model under it, whose lock no
/// one else can hold yet (it is not shared), and reads the lifecycle under it (the lifecycle's
/// lock is never held while taking another). The outbox and state locks are never nested.
///
/// Thread safety: all methods may be called from any thread or task. Remote changes are applied
/// by the driver's thread; their observers run on the observer executor, in apply order, so a
/// slow observer never holds up replication.
public final class StateSyncNode: Sendable {
    /// The configuration the node runs with.
    public let configuration: NodeConfiguration
    /// A random number chosen at every start, so peers and clients can tell restarts apart.
    public let incarnation: UInt64
    let clock: HybridLogicalClock
    let logger: Logger
    let storage: any NodeStorage
    package let observers: any ObserverExecutor
    /// Milliseconds of a monotonic clock: the driver's time.
    let monotonicNow: @Sendable () -> UInt64
    private let state: Mutex<HostState>
    /// The local writes of live models waiting for the driver (``LocalWriteQueue``), held
    /// strongly by the models attached to this node too.
    let localWrites: LocalWriteQueue
    /// 64 rounds: 262,144 writes, about half a second of work for the I/O thread here, some
    /// 40 MB of single-property writes queued (more for larger ones). Without a bound a thread writing in a tight loop queued millions
    /// (a 3-second single-set benchmark writer peaked at 437 MB resident).
    package static let defaultQueuedRoundsLimit = 64
    /// When the data directory's free space was last measured (monotonic milliseconds).
    private let lastSpaceCheck = Atomic<UInt64>(0)
    /// How often the free space is measured.
    static let spaceCheckInterval: UInt64 = 200
    private let driver = Mutex<(any NodeDriver)?>(nil)
    private let lifecycle = Mutex<Lifecycle>(.running(waiters: []))
    private let refusalReason = Mutex<String?>(nil)
    /// The latency histograms, and the times of own writes' log appends not yet durable and
    /// published (touched by the driver's thread only; the lock is never contended).
    let metrics: NodeMetrics
    private let writeTimes = Mutex(WriteTimes())
    /// Log records the machine appended that are not handed to storage yet (touched by the
    /// driver's thread only; the lock is never contended). The records of a whole round of inputs
    /// — the client requests and peer messages the driver drained at once — reach the file in one
    /// write instead of one each; they are handed over before any action that makes something
    /// visible outside the node (a reply, a DELTA, a watch event, a sync…) and at every tick, so
    /// nothing is seen before the operating system has it.
    private let pendingLog = Mutex(PendingLog())
    /// The outcomes of background compactions (``BackgroundCompactingStorage``), fed to the
    /// machine before the driver's next input; `compactionsDone` counts them, read without the
    /// lock on every input.
    private let finishedCompactions = Mutex<[NodeInput]>([])
    private let compactionsDone = Atomic<Int>(0)
    /// The driver fed ``NodeInput/stop``: compactions are written at once from then on, so that
    /// the machine hears their outcome before the driver's last round (a reset's, which its
    /// LEAVE waits for, in particular).
    private let stopFed = Atomic<Bool>(false)

    /// Why the node stopped on its own, if it did: it started with an empty data directory
    /// under an id whose earlier deltas the cluster holds, or that was forgotten (docs/PROTOCOL.md
    /// 7.5). `nil` while it runs, and after an ordinary stop.
    public var refusal: StateSyncError? {
        refusalReason.withLock { $0 }.map { StateSyncError(.dataDirectory, $0) }
    }

    /// The machine and the live models, behind one lock: a delivery is resolved to instances in
    /// the same critical section as the change, so a model attached meanwhile either adopted the
    /// change or gets it, never both and never neither.
    struct HostState: Sendable {
        var machine: NodeMachine
        var instances: [ModelAddress: InstanceReference] = [:]
    }

    private enum Lifecycle: Sendable {
        case running(waiters: [CheckedContinuation<Void, Never>])
        case stopping(waiters: [CheckedContinuation<Void, Never>])
        case stopped
    }

    /// A node that recovers its state from `storage` (snapshot, then the log replayed over it).
    /// It does nothing until a driver feeds it inputs (``process(_:now:via:)``).
    ///
    /// - Parameters:
    ///   - clock: the node's hybrid logical clock; its wall clock is the node's notion of time
    ///     for versions (the simulator's, or the system's).
    ///   - monotonicNow: milliseconds of a monotonic clock, for liveness and timers.
    ///   - incarnation: random and non-zero, new at every start.
    package init(
        configuration: NodeConfiguration, storage: any NodeStorage, clock: HybridLogicalClock,
        monotonicNow: @escaping @Sendable () -> UInt64, incarnation: UInt64, observers: any ObserverExecutor,
        faults: NodeFaults = NodeFaults(), metrics: NodeMetrics = NodeMetrics(), logger: Logger
    ) throws(StateSyncError) {
        var logger = logger
        logger[metadataKey: "node.id"] = .string(configuration.nodeID)
        let recovery = try storage.recover(onCorruptSnapshot: { logger.error("\($0)") })
        if let snapshot = recovery.snapshot {
            logger.info(
                "loaded snapshot",
                metadata: ["models": "\(snapshot.store.allModels.count)", "sequence": "\(snapshot.latestSequence)"])
        }
        if !recovery.deltas.isEmpty {
            logger.info("replayed the log", metadata: ["deltas": "\(recovery.deltas.count)"])
        }
        self.configuration = configuration
        self.incarnation = incarnation
        self.clock = clock
        self.logger = logger
        self.storage = storage
        self.observers = observers
        self.monotonicNow = monotonicNow
        self.metrics = metrics
        self.localWrites = LocalWriteQueue(clock: clock)
        var machine = NodeMachine(
            configuration: configuration, clock: clock, incarnation: incarnation, recovery: recovery,
            faults: faults, logger: logger)
        machine.latencySamples.enabled = metrics.isRecording
        state = Mutex(HostState(machine: machine))
    }

    /// The driver that feeds the node, once attached.
    package var attachedDriver: (any NodeDriver)? { driver.withLock { $0 } }

    /// Hands the node the driver that feeds it (and that ``stop()`` stops).
    package func attach(driver: any NodeDriver) {
        self.driver.withLock { $0 = driver }
        localWrites.attach(driver: driver)
    }

    deinit {
        // Models may outlive the node: their writes go nowhere from now on.
        localWrites.close()
    }

    /// The endpoint the PUB socket is bound to (a `*` port resolved).
    public var publishEndpoint: String { state.withLock { $0.machine.boundPublish } }
    /// The endpoint the client API is bound to (a `*` port resolved), if any.
    public var apiEndpoint: String? {
        configuration.apiEndpoint == nil ? nil : state.withLock { $0.machine.boundRepair }
    }
    /// Where peers send this node repair requests (a `*` port resolved): the client API, or
    /// without one the repair endpoint (``NodeConfiguration/repairServiceEndpoint``).
    public var repairEndpoint: String { state.withLock { $0.machine.boundRepair } }

    // MARK: - Driving

    /// Feeds the machine `input` (after the local writes models made meanwhile), then performs
    /// what it asks — storage here, sockets through `transport`, model deliveries on the live
    /// models — feeding the outcomes back until nothing follows. The driver calls this from its
    /// one thread.
    package func process(_ input: NodeInput, now: UInt64, via transport: some NodeTransport) {
        if case .stop = input {
            stopFed.store(true, ordering: .relaxed)
            for outcome in finishCompactionsUnderWay(via: transport) { handle(outcome, now: now, via: transport) }
        }
        if compactionsDone.load(ordering: .acquiring) > 0 {
            for outcome in takeFinishedCompactions() { handle(outcome, now: now, via: transport) }
        }
        // Every write stamped so far is in these rounds, still in flight, or above the floor.
        let (rounds, writeFloor) = localWrites.take()
        state.withLock { $0.machine.hostWriteFloor = writeFloor }
        // Writers can outrun the node by far: their writes go in as rounds of bounded size; a
        // full round is logged, synced and published (its outcomes handled) before the next.
        // Arrays stay small, and peers get the first writes of a long queue while the rest is
        // logged.
        for round in rounds { handle(.localRound(round), now: now, via: transport) }
        handle(input, now: now, via: transport)
        switch input {
        case .tick, .stop: flushLog()
        default: break
        }
        // Measured once what was taken is with the storage: the writes counted against the
        // free space since the last measurement are in it now.
        if case .tick = input, now &- lastSpaceCheck.load(ordering: .relaxed) >= Self.spaceCheckInterval {
            lastSpaceCheck.store(now, ordering: .relaxed)
            if let available = storage.availableBytes() {
                handle(.diskSpace(availableBytes: available), now: now, via: transport)
            }
        }
    }

    /// The outcomes of background compactions that ended, in order.
    private func takeFinishedCompactions() -> [NodeInput] {
        finishedCompactions.withLock { finished in
            defer { finished = [] }
            compactionsDone.store(0, ordering: .relaxed)
            return finished
        }
    }

    /// Waits for the compactions under way (the storage's, or those the transport took over)
    /// and returns their outcomes, in order.
    private func finishCompactionsUnderWay(via transport: some NodeTransport) -> [NodeInput] {
        (storage as? any BackgroundCompactingStorage)?.waitForCompactions()
        return takeFinishedCompactions()
            + Array(repeating: NodeInput.compactionWritten, count: transport.finishCompactionsNow())
    }

    /// Feeds the machine `input`, performs its actions, and feeds their outcomes back until
    /// nothing follows.
    private func handle(_ input: NodeInput, now: UInt64, via transport: some NodeTransport) {
        var inputs = [input]
        var next = 0
        while next < inputs.count {
            let (actions, deliveries, samples) = state.withLock { state in
                let actions = state.machine.handle(inputs[next], now: now)
                var samples: LatencySamples?
                if !state.machine.latencySamples.isEmpty {
                    samples = state.machine.latencySamples
                    state.machine.latencySamples = LatencySamples(enabled: true)
                }
                return (actions, Self.resolve(actions, in: &state), samples)
            }
            let durableThrough: UInt64?
            if case .logDurable(let position) = inputs[next] { durableThrough = position } else { durableThrough = nil }
            next += 1
            var delivered = 0
            for action in actions {
                if case .deliver = action {
                    // In the machine's order (for local writes after their log append; remote
                    // deltas reach live models first, see PROTOCOL.md 11.2).
                    for delivery in deliveries[delivered] { deliver(delivery) }
                    delivered += 1
                } else if case .compact(_, _, atOnce: true) = action {
                    // A reset's compaction: after those under way, whose outcomes go first.
                    inputs += finishCompactionsUnderWay(via: transport)
                    if let outcome = perform(action, via: transport) { inputs.append(outcome) }
                } else if let outcome = perform(action, via: transport) {
                    inputs.append(outcome)
                }
            }
            if metrics.isRecording, let durableThrough { recordPublished(through: durableThrough) }
            if let samples { record(samples) }
        }
    }

    /// Records write → durable, and with `storage.fsync: always` write → published, for the own
    /// writes the log is now durable through (their DELTA messages were just handed to the
    /// transport). With `interval` or `storage.publish: written` a write is published as it is
    /// appended, not at the sync.
    private func recordPublished(through position: UInt64) {
        let now = ContinuousClock.now
        let publishedAtSync = !configuration.publishesBeforeSync
        let done = writeTimes.withLock { $0.takeDurable(through: position) }
        for (appendedAt, durableAt) in done {
            metrics.writeDurable.record(appendedAt.duration(to: durableAt))
            if publishedAtSync { metrics.writePublished.record(appendedAt.duration(to: now)) }
        }
    }

    private func record(_ samples: LatencySamples) {
        for milliseconds in samples.remoteApplyMilliseconds {
            metrics.remoteApplyLag.recordMilliseconds(milliseconds)
        }
        for milliseconds in samples.watchMilliseconds { metrics.watchLag.recordMilliseconds(milliseconds) }
    }

    /// Whether something waits for the next tick (own writes to publish or sync, replies, watch
    /// events): a driver in a long turn ends it early then.
    package var awaitsTick: Bool {
        state.withLock { $0.machine.awaitsTick }
    }

    /// The latest time (monotonic milliseconds) the driver should call ``process(_:now:via:)``
    /// with a tick.
    package func nextDeadline() -> UInt64 {
        state.withLock { $0.machine.nextDeadline() }
    }

    /// Hands the log records appended since the last call to storage, in one write.
    private func flushLog() {
        guard let (bytes, mustSucceed) = pendingLog.withLock({ $0.take() }) else { return }
        do {
            try storage.append(bytes)
        } catch {
            // A peer's deltas can be sent again; the node's own writes must not be
            // acknowledged or published unless logged.
            guard mustSucceed else {
                logger.critical("cannot append to the log", metadata: ["error": "\(error)"])
                return
            }
            fatalError(
                "statesyncd: cannot append to the write-ahead log (\(error)); stopping before acknowledging writes")
        }
    }

    /// Performs one action; returns the input that reports its outcome, if the machine needs it.
    private func perform(_ action: NodeAction, via transport: some NodeTransport) -> NodeInput? {
        switch action {
        case .appendLog, .deliver: break
        default: flushLog()
        }
        switch action {
        case .publish(let frames):
            transport.publish(frames)
        case .appendLog(let bytes, let mustSucceed):
            if metrics.isRecording { writeTimes.withLock { $0.appended(bytes.count, ownWrites: mustSucceed) } }
            if pendingLog.withLock({ $0.add(bytes, mustSucceed: mustSucceed) }) >= PendingLog.flushBytes { flushLog() }
        case .syncLog(let position, let atOnce):
            if !atOnce, transport.syncLater(through: position) { return nil }
            let started = metrics.isRecording ? ContinuousClock.now : nil
            defer {
                if let started {
                    let done = ContinuousClock.now
                    metrics.fsync.record(started.duration(to: done))
                    writeTimes.withLock { $0.synced(through: position, at: done) }
                }
            }
            do {
                try storage.sync()
            } catch {
                // After a failed fsync the kernel may have dropped the dirty pages: retrying can
                // "succeed" without the data on disk. Stop rather than acknowledge lost writes;
                // a restart recovers from what the log really holds — and settles first, as
                // after a power loss: deltas published before their sync may be among them.
                storage.markReservationUnsafe()
                fatalError(
                    "statesyncd: cannot make the write-ahead log durable (\(error)); stopping before acknowledging writes"
                )
            }
            return .logDurable(through: position)
        case .reserveSequences(let through, let void):
            do {
                try storage.reserveSequences(through: through, void: void)
            } catch {
                // Publishing beyond a reservation that is not durable could make a restart after
                // a power loss reuse a published number: stop as a failed sync does.
                fatalError(
                    "statesyncd: cannot record the sequence reservation (\(error)); stopping before publishing writes")
            }
            return .sequencesReserved(through: through)
        case .logDamageSettled:
            storage.logDamageSettled()
        case .saveMembers(let bytes):
            do {
                try storage.saveMembers(bytes)
            } catch {
                logger.error(
                    "cannot save the member list; after a restart it is relearned from peers, and deletions are not collected until it is",
                    metadata: ["error": "\(error)"])
            }
        case .compact(let snapshot, let records, let atOnce):
            // Off this thread where the storage can: deltas and requests go on meanwhile.
            if !atOnce, !stopFed.load(ordering: .relaxed) {
                if let storage = storage as? any BackgroundCompactingStorage {
                    storage.compactInBackground(snapshot, keeping: records) { [weak self] failure in
                        guard let self else { return }
                        finishedCompactions.withLock {
                            $0.append(failure.map { .compactionFailed("\($0)") } ?? .compactionWritten)
                            compactionsDone.add(1, ordering: .relaxed)
                        }
                        attachedDriver?.wake()
                    }
                    return nil
                }
                if transport.compactLater(snapshot, keeping: records) { return nil }
            }
            do {
                try storage.compact(snapshot, keeping: records)
            } catch {
                return .compactionFailed("\(error)")
            }
            return .compactionWritten
        case .deliver:
            break  // resolved under the lock, applied in order by `process`
        case .connectRepairLink(let peer, let endpoint):
            transport.connectRepairLink(peer: peer, endpoint: endpoint)
        case .sendRepairRequest(let peer, let requestID, let frames):
            if !transport.sendRepairRequest(peer: peer, frames: frames) {
                return .repairRequestUnsent(peer: peer, requestID: requestID)
            }
        case .reply(let client, let frames):
            if transport.reply(client: client, frames: frames) == .full { return .replyDropped }
        case .sendWatchEvents(let key, let events):
            let (accepted, gone) = transport.sendWatchEvents(client: key.client, events: events)
            return .watchEventsSent(key, accepted: accepted, clientGone: gone)
        case .pauseIntake(let paused):
            transport.pauseIntake(paused)
        case .resetPeerLink(let endpoint):
            transport.resetPeerLink(endpoint)
        case .connectPeer(let endpoint, let node):
            transport.connectPeer(endpoint: endpoint, node: node)
        case .disconnectPeer(let endpoint):
            transport.disconnectPeer(endpoint: endpoint)
        case .refuseToRun(let reason):
            refusalReason.withLock { $0 = $0 ?? reason }
            transport.refuseToRun(reason)
        }
        return nil
    }

    // MARK: - Models

    /// One delivery resolved to its live instance.
    private struct ResolvedDelivery {
        let instance: any ReplicatedModel
        let delivery: ModelDelivery
    }

    /// For each `.deliver` among `actions`, the live instances its deliveries go to; instances
    /// that were deallocated are forgotten (and the machine stops delivering to their addresses).
    private static func resolve(_ actions: [NodeAction], in state: inout HostState) -> [[ResolvedDelivery]] {
        var resolved: [[ResolvedDelivery]] = []
        for case .deliver(let deliveries) in actions {
            var group: [ResolvedDelivery] = []
            for delivery in deliveries {
                if let instance = state.instances[delivery.address]?.model {
                    group.append(ResolvedDelivery(instance: instance, delivery: delivery))
                } else {
                    state.instances[delivery.address] = nil
                    state.machine.attachedModels[delivery.address] = nil
                }
            }
            resolved.append(group)
        }
        return resolved
    }

    /// Applies a delivery to its model (observers are notified on the observer executor) and
    /// accounts for what the model rejected.
    private func deliver(_ resolved: ResolvedDelivery) {
        let result = Self.apply(resolved.delivery.sets, to: resolved.instance, executor: observers)
        let rejected = result.rejected.count + result.unknownProperties.count
        guard rejected > 0 else { return }
        let suppressed = state.withLock { state -> Int? in
            state.machine.counters.rejectedProperties += rejected
            return state.machine.limiter.allow("rejected-property", now: monotonicNow())
        }
        if let suppressed {
            let address = resolved.delivery.address
            logger.warning(
                "a replicated value does not fit the local model; the model keeps its value",
                metadata: [
                    "model": "\(address.channel)/\(address.model)", "model.type": "\(type(of: resolved.instance))",
                    "rejected": "\(result.rejected.map { "\($0.property): \($0.reason)" })",
                    "unknown": "\(result.unknownProperties)", "suppressed": "\(suppressed)",
                ])
        }
    }

    private static func apply<M: ReplicatedModel>(
        _ sets: [ModelRegistrar.RemoteWriteSet], to model: M, executor: any ObserverExecutor
    ) -> ModelRegistrar.RemoteApplyResult {
        model._$registrar.applyRemote(model, sets, notifyingOn: executor)
    }

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
        // The queue, not the node, in the closures a model calls on every write: held strongly,
        // no weak reference loaded per write (see LocalWriteQueue).
        let queue = localWrites
        let binding = ModelBinding(
            address: address, localWrites: (queue, emitter),
            stamp: { queue.stamp() },
            emit: { address, version, writes in
                queue.enqueue(LocalWrite(address: address, version: version, writes: writes, emitter: emitter))
            },
            discard: { version in queue.release(version) },
            reportEncodingFailure: { [weak self] property, error in
                self?.reportEncodingFailure(address, property, error)
            },
            pace: { queue.pace() })
        return try state.withLock { state throws(StateSyncError) -> M in
            if let existing = state.instances[address]?.model {
                guard let typed = existing as? M else {
                    throw StateSyncError(
                        .modelTypeMismatch,
                        "\(address) is already held by a live \(Swift.type(of: existing)), not \(M.self)")
                }
                return typed
            }
            // Checked again under the lock that stop()'s detachment takes: a model attached
            // after that detachment would keep its binding, and its writes would wait in the
            // queue of a node that no longer takes them.
            guard isRunning else { throw StateSyncError(.stopped, "node \(configuration.nodeID) is stopped") }
            fresh._$registrar.attach(fresh, adopting: state.machine.store.properties(of: address), binding: binding)
            state.instances[address] = InstanceReference(fresh)
            state.machine.attachedModels[address] = fresh._$registrar.instanceID
            return fresh
        }
    }

    /// Rounds of local writes waiting for the driver now.
    package var queuedLocalWriteRounds: Int { localWrites.queuedLocalWriteRounds }
    /// How many times a writing thread waited for room in the outbox.
    package var writerWaitCount: Int { localWrites.writerWaitCount }
    /// Sets how many rounds the outbox holds before writers wait (tests use a small one).
    package func setQueuedRoundsLimit(_ rounds: Int) { localWrites.setQueuedRoundsLimit(rounds) }

    private func reportEncodingFailure(_ address: ModelAddress, _ property: String, _ error: any Error) {
        state.withLock { $0.machine.counters.encodingFailures += 1 }
        logger.error(
            "a local write could not be encoded and was not replicated",
            metadata: ["model": "\(address)", "property": "\(property)", "error": "\(error)"])
    }

    // MARK: - Untyped access (what the client API and embedding apps without models use)

    /// The properties of a model as this node holds them.
    public func properties(of address: ModelAddress) -> [String: ReplicaStore.Register] {
        state.withLock { $0.machine.store.properties(of: address) }
    }

    /// Per origin with a gap, the first run of sequence numbers this node is missing.
    package var firstGaps: [String: ClosedRange<UInt64>] {
        state.withLock { $0.machine.firstGaps }
    }

    /// Per origin with numbers received above a gap: how many runs and how many numbers they
    /// hold (tests: what a gap costs follows the gaps, not the deltas above them).
    package var heldAboveGaps: [String: (runs: Int, numbers: UInt64)] {
        state.withLock { state in
            state.machine.origins.compactMapValues { $0.above.isEmpty ? nil : ($0.above.runs.count, $0.above.count) }
        }
    }

    /// Whether a page of a peer's snapshot is being merged, a slice at a time (tests).
    package var isMergingSnapshotPage: Bool {
        state.withLock { $0.machine.repair.stream?.merging != nil }
    }

    /// The node's status.
    public var status: NodeStatus {
        let now = monotonicNow()
        return state.withLock { $0.machine.status(now: now) }
    }

    /// ``status`` if no other thread holds the node's state at this moment, else `nil`: for a
    /// caller that polls, such as the bench waiting for a late join. Waiting for the lock, a
    /// priority-inheriting futex on Linux, spins in the kernel while its holder runs: a poller
    /// every 2 ms spun through most of the I/O thread's snapshot slices, and took a good part of
    /// one of the two cores from the nodes it measured.
    package var statusIfIdle: NodeStatus? {
        let now = monotonicNow()
        return state.withLockIfAvailable { $0.machine.status(now: now) }
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
                // A writer waiting for room goes on: the driver takes the queue once more.
                localWrites.stopPacing()
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
        detachModels()
        // The driver feeds the machine `.stop` (every local write made durable and published),
        // then closes its sockets.
        await driver.withLock { $0 }?.stop()
        // Every change applied before the stop reaches its observers before stop() returns.
        await observers.flush()
        finishStop()
        let waiters = lifecycle.withLock { state -> [CheckedContinuation<Void, Never>] in
            defer { state = .stopped }
            switch state {
            case .running(let w), .stopping(let w): return w
            case .stopped: return []
            }
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Stops taking writes: detached models stay local, so nothing is queued after the driver's
    /// last round.
    package func detachModels() {
        let instances = state.withLock { state in state.instances.values.compactMap(\.model) }
        for instance in instances { instance._$registrar.detach() }
    }

    /// Writes the snapshot (everything in the log is in it) and releases the storage: the end of
    /// a clean stop, once the driver is done.
    package func finishStop() {
        flushLog()
        do {
            let (snapshot, records) = state.withLock { ($0.machine.snapshot, $0.machine.recordsAboveGaps) }
            try storage.compact(snapshot, keeping: records)
            logger.info("node stopped; snapshot written")
        } catch {
            logger.error("node stopped but the snapshot could not be written; the log keeps every write: \(error)")
        }
        storage.close()
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
}

extension StateSyncNode: Service {
    /// Runs until graceful shutdown (SIGTERM/SIGINT in a `ServiceGroup`) or until its task is
    /// cancelled, then stops the node and returns.
    public func run() async throws {
        await withGracefulShutdownHandler {
            await withTaskCancellationHandler {
                await waitUntilStopped()
            } onCancel: {
                Task { await self.stop() }
            }
        } onGracefulShutdown: {
            Task { await self.stop() }
        }
    }
}

/// A weak reference to a model instance attached to a node: the node does not keep models alive.
final class InstanceReference: Sendable {
    // Written once at init; `weak` reads are atomic in Swift.
    nonisolated(unsafe) weak var model: (any ReplicatedModel)?

    init(_ model: any ReplicatedModel) {
        self.model = model
    }
}

/// When the node's own writes were appended to the log, by log position, until they are durable
/// and published: the host's side of ``NodeMetrics/writeDurable`` and ``NodeMetrics/writePublished``.
struct WriteTimes: Sendable {
    /// Bytes appended since the start: the machine's log positions.
    private var appendedBytes: UInt64 = 0
    /// Appends of own writes not yet published: position after the append, and when.
    private var pending: [(position: UInt64, at: ContinuousClock.Instant)] = []
    private var first = 0
    /// The last sync that completed: the position it made durable, and when.
    private var lastSync: (position: UInt64, at: ContinuousClock.Instant)?

    mutating func appended(_ count: Int, ownWrites: Bool) {
        appendedBytes += UInt64(count)
        // Bounded: a node whose log never syncs (it could not run) does not grow this forever.
        if ownWrites, pending.count - first < 65_536 { pending.append((appendedBytes, .now)) }
    }

    mutating func synced(through position: UInt64, at instant: ContinuousClock.Instant) {
        lastSync = (position, instant)
    }

    /// The appends durable through `position`: when each was appended, and when it became durable.
    mutating func takeDurable(through position: UInt64) -> [(ContinuousClock.Instant, ContinuousClock.Instant)] {
        var done: [(ContinuousClock.Instant, ContinuousClock.Instant)] = []
        let syncedAt = lastSync.flatMap { $0.position >= position ? $0.at : nil } ?? .now
        while first < pending.count, pending[first].position <= position {
            done.append((pending[first].at, syncedAt))
            first += 1
        }
        if first == pending.count {
            pending.removeAll(keepingCapacity: true)
            first = 0
        } else if first > 1024 {
            pending.removeFirst(first)
            first = 0
        }
        return done
    }
}

/// Log records appended by the machine and not yet written (``StateSyncNode``'s `pendingLog`).
private struct PendingLog {
    /// Past this many octets the records are written at once, whatever comes next.
    static let flushBytes = 1 << 20
    private var bytes: [UInt8] = []
    /// Whether the records hold the node's own writes (a failed write of those stops the node).
    private var mustSucceed = false

    /// Adds records; returns the octets now pending.
    mutating func add(_ records: [UInt8], mustSucceed: Bool) -> Int {
        if bytes.isEmpty { bytes = records } else { bytes.append(contentsOf: records) }
        self.mustSucceed = self.mustSucceed || mustSucceed
        return bytes.count
    }

    /// The pending records and whether they must succeed; `nil` when there are none.
    mutating func take() -> (bytes: [UInt8], mustSucceed: Bool)? {
        guard !bytes.isEmpty else { return nil }
        defer {
            bytes = []
            mustSucceed = false
        }
        return (bytes, mustSucceed)
    }
}
