/// The state a node shares between its I/O thread and its API callers, kept behind one lock.
/// Pure data and transitions: no sockets, no threads.
struct NodeCore: Sendable {
    var store = ReplicaStore()
    var instances: [ModelAddress: InstanceReference] = [:]
    var origins: [String: OriginProgress] = [:]
    var history: [String: OriginHistory] = [:]
    /// Every recorded delta in this node's apply order: what watches follow.
    var journal = Journal()
    var peers: [String: PeerProgress] = [:]
    var counters = NodeCounters()
    /// How many deltas per origin are kept to serve repairs.
    var historyLimit = 100_000

    /// What this node has received of one origin's sequence numbers.
    struct OriginProgress: Sendable, Equatable {
        /// Every sequence number in 1...contiguous has been received.
        var contiguous: UInt64 = 0
        /// Received sequence numbers above `contiguous` (there is a gap below them).
        var above: Set<UInt64> = []
        /// The highest sequence number known to exist (from deltas and heartbeats).
        var announced: UInt64 = 0
        var incarnation: UInt64 = 0

        /// Records `sequence`; returns `false` when it was already received.
        mutating func receive(_ sequence: UInt64) -> Bool {
            if sequence <= contiguous || sequence == UInt64.max { return false }
            if sequence == contiguous + 1 {
                // The usual case, in order: no set to touch unless a gap is being closed.
                contiguous = sequence
                if !above.isEmpty { while above.remove(contiguous + 1) != nil { contiguous += 1 } }
            } else {
                guard above.insert(sequence).inserted else { return false }
            }
            announced = max(announced, sequence)
            return true
        }

        /// Records `sequence` like ``receive(_:)``; also says whether it opened the first gap.
        mutating func receiveNotingGap(_ sequence: UInt64) -> (isNew: Bool, openedGap: Bool) {
            let gapBefore = hasGap
            guard receive(sequence) else { return (false, false) }
            return (true, !gapBefore && hasGap)
        }

        /// Everything up to `sequence` is covered (by a snapshot that includes it).
        mutating func cover(through sequence: UInt64) {
            guard sequence > contiguous, sequence < UInt64.max else { return }
            contiguous = sequence
            above = above.filter { $0 > sequence }
            while above.remove(contiguous + 1) != nil { contiguous += 1 }
            announced = max(announced, sequence)
        }

        /// Whether some sequence number through `announced` is missing: O(1), for the per-delta
        /// path. (Numbers in `above` are never `contiguous + 1`, which is absorbed at once, so a
        /// number announced beyond `contiguous` always leaves one missing.)
        var hasGap: Bool { announced > contiguous }

        /// The first run of missing sequence numbers, if any.
        var firstGap: ClosedRange<UInt64>? {
            guard announced > contiguous else { return nil }
            let next = contiguous + 1
            let end = (above.min().map { $0 - 1 }) ?? announced
            return end >= next ? next...end : nil
        }
    }

    /// The order in which this node applied deltas, as (origin, sequence) references into the
    /// history, bounded like it.
    struct Journal: Sendable {
        struct Entry: Sendable {
            let delta: Delta
            var origin: String { delta.origin }
            var sequence: UInt64 { delta.sequence }
        }
        private(set) var entries: [Entry] = []
        /// The absolute position of `entries[0]`.
        private(set) var base = 0
        /// Per origin, the highest sequence number whose entry was dropped.
        private(set) var droppedThrough: [String: UInt64] = [:]

        var end: Int { base + entries.count }

        /// The journal keeps at least this many entries, whatever the history keeps: live watches
        /// follow it (a watch further behind gets a resync snapshot).
        static let minimumEntries = 16

        mutating func append(_ delta: Delta, limit: Int) {
            let limit = max(limit, Self.minimumEntries)
            entries.append(Entry(delta: delta))
            if entries.count > limit &+ limit / 8 {
                let drop = entries.count - limit
                // Runs of one origin are common: one dictionary update per run, not per entry.
                var origin = entries[0].origin
                var through: UInt64 = 0
                for entry in entries.prefix(drop) {
                    if entry.origin != origin {
                        droppedThrough[origin] = max(droppedThrough[origin] ?? 0, through)
                        origin = entry.origin
                        through = 0
                    }
                    through = max(through, entry.sequence)
                }
                droppedThrough[origin] = max(droppedThrough[origin] ?? 0, through)
                entries.removeFirst(drop)
                base += drop
            }
        }

        /// Marks the deltas of `origin` through `sequence` as not held (they came from a snapshot).
        mutating func markAbsent(origin: String, through sequence: UInt64) {
            droppedThrough[origin] = max(droppedThrough[origin] ?? 0, sequence)
        }

        /// The entry at absolute position `index`, if still held.
        func entry(at index: Int) -> Entry? {
            index >= base && index < end ? entries[index - base] : nil
        }
    }

    /// What this node has seen from one configured peer endpoint.
    struct PeerProgress: Sendable {
        var node: String?
        var lastMessageAt: UInt64?
        var deltasReceived = 0
        /// The peer's client API endpoint, from its heartbeats: where repairs are fetched.
        var api: String?
    }

    /// Records a delta's sequence number and keeps it for repairs. Returns `false` for a delta
    /// already received (applying it again would be harmless, but it is not logged twice).
    mutating func record(_ delta: Delta) -> Bool {
        record(run: CollectionOfOne(delta))[0]
    }

    /// Records a run of deltas of one origin like ``record(_:)``, with one look-up of the
    /// origin's progress and history for the whole run. Returns whether each was new.
    mutating func record<Run: Collection<Delta>>(run deltas: Run) -> [Bool] {
        guard let origin = deltas.first?.origin else { return [] }
        assert(deltas.allSatisfy { $0.origin == origin }, "a run is of one origin")
        // In place (no copy of the origin's set of received-above sequence numbers).
        let isNew = Self.record(
            deltas, progress: &origins[origin, default: OriginProgress()],
            history: &history[origin, default: OriginHistory()], historyLimit: historyLimit, counters: &counters)
        let (limit, overflow) = historyLimit.multipliedReportingOverflow(by: max(origins.count, 1))
        for (delta, new) in zip(deltas, isNew) where new {
            journal.append(delta, limit: overflow ? Int.max / 2 : limit)
        }
        return isNew
    }

    private static func record<Run: Collection<Delta>>(
        _ deltas: Run, progress: inout OriginProgress, history: inout OriginHistory, historyLimit: Int,
        counters: inout NodeCounters
    ) -> [Bool] {
        var isNew: [Bool] = []
        isNew.reserveCapacity(deltas.count)
        for delta in deltas {
            let (new, openedGap) = progress.receiveNotingGap(delta.sequence)
            isNew.append(new)
            guard new else {
                counters.duplicateDeltas += 1
                continue
            }
            if openedGap { counters.sequenceGaps += 1 }
            history.insert(delta, limit: historyLimit)
        }
        return isNew
    }

    /// The state now covers `origin` through `sequence` without the deltas themselves (a
    /// snapshot): neither repairs nor watch resumes can be served from history below it.
    mutating func coverWithoutHistory(origin: String, through sequence: UInt64) {
        origins[origin, default: OriginProgress()].cover(through: sequence)
        history[origin, default: OriginHistory()].drop(through: sequence)
        journal.markAbsent(origin: origin, through: sequence)
    }

    /// Records that `origin`'s deltas exist through `sequence` (a heartbeat or a peer's progress
    /// said so): a gap at the tail, with no later delta to reveal it, is counted like any other.
    mutating func announce(origin: String, through sequence: UInt64) {
        var progress = origins[origin, default: OriginProgress()]
        guard sequence > progress.announced else { return }
        let gapBefore = progress.hasGap
        progress.announced = sequence
        if !gapBefore, progress.hasGap { counters.sequenceGaps += 1 }
        origins[origin] = progress
    }

    /// The retained deltas of `origin` in `range`, and the lowest sequence number still held.
    func retained(origin: String, range: ClosedRange<UInt64>) -> (deltas: [Delta], droppedThrough: UInt64) {
        guard let history = history[origin] else { return ([], 0) }
        return (history.deltas(in: range), history.droppedThrough)
    }

    /// Sequence numbers known to exist but not received, over all origins (saturating: a peer's
    /// absurd announcement cannot overflow it).
    var missingDeltas: Int {
        var total: UInt64 = 0
        for progress in origins.values {
            let gap = progress.announced > progress.contiguous ? progress.announced - progress.contiguous : 0
            let missing = gap > UInt64(progress.above.count) ? gap - UInt64(progress.above.count) : 0
            total = total.addingReportingOverflow(missing).overflow ? .max : total + missing
        }
        return Int(clamping: total)
    }

    /// The live model instance at `address`, dropping the entry when it was deallocated.
    mutating func liveInstance(at address: ModelAddress) -> (any ReplicatedModel)? {
        guard let reference = instances[address] else { return nil }
        if let model = reference.model { return model }
        instances[address] = nil
        return nil
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

/// Local writes waiting for the I/O thread, in sequence order.
struct Outbox: Sendable {
    var nextSequence: UInt64 = 1
    var pending: [Delta] = []
    /// For each pending delta, the ``ModelRegistrar/instanceID`` of the model instance that made
    /// it, or 0 (a client's SET).
    var emitters: [UInt64] = []

    /// Gives `delta` the next sequence number and queues it.
    mutating func enqueue(address: ModelAddress, version: Version, writes: [PropertyWrite], emitter: UInt64 = 0) {
        pending.append(
            Delta(
                channel: address.channel, model: address.model, version: version, sequence: nextSequence,
                properties: writes))
        emitters.append(emitter)
        nextSequence += 1
    }

    /// Takes every pending delta with its emitter.
    mutating func takeAll() -> (deltas: [Delta], emitters: [UInt64]) {
        defer {
            pending = []
            emitters = []
        }
        return (pending, emitters)
    }

    var latestSequence: UInt64 { nextSequence - 1 }
}
