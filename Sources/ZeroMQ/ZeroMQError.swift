import CZeroMQ

/// An error reported by libzmq, with the `errno` it set, the operation that failed and
/// libzmq's own description of the error (`zmq_strerror`).
public struct ZeroMQError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The `errno` value libzmq reported (`zmq_errno()`), read immediately after the failing call.
    public let code: Int32
    /// The libzmq operation that failed, such as `zmq_bind(tcp://127.0.0.1:7001)`.
    public let operation: String
    /// libzmq's description of `code`.
    public let message: String

    /// Creates an error for `code` as reported by `operation`.
    public init(code: Int32, operation: String) {
        self.code = code
        self.operation = operation
        self.message = String(cString: zmq_strerror(code))
    }

    public var description: String { "\(operation) failed: \(message) (errno \(code))" }

    /// `true` when the error means the context or socket was terminated (`ETERM`).
    public var isTerminated: Bool { code == ETERM }

    /// `true` when a ROUTER_MANDATORY socket has no peer with the routing id (`EHOSTUNREACH`):
    /// the peer disconnected.
    public var isHostUnreachable: Bool { code == EHOSTUNREACH }
}

/// The outcome of a call that would have blocked on a non-blocking socket.
enum CallResult {
    case done(Int32)
    case wouldBlock
}

/// The single choke point for every libzmq call that returns `-1` on failure.
///
/// Reads `zmq_errno()` at once, retries `EINTR`, reports `EAGAIN` as `.wouldBlock`, and throws a
/// ``ZeroMQError`` for everything else.
@inline(__always)
func zmqCall(_ operation: @autoclosure () -> String, _ body: () -> Int32) throws(ZeroMQError) -> CallResult {
    while true {
        let rc = body()
        if rc >= 0 { return .done(rc) }
        let code = zmq_errno()
        if code == EINTR { continue }
        if code == EAGAIN { return .wouldBlock }
        throw ZeroMQError(code: code, operation: operation())
    }
}

/// Like ``zmqCall(_:_:)`` for calls that must not report would-block (bind, setsockopt, ...).
@inline(__always)
@discardableResult
func zmqCheck(_ operation: @autoclosure () -> String, _ body: () -> Int32) throws(ZeroMQError) -> Int32 {
    switch try zmqCall(operation(), body) {
    case .done(let rc): return rc
    case .wouldBlock: throw ZeroMQError(code: EAGAIN, operation: operation())
    }
}
