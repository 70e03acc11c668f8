/// The retained deltas of one origin, kept to serve repairs: those among the origin's last
/// `limit` sequence numbers.
///
/// Deltas arrive mostly in sequence order, so they are kept in a contiguous array indexed by
/// sequence number (slot `head + i` holds sequence number `base + i`, `nil` while not received):
/// an insert is O(1) amortised, with no hashing. Memory stays proportional to the deltas held,
/// not to how far apart their sequence numbers are: when an insert would leave the array mostly
/// empty (a peer announcing sequence number 10⁹, a far jump after a long gap), the history
/// switches to a dictionary by sequence number, and back once the deltas are dense again.
struct OriginHistory: Sendable {
    /// Sequence numbers at or below this are not held (dropped to bound memory, or covered by a
    /// snapshot without the deltas themselves).
    private(set) var droppedThrough: UInt64 = 0
    private var slots: [Delta?] = []
    /// Slots before `head` are free (`nil`): room to cut, or to extend the window downwards.
    private var head = 0
    /// The sequence number of `slots[head]` (meaningless while the window is empty).
    private var base: UInt64 = 0
    /// Non-`nil` slots.
    private var held = 0
    /// The deltas, while they are too sparse for the array.
    private var sparse: [UInt64: Delta]?
    private var insertsUntilDensityCheck = 0

    /// The number of deltas held.
    var count: Int { sparse?.count ?? held }

    /// Slots allocated to the window (for tests: memory follows the deltas held).
    var slotCount: Int { sparse == nil ? slots.count - head : sparse!.count }

    private var windowCount: Int { slots.count - head }

    /// At most this many slots per delta held (plus a constant): past it, a dictionary.
    private func denseEnough(slots: Int, deltas: Int) -> Bool { slots <= 4 * deltas + 4096 }

    /// Keeps `delta`, first sliding the window so it spans at most `limit` sequence numbers
    /// ending at `delta`'s. A delta at or below the window is not kept (it was dropped already).
    /// (`consuming`: the caller's copy is stored, not copied again: a copy is an atomic
    /// reference count, and a borrowed delta cost one more and its release per delta.)
    mutating func insert(_ delta: consuming Delta, limit: Int) {
        let sequence = delta.sequence
        guard limit > 0 else {
            drop(through: sequence)
            return
        }
        guard sequence > droppedThrough else { return }
        if sequence - droppedThrough > UInt64(limit) { drop(through: sequence - UInt64(limit)) }
        if sparse != nil {
            sparse![sequence] = delta
            checkDensity()
        } else if let slot = denseSlot(for: sequence) {
            if case .none = slots[slot] { held += 1 }  // (`== nil` would compare deltas)
            slots[slot] = delta
        } else {
            var deltas = dictionaryOfHeld()
            deltas[sequence] = delta
            sparse = deltas
            slots = []
            head = 0
            held = 0
            insertsUntilDensityCheck = deltas.count
        }
    }

    /// The slot of the array that holds `sequence`, the window grown to cover it; `nil`
    /// (changing nothing) when that would make it too sparse.
    private mutating func denseSlot(for sequence: UInt64) -> Int? {
        if windowCount == 0 {
            slots.removeAll(keepingCapacity: true)
            head = 0
            base = sequence
            held = 0
            slots.append(nil)
            return 0
        }
        if sequence >= base {
            let offset = sequence - base
            if offset < UInt64(windowCount) { return head + Int(offset) }
            let newCount = offset + 1
            guard newCount <= UInt64(Int.max / 2), denseEnough(slots: Int(newCount), deltas: held + 1) else {
                return nil
            }
            while slots.count - head <= Int(offset) { slots.append(nil) }
            return head + Int(offset)
        }
        // Below the window (a repair filling a gap): extend it downwards, into the free front
        // slots when there are enough, else reallocating with as much room again in front.
        let extra = base - sequence
        guard extra <= UInt64(Int.max / 4), denseEnough(slots: windowCount + Int(extra), deltas: held + 1) else {
            return nil
        }
        if Int(extra) > head {
            let room = Int(extra) + windowCount
            slots = [Delta?](repeating: nil, count: room) + slots[head...]
            head = room
        }
        head -= Int(extra)
        base = sequence
        return head
    }

    /// Drops every delta at or below `sequence`.
    mutating func drop(through sequence: UInt64) {
        guard sequence > droppedThrough else { return }
        let passed = sequence - droppedThrough
        let previous = droppedThrough
        droppedThrough = sequence
        if sparse != nil {
            // Key by key when the window moved less than the deltas held, else one filter:
            // O(1) amortised either way.
            if passed <= UInt64(sparse!.count) {
                for dropped in (previous + 1)...sequence { sparse!.removeValue(forKey: dropped) }
            } else {
                sparse = sparse!.filter { $0.key > sequence }
            }
            checkDensity()
            return
        }
        guard windowCount > 0, sequence >= base else { return }
        let cut = sequence - base + 1
        if cut >= UInt64(windowCount) {
            slots.removeAll(keepingCapacity: true)
            head = 0
            held = 0
            return
        }
        for index in head..<(head + Int(cut)) {
            guard case .some = slots[index] else { continue }
            slots[index] = nil  // release it now
            held -= 1
        }
        head += Int(cut)
        base = sequence + 1
        // Cut the dead front once it is most of the array: amortised O(1) per insert.
        if head >= 1024, head >= slots.count / 2 {
            slots.removeFirst(head)
            head = 0
        }
    }

    /// Back to the array once the sparse deltas are dense enough (checked after as many
    /// changes as deltas held: amortised O(1)).
    private mutating func checkDensity() {
        guard let deltas = sparse else { return }
        insertsUntilDensityCheck -= 1
        guard insertsUntilDensityCheck <= 0 else { return }
        insertsUntilDensityCheck = max(deltas.count, 64)
        guard let low = deltas.keys.min(), let high = deltas.keys.max() else {
            sparse = nil
            return
        }
        let span = high - low + 1
        guard span <= UInt64(Int.max / 2), denseEnough(slots: Int(span), deltas: deltas.count) else { return }
        var dense = [Delta?](repeating: nil, count: Int(span))
        for (sequence, delta) in deltas { dense[Int(sequence - low)] = delta }
        slots = dense
        head = 0
        base = low
        held = deltas.count
        sparse = nil
    }

    private func dictionaryOfHeld() -> [UInt64: Delta] {
        var deltas: [UInt64: Delta] = [:]
        deltas.reserveCapacity(held + 1)
        for index in head..<slots.count {
            if let delta = slots[index] { deltas[base + UInt64(index - head)] = delta }
        }
        return deltas
    }

    /// The delta with `sequence`, if held.
    subscript(sequence: UInt64) -> Delta? {
        guard sequence > droppedThrough else { return nil }
        if let sparse { return sparse[sequence] }
        guard windowCount > 0, sequence >= base, sequence - base < UInt64(windowCount) else { return nil }
        return slots[head + Int(sequence - base)]
    }

    /// The held deltas in `range`, in sequence order.
    func deltas(in range: ClosedRange<UInt64>) -> [Delta] {
        let lower = max(range.lowerBound, droppedThrough + 1)
        guard lower <= range.upperBound else { return [] }
        if let sparse {
            return sparse.values.filter { $0.sequence >= lower && $0.sequence <= range.upperBound }
                .sorted { $0.sequence < $1.sequence }
        }
        guard windowCount > 0 else { return [] }
        let first = max(lower, base)
        let last = min(range.upperBound, base + UInt64(windowCount) - 1)
        guard first <= last else { return [] }
        return slots[(head + Int(first - base))...(head + Int(last - base))].compactMap { $0 }
    }
}
