import Logging

/// The node's replication transitions, called by its I/O thread. Each returns what the I/O thread
/// must do next (log, publish, notify watchers); none touches a socket.
extension StateSyncNode {
    /// A delta new to this node, applied to the store, with its writes that won (possibly none).
    struct Applied: Sendable {
        let delta: Delta
        let won: [PropertyWrite]
    }

    /// Which live model instances get which applied deltas: runs of consecutive deltas of one
    /// model (a DELTA batch, usually), each delivered in one registrar transition. Built under
    /// the core's lock; holds each instance once per run, not once per delta.
    struct ModelDeliveries {
        struct Run {
            let instance: any ReplicatedModel
            let address: ModelAddress
            /// Positions in the applied deltas.
            var indices: [Int] = []
        }
        private(set) var runs: [Run] = []
        private var lastAddress: ModelAddress?
        /// The instance id of `runs.last` while it is the live instance at `lastAddress`, else 0.
        private var lastInstanceID: UInt64 = 0

        /// Adds the applied delta at `index` (which has writes that won), unless the live instance
        /// at its address is `emitter` (the instance that made it holds it already).
        mutating func add(_ index: Int, of delta: Delta, core: inout NodeCore, emitter: UInt64 = 0) {
            if lastAddress?.channel != delta.channel || lastAddress?.model != delta.model {
                lastAddress = delta.address
                lastInstanceID = 0
                if let instance = core.liveInstance(at: delta.address) {
                    lastInstanceID = instance._$registrar.instanceID
                    runs.append(Run(instance: instance, address: delta.address))
                }
            }
            guard lastInstanceID != 0, lastInstanceID != emitter else { return }
            runs[runs.count - 1].indices.append(index)
        }
    }

    /// Handles one message (or DELTA batch) from the peer at `endpoint`. Returns the deltas it
    /// applied that were new.
    func receive(from endpoint: String, frames: [[UInt8]]) -> [Applied] {
        let now = monotonicMilliseconds()
        do {
            if let deltas = try PeerMessage.decodeDeltas(frames) { return applyRemote(deltas, from: endpoint, at: now) }
            receive(try PeerMessage.decode(frames), from: endpoint, at: now)
        } catch {
            countMalformed(
                kind: "malformed-peer", "dropped a malformed message from a peer", endpoint: endpoint, error: error)
        }
        return []
    }

    private func receive(_ message: PeerMessage, from endpoint: String, at now: UInt64) {
        switch message {
        case .heartbeat(let beat):
            core.withLock { core in
                core.peers[endpoint, default: .init()].lastMessageAt = now
                core.peers[endpoint, default: .init()].node = beat.node
                core.peers[endpoint, default: .init()].api =
                    beat.api.isEmpty ? nil : Self.reachable(beat.api, via: endpoint)
                guard beat.node != configuration.nodeID else { return }
                core.origins[beat.node, default: .init()].incarnation = beat.incarnation
                core.announce(origin: beat.node, through: beat.latestSequence)
                // What the peer holds of every origin: a delta it has exists, so it is owed to us
                // too. For our own origin this means we lost deltas we had published (a damaged
                // or removed log): fetch them back and never reuse their sequence numbers.
                for (origin, through) in beat.progress { core.announce(origin: origin, through: through) }
            }
            if let own = beat.progress[configuration.nodeID], own < UInt64.max {
                outbox.withLock { $0.nextSequence = max($0.nextSequence, own + 1) }
            }
        case .delta(let delta):
            _ = applyRemote([delta], from: endpoint, at: now)
        }
    }

    /// An advertised endpoint bound to a wildcard host is reached at the host we reach the peer at.
    static func reachable(_ advertised: String, via peerEndpoint: String) -> String {
        for wildcard in ["tcp://*:", "tcp://0.0.0.0:"] where advertised.hasPrefix(wildcard) {
            let port = advertised.dropFirst(wildcard.count)
            let hostPart = peerEndpoint.dropFirst("tcp://".count)
            guard peerEndpoint.hasPrefix("tcp://"), let colon = hostPart.lastIndex(of: ":") else { return advertised }
            return "tcp://\(hostPart[..<colon]):\(port)"
        }
        return advertised
    }

    private func countMalformed(kind: String, _ message: Logger.Message, endpoint: String, error: any Error) {
        core.withLock { $0.counters.malformedMessages += 1 }
        if let suppressed = limiter.allow(kind) {
            logger.warning(
                message, metadata: ["peer.endpoint": "\(endpoint)", "error": "\(error)", "suppressed": "\(suppressed)"])
        }
    }

    /// Applies a delta from a peer (published or fetched by repair). Returns it when it is new.
    func applyRemote(_ delta: Delta, from endpoint: String, at now: UInt64, repaired: Bool = false) -> Applied? {
        applyRemote([delta], from: endpoint, at: now, repaired: repaired).first
    }

    /// Applies deltas from one peer message (or one repair answer) under one lock. Returns the new
    /// ones, in order.
    func applyRemote(_ deltas: [Delta], from endpoint: String, at now: UInt64, repaired: Bool = false) -> [Applied] {
        // The deltas to apply: all of them (the same array, no copy) unless one is refused.
        var accepted = deltas
        var refusedAny = false
        var validated: ModelAddress?  // a batch is of one model: its names are checked once
        for index in deltas.indices {
            let delta = deltas[index]
            var refused = delta.origin == configuration.nodeID && !repaired  // our own write, echoed back
            if !refused {
                do {
                    if validated?.channel != delta.channel || validated?.model != delta.model {
                        try Names.validateChannel(delta.channel)
                        try Names.validateModel(delta.model)
                        validated = delta.address
                    }
                    for property in delta.properties { try Names.validateProperty(property.name) }
                    refused = dropRemoteDeltas(delta)
                } catch {
                    countMalformed(
                        kind: "invalid-delta", "dropped a delta with an invalid name", endpoint: endpoint, error: error)
                    refused = true
                }
            }
            if refused, !refusedAny {
                refusedAny = true
                accepted = Array(deltas[..<index])
            } else if !refused, refusedAny {
                accepted.append(delta)
            }
        }
        guard let newest = accepted.indices.max(by: { accepted[$0].version < accepted[$1].version }) else {
            return []
        }
        // Every version at or below one the clock follows is within the drift bound too.
        let drifted =
            clock.observe(accepted[newest].version)
            ? [] : accepted.indices.filter { $0 == newest || !clock.observe(accepted[$0].version) }.map { accepted[$0] }
        let (applied, deliveries) = core.withLock { core -> ([Applied], ModelDeliveries) in
            if !repaired {
                core.peers[endpoint, default: .init()].lastMessageAt = now
                core.peers[endpoint, default: .init()].node = accepted[accepted.count - 1].origin
                core.peers[endpoint, default: .init()].deltasReceived += accepted.count
                core.counters.deltasReceived += accepted.count
            }
            core.counters.clockDriftRejections += drifted.count
            var applied: [Applied] = []
            applied.reserveCapacity(accepted.count)
            var deliveries = ModelDeliveries()
            // Runs of one origin and one model (a DELTA batch, usually): their bookkeeping looks
            // each up once per run.
            var start = 0
            while start < accepted.count {
                var end = start + 1
                while end < accepted.count, accepted[end].origin == accepted[start].origin,
                    accepted[end].channel == accepted[start].channel, accepted[end].model == accepted[start].model
                {
                    end += 1
                }
                let isNew = core.record(run: accepted[start..<end])
                let fresh = zip(accepted[start..<end], isNew).compactMap { $1 ? $0 : nil }
                for (delta, won) in zip(fresh, core.store.applyWinning(run: fresh)) {
                    core.counters.propertiesStale += delta.properties.count - won.count
                    if !won.isEmpty {
                        core.counters.deltasApplied += 1
                        deliveries.add(applied.count, of: delta, core: &core)
                    }
                    applied.append(Applied(delta: delta, won: won))
                }
                start = end
            }
            return (applied, deliveries)
        }
        if let drifted = drifted.first, let suppressed = limiter.allow("clock-drift") {
            logger.warning(
                "a peer's clock is further ahead than clock.max_drift_ms; not following it",
                metadata: [
                    "peer.id": "\(drifted.origin)", "delta.version": "\(drifted.version)",
                    "suppressed": "\(suppressed)",
                ])
        }
        deliver(deliveries, of: applied)
        return applied
    }

    /// Test-only fault injection (`STATESYNC_TEST_DROP_REMOTE_DELTAS`, see the README): silently
    /// discards a share of remote deltas and marks them received, so they are never repaired.
    private func dropRemoteDeltas(_ delta: Delta) -> Bool {
        guard plantedDropShare > 0, delta.origin != configuration.nodeID,
            Double(delta.sequence &* 2_654_435_761 % 1000) / 1000 < plantedDropShare
        else { return false }
        core.withLock { core in _ = core.record(delta) }
        return true
    }

    /// Applies the writes that won to the live model instances they belong to, one registrar
    /// transition per run.
    private func deliver(_ deliveries: ModelDeliveries, of applied: [Applied]) {
        for run in deliveries.runs where !run.indices.isEmpty {
            let sets = run.indices.map { index in
                ModelRegistrar.RemoteWriteSet(
                    writes: applied[index].won, version: applied[index].delta.version,
                    isRemote: applied[index].delta.origin != configuration.nodeID)
            }
            apply(sets, to: run.instance, address: run.address)
        }
    }

    /// Applies write sets to a live model instance (its observers are notified on the observer
    /// queue) and accounts for what it rejected.
    private func apply(_ sets: [ModelRegistrar.RemoteWriteSet], to instance: any ReplicatedModel, address: ModelAddress)
    {
        let result = Self.apply(sets, to: instance, executor: observerExecutor)
        let rejected = result.rejected.count + result.unknownProperties.count
        if rejected > 0 {
            core.withLock { $0.counters.rejectedProperties += rejected }
            if let suppressed = limiter.allow("rejected-property") {
                logger.warning(
                    "a replicated value does not fit the local model; the model keeps its value",
                    metadata: [
                        "model": "\(address.channel)/\(address.model)", "model.type": "\(type(of: instance))",
                        "rejected": "\(result.rejected.map { "\($0.property): \($0.reason)" })",
                        "unknown": "\(result.unknownProperties)", "suppressed": "\(suppressed)",
                    ])
            }
        }
    }

    private static func apply<M: ReplicatedModel>(
        _ sets: [ModelRegistrar.RemoteWriteSet], to model: M, executor: ObserverExecutor
    ) -> ModelRegistrar.RemoteApplyResult {
        model._$registrar.applyRemote(model, sets, notifyingOn: executor)
    }

    /// Takes the local writes queued by attached models and applies them to the store, in
    /// sequence order. The I/O thread logs them and publishes them in this order.
    func takeLocalWrites() -> [Applied] {
        let (pending, emitters) = outbox.withLock { $0.takeAll() }
        return applyLocal(pending, emitters: emitters)
    }

    /// `emitters[i]` is the instance id of the model that made `deltas[i]` (0 for none).
    private func applyLocal(_ deltas: [Delta], emitters: [UInt64]) -> [Applied] {
        if deltas.isEmpty { return [] }
        let (applied, deliveries) = core.withLock { core -> ([Applied], ModelDeliveries) in
            var applied: [Applied] = []
            applied.reserveCapacity(deltas.count)
            var deliveries = ModelDeliveries()
            _ = core.record(run: deltas)  // all of this node's origin, new by construction
            for (delta, emitter) in zip(deltas, emitters) {
                core.counters.deltasPublished += 1
                let won = core.store.applyWinning(delta)
                // The instance that wrote it already holds it; another instance at the address
                // (a newer one may have adopted the store before this write landed) gets it.
                if !won.isEmpty { deliveries.add(applied.count, of: delta, core: &core, emitter: emitter) }
                applied.append(Applied(delta: delta, won: won))
            }
            return (applied, deliveries)
        }
        deliver(deliveries, of: applied)
        return applied
    }

    /// The largest write a SET may carry (names and encoded values), so its delta fits a log
    /// record and a message with room to spare.
    static let maximumWriteBytes = 32 << 20

    /// What a client's SET did.
    enum SetResult: UInt8, Sendable {
        /// Every value was already current: no delta.
        case unchanged = 0
        /// The write applied.
        case changed = 1
        /// The write lost last-writer-wins for every property: this node already holds newer
        /// versions (written by a peer whose clock is ahead). It is published but changes nothing.
        case superseded = 2
    }

    /// A client's SET: the properties whose value differs become one delta with a new version.
    /// Returns every delta to log and publish (queued model writes first), the version to report
    /// (the write's, or when nothing changed the newest of the named properties) and what
    /// happened.
    func clientSet(_ address: ModelAddress, _ writes: [PropertyWrite]) throws(StateSyncError) -> (
        published: [Applied], version: Version, result: SetResult
    ) {
        try Names.validateChannel(address.channel)
        try Names.validateModel(address.model)
        guard !writes.isEmpty else { throw StateSyncError(.invalidName, "a set needs at least one property") }
        var seen = Set<String>()
        for write in writes {
            try Names.validateProperty(write.name)
            guard seen.insert(write.name).inserted else {
                throw StateSyncError(.invalidName, "property '\(write.name)' is given twice")
            }
        }
        let size = writes.reduce(0) { total, write in
            var w = WireWriter()
            w.value(write.value)
            return total + write.name.utf8.count + w.bytes.count
        }
        guard size <= Self.maximumWriteBytes else {
            throw StateSyncError(
                .invalidName, "the write is \(size) bytes; a delta may carry at most \(Self.maximumWriteBytes)")
        }
        // Writes queued by models go first: they were made before this SET.
        var applied = takeLocalWrites()
        let current = core.withLock { $0.store.properties(of: address) }
        let effective = writes.filter { current[$0.name]?.value != $0.value }
        let (batch, emitters) = outbox.withLock { outbox in
            if !effective.isEmpty { outbox.enqueue(address: address, version: clock.next(), writes: effective) }
            return outbox.takeAll()
        }
        applied += applyLocal(batch, emitters: emitters)
        guard !effective.isEmpty, let mine = applied.last else {
            let newest = writes.compactMap { current[$0.name]?.version }.max() ?? .zero
            return (applied, newest, .unchanged)
        }
        let version = mine.delta.version
        if mine.won.isEmpty {
            let held = properties(of: address)
            return (applied, writes.compactMap { held[$0.name]?.version }.max() ?? version, .superseded)
        }
        // (A live model at the address got the change in applyLocal.)
        return (applied, version, .changed)
    }

    /// This node's heartbeat; `published` is the highest sequence number it has published.
    func heartbeat(published: UInt64, api: String?) -> PeerMessage {
        let progress = core.withLock { core in core.origins.mapValues(\.contiguous).filter { $0.value > 0 } }
        return .heartbeat(
            PeerMessage.Heartbeat(
                node: configuration.nodeID, latestSequence: published,
                clock: HybridLogicalClock.systemMilliseconds() << 16, incarnation: incarnation, api: api ?? "",
                progress: progress))
    }

    // MARK: - Repair

    /// The first missing run of sequence numbers of every origin that has one.
    func gaps() -> [(origin: String, range: ClosedRange<UInt64>)] {
        core.withLock { core in
            core.origins.compactMap { origin, progress in
                guard let gap = progress.firstGap else { return nil }
                return (origin, gap)
            }
        }
    }

    /// Serves a FETCH: the retained deltas of `origin` in `range`.
    func fetch(origin: String, range: ClosedRange<UInt64>) -> (deltas: [Delta], droppedThrough: UInt64) {
        core.withLock { core in
            let result = core.retained(origin: origin, range: range)
            core.counters.deltasServed += result.deltas.count
            return result
        }
    }

    /// Serves a SNAPSHOT: the whole state and, per origin, how far it includes its deltas.
    func snapshot() -> DataDirectory.Snapshot {
        core.withLock { core in
            core.counters.snapshotsServed += 1
            return DataDirectory.Snapshot(
                store: core.store, latestSequence: outbox.withLock { $0.latestSequence },
                progress: core.origins.mapValues(\.contiguous))
        }
    }

    /// Merges a peer's snapshot: every register through last-writer-wins, then the progress it
    /// covers. Returns the channels it changed.
    func merge(_ snapshot: DataDirectory.Snapshot) -> Set<String> {
        var changed = Set<String>()
        for (address, registers) in snapshot.store.allModels {
            // One model at a time under the lock: no long stall for readers of the node.
            let (changes, instance) = core.withLock { core -> ([PropertyChange], (any ReplicatedModel)?) in
                let changes = registers.compactMap { name, register in
                    core.store.merge(address, property: name, register: register)
                }
                return (changes, changes.isEmpty ? nil : core.liveInstance(at: address))
            }
            guard let newest = changes.map(\.version).max() else { continue }
            clock.observe(newest)
            changed.insert(address.channel)
            if let instance {
                let sets = changes.map { change in
                    ModelRegistrar.RemoteWriteSet(
                        writes: [PropertyWrite(name: change.property, value: change.new)], version: change.version)
                }
                apply(sets, to: instance, address: address)
            }
        }
        core.withLock { core in
            for (origin, through) in snapshot.progress {
                core.coverWithoutHistory(origin: origin, through: through)
            }
            core.counters.snapshotsApplied += 1
        }
        if let own = snapshot.progress[configuration.nodeID], own < UInt64.max {
            outbox.withLock { $0.nextSequence = max($0.nextSequence, own + 1) }
        }
        return changed
    }

    func countRepairRequest() { core.withLock { $0.counters.repairRequests += 1 } }

    func countClientRequest(error: Bool) {
        core.withLock { core in
            core.counters.clientRequests += 1
            if error { core.counters.clientErrors += 1 }
        }
    }

    func countDroppedReply() {
        core.withLock { $0.counters.repliesDropped += 1 }
    }

    func countMalformedClientMessage() {
        core.withLock { $0.counters.malformedMessages += 1 }
    }
}
