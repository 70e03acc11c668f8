import Testing

@testable import StateSync

/// A run of deltas of one model merges with one look-up of the model, and finds each register
/// where the delta before found the one at the same position (``ReplicaStore/SlotHints``). Those
/// slots move when a register is added or removed; the store's storage may be copied by the
/// run's first write: the result must be the same as merging the deltas one by one, whatever the
/// run holds.
@Suite("Merging runs of deltas")
struct ReplicaStoreRunTests {
    static let address = ModelAddress(channel: "c", model: "m")

    static func delta(_ sequence: UInt64, _ writes: [PropertyWrite]) -> Delta {
        Delta(
            channel: "c", model: "m", version: Version(milliseconds: 10 + sequence, counter: 0, node: "n2"),
            sequence: sequence, properties: writes)
    }

    /// Properties written in changing orders, new ones appearing mid-run, a property deleted and
    /// the whole model deleted mid-run, a stale write: against a store whose storage a copy
    /// shares (a snapshot holds one), so the run's first write copies it.
    @Test func aRunMergesAsItsDeltasOneByOneWhileSlotsMove() {
        var store = ReplicaStore()
        _ = store.apply(Self.delta(1, [PropertyWrite(name: "x", value: 1), PropertyWrite(name: "y", value: 1)]))
        let held = store
        var oneByOne = store
        let run: [Delta] = [
            Self.delta(2, [PropertyWrite(name: "x", value: 2), PropertyWrite(name: "y", value: 2)]),
            Self.delta(3, [PropertyWrite(name: "y", value: 3), PropertyWrite(name: "x", value: 3)]),
            Self.delta(4, [PropertyWrite(name: "x", value: 4), PropertyWrite(name: "z", value: 4)]),
            Self.delta(5, [PropertyWrite(name: "x", value: 5), PropertyWrite(name: "z", value: 5)]),
            Self.delta(6, [.deletion(of: "x"), PropertyWrite(name: "z", value: 6)]),
            Self.delta(7, [PropertyWrite(name: "x", value: 7), PropertyWrite(name: "z", value: 7)]),
            Self.delta(8, [.modelDeletion]),
            Self.delta(9, [PropertyWrite(name: "z", value: 9), PropertyWrite(name: "x", value: 9)]),
            Self.delta(10, [PropertyWrite(name: "z", value: 10), PropertyWrite(name: "x", value: 10)]),
        ]
        let won = store.applyWinning(run: run)
        var wonOneByOne: [Int] = []
        for delta in run {
            wonOneByOne.append(oneByOne.applyWinning(run: [delta])[0].count)
        }
        #expect(won.map(\.count) == wonOneByOne)
        #expect(store.properties(of: Self.address) == oneByOne.properties(of: Self.address))
        #expect(store.properties(of: Self.address)["x"]?.value == .int(10))
        // The model's deletion took y, which no later write gave a value.
        #expect(store.properties(of: Self.address)["y"] == nil)
        #expect(store.digest == oneByOne.digest)
        // The copy taken before the run kept what it held.
        #expect(held.properties(of: Self.address)["x"]?.value == .int(1))
        #expect(held.properties(of: Self.address)["z"] == nil)
        // A stale write in a run loses, and the run goes on.
        let stale = Self.delta(11, [PropertyWrite(name: "x", value: 99)])
        var older = stale
        older.version = Version(milliseconds: 1, counter: 0, node: "n2")
        let more = store.applyWinning(run: [older, Self.delta(12, [PropertyWrite(name: "x", value: 12)])])
        #expect(more.map(\.count) == [0, 1])
        #expect(store.properties(of: Self.address)["x"]?.value == .int(12))
    }
}

extension ReplicaStore {
    /// Each delta's winning writes of a run merged with ``applyWinning(run:into:)``.
    fileprivate mutating func applyWinning(run deltas: [Delta]) -> [[PropertyWrite]] {
        var won: [PropertyWrites] = []
        applyWinning(run: deltas, into: &won)
        return won.map(\.array)
    }
}
