/// The retained deltas of one origin, kept to serve repairs: those among the origin's last
/// `limit` sequence numbers.
///
/// Deltas arrive mostly in sequence order, so they are kept in a window of slots indexed by
/// sequence number (the `i`th slot of the window holds sequence number `base + i`, `nil` while not
/// received): an insert is O(1) amortised, with no hashing. The window lies in a ring buffer, so
/// sliding it (one delta in, the oldest out) moves no other slot: it was an array whose dead front
/// was cut with a `memmove` of the whole window every so many inserts, and each insert appended a
/// slot before it stored (issue #17). Memory stays proportional to the deltas held, not to how far
/// apart their sequence numbers are: when an insert would leave the window mostly empty (a peer
/// announcing sequence number 10⁹, a far jump after a long gap), the history switches to a
/// dictionary by sequence number, and back once the deltas are dense again.
struct OriginHistory: Sendable {
    /// Sequence numbers at or below this are not held (dropped to bound memory, or covered by a
    /// snapshot without the deltas themselves).
    private(set) var droppedThrough: UInt64 = 0
    /// The ring: `ring.count` is zero or a power of two; the window's `i`th slot is
    /// `ring[(start + i) & mask]`, and every slot outside the window is `nil`.
    private var ring: [Delta?] = []
    private var start = 0
    /// The window's slots (received or not), from `base`.
    private var window = 0
    /// The sequence number of the window's first slot (meaningless while the window is empty).
    private var base: UInt64 = 0
    /// Non-`nil` slots.
    private var held = 0
    /// The deltas, while they are too sparse for the window.
    private var sparse: [UInt64: Delta]?
    private var insertsUntilDensityCheck = 0

    private var mask: Int { ring.count &- 1 }

    /// The number of deltas held.
    var count: Int { sparse?.count ?? held }

    /// Slots of the window (for tests: memory follows the deltas held; the ring holds at most
    /// twice as many, rounded up to a power of two).
    var slotCount: Int { sparse == nil ? window : sparse!.count }

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
            if case .none = ring[slot] { held += 1 }  // (`== nil` would compare deltas)
            ring[slot] = delta
        } else {
            var deltas = dictionaryOfHeld()
            deltas[sequence] = delta
            sparse = deltas
            ring = []
            start = 0
            window = 0
            held = 0
            insertsUntilDensityCheck = deltas.count
        }
    }

    /// The ring slot that holds `sequence`, the window grown to cover it; `nil` (changing
    /// nothing) when that would make it too sparse.
    private mutating func denseSlot(for sequence: UInt64) -> Int? {
        if window == 0 {
            if ring.isEmpty { ring = [Delta?](repeating: nil, count: Self.smallestRing) }
            start = 0
            base = sequence
            window = 1
            held = 0
            return 0
        }
        if sequence >= base {
            let offset = sequence - base
            if offset < UInt64(window) { return (start &+ Int(offset)) & mask }
            let newWindow = offset + 1
            guard newWindow <= UInt64(Int.max / 2), denseEnough(slots: Int(newWindow), deltas: held + 1) else {
                return nil
            }
            if Int(newWindow) > ring.count { grow(toHold: Int(newWindow)) }
            window = Int(newWindow)
            return (start &+ Int(offset)) & mask
        }
        // Below the window (a repair filling a gap): extend it downwards.
        let extra = base - sequence
        guard extra <= UInt64(Int.max / 4), denseEnough(slots: window + Int(extra), deltas: held + 1) else {
            return nil
        }
        if window + Int(extra) > ring.count { grow(toHold: window + Int(extra)) }
        start = (start &- Int(extra)) & mask
        base = sequence
        window += Int(extra)
        return start
    }

    /// The ring's size when it is first needed.
    private static let smallestRing = 16
    /// The largest ring kept when everything is dropped.
    private static let largestKeptEmptyRing = 1024

    /// The smallest power of two, `from` or above, that is at least `slots`.
    private static func ringSize(toHold slots: Int, from size: Int = smallestRing) -> Int {
        var size = max(size, smallestRing)
        while size < slots { size *= 2 }
        return size
    }

    /// A ring of at least `slots` slots (a power of two), the window moved to its front.
    private mutating func grow(toHold slots: Int) {
        var larger = [Delta?](repeating: nil, count: Self.ringSize(toHold: slots, from: ring.count))
        for index in 0..<window { larger[index] = ring[(start &+ index) & mask].take() }
        ring = larger
        start = 0
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
        guard window > 0, sequence >= base else { return }
        let cut = sequence - base + 1
        if cut >= UInt64(window) {
            // All of it: a ring far larger than the window usually needs is let go (a snapshot
            // covered a long history), else kept for the deltas to come.
            if ring.count > Self.largestKeptEmptyRing {
                ring = []
            } else {
                for index in 0..<window { ring[(start &+ index) & mask] = nil }
            }
            start = 0
            window = 0
            held = 0
            return
        }
        for index in 0..<Int(cut) {
            let slot = (start &+ index) & mask
            guard case .some = ring[slot] else { continue }
            ring[slot] = nil  // release it now
            held -= 1
        }
        start = (start &+ Int(cut)) & mask
        base = sequence + 1
        window -= Int(cut)
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
        var dense = [Delta?](repeating: nil, count: Self.ringSize(toHold: Int(span)))
        for (sequence, delta) in deltas { dense[Int(sequence - low)] = delta }
        ring = dense
        start = 0
        window = Int(span)
        base = low
        held = deltas.count
        sparse = nil
    }

    private func dictionaryOfHeld() -> [UInt64: Delta] {
        var deltas: [UInt64: Delta] = [:]
        deltas.reserveCapacity(held + 1)
        for index in 0..<window {
            if let delta = ring[(start &+ index) & mask] { deltas[base + UInt64(index)] = delta }
        }
        return deltas
    }

    /// The delta with `sequence`, if held.
    subscript(sequence: UInt64) -> Delta? {
        guard sequence > droppedThrough else { return nil }
        if let sparse { return sparse[sequence] }
        guard window > 0, sequence >= base, sequence - base < UInt64(window) else { return nil }
        return ring[(start &+ Int(sequence - base)) & mask]
    }

    /// The held deltas in `range`, in sequence order.
    func deltas(in range: ClosedRange<UInt64>) -> [Delta] {
        let lower = max(range.lowerBound, droppedThrough + 1)
        guard lower <= range.upperBound else { return [] }
        if let sparse {
            return sparse.values.filter { $0.sequence >= lower && $0.sequence <= range.upperBound }
                .sorted { $0.sequence < $1.sequence }
        }
        guard window > 0 else { return [] }
        let first = max(lower, base)
        let last = min(range.upperBound, base + UInt64(window) - 1)
        guard first <= last else { return [] }
        return (Int(first - base)...Int(last - base)).compactMap { ring[(start &+ $0) & mask] }
    }
}
