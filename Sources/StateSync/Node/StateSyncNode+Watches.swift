/// What the node's watches need from its shared state (docs/PROTOCOL.md, "Watches"): the deltas
/// of a channel in this node's apply order, snapshots, and progress.
extension StateSyncNode {
    /// Where a watch is: its position in this node's journal, and what it has been delivered, as
    /// a cursor (every sequence number through it) plus the numbers delivered above it.
    struct WatchPosition: Sendable {
        var journalIndex: Int
        var cursor: WatchCursor
        var above: [String: Set<UInt64>] = [:]

        /// Whether the delta of `origin`/`sequence` was already delivered.
        func covers(_ origin: String, _ sequence: UInt64) -> Bool {
            sequence <= cursor[origin] || above[origin]?.contains(sequence) == true
        }

        mutating func deliver(_ origin: String, _ sequence: UInt64) {
            if sequence == cursor[origin] + 1 {
                var position = sequence
                while above[origin]?.remove(position + 1) != nil { position += 1 }
                cursor[origin] = position
                if above[origin]?.isEmpty == true { above[origin] = nil }
            } else {
                above[origin, default: []].insert(sequence)
            }
        }
    }

    /// The next deltas of `channel` a watch at `position` must get, in this node's apply order, up
    /// to `limit`, with the position after each. Stops before this node's own deltas that are not
    /// yet durable. `historyGone` says the watch needs deltas the node no longer holds.
    func nextDeltas(
        channel: String, from position: WatchPosition, ownPublished: UInt64, limit: Int
    ) -> (deltas: [(Delta, WatchPosition)], end: WatchPosition, historyGone: Bool) {
        core.withLock { core in
            var position = position
            if position.journalIndex < core.journal.base {
                // Entries this watch has not passed were dropped: only those it still needs matter.
                let needed = core.journal.droppedThrough.contains { origin, through in
                    through > position.cursor[origin]
                        && !(position.cursor[origin] + 1...through).allSatisfy { position.covers(origin, $0) }
                }
                if needed { return ([], position, true) }
                position.journalIndex = core.journal.base
            }
            var deltas: [(Delta, WatchPosition)] = []
            while deltas.count < limit, let entry = core.journal.entry(at: position.journalIndex) {
                if entry.origin == configuration.nodeID && entry.sequence > ownPublished { break }
                position.journalIndex += 1
                if position.covers(entry.origin, entry.sequence) { continue }
                let delta = entry.delta
                position.deliver(entry.origin, entry.sequence)
                if delta.channel == channel { deltas.append((delta, position)) }
            }
            return (deltas, position, false)
        }
    }

    /// The registers of `channel` and the watch position they stand for.
    func channelSnapshot(_ channel: String, ownPublished: UInt64) -> (
        records: [(String, [(String, ReplicaStore.Register)])], position: WatchPosition
    ) {
        core.withLock { core in
            var position = WatchPosition(journalIndex: core.journal.end, cursor: WatchCursor())
            for (origin, progress) in core.origins {
                if origin == configuration.nodeID {
                    position.cursor[origin] = min(progress.contiguous, ownPublished)
                } else {
                    position.cursor[origin] = progress.contiguous
                    if !progress.above.isEmpty { position.above[origin] = progress.above }
                }
            }
            // Own deltas not yet durable are in the state but not in the cursor: the watch goes
            // through them again (harmless: a client ignores a delta it already holds).
            var index = core.journal.base
            while let entry = core.journal.entry(at: index) {
                if entry.origin == configuration.nodeID && entry.sequence > ownPublished {
                    position.journalIndex = index
                    break
                }
                index += 1
            }
            let models = core.store.models(in: channel).sorted().map { model in
                (
                    model,
                    core.store.properties(of: ModelAddress(channel: channel, model: model)).sorted { $0.key < $1.key }
                )
            }
            return (models, position)
        }
    }

    /// Where a watch resuming at `cursor` starts: the oldest retained journal entry (entries it
    /// already has are skipped), or `nil` when the node no longer holds deltas it needs.
    func resumePosition(after cursor: WatchCursor) -> WatchPosition? {
        core.withLock { core in
            // Every delta the cursor lacks must still be in the journal (not dropped, and not known
            // only through a snapshot) — also above a gap of the origin.
            for (origin, through) in core.journal.droppedThrough where through > cursor[origin] { return nil }
            return WatchPosition(journalIndex: core.journal.base, cursor: cursor)
        }
    }

    /// The current newest version and how many deltas the node itself is missing.
    func progressSummary() -> (latest: Version?, missing: Int) {
        core.withLock { core in
            (core.store.latestVersion == .zero ? nil : core.store.latestVersion, core.missingDeltas)
        }
    }
}
