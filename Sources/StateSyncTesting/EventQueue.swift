/// A priority queue of timed items (a binary heap): the earliest first, and among items due at
/// the same time the one scheduled first — so a simulation's order never depends on anything
/// but its inputs.
struct EventQueue<Element> {
    private var heap: [(time: UInt64, order: UInt64, element: Element)] = []
    private var scheduled: UInt64 = 0

    var isEmpty: Bool { heap.isEmpty }
    var count: Int { heap.count }
    /// The time of the earliest item.
    var nextTime: UInt64? { heap.first?.time }

    mutating func schedule(_ element: Element, at time: UInt64) {
        heap.append((time, scheduled, element))
        scheduled += 1
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard Self.before(heap[child], heap[parent]) else { break }
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
            if left < heap.count, Self.before(heap[left], heap[smallest]) { smallest = left }
            if right < heap.count, Self.before(heap[right], heap[smallest]) { smallest = right }
            if smallest == parent { break }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
        return (first.time, first.element)
    }

    private static func before(
        _ a: (time: UInt64, order: UInt64, element: Element), _ b: (time: UInt64, order: UInt64, element: Element)
    ) -> Bool {
        a.time != b.time ? a.time < b.time : a.order < b.order
    }
}
