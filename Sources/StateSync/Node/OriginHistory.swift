/// The retained deltas of one origin, kept to serve repairs: a window over the origin's last
/// `limit` sequence numbers, indexed by sequence number.
///
/// Deltas arrive mostly in sequence order, so the window is a contiguous array whose slot `i`
/// holds sequence number `droppedThrough + 1 + i` (`nil` while it has not been received). An
/// insert is O(1) amortised: no hashing, no sorting, no copy of the retained deltas when the
/// window slides (the front is cut in bulk once a fraction of the array is dead).
struct OriginHistory: Sendable {
    /// Sequence numbers at or below this are not held (dropped to bound memory, or covered by a
    /// snapshot without the deltas themselves).
    private(set) var droppedThrough: UInt64 = 0
    /// `slots[head + i]` holds sequence number `droppedThrough + 1 + i`.
    private var slots: [Delta?] = []
    private var head = 0

    /// Sequence numbers held in the window (received or not).
    var windowCount: Int { slots.count - head }

    /// The number of deltas held.
    var count: Int { slots[head...].lazy.filter { $0 != nil }.count }

    /// Keeps `delta`, sliding the window so it spans at most `limit` sequence numbers ending at
    /// the highest one seen. A delta below the window is not kept (it was dropped already).
    mutating func insert(_ delta: Delta, limit: Int) {
        let sequence = delta.sequence
        guard limit > 0 else {
            drop(through: sequence)
            return
        }
        guard sequence > droppedThrough else { return }
        if sequence - droppedThrough > UInt64(limit) { drop(through: sequence - UInt64(limit)) }
        let index = head + Int(sequence - droppedThrough - 1)
        if index < slots.count {
            slots[index] = delta
        } else {
            while slots.count < index { slots.append(nil) }
            slots.append(delta)
        }
    }

    /// Drops every delta at or below `sequence`.
    mutating func drop(through sequence: UInt64) {
        guard sequence > droppedThrough else { return }
        let shift = sequence - droppedThrough
        droppedThrough = sequence
        if shift >= UInt64(windowCount) {
            slots.removeAll(keepingCapacity: true)
            head = 0
            return
        }
        for index in head..<(head + Int(shift)) { slots[index] = nil }  // release them now
        head += Int(shift)
        // Cut the dead front once it is most of the array: amortised O(1) per insert.
        if head >= 1024, head >= slots.count / 2 {
            slots.removeFirst(head)
            head = 0
        }
    }

    /// The delta with `sequence`, if held.
    subscript(sequence: UInt64) -> Delta? {
        guard sequence > droppedThrough, sequence - droppedThrough <= UInt64(windowCount) else { return nil }
        return slots[head + Int(sequence - droppedThrough - 1)]
    }

    /// The held deltas in `range`, in sequence order.
    func deltas(in range: ClosedRange<UInt64>) -> [Delta] {
        guard windowCount > 0 else { return [] }
        let lower = max(range.lowerBound, droppedThrough + 1)
        let upper = min(range.upperBound, droppedThrough + UInt64(windowCount))
        guard lower <= upper else { return [] }
        let start = head + Int(lower - droppedThrough - 1)
        let end = head + Int(upper - droppedThrough - 1)
        return slots[start...end].compactMap { $0 }
    }
}
