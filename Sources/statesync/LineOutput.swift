import Dispatch
import Foundation
import Synchronization

/// Standard output for a stream of lines (`statesync watch`): lines are written by a serial
/// queue, all the lines queued since its last write in one `write`. An idle watch prints each
/// line at once; one that receives faster than one write per line batches by itself, instead of
/// one system call (and one wake-up of the reading process) per line.
///
/// A line given to ``print(_:)`` is not yet on stdout: ``flush()`` waits until it is. Not
/// `batched` (the `--state` watch, which records a line as printed once printing returns), each
/// line is written before ``print(_:)`` returns.
final class LineOutput: Sendable {
    private let batched: Bool
    private let queue = DispatchQueue(label: "statesync.stdout")
    /// Lines not yet handed to the queue's next write, and whether that write is scheduled.
    private let pending = Mutex<(bytes: [UInt8], scheduled: Bool)>(([], false))

    init(batched: Bool) {
        self.batched = batched
    }

    /// Queues `line` and a newline (writes them, not `batched`).
    func print(_ line: String) {
        guard batched else { return emit(line) }
        let schedule = pending.withLock { pending -> Bool in
            pending.bytes.append(contentsOf: line.utf8)
            pending.bytes.append(0x0A)
            defer { pending.scheduled = true }
            return !pending.scheduled
        }
        if schedule { queue.async { self.writePending() } }
    }

    /// Returns once every line queued before the call is written.
    func flush() {
        queue.sync { writePending() }
    }

    private func writePending() {
        let bytes = pending.withLock { pending -> [UInt8] in
            defer { pending = ([], false) }
            return pending.bytes
        }
        var written = 0
        while written < bytes.count {
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
                // A non-blocking stdout that is full: wait until it takes more.
                var descriptor = pollfd(fd: STDOUT_FILENO, events: Int16(POLLOUT), revents: 0)
                _ = poll(&descriptor, 1, -1)
            default:
                // A line that cannot be printed must not be skipped silently while later ones are:
                // the watch ends (EPIPE: the reader went away).
                if error != EPIPE {
                    FileHandle.standardError.write(
                        Data(
                            "statesync: cannot write to stdout: \(String(cString: strerror(error))); the watch ends\n"
                                .utf8))
                }
                _exit(1)
            }
        }
    }
}
