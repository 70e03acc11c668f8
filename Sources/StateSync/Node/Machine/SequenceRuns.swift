/// A set of sequence numbers kept as runs: sorted, disjoint ranges with at least one number
/// missing between any two of them.
///
/// What a node receives above a gap, and what a watch is delivered above its cursor, mostly
/// arrives in order: one run, however many numbers it holds. A set of the numbers themselves grew
/// by one entry per delta for as long as the gap stayed open (a partition healed while the live
/// stream goes on: every delta until repair reaches it), and finding its lowest or highest number
/// walked all of them (docs/PROTOCOL.md section 11.5, item 2). Runs cost memory per gap, not per
/// number. The usual changes are O(1): the next number of the last run, and taking the first run
/// away (repair fills gaps from the lowest up, and each filled gap hands its run to the
/// contiguous mark); look-ups are a binary search.
///
/// Not a `Sequence` on purpose: `min()`, `sorted()` or `filter` would walk every number of every
/// run. ``numbers`` walks them when that is meant.
struct SequenceRuns: Sendable, Equatable, ExpressibleByArrayLiteral {
    /// The runs from `head` on are the set's: sorted, disjoint and never adjacent
    /// (`upperBound + 1 < ` the next one's `lowerBound`). Those before `head` were taken away;
    /// they are dropped once they are half the storage, so taking the first run does not move
    /// the others every time.
    private var storage: [ClosedRange<UInt64>] = []
    private var head = 0
    /// How many numbers the runs hold.
    private(set) var count: UInt64 = 0

    init() {}

    init(arrayLiteral elements: UInt64...) { self.init(elements) }

    init(_ elements: some Sequence<UInt64>) {
        for element in elements { insert(element) }
    }

    /// The runs, lowest first.
    var runs: ArraySlice<ClosedRange<UInt64>> { storage[head...] }

    /// The numbers, in ascending order.
    var numbers: FlattenSequence<ArraySlice<ClosedRange<UInt64>>> { runs.joined() }

    var isEmpty: Bool { head == storage.count }

    /// The lowest number held.
    var lowest: UInt64? { isEmpty ? nil : storage[head].lowerBound }

    /// The highest number held.
    var highest: UInt64? { isEmpty ? nil : storage[storage.count - 1].upperBound }

    static func == (left: SequenceRuns, right: SequenceRuns) -> Bool { left.runs == right.runs }

    /// The index of the first run that reaches `value` (whose upper bound is at least `value`),
    /// or `storage.count` when none does.
    private func firstRun(reaching value: UInt64) -> Int {
        var low = head
        var high = storage.count
        while low < high {
            let middle = low + (high - low) / 2
            if storage[middle].upperBound < value { low = middle + 1 } else { high = middle }
        }
        return low
    }

    func contains(_ value: UInt64) -> Bool {
        guard let highest, value <= highest else { return false }
        return storage[firstRun(reaching: value)].lowerBound <= value
    }

    /// The lowest number at or above `value` that is not held (`UInt64.max` when every number
    /// from `value` up is).
    func firstAbsent(from value: UInt64) -> UInt64 {
        guard let highest, value <= highest else { return value }
        let run = storage[firstRun(reaching: value)]
        guard run.lowerBound <= value else { return value }
        return run.upperBound == .max ? .max : run.upperBound + 1
    }

    /// Adds `value`; returns `false` when it was held already.
    @discardableResult
    mutating func insert(_ value: UInt64) -> Bool {
        guard let highest else {
            storage.append(value...value)  // (empty storage: `dropFirst` empties it with the set)
            count = 1
            return true
        }
        if value > highest {
            // The usual case: the next number, or a new run above the last.
            if value == highest + 1 {
                storage[storage.count - 1] = storage[storage.count - 1].lowerBound...value
            } else {
                storage.append(value...value)
            }
            count += 1
            return true
        }
        let index = firstRun(reaching: value)  // exists: `value` is at most the highest
        if storage[index].lowerBound <= value { return false }
        // Below storage[index] (so `value + 1` cannot overflow) and above the run before it.
        let joinsNext = value + 1 == storage[index].lowerBound
        let joinsPrevious = index > head && storage[index - 1].upperBound + 1 == value
        switch (joinsPrevious, joinsNext) {
        case (true, true):
            storage[index - 1] = storage[index - 1].lowerBound...storage[index].upperBound
            storage.remove(at: index)
        case (true, false): storage[index - 1] = storage[index - 1].lowerBound...value
        case (false, true): storage[index] = value...storage[index].upperBound
        case (false, false):
            if index == head && head > 0 {
                // Below every run, with room before them: no run moves.
                head -= 1
                storage[head] = value...value
            } else {
                storage.insert(value...value, at: index)
            }
        }
        count += 1
        return true
    }

    /// Removes the first run when it starts at `value`, and returns its highest number: what a
    /// contiguous mark that just reached `value - 1` takes in at once. (Runs are never adjacent,
    /// so the number after it is not held.)
    mutating func removeRun(startingAt value: UInt64) -> UInt64? {
        guard !isEmpty, storage[head].lowerBound == value else { return nil }
        let first = storage[head]
        count -= Self.size(of: first)
        dropFirst(1)
        return first.upperBound
    }

    /// Removes every number up to and including `value`.
    mutating func removeAll(through value: UInt64) {
        guard let lowest, lowest <= value else { return }
        let index = firstRun(reaching: value)
        for run in storage[head..<index] { count -= Self.size(of: run) }
        dropFirst(index - head)
        if !isEmpty, storage[head].lowerBound <= value {
            let first = storage[head]
            count -= value - first.lowerBound + 1
            if first.upperBound == value { dropFirst(1) } else { storage[head] = (value + 1)...first.upperBound }
        }
    }

    /// Takes the first `runs` runs away.
    private mutating func dropFirst(_ runs: Int) {
        head += runs
        if head == storage.count {
            storage.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 64 && head * 2 >= storage.count {
            storage.removeFirst(head)
            head = 0
        }
    }

    /// How many numbers `run` holds (sequence numbers never span all of `UInt64`).
    private static func size(of run: ClosedRange<UInt64>) -> UInt64 { run.upperBound - run.lowerBound + 1 }
}
