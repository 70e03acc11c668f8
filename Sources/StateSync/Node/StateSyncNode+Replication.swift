import Logging

/// The node's replication transitions, called by its I/O thread. Each returns what the I/O thread
/// must do next (publish, notify watchers); none touches a socket.
extension StateSyncNode {
    /// A delta applied to the store, with the changes it made (possibly none).
    struct Applied: Sendable {
        let delta: Delta
        let changes: [PropertyChange]
    }

    /// Handles one message from the peer at `endpoint`. Returns the changes it applied.
    func receive(from endpoint: String, frames: [[UInt8]]) -> [PropertyChange] {
        let message: PeerMessage
        do {
            message = try PeerMessage.decode(frames)
        } catch {
            core.withLock { $0.counters.malformedMessages += 1 }
            if let suppressed = limiter.allow("malformed-peer") {
                logger.warning(
                    "dropped a malformed message from a peer",
                    metadata: ["peer.endpoint": "\(endpoint)", "error": "\(error)", "suppressed": "\(suppressed)"])
            }
            return []
        }
        let now = monotonicMilliseconds()
        switch message {
        case .heartbeat(let beat):
            core.withLock { core in
                core.peers[endpoint, default: .init()].lastMessageAt = now
                core.peers[endpoint, default: .init()].node = beat.node
                var origin = core.origins[beat.node, default: .init()]
                if origin.incarnation != 0, origin.incarnation != beat.incarnation {
                    // The peer restarted: its sequence numbers may start again.
                    origin.highestSequence = 0
                }
                origin.incarnation = beat.incarnation
                core.origins[beat.node] = origin
            }
            return []
        case .delta(let delta):
            return applyPeerDelta(delta, from: endpoint, at: now)
        }
    }

    private func applyPeerDelta(_ delta: Delta, from endpoint: String, at now: UInt64) -> [PropertyChange] {
        if delta.origin == configuration.nodeID { return [] }  // our own write, echoed back
        do {
            try Names.validateChannel(delta.channel)
            try Names.validateModel(delta.model)
            for property in delta.properties { try Names.validateProperty(property.name) }
        } catch {
            core.withLock { $0.counters.malformedMessages += 1 }
            if let suppressed = limiter.allow("invalid-delta") {
                logger.warning(
                    "dropped a delta with an invalid name",
                    metadata: ["peer.endpoint": "\(endpoint)", "error": "\(error)", "suppressed": "\(suppressed)"])
            }
            return []
        }
        let followed = clock.observe(delta.version)
        let (changes, instance) = core.withLock { core -> ([PropertyChange], (any ReplicatedModel)?) in
            core.peers[endpoint, default: .init()].lastMessageAt = now
            core.peers[endpoint, default: .init()].node = delta.origin
            core.peers[endpoint, default: .init()].deltasReceived += 1
            core.counters.deltasReceived += 1
            if !followed { core.counters.clockDriftRejections += 1 }
            core.track(delta)
            let changes = core.store.apply(delta)
            core.counters.propertiesStale += delta.properties.count - changes.count
            if !changes.isEmpty { core.counters.deltasApplied += 1 }
            return (changes, changes.isEmpty ? nil : core.liveInstance(at: ModelAddress(channel: delta.channel, model: delta.model)))
        }
        if !followed, let suppressed = limiter.allow("clock-drift") {
            logger.warning(
                "a peer's clock is further ahead than clock.max_drift_ms; not following it",
                metadata: [
                    "peer.id": "\(delta.origin)", "delta.version": "\(delta.version)",
                    "suppressed": "\(suppressed)",
                ])
        }
        if let instance {
            apply(changes, to: instance, version: delta.version, isRemote: true)
        }
        return changes
    }

    /// Applies store changes to a live model instance and accounts for what it rejected.
    private func apply(_ changes: [PropertyChange], to instance: any ReplicatedModel, version: Version, isRemote: Bool) {
        let writes = changes.map { PropertyWrite(name: $0.property, value: $0.new) }
        let result = Self.apply(writes, to: instance, version: version, isRemote: isRemote)
        let rejected = result.rejected.count + result.unknownProperties.count
        if rejected > 0 {
            core.withLock { $0.counters.rejectedProperties += rejected }
            if let suppressed = limiter.allow("rejected-property") {
                logger.warning(
                    "a replicated value does not fit the local model; the model keeps its value",
                    metadata: [
                        "model": "\(changes[0].channel)/\(changes[0].model)", "model.type": "\(type(of: instance))",
                        "rejected": "\(result.rejected.map { "\($0.property): \($0.reason)" })",
                        "unknown": "\(result.unknownProperties)", "suppressed": "\(suppressed)",
                    ])
            }
        }
    }

    private static func apply<M: ReplicatedModel>(
        _ writes: [PropertyWrite], to model: M, version: Version, isRemote: Bool
    ) -> ModelRegistrar.RemoteApplyResult {
        model._$registrar.applyRemote(model, writes: writes, version: version, isRemote: isRemote)
    }

    /// Takes the local writes queued by attached models and applies them to the store, in
    /// sequence order. The I/O thread publishes the returned deltas in this order.
    func takeLocalWrites() -> [Applied] {
        let pending = outbox.withLock { outbox -> [Delta] in
            let pending = outbox.pending
            outbox.pending = []
            return pending
        }
        return applyLocal(pending)
    }

    private func applyLocal(_ deltas: [Delta]) -> [Applied] {
        if deltas.isEmpty { return [] }
        return core.withLock { core in
            deltas.map { delta in
                core.counters.deltasPublished += 1
                return Applied(delta: delta, changes: core.store.apply(delta))
            }
        }
    }

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
    /// Returns every delta to publish (queued model writes first), the version to report (the
    /// write's, or when nothing changed the newest of the named properties) and what happened.
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
        let current = core.withLock { $0.store.properties(of: address) }
        let effective = writes.filter { current[$0.name]?.value != $0.value }
        let version: Version? = effective.isEmpty ? nil : clock.next()
        let batch = outbox.withLock { outbox -> [Delta] in
            if let version { outbox.enqueue(address: address, version: version, writes: effective) }
            let all = outbox.pending
            outbox.pending = []
            return all
        }
        let applied = applyLocal(batch)
        guard let version, let mine = applied.last, mine.delta.version == version else {
            let newest = writes.compactMap { current[$0.name]?.version }.max() ?? .zero
            return (applied, newest, .unchanged)
        }
        if mine.changes.isEmpty {
            let held = properties(of: address)
            return (applied, writes.compactMap { held[$0.name]?.version }.max() ?? version, .superseded)
        }
        let instance = core.withLock { $0.liveInstance(at: address) }
        if let instance { apply(mine.changes, to: instance, version: version, isRemote: false) }
        return (applied, version, .changed)
    }

    /// This node's heartbeat.
    func heartbeat() -> PeerMessage {
        .heartbeat(
            PeerMessage.Heartbeat(
                node: configuration.nodeID, latestSequence: outbox.withLock { $0.latestSequence },
                clock: HybridLogicalClock.systemMilliseconds() << 16, incarnation: incarnation))
    }

    func countClientRequest(error: Bool) {
        core.withLock { core in
            core.counters.clientRequests += 1
            if error { core.counters.clientErrors += 1 }
        }
    }

    func countDroppedWatchEvent() {
        core.withLock { $0.counters.watchEventsDropped += 1 }
    }

    func countDroppedReply() {
        core.withLock { $0.counters.repliesDropped += 1 }
    }

    func countMalformedClientMessage() {
        core.withLock { $0.counters.malformedMessages += 1 }
    }
}
