/// Registers ordered by a time: the values written with a time to live by when they expire, the
/// deletions by their version (for collection). A binary min-heap.
///
/// Entries are not removed when their register changes (a later write replaces the value, a
/// deletion removes it): whoever pops an entry checks that the register still holds the version
/// it names. So a push costs O(log n) and nothing else does work on the write path.
///
/// Thread safety: none; its owner serialises access.
struct TimedQueue: Sendable {
    /// One register: when it is due, where it is and the version that wrote it.
    struct Entry: Sendable, Equatable {
        let time: UInt64
        let channel: String
        let model: String
        /// Empty for the deletion of the model.
        let property: String
        let version: Version

        /// Earlier first; equal times by address, so every replica takes them in one order.
        func precedes(_ other: Entry) -> Bool {
            if time != other.time { return time < other.time }
            if channel != other.channel { return channel.utf8.lexicographicallyPrecedes(other.channel.utf8) }
            if model != other.model { return model.utf8.lexicographicallyPrecedes(other.model.utf8) }
            return property.utf8.lexicographicallyPrecedes(other.property.utf8)
        }
    }

    private var heap: [Entry] = []

    /// How many entries wait (including those whose register changed since).
    var count: Int { heap.count }

    /// When the earliest entry is due.
    var earliest: UInt64? { heap.first?.time }

    mutating func push(_ entry: Entry) {
        heap.append(entry)
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].precedes(heap[parent]) else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    /// Removes and returns the earliest entry if it is due at or before `now`.
    mutating func popDue(through now: UInt64) -> Entry? {
        guard let first = heap.first, first.time <= now else { return nil }
        let last = heap.removeLast()
        guard !heap.isEmpty else { return first }
        heap[0] = last
        var parent = 0
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < heap.count, heap[left].precedes(heap[smallest]) { smallest = left }
            if right < heap.count, heap[right].precedes(heap[smallest]) { smallest = right }
            if smallest == parent { break }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
        return first
    }
}
