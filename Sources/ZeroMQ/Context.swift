import CZeroMQ
import Synchronization

/// A libzmq context: the container of every socket of a process (or of one component).
///
/// Thread safety: a context is safe to share between threads (libzmq guarantees it); the sockets
/// it creates are not. Terminating a context waits for sockets to close, so every ``Socket`` sets
/// a bounded linger.
public final class Context: Sendable {
    // libzmq contexts are thread-safe by contract (zmq_ctx_new(3)); the pointer is immutable.
    nonisolated(unsafe) let handle: UnsafeMutableRawPointer
    private let terminated = Atomic<Bool>(false)

    /// Creates a new context.
    public init() throws(ZeroMQError) {
        guard let handle = zmq_ctx_new() else {
            throw ZeroMQError(code: zmq_errno(), operation: "zmq_ctx_new")
        }
        self.handle = handle
    }

    /// Creates a socket of `type` owned by the calling thread. Linger defaults to 0 ms so closing
    /// never blocks; change it with ``Socket/setLinger(milliseconds:)``.
    public func socket(_ type: SocketType) throws(ZeroMQError) -> Socket {
        try Socket(context: self, type: type)
    }

    /// The version of the libzmq library in use, e.g. `(4, 3, 4)`.
    public static var libraryVersion: (major: Int32, minor: Int32, patch: Int32) {
        var major: Int32 = 0
        var minor: Int32 = 0
        var patch: Int32 = 0
        zmq_version(&major, &minor, &patch)
        return (major, minor, patch)
    }

    /// Whether libzmq was built with `capability` (e.g. `"curve"`).
    public static func has(_ capability: String) -> Bool {
        zmq_has(capability) == 1
    }

    /// Terminates the context: waits (up to each socket's linger) until every socket of it is
    /// closed and its I/O threads have released their endpoints. Call after closing the sockets;
    /// idempotent. Deinitialisation does it too, at a time ARC chooses.
    public func terminate() {
        guard !terminated.exchange(true, ordering: .acquiringAndReleasing) else { return }
        while zmq_ctx_term(handle) != 0 && zmq_errno() == EINTR {}
    }

    deinit {
        terminate()
    }
}
