import Foundation
import Synchronization

/// Standard output for a stream of lines (`statesync watch`). Batched, the lines printed are
/// kept until ``flush()`` writes them all in one `write`: the watch flushes after each batch of
/// events its client received together, so a watch that receives faster than one write per line
/// makes one system call (and one wake-up of the reading process) per batch, and an idle one
/// prints each line at once. The caller's thread writes: no hop to another thread per batch.
///
/// Not `batched` (the `--state` watch, which records a line as printed once printing returns),
/// each line is written before ``print(_:)`` returns.
final class LineOutput: Sendable {
    private let batched: Bool
    /// Lines not yet written. The lock is held while they are written, so that a flush from a
    /// signal handler returns only once a write in progress has ended.
    private let pending = Mutex<[UInt8]>([])

    init(batched: Bool) {
        self.batched = batched
    }

    /// Keeps `line` and a newline for the next ``flush()`` (writes them, not `batched`).
    func print(_ line: String) {
        guard batched else { return emit(line) }
        pending.withLock { pending in
            pending.append(contentsOf: line.utf8)
            pending.append(0x0A)
        }
    }

    /// Keeps the line `write` appends, and a newline, for the next ``flush()`` (writes them, not
    /// `batched`): the line goes straight into the pending octets, with no `String` between.
    func print(writing write: (inout [UInt8]) -> Void) {
        guard batched else {
            var line: [UInt8] = []
            write(&line)
            line.append(0x0A)
            return pending.withLock { _ in Self.writeAll(line) }
        }
        pending.withLock { pending in
            write(&pending)
            pending.append(0x0A)
        }
    }

    /// Returns once every line printed before the call is written.
    func flush() {
        pending.withLock { pending in
            guard !pending.isEmpty else { return }
            Self.writeAll(pending)
            // A burst's large buffer is not kept for the quiet that follows.
            pending.removeAll(keepingCapacity: pending.count <= 1 << 16)
        }
    }

    /// For a signal that ends the process: writes what is pending, unless standard output does
    /// not take it within `limit` (its reader stopped reading: a paused pager, a stalled pipe).
    /// Then the process must still end — the lock may be held by a write that never returns —
    /// so this gives up and says how much was not written.
    /// Returns whether everything queued was written.
    @discardableResult
    func flushBeforeExit(within limit: Duration) -> Bool {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            let flushed: Bool? = pending.withLockIfAvailable { pending in
                guard !pending.isEmpty else { return true }
                // Non-blocking from here: a full pipe must not hold the exit up.
                let flags = fcntl(STDOUT_FILENO, F_GETFL)
                if flags >= 0 { _ = fcntl(STDOUT_FILENO, F_SETFL, flags | O_NONBLOCK) }
                let written = Self.writeAll(pending, until: deadline)
                if written < pending.count { Self.reportUnwritten(pending.count - written) }
                return written == pending.count
            }
            if let flushed { return flushed }
            usleep(5_000)  // a write in progress holds the lock: look again until the deadline
        }
        Self.reportUnwritten(nil)
        return false
    }

    private static func reportUnwritten(_ octets: Int?) {
        let what = octets.map { "\($0) bytes of output were" } ?? "the output queued was"
        FileHandle.standardError.write(
            Data("statesync: \(what) not written: standard output is not being read\n".utf8))
    }

    /// Writes `bytes` to standard output; returns how many octets went. Without a `deadline`,
    /// all of them: a line that cannot be printed must not be skipped silently while later ones
    /// are, so a write error ends the watch (EPIPE: the reader went away). With one, what goes by
    /// then (a write error ends the attempt).
    @discardableResult
    private static func writeAll(_ bytes: [UInt8], until deadline: ContinuousClock.Instant? = nil) -> Int {
        var written = 0
        while written < bytes.count {
            if let deadline, ContinuousClock.now >= deadline { break }
            let result = bytes.withUnsafeBytes { write(STDOUT_FILENO, $0.baseAddress! + written, $0.count - written) }
            if result > 0 {
                written += result
                continue
            }
            let error = result < 0 ? errno : EIO
            switch error {
            case EINTR:
                continue
            case EAGAIN:
                // A non-blocking stdout that is full: wait until it takes more (a while, with a
                // deadline).
                var descriptor = pollfd(fd: STDOUT_FILENO, events: Int16(POLLOUT), revents: 0)
                _ = poll(&descriptor, 1, deadline == nil ? -1 : 10)
            default:
                guard deadline == nil else { return written }
                if error != EPIPE {
                    FileHandle.standardError.write(
                        Data(
                            "statesync: cannot write to stdout: \(String(cString: strerror(error))); the watch ends\n"
                                .utf8))
                }
                _exit(1)
            }
        }
        return written
    }
}
