/// A priority queue of timed items (a binary heap): the earliest first, and among items due at
/// the same time the one scheduled first — so a simulation's order never depends on anything
/// but its inputs.
///
/// The heap orders small keys; the items wait in a slab beside it, so sifting never copies
/// (or retains) an item.
struct EventQueue<Element> {
    private struct Key {
        let time: UInt64
        let order: UInt64
        let slot: Int

        func before(_ other: Key) -> Bool {
            time != other.time ? time < other.time : order < other.order
        }
    }

    private var heap: [Key] = []
    private var slab: [Element?] = []
    private var free: [Int] = []
    private var scheduled: UInt64 = 0

    var isEmpty: Bool { heap.isEmpty }
    var count: Int { heap.count }
    /// The time of the earliest item.
    var nextTime: UInt64? { heap.first?.time }

    mutating func schedule(_ element: Element, at time: UInt64) {
        let slot: Int
        if let reused = free.popLast() {
            slot = reused
            slab[slot] = element
        } else {
            slot = slab.count
            slab.append(element)
        }
        heap.append(Key(time: time, order: scheduled, slot: slot))
        scheduled += 1
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].before(heap[parent]) else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    /// Removes and returns the earliest item.
    mutating func pop() -> (time: UInt64, element: Element)? {
        guard !heap.isEmpty else { return nil }
        heap.swapAt(0, heap.count - 1)
        let first = heap.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < heap.count, heap[left].before(heap[smallest]) { smallest = left }
            if right < heap.count, heap[right].before(heap[smallest]) { smallest = right }
            if smallest == parent { break }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
        let element = slab[first.slot].take()!
        free.append(first.slot)
        return (first.time, element)
    }
}
