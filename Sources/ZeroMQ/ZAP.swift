import CZeroMQ

/// The ZeroMQ Authentication Protocol (ZAP, RFC 27): how libzmq asks the application whether to
/// admit a peer that completed a security handshake (for CURVE: which public key it holds).
///
/// The application binds a REP socket at ``endpoint`` in the same context *before* any secured
/// socket accepts connections (without a handler, libzmq admits every CURVE client), receives
/// ``Request``s and answers each with ``reply(to:admit:userID:reason:)``.
public enum ZAP {
    /// Where libzmq sends its requests, in the context of the secured sockets.
    public static let endpoint = "inproc://zeromq.zap.01"
    static let version = Array("1.0".utf8)

    /// One authentication request.
    public struct Request: Sendable, Equatable {
        /// Echoed in the reply.
        public let requestID: [UInt8]
        /// The socket's ZAP domain (`ZMQ_ZAP_DOMAIN`; empty unless set).
        public let domain: String
        /// The peer's IP address, as text.
        public let address: String
        /// The peer's routing id, if it set one.
        public let routingID: [UInt8]
        /// `NULL`, `PLAIN` or `CURVE`.
        public let mechanism: String
        /// The mechanism's credentials: for CURVE, the client's 32-byte public key.
        public let credentials: [[UInt8]]

        /// The client's public key, for a CURVE request.
        public var curvePublicKey: [UInt8]? {
            mechanism == "CURVE" && credentials.count == 1 && credentials[0].count == 32 ? credentials[0] : nil
        }

        /// Decodes the frames a REP socket received (RFC 27 section 2). Throws for anything
        /// that is not a version 1.0 request.
        public init(frames: [[UInt8]]) throws(ZeroMQError) {
            guard frames.count >= 6, frames[0] == ZAP.version else {
                throw ZeroMQError(code: EPROTO, operation: "ZAP request (not version 1.0, or fewer than 6 frames)")
            }
            requestID = frames[1]
            domain = String(decoding: frames[2], as: UTF8.self)
            address = String(decoding: frames[3], as: UTF8.self)
            routingID = frames[4]
            mechanism = String(decoding: frames[5], as: UTF8.self)
            credentials = Array(frames.dropFirst(6))
        }
    }

    /// The reply to `request`: status 200 (admitted, with `userID`, which the peer's messages
    /// then carry as their `User-Id` property) or 400 (refused, with `reason`).
    public static func reply(to request: Request, admit: Bool, userID: String = "", reason: String = "")
        -> [[UInt8]]
    {
        [
            version, request.requestID, Array((admit ? "200" : "400").utf8),
            Array((reason.isEmpty ? (admit ? "OK" : "refused") : reason).utf8), Array(userID.utf8), [],
        ]
    }

    /// The reply to a request that could not be decoded (status 500), when it carried at least a
    /// request id; `nil` when nothing can be answered.
    public static func replyToMalformed(_ frames: [[UInt8]]) -> [[UInt8]]? {
        guard frames.count >= 2 else { return nil }
        return [version, frames[1], Array("500".utf8), Array("malformed ZAP request".utf8), [], []]
    }
}
