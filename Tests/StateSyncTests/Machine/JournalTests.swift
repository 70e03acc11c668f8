import Testing

@testable import StateSync

/// The journal drops its oldest entry at each append past its limit (steadily, not in bursts:
/// issue #17), and keeps, per origin, the highest sequence number it dropped.
@Suite("The watch journal")
struct JournalTests {
    static func delta(_ origin: String, _ sequence: UInt64) -> Delta {
        Delta(
            channel: "c", model: "m", version: Version(milliseconds: sequence, counter: 0, node: origin),
            sequence: sequence, properties: [PropertyWrite(name: "p", value: .int(Int64(sequence)))])
    }

    @Test func pastItsLimitEachAppendDropsTheOldestEntry() {
        var journal = Journal()
        for sequence in UInt64(1)...100 {
            journal.append(Self.delta("n1", sequence), limit: 40)
            #expect(journal.entries.count == min(Int(sequence), 40))
        }
        #expect(journal.base == 60)
        #expect(journal.end == 100)
        #expect(journal.entry(at: 59) == nil)
        #expect(journal.entry(at: 60)?.sequence == 61)
        #expect(journal.droppedThrough == ["n1": 60])
    }

    /// The journal is a ring: entries keep their order and positions when it grows while its
    /// oldest entry is not at the front of its storage (the limit rose after drops moved it),
    /// and after everything was dropped.
    @Test func theRingKeepsOrderWhenItGrowsAfterDrops() {
        var journal = Journal()
        var all: [Delta] = []
        func append(_ count: Int, limit: Int) {
            for _ in 0..<count {
                let delta = Self.delta("n1", UInt64(all.count + 1))
                all.append(delta)
                journal.append(delta, limit: limit)
            }
        }
        append(70, limit: 20)  // 20 held, the oldest some way into the ring
        #expect(journal.entries.map(\.delta) == Array(all[50...]))
        append(150, limit: 200)  // grows three times, the first while wrapped
        #expect(journal.base == 50 && journal.end == 220)
        #expect(journal.entries.map(\.delta) == Array(all[50...]))
        for position in [49, 50, 51, 131, 219, 220] {
            #expect(
                journal.entry(at: position)?.sequence == ((50..<220).contains(position) ? UInt64(position + 1) : nil))
        }
        journal.dropAll()
        #expect(journal.entries.isEmpty && journal.base == 220 && journal.droppedThrough == ["n1": 220])
        append(3, limit: 20)
        #expect(journal.entries.map(\.delta) == Array(all[220...]) && journal.entry(at: 221)?.sequence == 222)
    }

    /// Runs of origins of random lengths, against a reference that keeps every entry: the same
    /// entries held, the same highest sequence number dropped per origin, at every step (the
    /// origin being dropped now is folded in when read).
    @Test(arguments: [1, 2, 3, 4, 5, 6])
    func droppedThroughMatchesAReference(seed: UInt64) {
        var random = SplitMix64(seed: seed)
        let limit = Int(random.next() % 50) + Journal.minimumEntries
        let origins = ["n1", "n2", "a-node-id-longer-than-fifteen-bytes"]
        var next: [String: UInt64] = [:]
        var journal = Journal()
        var all: [Delta] = []
        var absent: [String: UInt64] = [:]
        for step in 0..<2_000 {
            let origin = origins[Int(random.next() % UInt64(origins.count))]
            for _ in 0..<(Int(random.next() % 7) + 1) {
                next[origin, default: 0] += 1
                let delta = Self.delta(origin, next[origin]!)
                all.append(delta)
                journal.append(delta, limit: limit)
            }
            if step % 97 == 0 {
                // A snapshot covered some of an origin's numbers.
                journal.markAbsent(origin: origin, through: next[origin]! / 2)
                absent[origin] = max(absent[origin] ?? 0, next[origin]! / 2)
            }
            let kept = max(all.count - limit, 0)
            var expected = absent
            for delta in all[..<kept] { expected[delta.origin] = max(expected[delta.origin] ?? 0, delta.sequence) }
            #expect(journal.droppedThrough == expected, "seed \(seed), step \(step)")
            #expect(journal.base == kept, "seed \(seed), step \(step)")
            #expect(journal.entries.map(\.delta) == Array(all[kept...]), "seed \(seed), step \(step)")
        }
        journal.dropAll()
        var everything = absent
        for delta in all { everything[delta.origin] = max(everything[delta.origin] ?? 0, delta.sequence) }
        #expect(journal.droppedThrough == everything, "seed \(seed)")
        #expect(journal.entries.isEmpty && journal.base == all.count)
    }

    /// The keys a resumed watch walks by (``Journal/firstNotCovered(from:through:own:above:)``)
    /// say what the entries say: against a scan of the entries themselves, from random
    /// positions, with random covers (origins missing from them too), an own origin, and
    /// sequences out of order (repairs), while the ring grows, wraps, drops and is emptied.
    @Test(arguments: [1, 2, 3, 4, 5, 6])
    func theFirstEntryNotCoveredIsFoundByItsKeys(seed: UInt64) {
        var random = SplitMix64(seed: seed)
        let origins = ["n1", "n2", "a-node-id-longer-than-fifteen-bytes", "n4"]
        var journal = Journal()
        var limit = Int(random.next() % 200) + Journal.minimumEntries
        for step in 0..<1_500 {
            let origin = origins[Int(random.next() % 3)]  // n4 never writes: its number is unknown
            journal.append(Self.delta(origin, random.next() % 500 + 1), limit: limit)
            if step % 211 == 0 { limit = Int(random.next() % 400) + Journal.minimumEntries }
            if step == 900 { journal.dropAll() }
            let cover = Dictionary(uniqueKeysWithValues: origins.map { ($0, random.next() % 520) })
            let through = journal.originNames.map { cover[$0]! }
                .prefix(Int(random.next() % UInt64(journal.originNames.count + 1)))  // some left out
            let own = origins[Int(random.next() % UInt64(origins.count))]
            let visible = random.next() % 520
            let from = journal.base + Int(random.next() % UInt64(journal.end - journal.base + 2)) - 1
            var expected = max(from, journal.base)
            while let entry = journal.entry(at: expected) {
                let number = journal.number(ifKnown: entry.origin).map(Int.init)!
                if entry.origin == own && entry.sequence > visible { break }
                guard number < through.count, entry.sequence <= cover[entry.origin]! else { break }
                expected += 1
            }
            let found = journal.firstNotCovered(
                from: from, through: Array(through), own: journal.number(ifKnown: own), above: visible)
            #expect(found == expected, "seed \(seed), step \(step)")
            #expect(
                journal.key(at: expected).map { journal.originNames[Int($0.origin)] }
                    == journal.entry(at: expected)?.origin, "seed \(seed), step \(step)")
        }
    }

    /// A watch's walk (``NodeMachine/nextDeltas(channel:from:limit:)``), which passes over
    /// covered entries by their keys on a long way, gives what the walk over the entries
    /// themselves gave: the same deltas with the same positions after each, and the same end,
    /// for random journals (own deltas not yet visible among them, sequences out of order),
    /// cursors with numbers held above them, channels and limits, long ways and short.
    @Test(arguments: [1, 2, 3, 4, 5, 6, 7, 8])
    func aWatchsWalkByKeysGivesWhatTheEntriesGive(seed: UInt64) {
        var random = SplitMix64(seed: seed)
        var runner = MachineRunner(MachineRunner.configuration("n1"))
        let origins = ["n1", "n2", "a-node-id-longer-than-fifteen-bytes"]
        for step in 0..<400 {
            let origin = origins[Int(random.next() % 3)]
            var delta = Self.delta(origin, random.next() % 300 + 1)
            if random.next() % 3 == 0 { delta.channel = "d" }
            runner.machine.journal.append(delta, limit: 100_000)
            guard step % 7 == 0 else { continue }
            runner.machine.visibleToWatches = random.next() % 320
            var position = NodeMachine.WatchPosition(
                journalIndex: Int(random.next() % UInt64(runner.machine.journal.end + 1)),
                cursor: WatchCursor(Dictionary(uniqueKeysWithValues: origins.map { ($0, random.next() % 320) })))
            for _ in 0..<(random.next() % 4) {
                let origin = origins[Int(random.next() % 3)]
                let above = position.cursor[origin] + 2 + random.next() % 40
                _ = position.above[origin, default: []].insert(above)
            }
            let channel = random.next() % 2 == 0 ? "c" : "d"
            let limit = Int(random.next() % 60) + 1
            let (deltas, end, gone) = runner.machine.nextDeltas(channel: channel, from: position, limit: limit)
            // The walk over the entries, as it was.
            var expected: [(Delta, NodeMachine.WatchPosition)] = []
            var walk = position
            while expected.count < limit, let entry = runner.machine.journal.entry(at: walk.journalIndex) {
                if entry.origin == "n1" && entry.sequence > runner.machine.visibleToWatches { break }
                walk.journalIndex += 1
                if walk.covers(entry.origin, entry.sequence) { continue }
                walk.deliver(entry.origin, entry.sequence)
                if entry.delta.channel == channel { expected.append((entry.delta, walk)) }
            }
            func same(_ a: NodeMachine.WatchPosition, _ b: NodeMachine.WatchPosition) -> Bool {
                a.journalIndex == b.journalIndex && a.cursor == b.cursor && a.above == b.above
            }
            #expect(!gone, "seed \(seed), step \(step)")
            #expect(deltas.map(\.0) == expected.map(\.0), "seed \(seed), step \(step): the deltas")
            #expect(
                zip(deltas, expected).allSatisfy { same($0.1, $1.1) } && same(end, walk),
                "seed \(seed), step \(step): the positions")
        }
    }
}
