import Foundation
import Synchronization
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

    /// A background compaction (the daemon's): the node appends while the snapshot is written,
    /// and the new log holds the kept records, then everything appended from the compaction's
    /// start on (here 300 KiB, more than is copied under the lock, and then a little more). The
    /// next start reads the snapshot and those, none twice and none lost.
    @Test func recordsAppendedDuringABackgroundCompactionAreInTheNewLog() throws {
        let path = temporaryDirectory("background-compaction")
        defer { try? FileManager.default.removeItem(atPath: path) }
        var warnings: [String] = []
        let snapshot = StateSnapshot(store: ReplicaStore(), latestSequence: 0, progress: ["n2": 10])
        try SequenceReservationTests.reopened(path, warnings: &warnings) { directory in
            try directory.append(Self.records(Array(1...10) + [12]))
            let appended = DispatchSemaphore(value: 0)
            let done = DispatchSemaphore(value: 0)
            let failure = Mutex<StateSyncError?>(nil)
            directory.afterBackgroundSnapshot.withLock { $0 = { appended.wait() } }
            directory.compactInBackground(snapshot, keeping: Self.records([12])) { error in
                failure.withLock { $0 = error }
                done.signal()
            }
            // Deltas of about 1 KiB each: 300 of them pass what is copied under the lock.
            var batch = DeltaLog.Batch()
            for sequence in 13...312 as ClosedRange<UInt64> {
                batch.add(
                    Delta(
                        channel: "c", model: "m", version: Version(milliseconds: sequence, counter: 0, node: "n2"),
                        sequence: sequence,
                        properties: [PropertyWrite(name: "x", value: .string(String(repeating: "v", count: 1000)))]))
            }
            #expect(batch.bytes.count > DataDirectory.lockedCopyBytes)
            try directory.append(batch.bytes)
            appended.signal()
            try directory.append(Self.records([313]))
            #expect(done.wait(timeout: .now() + 30) == .success)
            #expect(failure.withLock { $0 } == nil)
            try directory.append(Self.records([314]))
            try directory.sync()
        }
        let recovery = try SequenceReservationTests.reopened(path, warnings: &warnings)
        #expect(recovery.snapshot?.progress == ["n2": 10])
        #expect(recovery.deltas.map(\.sequence) == [12] + Array(13...314))
        #expect(recovery.cutBytes == 0)
        #expect(warnings.isEmpty)
    }

    /// A directory sync that fails after the new log was renamed into place (PROTOCOL.md 11.2):
    /// the compaction fails, the node goes on appending to the new log (the file that holds the
    /// name), and nothing appended to it is reported durable until a sync of the directory
    /// succeeds, which the next log sync retries. A power loss in between could bring back the
    /// old log without those records.
    @Test(arguments: [false, true])
    func aFailedDirectorySyncAfterARenameHoldsBackDurability(inBackground: Bool) throws {
        let path = temporaryDirectory("directory-sync")
        defer { try? FileManager.default.removeItem(atPath: path) }
        var warnings: [String] = []
        let snapshot = StateSnapshot(store: ReplicaStore(), latestSequence: 0, progress: ["n2": 2])
        try SequenceReservationTests.reopened(path, warnings: &warnings) { directory in
            try directory.append(Self.records([1, 2, 4]))
            directory.failingDirectorySyncs.store(2, ordering: .relaxed)
            if inBackground {
                let done = DispatchSemaphore(value: 0)
                let failure = Mutex<StateSyncError?>(nil)
                directory.compactInBackground(snapshot, keeping: Self.records([4])) { error in
                    failure.withLock { $0 = error }
                    done.signal()
                }
                #expect(done.wait(timeout: .now() + 30) == .success)
                #expect(failure.withLock { $0 }?.message.contains("injected failure") == true)
            } else {
                #expect(throws: StateSyncError.self) { try directory.compact(snapshot, keeping: Self.records([4])) }
            }
            try directory.append(Self.records([5]))
            // The log's own sync succeeds; the directory's, retried, fails once more.
            #expect(throws: StateSyncError.self) { try directory.sync() }
            #expect(directory.failingDirectorySyncs.load(ordering: .relaxed) == 0)
            try directory.append(Self.records([6]))
            try directory.sync()
        }
        let recovery = try SequenceReservationTests.reopened(path, warnings: &warnings)
        #expect(recovery.snapshot?.progress == ["n2": 2])
        #expect(recovery.deltas.map(\.sequence) == [4, 5, 6])
        #expect(recovery.cutBytes == 0)
        #expect(warnings.isEmpty)
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
