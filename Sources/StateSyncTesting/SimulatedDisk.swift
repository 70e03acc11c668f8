public import StateSync
import Synchronization

/// A node's disk in the simulator: the log and the snapshot in memory, with a crash that loses
/// what was not synced — and, when asked, keeps a torn part of it, as a power loss in the middle
/// of a write can.
///
/// Recovery reads it with the same code as a real data directory (the log's records and their
/// checksums, the snapshot's checksum), so a torn tail is cut exactly as on a real disk.
///
/// Thread safety: all methods may be called from any thread (one lock).
public final class SimulatedDisk: NodeStorage {
    private struct State {
        var snapshot: [UInt8]?
        var members: [UInt8]?
        var durableLog: [UInt8] = DeltaLog.magic
        var pendingLog: [UInt8] = []
        var syncs = 0
        var bytesAppended = 0
        var appends = 0
        var freeBytes: UInt64?
        /// A damaged log was cut and the node has not settled since (``logDamageSettled()``).
        var logDamageMarked = false
        /// The sequence reservation (written durably at once) and the boot it was made in.
        var reservation: SequenceReservation?
        /// The boot of the simulated OS: a power loss starts a new one.
        var boot = 1
        /// A compaction under way (``startCompaction(_:keeping:)``): its snapshot's bytes, the
        /// records it keeps, and where the log (durable, then pending) stood when it began.
        var compacting: (snapshot: [UInt8], records: [UInt8], mark: Int)?
        /// Compactions written later that ended (``finishCompaction()``).
        var compactionsFinished = 0
    }

    private let state = Mutex(State())

    /// An empty disk (recovery creates the log).
    public init() {}

    /// Takes what `other` holds durably (its snapshot, member list, log and reservation), as
    /// `cp -a` of a running node's data directory does: a copy of a node started elsewhere.
    package func copyDurableState(of other: SimulatedDisk) {
        let source = other.state.withLock { $0 }
        state.withLock { state in
            state.snapshot = source.snapshot
            state.members = source.members
            state.durableLog = source.durableLog
            state.reservation = source.reservation
        }
    }

    package func recover(onCorruptSnapshot: (String) -> Void) throws(StateSyncError) -> NodeMachine.Recovery {
        let (snapshotBytes, log, membersBytes) = state.withLock { state in
            state.pendingLog = []
            return (state.snapshot, state.durableLog, state.members)
        }
        var snapshot: StateSnapshot?
        if let snapshotBytes {
            do {
                snapshot = try StateSnapshot.decode(snapshotBytes)
            } catch {
                onCorruptSnapshot("the simulated snapshot is damaged (\(error)); starting empty")
            }
        }
        let parsed = try DeltaLog.parse(log, path: "simulated log")
        let intact = parsed.end
        state.withLock { $0.durableLog = Array(log.prefix(intact)) }
        var recovery = NodeMachine.Recovery(
            snapshot: snapshot, deltas: parsed.deltas, cutBytes: parsed.cutBytes, cutReason: parsed.cutReason,
            logSize: intact)
        recovery.logDamaged = state.withLock { state in
            if parsed.damaged { state.logDamageMarked = true }
            return state.logDamageMarked
        }
        recovery.members = (membersBytes.flatMap { try? Membership.decodeFile($0) }) ?? []
        let (reservation, boot) = state.withLock { ($0.reservation, $0.boot) }
        if let reservation {
            recovery.reservedSequence = reservation.through
            recovery.reservedInThisBoot = reservation.isOfBoot("\(boot)")
            recovery.voidSequences = reservation.void
        }
        return recovery
    }

    /// Flips a byte in the payload of durable record `index` (0 the first), as a bad disk may
    /// (a crash keeps the damage: recovery finds it); `false` when the log has no such record.
    package func damageLog(atRecord index: Int) -> Bool {
        state.withLock { state in
            var offset = DeltaLog.magic.count
            var record = 0
            while offset + 8 < state.durableLog.count {
                let length = state.durableLog[offset..<offset + 4].reduce(0) { $0 << 8 | Int($1) }
                guard length > 0, offset + 8 + length <= state.durableLog.count else { return false }
                if record == index {
                    state.durableLog[offset + 8 + length / 2] ^= 0x5A
                    return true
                }
                offset += 8 + length
                record += 1
            }
            return false
        }
    }

    package func logDamageSettled() {
        state.withLock { $0.logDamageMarked = false }
    }

    /// Whether a damaged log was cut and its node has not settled since.
    package var logDamageMarked: Bool { state.withLock { $0.logDamageMarked } }

    package func saveMembers(_ bytes: [UInt8]) throws(StateSyncError) {
        state.withLock { $0.members = bytes }
    }

    package func markReservationUnsafe() {
        state.withLock { state in state.reservation?.bootID = "" }
    }

    package func reserveSequences(through: UInt64, void: [ClosedRange<UInt64>]) throws(StateSyncError) {
        state.withLock { state in
            state.reservation = SequenceReservation(through: through, bootID: "\(state.boot)", void: void)
        }
    }

    package func append(_ records: [UInt8]) throws(StateSyncError) {
        state.withLock { state in
            state.pendingLog += records
            state.bytesAppended += records.count
            state.appends += 1
        }
    }

    package func sync() throws(StateSyncError) {
        sync(prefix: .max)
    }

    /// A sync that began when `octets` were unsynced ended: those (the oldest unsynced ones)
    /// are durable; what was appended since is not. `compactionsAtStart` (``compactionsFinished``
    /// when it began): if a compaction ended since, it made those octets durable already, and
    /// what is unsynced now was appended after this sync began.
    package func sync(prefix octets: Int, compactionsAtStart: Int? = nil) {
        state.withLock { state in
            let noCompactionEnded = compactionsAtStart.map { $0 == state.compactionsFinished } ?? true
            let count = min(max(0, noCompactionEnded ? octets : 0), state.pendingLog.count)
            state.durableLog += state.pendingLog.prefix(count)
            state.pendingLog.removeFirst(count)
            state.syncs += 1
        }
    }

    package func compact(_ snapshot: StateSnapshot, keeping records: [UInt8]) throws(StateSyncError) {
        let bytes = StateSnapshot.encode(snapshot)
        state.withLock { state in
            // Written and renamed into place atomically, then the log replaced.
            state.snapshot = bytes
            state.durableLog = DeltaLog.magic + records
            state.pendingLog = []
            state.syncs += 1
            state.compacting = nil
        }
    }

    /// Begins a compaction written later (``finishCompaction()``), as the daemon's data directory
    /// writes one in the background while the node goes on appending.
    package func startCompaction(_ snapshot: StateSnapshot, keeping records: [UInt8]) {
        let bytes = StateSnapshot.encode(snapshot)
        state.withLock { $0.compacting = (bytes, records, $0.durableLog.count + $0.pendingLog.count) }
    }

    /// Writes the compaction under way, if any: the snapshot, then a log of the records it keeps
    /// and every record appended since it began, all durable (the daemon syncs the new log before
    /// it renames it over the old). Returns whether there was one.
    @discardableResult
    package func finishCompaction() -> Bool {
        state.withLock { state in
            guard let job = state.compacting else { return false }
            state.compacting = nil
            let log = state.durableLog + state.pendingLog
            state.snapshot = job.snapshot
            state.durableLog = DeltaLog.magic + job.records + log[job.mark...]
            state.pendingLog = []
            state.syncs += 1
            state.compactionsFinished += 1
            return true
        }
    }

    /// How many compactions written later ended.
    package var compactionsFinished: Int { state.withLock { $0.compactionsFinished } }

    /// Whether a compaction is under way.
    package var isCompacting: Bool { state.withLock { $0.compacting != nil } }

    package func close() {}

    /// The free space the node sees (`nil`: unknown, as a file system that cannot say).
    package var freeBytes: UInt64? {
        get { state.withLock { $0.freeBytes } }
        set { state.withLock { $0.freeBytes = newValue } }
    }
    package func availableBytes() -> UInt64? { freeBytes }

    /// The node crashed: what was not synced is lost, except the first `tornBytes` of it (at most
    /// what was pending), which reached the platter — possibly half a record.
    /// `powerLoss`: the OS went down too, and comes back as a new boot.
    /// A compaction under way ends with the crash; with `compactionWroteSnapshot` its snapshot was
    /// renamed into place already, not yet its log (the new snapshot and the old log overlap).
    public func crash(keepingTorn tornBytes: Int = 0, powerLoss: Bool = false, compactionWroteSnapshot: Bool = false) {
        state.withLock { state in
            state.durableLog += state.pendingLog.prefix(max(0, tornBytes))
            state.pendingLog = []
            if powerLoss { state.boot += 1 }
            if compactionWroteSnapshot, let job = state.compacting { state.snapshot = job.snapshot }
            state.compacting = nil
        }
    }

    /// Bytes appended but not yet synced.
    public var unsyncedBytes: Int { state.withLock { $0.pendingLog.count } }
    /// Octets appended to the log since the disk was made.
    public var appendedBytes: Int { state.withLock { $0.bytesAppended } }
    /// How many appends (writes) the log took.
    public var appendCount: Int { state.withLock { $0.appends } }
    /// How many times the log was synced (or a snapshot written).
    public var syncCount: Int { state.withLock { $0.syncs } }
}
