import StateSyncTesting
import Testing

@testable import StateSync

/// The numbers a node holds above a gap, kept as runs (PROTOCOL.md section 11.5, item 2).
@Suite("Sequence numbers held as runs")
struct SequenceRunsTests {
    /// Random inserts, removals through a number and removals of a first run, checked step by
    /// step against a plain set; the runs stay sorted, disjoint and never adjacent.
    @Test(arguments: 1...40 as ClosedRange<UInt64>)
    func runsHoldWhatASetHolds(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        var runs = SequenceRuns()
        var model = Set<UInt64>()
        var floor: UInt64 = 0
        for step in 0..<600 {
            let value = floor + 1 + random.next() % 60
            switch random.next() % 10 {
            case 0:
                runs.removeAll(through: value)
                model = model.filter { $0 > value }
            case 1, 2:
                // Half the time at the lowest number, where a run does start.
                let start = random.next() % 2 == 0 ? (runs.lowest ?? value) : value
                let removed = runs.removeRun(startingAt: start)
                if let lowest = model.min(), lowest == start {
                    var end = start
                    while model.contains(end + 1) { end += 1 }
                    #expect(removed == end, "seed \(seed), step \(step)")
                    model = model.filter { $0 > end }
                } else {
                    #expect(removed == nil, "seed \(seed), step \(step)")
                }
                floor = max(floor, start / 2)
            default:
                let inserted = runs.insert(value)
                #expect(inserted == model.insert(value).inserted, "seed \(seed), step \(step): \(value)")
            }
            #expect(Array(runs.numbers) == model.sorted(), "seed \(seed), step \(step)")
            #expect(runs.count == UInt64(model.count) && runs.isEmpty == model.isEmpty, "seed \(seed), step \(step)")
            #expect(runs.lowest == model.min() && runs.highest == model.max(), "seed \(seed), step \(step)")
            for probe in floor...(floor + 62) {
                #expect(runs.contains(probe) == model.contains(probe), "seed \(seed), step \(step): \(probe)")
                var absent = probe
                while model.contains(absent) { absent += 1 }
                #expect(runs.firstAbsent(from: probe) == absent, "seed \(seed), step \(step): \(probe)")
            }
            for (run, next) in zip(runs.runs, runs.runs.dropFirst()) {
                #expect(run.upperBound + 1 < next.lowerBound, "seed \(seed), step \(step): \(runs.runs)")
            }
        }
    }

    @Test func theHighestNumbersAreHeldWithoutOverflow() {
        var runs: SequenceRuns = [.max - 2, .max]
        let joined = runs.insert(.max - 1)
        #expect(joined && runs.runs == [(.max - 2)...(.max)] && runs.count == 3)
        #expect(runs.contains(.max) && runs.firstAbsent(from: .max - 2) == .max)
        runs.removeAll(through: .max - 1)
        #expect(runs.runs == [(.max)...(.max)] && runs.count == 1)
        runs.removeAll(through: .max)
        #expect(runs.isEmpty && runs.count == 0 && runs.highest == nil)
    }

    /// Repair fills gaps from the lowest up: each filled gap takes the first run away, and the
    /// runs left are the same set, whatever the storage does underneath.
    @Test func takingTheFirstRunsOneByOneLeavesTheRest() {
        var runs = SequenceRuns()
        for run: UInt64 in 0..<1_000 { runs.insert(run * 3 + 1) }
        for run: UInt64 in 0..<999 {
            #expect(runs.removeRun(startingAt: run * 3 + 1) == run * 3 + 1)
            #expect(runs.lowest == run * 3 + 4 && runs.count == 999 - run && runs.runs.count == Int(999 - run))
        }
        let below = runs.insert(1)
        #expect(below && runs.runs == [1...1, 2_998...2_998])
    }

    @Test func aNumberBetweenTwoRunsJoinsThem() {
        var runs: SequenceRuns = [3, 4, 6, 7]
        #expect(runs.runs == [3...4, 6...7])
        let inserted = runs.insert(5)
        let again = runs.insert(5)
        #expect(inserted && !again)
        #expect(runs.runs == [3...7] && runs.count == 5)
    }

    /// A partition healed while the live stream goes on: a hundred thousand numbers received above
    /// one missing number are one run, and the repaired number takes them all in.
    @Test func numbersReceivedInOrderAboveAGapAreOneRun() {
        var progress = OriginProgress()
        var taken = progress.receive(1)
        for sequence: UInt64 in 3...100_002 { taken = progress.receive(sequence) && taken }
        #expect(taken)
        #expect(progress.above.runs == [3...100_002])
        #expect(progress.firstGap == 2...2 && progress.missing == 1 && progress.highestReceived == 100_002)
        let duplicate = progress.receive(50_000)
        #expect(!duplicate && progress.holds(50_000) && !progress.holds(2))
        let repaired = progress.receive(2)
        #expect(repaired)
        #expect(progress.contiguous == 100_002 && progress.above.isEmpty && !progress.hasGap)
    }

    /// A snapshot that covers part of a run keeps the rest, and takes in what then follows it.
    @Test func coverThroughARunKeepsItsRest() {
        var progress = OriginProgress()
        for sequence: UInt64 in [3, 4, 5, 8, 9] { _ = progress.receive(sequence) }
        #expect(progress.above.runs == [3...5, 8...9])
        progress.cover(through: 4)
        #expect(progress.contiguous == 5 && progress.above.runs == [8...9])
        #expect(progress.missing == 2 && progress.firstGap == 6...7)
        progress.cover(through: 7)
        #expect(progress.contiguous == 9 && progress.above.isEmpty)
    }

    /// A watch delivered numbers out of order holds them as runs above its cursor; the number
    /// that fills the gap takes its cursor through the run, and a number at or below the cursor
    /// (delivered already) changes nothing.
    @Test func aWatchPositionTakesInTheRunAboveItsCursor() {
        var position = NodeMachine.WatchPosition(journalIndex: 0, cursor: WatchCursor(["n1": 2]))
        for sequence: UInt64 in [5, 6, 4, 9] { position.deliver("n1", sequence) }
        #expect(position.above["n1"]?.runs == [4...6, 9...9])
        #expect(position.covers("n1", 5) && !position.covers("n1", 3) && !position.covers("n1", 7))
        position.deliver("n1", 2)
        #expect(position.above["n1"]?.runs == [4...6, 9...9] && position.cursor["n1"] == 2)
        position.deliver("n1", 3)
        #expect(position.cursor["n1"] == 6 && position.above["n1"]?.runs == [9...9])
        position.deliver("n1", 8)
        position.deliver("n1", 7)
        #expect(position.cursor["n1"] == 9 && position.above["n1"] == nil)
    }
}
