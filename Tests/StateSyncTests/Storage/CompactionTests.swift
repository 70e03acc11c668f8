import Foundation
import Testing

@testable import StateSync

/// Compaction of a real data directory: the snapshot is written, and the log is replaced by one
/// holding only the records the node keeps (the deltas it holds above a gap, PROTOCOL.md 11.5
/// item 6), atomically.
@Suite("Compaction of a data directory")
struct CompactionTests {
    static func records(_ sequences: [UInt64]) -> [UInt8] {
        var batch = DeltaLog.Batch()
        for sequence in sequences { batch.add(RepairMachineTests.delta("n2", sequence)) }
        return batch.bytes
    }

    /// The next start reads the snapshot and, from the log, the kept records and what was
    /// appended after the compaction (the new log takes appends like the old one).
    @Test func aCompactionKeepsOnlyTheRecordsItIsGiven() throws {
        let path = temporaryDirectory("compaction")
        defer { try? FileManager.default.removeItem(atPath: path) }
        var warnings: [String] = []
        let snapshot = StateSnapshot(store: ReplicaStore(), latestSequence: 0, progress: ["n2": 1])
        try SequenceReservationTests.reopened(path, warnings: &warnings) { directory in
            try directory.append(Self.records([1, 3, 4]))
            try directory.compact(snapshot, keeping: Self.records([3, 4]))
            try directory.append(Self.records([6]))
            try directory.sync()
        }
        let recovery = try SequenceReservationTests.reopened(path, warnings: &warnings)
        #expect(recovery.snapshot?.progress == ["n2": 1])
        #expect(recovery.deltas.map(\.sequence) == [3, 4, 6])
        #expect(recovery.cutBytes == 0)
        #expect(warnings.isEmpty)
        // Keeping nothing empties the log.
        try SequenceReservationTests.reopened(path, warnings: &warnings) { try $0.compact(snapshot, keeping: []) }
        #expect(try SequenceReservationTests.reopened(path, warnings: &warnings).deltas.isEmpty)
    }

    /// Appendix A: a node that dropped its state writes `SSNAP4`, which keeps its recovery through
    /// a restart (a real data directory), and once the recovery ended the reset it remembers
    /// (recovered = through); any other writes `SSNAP3` as before, which an older node still reads.
    @Test func theOwnRecoveryAndTheLastResetAreInTheFile() throws {
        let path = temporaryDirectory("own-recovery")
        defer { try? FileManager.default.removeItem(atPath: path) }
        var warnings: [String] = []
        for recovery in [
            StateSnapshot.OwnRecovery(through: 40, recovered: nil),
            StateSnapshot.OwnRecovery(through: 40, recovered: 0),
            StateSnapshot.OwnRecovery(through: 40, recovered: 33),
            StateSnapshot.OwnRecovery(through: 40, recovered: 40),
        ] {
            let snapshot = StateSnapshot(
                store: ReplicaStore(), latestSequence: 45, progress: ["n1": 45], ownRecovery: recovery)
            #expect(StateSnapshot.encode(snapshot).starts(with: Array("SSNAP4\n".utf8)))
            try SequenceReservationTests.reopened(path, warnings: &warnings) { try $0.compact(snapshot, keeping: []) }
            let read = try SequenceReservationTests.reopened(path, warnings: &warnings).snapshot
            #expect(read?.ownRecovery == recovery)
            #expect(read?.progress == ["n1": 45] && read?.latestSequence == 45)
        }
        let plain = StateSnapshot(store: ReplicaStore(), latestSequence: 45, progress: ["n1": 45])
        #expect(StateSnapshot.encode(plain).starts(with: Array("SSNAP3\n".utf8)))
        #expect(try StateSnapshot.decode(StateSnapshot.encode(plain)).ownRecovery == nil)
        #expect(warnings.isEmpty)
        // A recovery past its end is not one: the file is refused, not trusted.
        let past = StateSnapshot(
            store: ReplicaStore(), latestSequence: 45,
            ownRecovery: StateSnapshot.OwnRecovery(through: 40, recovered: 41))
        #expect(throws: WireError.self) { try StateSnapshot.decode(StateSnapshot.encode(past)) }
    }
}
