/// What this node has received of one origin's sequence numbers.
struct OriginProgress: Sendable, Equatable {
    /// Every sequence number in 1...contiguous has been received.
    var contiguous: UInt64 = 0
    /// Received sequence numbers above `contiguous` (there is a gap below them), as runs.
    var above = SequenceRuns()
    /// The highest sequence number known to exist (from deltas and heartbeats).
    var announced: UInt64 = 0
    var incarnation: UInt64 = 0

    /// Records `sequence`; returns `false` when it was already received.
    mutating func receive(_ sequence: UInt64) -> Bool {
        if sequence <= contiguous || sequence == UInt64.max { return false }
        if sequence == contiguous + 1 {
            // The usual case, in order: no set to touch unless a gap is being closed.
            contiguous = sequence
            if !above.isEmpty, let end = above.removeRun(startingAt: contiguous + 1) { contiguous = end }
        } else {
            guard above.insert(sequence) else { return false }
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
        above.removeAll(through: sequence)
        if let end = above.removeRun(startingAt: contiguous + 1) { contiguous = end }
        announced = max(announced, sequence)
    }

    /// Whether some sequence number through `announced` is missing: O(1), for the per-delta
    /// path. (Numbers in `above` are never `contiguous + 1`, which is absorbed at once, so a
    /// number announced beyond `contiguous` always leaves one missing.)
    var hasGap: Bool { announced > contiguous }

    /// Whether `sequence` has been received.
    func holds(_ sequence: UInt64) -> Bool { sequence <= contiguous || above.contains(sequence) }

    /// The highest sequence number received.
    var highestReceived: UInt64 { max(contiguous, above.highest ?? 0) }

    /// How many sequence numbers through `announced` are missing.
    var missing: UInt64 {
        let gap = announced > contiguous ? announced - contiguous : 0
        return gap > above.count ? gap - above.count : 0
    }

    /// The first run of missing sequence numbers, if any.
    var firstGap: ClosedRange<UInt64>? {
        guard announced > contiguous else { return nil }
        let next = contiguous + 1
        let end = above.lowest.map { $0 - 1 } ?? announced
        return end >= next ? next...end : nil
    }
}
