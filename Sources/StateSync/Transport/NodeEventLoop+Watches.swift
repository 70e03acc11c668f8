import Logging
import ZeroMQ

/// Watches on the client API (docs/PROTOCOL.md, "Watches"): a snapshot of the channel and an
/// "initial state complete" marker, then every delta of the channel in each origin's sequence
/// order, and "caught up" markers. Nothing is buffered per watch: a watch is a cursor into the
/// node's retained history, advanced only when the client's queue takes the next event. A client
/// too slow for the history is told it lagged and resynchronised with a snapshot.
extension NodeEventLoop {
    struct WatchKey: Hashable {
        let client: [UInt8]
        let requestID: UInt64
    }

    struct Watch {
        let channel: String
        var onLag: ClientProtocol.LagPolicy = .resync
        /// The watch lagged with the "end" policy: its ERROR is still to be queued.
        var ending = false
        var position: StateSyncNode.WatchPosition
        /// A snapshot (and why) still to send before any delta.
        var pendingSnapshot: ClientProtocol.SnapshotReason?
        var caughtUpSent = false
        var lastMarker: UInt64 = 0
        var lagging = false
    }

    static let markerInterval: UInt64 = 1000
    static let snapshotChunk = 256
    static let pumpLimit = 256

    func addWatch(
        _ key: WatchKey, channel: String, from cursor: WatchCursor?, onLag: ClientProtocol.LagPolicy,
        state: inout LoopState,
        node: StateSyncNode
    ) {
        var watch = Watch(
            channel: channel, onLag: onLag,
            position: StateSyncNode.WatchPosition(journalIndex: 0, cursor: cursor ?? WatchCursor()))
        if let cursor {
            if let position = node.resumePosition(after: cursor) {
                watch.position = position
            } else {
                watch.pendingSnapshot = .historyGone
            }
        } else {
            watch.pendingSnapshot = .initial
        }
        state.watches[key] = watch
        setWatcherCount(state.watches.count)
    }

    /// Watches of `channels` get a resync snapshot: their state changed without deltas (a peer's
    /// snapshot was merged), which the journal cannot show them.
    func resyncWatches(of channels: Set<String>, state: inout LoopState) {
        for (key, watch) in state.watches where channels.contains(watch.channel) && watch.pendingSnapshot == nil {
            state.watches[key]?.pendingSnapshot = .lagged
        }
    }

    func removeWatch(_ key: WatchKey, state: inout LoopState) {
        state.watches[key] = nil
        setWatcherCount(state.watches.count)
    }

    /// Sends every watch what it is owed, as far as its client's queue takes it.
    func pumpWatches(state: inout LoopState, api: Socket?, node: StateSyncNode, published: UInt64) {
        guard let api, !state.watches.isEmpty else { return }
        let now = monotonicMilliseconds()
        var gone: Set<[UInt8]> = []
        var lag = 0
        for key in Array(state.watches.keys) where !gone.contains(key.client) {
            guard var watch = state.watches[key] else { continue }
            let outcome = pump(&watch, key: key, api: api, node: node, published: published, now: now)
            switch outcome {
            case .clientGone: gone.insert(key.client)
            case .ended: state.watches[key] = nil
            case .blocked:
                if !watch.lagging, let suppressed = node.limiter.allow("slow-watcher") {
                    logger.warning(
                        "a watching client is not keeping up; its watch waits (and resyncs if it falls behind history)",
                        metadata: ["watch.channel": "\(watch.channel)", "suppressed": "\(suppressed)"])
                }
                watch.lagging = true
                state.watches[key] = watch
            case .done:
                watch.lagging = false
                state.watches[key] = watch
            }
            if watch.lagging { lag += 1 }
        }
        for client in gone {
            for key in state.watches.keys where key.client == client { state.watches[key] = nil }
        }
        state.laggingWatches = lag
        setLaggingWatchCount(lag)
        setWatcherCount(state.watches.count)
    }

    enum PumpOutcome { case done, blocked, clientGone, ended }

    private func pump(
        _ watch: inout Watch, key: WatchKey, api: Socket, node: StateSyncNode, published: UInt64, now: UInt64
    ) -> PumpOutcome {
        func send(_ event: ClientProtocol.WatchEventBody) -> PumpOutcome {
            do {
                let frames =
                    [key.client]
                    + ClientProtocol.encodeReply(
                        .event, id: key.requestID, body: ClientProtocol.encodeWatchEvent(event))
                return try api.send(frames, dontWait: true) ? .done : .blocked
            } catch let error where error.isHostUnreachable {
                return .clientGone
            } catch {
                logger.error("sending a watch event failed", metadata: ["error": "\(error)"])
                return .clientGone
            }
        }

        if watch.ending {
            let body = ClientProtocol.encodeError(
                .lagged,
                "this watch fell behind the node's history and ended (its policy is to end on lag); watch again")
            do {
                return try api.send(
                    [key.client] + ClientProtocol.encodeReply(.error, id: key.requestID, body: body), dontWait: true)
                    ? .ended : .blocked
            } catch {
                return .clientGone
            }
        }
        if let reason = watch.pendingSnapshot {
            let (models, position) = node.channelSnapshot(watch.channel, ownPublished: published)
            var outcome = send(.snapshotBegin(reason))
            guard outcome == .done else { return outcome }
            var digest = RegisterDigest()
            var chunk: [(model: String, properties: [(String, ReplicaStore.Register)])] = []
            var inChunk = 0
            for (model, properties) in models {
                for (name, register) in properties {
                    digest.add(channel: watch.channel, model: model, property: name, register: register)
                }
                chunk.append((model, properties))
                inChunk += properties.count
                if inChunk >= Self.snapshotChunk {
                    outcome = send(.records(chunk))
                    guard outcome == .done else { return outcome }  // the whole snapshot is sent again
                    chunk = []
                    inChunk = 0
                }
            }
            if !chunk.isEmpty {
                outcome = send(.records(chunk))
                guard outcome == .done else { return outcome }
            }
            outcome = send(.snapshotEnd(records: digest.count, digest: digest.value, cursor: position.cursor))
            guard outcome == .done else { return outcome }
            watch.position = position
            watch.pendingSnapshot = nil
            watch.caughtUpSent = false
        }

        while true {
            let before = watch.position
            let (deltas, end, historyGone) = node.nextDeltas(
                channel: watch.channel, from: watch.position, ownPublished: published, limit: Self.pumpLimit)
            if historyGone {
                if watch.onLag == .end {
                    // Told once the client's queue takes it (it may be full now: that is the lag).
                    watch.ending = true
                    return pump(&watch, key: key, api: api, node: node, published: published, now: now)
                }
                watch.pendingSnapshot = .lagged
                return pump(&watch, key: key, api: api, node: node, published: published, now: now)
            }
            // Advance delta by delta, so a refusal resumes exactly where it stopped.
            var sent = before
            for (delta, after) in deltas {
                let outcome = send(.delta(delta, cursor: after.cursor))
                guard outcome == .done else {
                    watch.position = sent
                    return outcome
                }
                sent = after
            }
            watch.position = end
            if deltas.isEmpty && end.journalIndex == before.journalIndex { break }
        }
        // The first time the watch has everything (after its snapshot), then at most once per
        // interval: "nothing changed" is told apart from "not yet synced" without a marker per
        // delta.
        if !watch.caughtUpSent || now &- watch.lastMarker >= Self.markerInterval {
            let summary = node.progressSummary()
            let outcome = send(
                .caughtUp(cursor: watch.position.cursor, latest: summary.latest, missing: summary.missing))
            guard outcome == .done else { return outcome }
            watch.caughtUpSent = true
            watch.lastMarker = now
        }
        return .done
    }
}
