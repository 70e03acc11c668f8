import Testing

@testable import StateSync

@Suite("Per-origin history kept for repairs")
struct OriginHistoryTests {
    static func delta(_ sequence: UInt64) -> Delta {
        Delta(
            channel: "c", model: "m", version: Version(milliseconds: sequence, counter: 0, node: "n1"),
            sequence: sequence, properties: [PropertyWrite(name: "p", value: .int(Int64(truncatingIfNeeded: sequence)))]
        )
    }

    @Test func inOrderInsertsKeepTheLastLimitSequenceNumbers() {
        var history = OriginHistory()
        for sequence in UInt64(1)...10_000 { history.insert(Self.delta(sequence), limit: 3_000) }
        #expect(history.droppedThrough == 7_000)
        #expect(history.count == 3_000)
        #expect(history[7_000] == nil)
        #expect(history[7_001] == Self.delta(7_001))
        #expect(history[10_000] == Self.delta(10_000))
        #expect(history.deltas(in: 6_990...7_010).map(\.sequence) == Array(7_001...7_010))
    }

    @Test func gapsAreEmptySlotsAndFillLater() {
        var history = OriginHistory()
        for sequence: UInt64 in [1, 2, 5, 9] { history.insert(Self.delta(sequence), limit: 100) }
        #expect(history.deltas(in: 1...9).map(\.sequence) == [1, 2, 5, 9])
        history.insert(Self.delta(4), limit: 100)
        #expect(history.deltas(in: 3...6).map(\.sequence) == [4, 5])
        #expect(history[3] == nil)
    }

    @Test func aJumpFarAheadDropsEverythingBelowTheNewWindow() {
        var history = OriginHistory()
        for sequence in UInt64(1)...50 { history.insert(Self.delta(sequence), limit: 100) }
        history.insert(Self.delta(1_000_000), limit: 100)
        #expect(history.droppedThrough == 999_900)
        #expect(history.count == 1)
        // Late arrivals below the window are not kept.
        history.insert(Self.delta(60), limit: 100)
        #expect(history[60] == nil)
        // A huge window holds what arrived, nothing more: memory follows the deltas held.
        var sparse = OriginHistory()
        sparse.insert(Self.delta(1), limit: 100_000_000)
        sparse.insert(Self.delta(90_000_000), limit: 100_000_000)
        #expect(sparse.count == 2 && sparse.droppedThrough == 0)
        #expect(sparse.slotCount <= 2 * 4 + 4096, "no window of empty slots between 1 and 90,000,000")
        #expect(sparse.deltas(in: 1...UInt64.max - 1).map(\.sequence) == [1, 90_000_000])
        sparse.insert(Self.delta(UInt64.max - 1), limit: 100_000_000)
        #expect(sparse.count == 1 && sparse.droppedThrough == UInt64.max - 1 - 100_000_000)
    }

    /// A node that first hears an origin at sequence 5,000,000 and then repairs what came
    /// before, in ascending or descending order, keeps all of it; dense again once it is.
    @Test(arguments: [true, false])
    func repairsBelowTheFirstDeltaAreKept(ascending: Bool) {
        var history = OriginHistory()
        history.insert(Self.delta(5_000_000), limit: 100_000)
        let repaired = Array(UInt64(4_990_000)..<5_000_000)
        for sequence in ascending ? repaired : repaired.reversed() {
            history.insert(Self.delta(sequence), limit: 100_000)
        }
        #expect(history.count == 10_001)
        #expect(history.deltas(in: 4_989_999...5_000_000).map(\.sequence) == Array(4_990_000...5_000_000))
        #expect(history.slotCount <= 4 * 10_001 + 4096)
        for sequence in UInt64(5_000_001)...5_000_100 { history.insert(Self.delta(sequence), limit: 100_000) }
        #expect(history[5_000_100] == Self.delta(5_000_100) && history[4_990_000] == Self.delta(4_990_000))
    }

    /// The window slides around its ring many times; slots are found by sequence number across
    /// the wrap, also when a repair extends the window downwards past the ring's first slot.
    @Test func theWindowWrapsAroundItsRing() {
        var history = OriginHistory()
        for sequence in UInt64(1)...1_000 where !sequence.isMultiple(of: 3) {
            history.insert(Self.delta(sequence), limit: 20)
        }
        #expect(history.droppedThrough == 980)
        #expect(history.deltas(in: 1...1_000).map(\.sequence) == (981...1_000).filter { !$0.isMultiple(of: 3) })
        for sequence in (981...1_000).reversed() where sequence.isMultiple(of: 3) {
            history.insert(Self.delta(UInt64(sequence)), limit: 20)
        }
        #expect(history.count == 20)
        for sequence in UInt64(981)...1_000 { #expect(history[sequence]?.sequence == sequence) }
        // Dropped to a window starting mid-ring, then repaired from below it.
        history.drop(through: 990)
        var fresh = OriginHistory()
        for sequence in UInt64(1)...37 { fresh.insert(Self.delta(sequence), limit: 1_000) }
        fresh.drop(through: 30)
        for sequence in UInt64(41)...44 { fresh.insert(Self.delta(sequence), limit: 1_000) }
        #expect(fresh.deltas(in: 1...100).map(\.sequence) == Array(31...37) + Array(41...44))
        for sequence in (UInt64(38)...40).reversed() { fresh.insert(Self.delta(sequence), limit: 1_000) }
        for sequence in UInt64(31)...44 { #expect(fresh[sequence] == Self.delta(sequence)) }
        #expect(history.deltas(in: 1...1_000).map(\.sequence) == Array(991...1_000))
        // The first delta in the ring's first slot; repairs below it take the ring's last slots.
        var repaired = OriginHistory()
        for sequence in (UInt64(80)...100).reversed() { repaired.insert(Self.delta(sequence), limit: 1_000) }
        for sequence in UInt64(101)...110 { repaired.insert(Self.delta(sequence), limit: 1_000) }
        for sequence in UInt64(80)...110 { #expect(repaired[sequence] == Self.delta(sequence)) }
        #expect(repaired.deltas(in: 1...200).map(\.sequence) == Array(80...110))
    }

    @Test func dropThroughCoversASnapshot() {
        var history = OriginHistory()
        for sequence in UInt64(1)...20 { history.insert(Self.delta(sequence), limit: 100) }
        history.drop(through: 15)
        #expect(history.droppedThrough == 15)
        #expect(history.deltas(in: 1...100).map(\.sequence) == Array(16...20))
        history.drop(through: 10)  // never moves back
        #expect(history.droppedThrough == 15)
        history.drop(through: 500)
        #expect(history.count == 0)
        history.insert(Self.delta(501), limit: 100)
        #expect(history[501] == Self.delta(501))
    }

    @Test func aZeroLimitKeepsNothing() {
        var history = OriginHistory()
        for sequence in UInt64(1)...10 { history.insert(Self.delta(sequence), limit: 0) }
        #expect(history.count == 0)
        #expect(history.droppedThrough == 10)
    }

    /// Shuffled, duplicated inserts against a plain reference: the same deltas held, the same
    /// lower bound.
    @Test(arguments: [1, 2, 3, 4, 5, 6, 7, 8])
    func randomDeliveryMatchesAReference(seed: UInt64) {
        var random = SplitMix64(seed: seed)
        // Small windows, and (every other seed) windows far larger than what arrives.
        let limit = seed.isMultiple(of: 2) ? Int(random.next() % 400) + 1 : 1_000_000_000
        var history = OriginHistory()
        var held: Set<UInt64> = []
        var dropped: UInt64 = 0
        var next: UInt64 = 1
        for step in 0..<5_000 {
            // Mostly in order, sometimes a duplicate, a late one, a skip ahead, or a snapshot.
            let roll = random.next() % 100
            let sequence: UInt64
            if roll < 70 {
                sequence = next
                next += 1
            } else if roll < 85 {
                sequence = next > 1 ? 1 + random.next() % (next - 1) : next
            } else if roll < 96 {
                next += random.next() % 50
                sequence = next
                next += 1
            } else if roll < 97 {
                // A far jump (a long gap, or an absurd announcement): must not cost memory.
                next += 1 + random.next() % 10_000_000
                sequence = next
                next += 1
            } else if roll < 98 {
                // A repair filling below, possibly far below, what is held.
                sequence = next > 1 ? next - 1 - random.next() % min(next - 1, 5_000) : next
            } else {
                let through = random.next() % (next + 10)
                history.drop(through: through)
                dropped = max(dropped, through)
                held = held.filter { $0 > dropped }
                continue
            }
            history.insert(Self.delta(sequence), limit: limit)
            if sequence > dropped {
                if sequence > UInt64(limit) { dropped = max(dropped, sequence - UInt64(limit)) }
                held.insert(sequence)
                held = held.filter { $0 > dropped }
            }
            #expect(history.droppedThrough == dropped, "seed \(seed), step \(step)")
            #expect(history.count == held.count, "seed \(seed), step \(step)")
            #expect(history.slotCount <= 4 * held.count + 4096, "seed \(seed), step \(step): memory follows deltas")
            if history.droppedThrough != dropped || history.count != held.count { return }
        }
        let top = next + 10
        #expect(history.deltas(in: 1...top).map(\.sequence) == held.sorted(), "seed \(seed)")
        #expect(history.count == held.count, "seed \(seed)")
    }
}
