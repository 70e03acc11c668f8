import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A node's data directory, its ``NodeStorage``: an exclusive lock (one node per directory), the
/// write-ahead log (``DeltaLog``) and the state snapshot.
///
/// The snapshot is written to a temporary file, fsynced, renamed over the old one and the
/// directory fsynced, so a crash leaves either the old or the new snapshot, never a mix. Its
/// checksum is verified on load; a damaged snapshot is moved aside, never loaded as data.
///
/// A compaction runs in the background (``compactInBackground(_:keeping:whenDone:)``): the
/// snapshot is encoded and written on a thread of its own while the node goes on appending to
/// the log, and the new log takes what was appended meanwhile.
///
/// Thread safety: the log is used under a lock, by the thread performing the node's actions and
/// by the compaction's thread, which replaces it.
package final class DataDirectory: NodeStorage, BackgroundCompactingStorage {
    let path: String
    private let lockDescriptor: Int32
    private let locked = Atomic<Bool>(true)
    /// The log in use, from ``recover(onCorruptSnapshot:)`` on. Appends and syncs hold the lock
    /// (an append never lands in a log already replaced); a background compaction holds it only
    /// to copy the last records appended and swap the files.
    private let log = Mutex<DeltaLog?>(nil)
    /// Runs background compactions, one at a time.
    private let compactor = DispatchQueue(label: "statesync.compaction")
    /// A background compaction copies what was appended during it in rounds without the lock
    /// while more than this is left, then the rest under the lock.
    static let lockedCopyBytes = 64 << 10
    /// A log was renamed into place and the directory's sync after it failed: until a sync of the
    /// directory succeeds, a power loss could bring back the old file, so ``sync()`` syncs the
    /// directory too before it says anything appended is durable.
    private let directoryUnsynced = Atomic<Bool>(false)
    /// Tests only: runs on the compactor's thread once a background compaction's snapshot is
    /// written, before the records appended meanwhile are copied.
    let afterBackgroundSnapshot = Mutex<(@Sendable () -> Void)?>(nil)
    /// Tests only: the next this many syncs of the directory after a log was renamed into place
    /// fail, as an `fsync` returning EIO would.
    let failingDirectorySyncs = Atomic<Int>(0)

    static let lockName = "LOCK"
    static let snapshotName = "state.snapshot"
    static let membersName = "members"
    static let logName = "deltas.log"
    static let reservationName = "sequence.reserved"
    /// The octets cut from a damaged log, kept beside it; while the file is there the node has
    /// not settled since (docs/PROTOCOL.md 11.2).
    static let damagedLogName = "deltas.log.damaged"

    /// The running boot of the OS (Linux: `/proc/sys/kernel/random/boot_id`), "" when unknown.
    package static let currentBootID: String = {
        guard let data = FileManager.default.contents(atPath: "/proc/sys/kernel/random/boot_id"),
            let text = String(data: data, encoding: .utf8)
        else { return "" }
        return text.trimmingCharacters(in: .whitespacesAndNewlines)
    }()

    /// Checks that this process can create (when missing) and write the data directory at
    /// `path` and the files a node keeps in it: a directory this user may not write is a
    /// configuration the node must not start with (restarting would not help), said before
    /// anything is touched, with the path and the user. (A missing directory's nearest existing
    /// parent gets an empty directory made and removed at once: the kernel's say, not `access`'s.)
    package static func checkWritable(_ path: String) throws(StateSyncError) {
        func refuse(_ what: String, _ error: Int32) -> StateSyncError {
            StateSyncError(
                .invalidConfiguration,
                "node.data_dir \(path): \(what) is not writable by this user (uid \(geteuid())): \(String(cString: strerror(error))); give the user the directory (chown) or choose another node.data_dir"
            )
        }
        func isDirectory(_ candidate: String) -> Bool? {
            var info = stat()
            guard stat(candidate, &info) == 0 else { return nil }
            return info.st_mode & S_IFMT == S_IFDIR
        }
        func unreadable(_ what: String, _ error: Int32) -> StateSyncError {
            StateSyncError(
                .invalidConfiguration,
                "node.data_dir \(path): \(what) cannot be looked up by this user (uid \(geteuid())): \(String(cString: strerror(error)))"
            )
        }
        // Missing, or under a file: what `stat` says of a path one of whose levels is missing or
        // not a directory.
        func absent(_ error: Int32) -> Bool { error == ENOENT || error == ENOTDIR }
        guard let exists = isDirectory(path) else {
            guard absent(errno) else { throw unreadable("the directory", errno) }
            // Created in the nearest existing level of its path, which must be a directory this
            // user may write.
            var parent = (path as NSString).deletingLastPathComponent
            if parent.isEmpty { parent = FileManager.default.currentDirectoryPath }
            var found = isDirectory(parent)
            while found == nil, absent(errno) {
                let up = (parent as NSString).deletingLastPathComponent
                if up == parent || up.isEmpty { return }
                parent = up
                found = isDirectory(parent)
            }
            guard let found else { throw unreadable("its parent \(parent)", errno) }
            guard found else {
                throw StateSyncError(
                    .invalidConfiguration, "node.data_dir \(path): \(parent) is in its path and is not a directory")
            }
            if faccessat(AT_FDCWD, parent, W_OK | X_OK, AT_EACCESS) != 0 { throw refuse("its parent \(parent)", errno) }
            // `access` passes what the kernel may still refuse (a pseudo file system such as
            // /proc; for root, any directory): a directory is made there and removed.
            let probe = parent + "/.statesync-check-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            guard mkdir(probe, 0o700) == 0 else {
                throw StateSyncError(
                    .invalidConfiguration,
                    "node.data_dir \(path): cannot create a directory in \(parent): \(String(cString: strerror(errno)))"
                )
            }
            rmdir(probe)
            return
        }
        guard exists else { throw StateSyncError(.invalidConfiguration, "node.data_dir \(path) is not a directory") }
        if faccessat(AT_FDCWD, path, W_OK | X_OK, AT_EACCESS) != 0 { throw refuse("the directory", errno) }
        // The lock and the log are opened for writing; the other files are read, and replaced
        // by renaming a new one over them (which needs only the directory).
        for name in [lockName, logName] {
            let file = path + "/" + name
            if access(file, F_OK) == 0, faccessat(AT_FDCWD, file, R_OK | W_OK, AT_EACCESS) != 0 {
                throw refuse(file, errno)
            }
        }
        for name in [snapshotName, membersName, reservationName] {
            let file = path + "/" + name
            if access(file, F_OK) == 0, faccessat(AT_FDCWD, file, R_OK, AT_EACCESS) != 0 {
                throw StateSyncError(
                    .invalidConfiguration,
                    "node.data_dir \(path): \(file) is not readable by this user (uid \(geteuid())): \(String(cString: strerror(errno)))"
                )
            }
        }
    }

    /// Makes every missing level of `path` (as `mkdir -p`); returns which level could not be
    /// made and the kernel's reason, or `nil`.
    private static func makeDirectories(_ path: String) -> String? {
        var made = path.hasPrefix("/") ? "/" : ""
        for level in path.split(separator: "/") {
            if !made.isEmpty && !made.hasSuffix("/") { made += "/" }
            made += level
            if mkdir(made, 0o755) == 0 { continue }
            let error = errno
            var info = stat()
            if error == EEXIST, stat(made, &info) == 0, info.st_mode & S_IFMT == S_IFDIR { continue }
            return "\(made): \(String(cString: strerror(error == EEXIST ? ENOTDIR : error)))"
        }
        return nil
    }

    /// Creates the directory when missing and takes its lock.
    package init(path: String) throws(StateSyncError) {
        self.path = path
        if let failure = Self.makeDirectories(path) {
            throw StateSyncError(.dataDirectory, "cannot create data directory \(path): \(failure)")
        }
        let lockPath = path + "/" + Self.lockName
        let fd = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else {
            throw StateSyncError(.dataDirectory, "cannot open \(lockPath): \(String(cString: strerror(errno)))")
        }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            Glibc.close(fd)
            throw StateSyncError(
                .dataDirectory,
                "data directory \(path) is in use by another node (its LOCK is held); give each node its own node.data_dir"
            )
        }
        lockDescriptor = fd
        // A file written aside and never renamed into place (a stop on a full disk, a crash in
        // the middle of a write) is of no use: the one it was to replace is still there.
        for name in [Self.snapshotName, Self.membersName, Self.reservationName, Self.logName] {
            unlink(path + "/" + name + ".tmp")
        }
    }

    /// Releases the directory for another node. Idempotent.
    package func close() { unlock() }

    /// Renames the damaged log's octets aside (`deltas.log.damaged-<milliseconds>`, kept for
    /// whoever looks into them): the next start has nothing to settle. Best effort: a failure
    /// makes the next start settle once more.
    package func logDamageSettled() {
        let marker = path + "/" + Self.damagedLogName
        let milliseconds = Int64(Date().timeIntervalSince1970 * 1000)
        if rename(marker, "\(marker)-\(milliseconds)") == 0 { try? syncDirectory() }
    }

    /// The bytes an unprivileged writer may still use on the directory's file system
    /// (`statvfs`: free blocks × fragment size), `nil` if it cannot be read.
    package func availableBytes() -> UInt64? {
        var info = statvfs()
        guard statvfs(path, &info) == 0 else { return nil }
        return UInt64(info.f_bavail).multipliedReportingOverflow(by: UInt64(info.f_frsize)).partialValue
    }

    /// Releases the directory for another node. Idempotent.
    func unlock() {
        if locked.exchange(false, ordering: .acquiringAndReleasing) {
            flock(lockDescriptor, LOCK_UN)
            Glibc.close(lockDescriptor)
        }
    }

    deinit {
        unlock()
    }

    package func recover(onCorruptSnapshot: (String) -> Void) throws(StateSyncError) -> NodeMachine.Recovery {
        let snapshot = loadSnapshot(onCorrupt: onCorruptSnapshot)
        var log = try openLog()
        self.log.withLock { $0 = log }
        // Damage (not a torn tail) is kept before it is cut: its octets, for whoever looks into
        // them, and the file as the record that the node must settle, until it has (a restart in
        // between finds the log intact). One already there is kept.
        let damagedLog = path + "/" + Self.damagedLogName
        let recovered = try log.recover { cut throws(StateSyncError) in
            guard !FileManager.default.fileExists(atPath: damagedLog) else { return }
            try writeFileAtomically(Array(cut), named: Self.damagedLogName)
        }
        if recovered.isFirstFormat { log = try convertLog(through: recovered.end) }
        // A rename of the log (a conversion, or a compaction) not yet durable when the last
        // process stopped must be before the node appends to the file it found: a power loss
        // could otherwise bring back the older file, without what is appended now.
        try syncDirectory()
        var recovery = NodeMachine.Recovery(
            snapshot: snapshot, deltas: recovered.deltas, cutBytes: recovered.cutBytes,
            cutReason: recovered.cutReason, logSize: log.size)
        // Damage found now, or found earlier by a start that stopped before it settled.
        recovery.logDamaged =
            recovered.damaged
            || FileManager.default.fileExists(atPath: damagedLog)
        let members = path + "/" + Self.membersName
        if let data = FileManager.default.contents(atPath: members) {
            do {
                recovery.members = try Membership.decodeFile(Array(data))
            } catch {
                // The list is relearned from the peers; only collection waits for it meanwhile.
                onCorruptSnapshot(
                    "members file \(members) is damaged (\(error)); relearning the member list from peers")
            }
        }
        let reservation = path + "/" + Self.reservationName
        if let data = FileManager.default.contents(atPath: reservation) {
            // A rename not yet made durable (a crash right after it) is, by the directory's sync
            // above, before it is trusted: a power loss could otherwise bring back the older,
            // lower value.
            do {
                let reserved = try SequenceReservation.decode(Array(data))
                recovery.reservedSequence = reserved.through
                recovery.reservedInThisBoot = reserved.isOfBoot(Self.currentBootID)
                recovery.voidSequences = reserved.void
            } catch {
                // Written atomically, so only a damaged disk gets here: the log's own deltas and
                // the peers' progress lists still move the next sequence number (section 7.3).
                onCorruptSnapshot(
                    "sequence reservation \(reservation) is damaged (\(error)); after a power loss this node cannot tell which of its published deltas its log lost"
                )
            }
        }
        return recovery
    }

    package func markReservationUnsafe() {
        let file = path + "/" + Self.reservationName
        guard let data = FileManager.default.contents(atPath: file),
            let reserved = try? SequenceReservation.decode(Array(data))
        else { return }
        try? writeFileAtomically(
            SequenceReservation(through: reserved.through, bootID: "", void: reserved.void).encode(),
            named: Self.reservationName)
    }

    package func reserveSequences(through: UInt64, void: [ClosedRange<UInt64>]) throws(StateSyncError) {
        try writeFileAtomically(
            SequenceReservation(through: through, bootID: Self.currentBootID, void: void).encode(),
            named: Self.reservationName)
    }

    package func saveMembers(_ bytes: [UInt8]) throws(StateSyncError) {
        try writeFileAtomically(bytes, named: Self.membersName)
    }

    package func append(_ records: [UInt8]) throws(StateSyncError) {
        try withLog { log throws(StateSyncError) in try log.append(encoded: records) }
    }

    package func sync() throws(StateSyncError) {
        try withLog { log throws(StateSyncError) in
            try log.sync()
            if directoryUnsynced.load(ordering: .relaxed) { try syncDirectoryAfterRename() }
        }
    }

    /// Syncs the directory after a log was renamed into place; a failure is remembered for
    /// ``sync()`` to retry (see ``directoryUnsynced``).
    private func syncDirectoryAfterRename() throws(StateSyncError) {
        directoryUnsynced.store(true, ordering: .relaxed)
        if failingDirectorySyncs.load(ordering: .relaxed) > 0 {
            failingDirectorySyncs.subtract(1, ordering: .relaxed)
            throw StateSyncError(.dataDirectory, "cannot fsync \(path): injected failure (tests)")
        }
        try syncDirectory()
        directoryUnsynced.store(false, ordering: .relaxed)
    }

    /// Runs `body` with the log in use, holding its lock.
    private func withLog<T>(_ body: (DeltaLog) throws(StateSyncError) -> T) throws(StateSyncError) -> T {
        try log.withLock { log throws(StateSyncError) -> T in
            guard let log else { throw StateSyncError(.dataDirectory, "\(path): the log is used before recovery") }
            return try body(log)
        }
    }

    package func compact(_ snapshot: StateSnapshot, keeping records: [UInt8]) throws(StateSyncError) {
        waitForCompactions()
        try withLog { log throws(StateSyncError) in try log.sync() }
        try writeSnapshot(snapshot)
        guard !records.isEmpty else {
            try withLog { log throws(StateSyncError) in try log.reset() }
            return
        }
        // A new log with the records, renamed over the old one: a crash leaves the old log (whose
        // records the snapshot holds: replayed, they change nothing) or the new one.
        let temporary = try writeAside(DeltaLog.magic + records, named: Self.logName)
        _ = try log.withLock { log throws(StateSyncError) in try install(temporary, in: &log) }
    }

    /// Puts the log written aside at `temporary` in use, `log` being the one in use (its lock
    /// held): opened before the rename, so that from the rename on the node appends to the file
    /// that holds the name, whatever fails after (a failure before leaves the old log in use);
    /// then the directory synced, before an append to the new log can be reported durable (a
    /// power loss could bring back the old file without it). Returns the new log.
    private func install(_ temporary: String, in log: inout DeltaLog?) throws(StateSyncError) -> DeltaLog {
        let file = path + "/" + Self.logName
        let replacement = try DeltaLog(path: file, openingAt: temporary)
        guard rename(temporary, file) == 0 else { throw Self.ioError("rename", file) }
        log = replacement
        try syncDirectoryAfterRename()
        return replacement
    }

    package func compactInBackground(
        _ snapshot: StateSnapshot, keeping records: [UInt8],
        whenDone done: @escaping @Sendable (StateSyncError?) -> Void
    ) {
        // The snapshot holds every record appended so far: the new log takes those from here on.
        let mark: Int
        do {
            mark = try withLog { $0.size }
        } catch {
            done(error)
            return
        }
        compactor.async {
            do throws(StateSyncError) {
                try self.compact(snapshot, keeping: records, appendedFrom: mark)
                done(nil)
            } catch {
                // Not left to fill the disk (a full one, often): the next compaction writes anew.
                unlink(self.path + "/" + Self.logName + ".tmp")
                done(error)
            }
        }
    }

    package func waitForCompactions() {
        compactor.sync {}
    }

    /// A background compaction, on the compactor's thread: writes the snapshot, then replaces the
    /// log with one holding `records` and every record appended to the old one from `mark` on,
    /// while the node goes on appending (PROTOCOL.md appendix A). A crash leaves the old snapshot
    /// and log, the new snapshot and the old log (whose records before `mark` it holds: replayed,
    /// they change nothing), or both new; a failure leaves the old log in use, holding everything.
    private func compact(_ snapshot: StateSnapshot, keeping records: [UInt8], appendedFrom mark: Int)
        throws(StateSyncError)
    {
        try writeSnapshot(snapshot)
        afterBackgroundSnapshot.withLock { $0 }?()
        let file = path + "/" + Self.logName
        let temporary = path + "/" + Self.logName + ".tmp"
        // The log file until the swap below: only this thread renames it.
        let source = open(file, O_RDONLY | O_CLOEXEC)
        guard source >= 0 else { throw Self.ioError("open", file) }
        defer { Glibc.close(source) }
        let target = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard target >= 0 else { throw Self.ioError("open", temporary) }
        defer { Glibc.close(target) }
        try Self.write(DeltaLog.magic + records, to: target, path: temporary)
        // What was appended while the snapshot was written, in rounds without the lock (the
        // records before a size read are written and never change); the rest under it, so that
        // nothing is appended between the last copy and the swap.
        var copied = mark
        while true {
            let end = try withLog { $0.size }
            if end - copied <= Self.lockedCopyBytes { break }
            try Self.copy(from: source, copied..<end, to: target, file: file, temporary: temporary)
            copied = end
        }
        guard fsync(target) == 0 else { throw Self.ioError("fsync", temporary) }
        try log.withLock { log throws(StateSyncError) in
            let end = log?.size ?? copied
            try Self.copy(from: source, copied..<end, to: target, file: file, temporary: temporary)
            guard fsync(target) == 0 else { throw Self.ioError("fsync", temporary) }
            _ = try install(temporary, in: &log)
        }
    }

    /// Copies `range` of the file open as `source` to the end of `target`.
    private static func copy(
        from source: Int32, _ range: Range<Int>, to target: Int32, file: String, temporary: String
    ) throws(StateSyncError) {
        var buffer = [UInt8](repeating: 0, count: min(range.count, 1 << 20))
        var at = range.lowerBound
        while at < range.upperBound {
            let wanted = min(buffer.count, range.upperBound - at)
            let n = buffer.withUnsafeMutableBytes { pread(source, $0.baseAddress, wanted, off_t(at)) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw Self.ioError("read", file) }
            try write(Array(buffer[..<n]), to: target, path: temporary)
            at += n
        }
    }

    /// Writes all of `bytes` at the file offset of `descriptor`.
    private static func write(_ bytes: [UInt8], to descriptor: Int32, path: String) throws(StateSyncError) {
        var written = 0
        while written < bytes.count {
            let n = bytes[written...].withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw Self.ioError("write", path)
            }
            written += n
        }
    }

    /// Rewrites the log, of the first format (CRC-32) through `end` (its intact records), in the
    /// current one (CRC-32C): written aside, fsynced, renamed over it, the directory fsynced. A
    /// crash leaves the old file or the new one, and the node reads either. Returns the new log,
    /// in use from now on.
    private func convertLog(through end: Int) throws(StateSyncError) -> DeltaLog {
        let file = path + "/" + Self.logName
        guard let data = FileManager.default.contents(atPath: file) else { throw Self.ioError("read", file) }
        let converted = DeltaLog.converted(fromFirstFormat: [UInt8](data), through: end)
        let temporary = try writeAside(converted, named: Self.logName)
        return try log.withLock { log throws(StateSyncError) in try install(temporary, in: &log) }
    }

    /// Opens (and recovers) the directory's write-ahead log.
    func openLog() throws(StateSyncError) -> DeltaLog {
        try DeltaLog(path: path + "/" + Self.logName)
    }

    /// Loads the snapshot, or `nil` when there is none. A damaged one is renamed `*.corrupt-<time>`
    /// and reported through `onCorrupt`.
    func loadSnapshot(onCorrupt: (String) -> Void) -> StateSnapshot? {
        let file = path + "/" + Self.snapshotName
        guard let data = FileManager.default.contents(atPath: file) else { return nil }
        do {
            return try StateSnapshot.decode(Array(data))
        } catch {
            let aside = file + ".corrupt-\(Int(Date().timeIntervalSince1970))"
            try? FileManager.default.moveItem(atPath: file, toPath: aside)
            onCorrupt("snapshot \(file) is damaged (\(error)); moved to \(aside), starting empty")
            return nil
        }
    }

    /// Writes the snapshot atomically and durably.
    func writeSnapshot(_ snapshot: StateSnapshot) throws(StateSyncError) {
        try writeFileAtomically(StateSnapshot.encode(snapshot), named: Self.snapshotName)
    }

    /// Writes `bytes` as the file `name` of the directory: a temporary file, fsynced, renamed
    /// over the old one, the directory fsynced — a crash leaves the old file or the new one.
    func writeFileAtomically(_ bytes: [UInt8], named name: String) throws(StateSyncError) {
        let file = path + "/" + name
        let temporary = try writeAside(bytes, named: name)
        guard rename(temporary, file) == 0 else { throw Self.ioError("rename", file) }
        try syncDirectory()
    }

    /// Writes `bytes` as the temporary file of `name` (`name.tmp`), fsynced; returns its path.
    private func writeAside(_ bytes: [UInt8], named name: String) throws(StateSyncError) -> String {
        let temporary = path + "/" + name + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw Self.ioError("open", temporary) }
        defer { Glibc.close(fd) }
        do throws(StateSyncError) {
            try Self.write(bytes, to: fd, path: temporary)
            guard fsync(fd) == 0 else { throw Self.ioError("fsync", temporary) }
        } catch {
            // Not left behind on a full disk, where its octets are what is missing.
            unlink(temporary)
            throw error
        }
        return temporary
    }

    /// Makes the directory's entries (a rename) durable.
    func syncDirectory() throws(StateSyncError) {
        let dir = open(path, O_RDONLY | O_CLOEXEC)
        guard dir >= 0 else { throw Self.ioError("open", path) }
        defer { Glibc.close(dir) }
        guard fsync(dir) == 0 else { throw Self.ioError("fsync", path) }
    }

    private static func ioError(_ op: String, _ file: String) -> StateSyncError {
        StateSyncError(.dataDirectory, "cannot \(op) \(file): \(String(cString: strerror(errno)))")
    }
}
