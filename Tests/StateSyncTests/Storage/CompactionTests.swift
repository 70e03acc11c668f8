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
}
