import StateSync
import Synchronization

/// A node's ``DataDirectory`` that counts the CPU its calling thread spends in `sync()` (the
/// kernel's `fdatasync` work, most of it): `statesync bench --path` reports it apart, so that a
/// change to the node's own code is not lost in how long the disk took that minute. Everything
/// else goes to the data directory as it is, compactions in the background included.
final class TimedStorage: BackgroundCompactingStorage {
    private let directory: DataDirectory
    private let syncNanoseconds = Atomic<UInt64>(0)

    init(path: String) throws(StateSyncError) {
        directory = try DataDirectory(path: path)
    }

    /// The thread CPU spent in `sync()` so far, in nanoseconds.
    var syncedNanoseconds: UInt64 { syncNanoseconds.load(ordering: .relaxed) }

    func sync() throws(StateSyncError) {
        let started = threadCPUNanoseconds()
        defer { syncNanoseconds.add(threadCPUNanoseconds() &- started, ordering: .relaxed) }
        try directory.sync()
    }

    func recover(onCorruptSnapshot: (String) -> Void) throws(StateSyncError) -> NodeMachine.Recovery {
        try directory.recover(onCorruptSnapshot: onCorruptSnapshot)
    }
    func append(_ records: [UInt8]) throws(StateSyncError) { try directory.append(records) }
    func compact(_ snapshot: StateSnapshot, keeping records: [UInt8]) throws(StateSyncError) {
        try directory.compact(snapshot, keeping: records)
    }
    func saveMembers(_ bytes: [UInt8]) throws(StateSyncError) { try directory.saveMembers(bytes) }
    func reserveSequences(through: UInt64, void: [ClosedRange<UInt64>]) throws(StateSyncError) {
        try directory.reserveSequences(through: through, void: void)
    }
    func markReservationUnsafe() { directory.markReservationUnsafe() }
    func logDamageSettled() { directory.logDamageSettled() }
    func close() { directory.close() }
    func availableBytes() -> UInt64? { directory.availableBytes() }
    func compactInBackground(
        _ snapshot: StateSnapshot, keeping records: [UInt8],
        whenDone done: @escaping @Sendable (StateSyncError?) -> Void
    ) {
        directory.compactInBackground(snapshot, keeping: records, whenDone: done)
    }
    func waitForCompactions() { directory.waitForCompactions() }
}
