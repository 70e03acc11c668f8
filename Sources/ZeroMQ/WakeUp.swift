import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A wake-up signal another thread can raise to interrupt a ``Poller`` or ``ReadPoller`` wait.
///
/// The owner of an I/O thread polls ``fileDescriptor`` for `.readable` next to its sockets; any
/// thread may call ``signal()``. It is a pipe, so signals coalesce and never block.
///
/// A signal raised while one is already pending costs an atomic exchange, not a `write`: the
/// polling thread must look for work *after* ``drain()`` (work queued before a signal is then
/// seen, whether or not that signal wrote to the pipe).
///
/// Thread safety: `signal()` is safe from any thread; `drain()` belongs to the polling thread.
public final class WakeUp: Sendable {
    /// The descriptor to poll for readability.
    public let fileDescriptor: Int32
    private let writeDescriptor: Int32
    /// A byte is in the pipe, or about to be, that the poller has not drained yet.
    private let pending = Atomic<Bool>(false)

    public init() throws(ZeroMQError) {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw ZeroMQError(code: errno, operation: "pipe") }
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        fileDescriptor = fds[0]
        writeDescriptor = fds[1]
    }

    /// Wakes the poller. A full pipe already holds a pending wake-up, so a failed write is fine.
    public func signal() {
        guard !pending.exchange(true, ordering: .sequentiallyConsistent) else { return }
        var byte: UInt8 = 1
        _ = write(writeDescriptor, &byte, 1)
    }

    /// Consumes every pending signal; call after the poller reported `.readable`, then look for
    /// work.
    public func drain() {
        // One read: ``signal()`` writes only while no byte is pending, and the flag is cleared
        // below only after this read, so the pipe holds at most one byte. (A loop until
        // `EAGAIN` cost a second `read` per wake-up, on the path of every lone write; a stray
        // byte would only cost a spurious wake-up.)
        var byte: UInt8 = 0
        _ = read(fileDescriptor, &byte, 1)
        // Cleared after reading: a signal that saw the flag set came before this point, so its
        // work is queued already and the caller looks for work next.
        pending.store(false, ordering: .sequentiallyConsistent)
    }

    deinit {
        close(fileDescriptor)
        close(writeDescriptor)
    }
}
