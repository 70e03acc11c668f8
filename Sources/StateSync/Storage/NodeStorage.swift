/// Where a node keeps what must survive it: the write-ahead log and the state snapshot
/// (docs/PROTOCOL.md section 11.2 and appendices A and B). The node's host calls it while it
/// performs a ``NodeMachine``'s actions, from one thread at a time.
///
/// ``DataDirectory`` is the real one (files, `fdatasync`, an exclusive lock); the cluster
/// simulator's disk loses what was not synced when its node crashes.
package protocol NodeStorage: AnyObject, Sendable {
    /// Reads the snapshot and the log, cutting a torn or corrupt tail from the log.
    func recover(onCorruptSnapshot: (String) -> Void) throws(StateSyncError) -> NodeMachine.Recovery
    /// Appends encoded log records (not yet durable).
    func append(_ records: [UInt8]) throws(StateSyncError)
    /// Makes everything appended durable.
    func sync() throws(StateSyncError)
    /// Syncs the log, writes `snapshot` durably (atomically), then replaces the log with one
    /// holding only `records` (encoded log records, usually none), atomically.
    func compact(_ snapshot: StateSnapshot, keeping records: [UInt8]) throws(StateSyncError)
    /// Writes the member list (``Membership/encodeFile(_:)``) durably and atomically.
    func saveMembers(_ bytes: [UInt8]) throws(StateSyncError)
    /// Records durably and atomically, with the OS's boot id, that own sequence numbers through
    /// `through` may be published before they are durable (``SequenceReservation``), with the own
    /// numbers declared void (kept across restarts).
    func reserveSequences(through: UInt64, void: [ClosedRange<UInt64>]) throws(StateSyncError)
    /// Best effort, before the node stops on a failed sync: marks the reservation as not made in
    /// this boot (the OS may have dropped written pages), so the next start settles.
    func markReservationUnsafe()
    /// The node settled after a damaged log (docs/PROTOCOL.md 11.2): recovery keeps reporting the
    /// damage (``NodeMachine/Recovery/logDamaged``), also after restarts, until this is called.
    func logDamageSettled()
    /// Releases the storage for another node. Idempotent.
    func close()
    /// The bytes still free for the log and snapshot (`nil` when unknown).
    func availableBytes() -> UInt64?
}

/// A ``NodeStorage`` that writes a compaction off the thread performing the node's actions: the
/// snapshot of a large state takes a while to encode and write (about 0.4 s for 1 M properties
/// here), and deltas and client requests would wait for it. ``DataDirectory`` is one; the
/// simulator's disk compacts at once.
package protocol BackgroundCompactingStorage: NodeStorage {
    /// Starts a ``NodeStorage/compact(_:keeping:)`` and returns: the records appended from now on
    /// go on to the log in use, and the new log holds them after `records`. `done` is called
    /// once, on another thread, with `nil` once the snapshot and the new log are durable, or with
    /// the failure (the old log, holding everything, stays in use). One at a time: the node asks
    /// for the next only once this one is done.
    func compactInBackground(
        _ snapshot: StateSnapshot, keeping records: [UInt8],
        whenDone done: @escaping @Sendable (StateSyncError?) -> Void)
    /// Returns once no background compaction runs.
    func waitForCompactions()
}

/// Runs observers' notifications of the changes a node applied, off the thread that applied
/// them (see ``ModelRegistrar``).
package protocol ObserverExecutor: Sendable {
    /// Runs `job` after every job submitted before it. `weight` (the changes it delivers, at
    /// least 1) counts in ``backlog`` until it has run.
    func run(weight: Int, _ job: @escaping @Sendable () -> Void)
    /// The weight of the jobs submitted and not yet run: roughly, the changes waiting for their
    /// observers. The node stops taking peer deltas while it is too high (backpressure).
    var backlog: Int { get }
    /// Returns once every job submitted before the call has run.
    func flush() async
}

/// An executor that runs every job at once, on the calling thread: for the simulator and tests,
/// where the driver is single-threaded and order must be deterministic.
package final class InlineObserverExecutor: ObserverExecutor {
    package init() {}
    package func run(weight: Int, _ job: @escaping @Sendable () -> Void) { job() }
    package var backlog: Int { 0 }
    package func flush() async {}
}
