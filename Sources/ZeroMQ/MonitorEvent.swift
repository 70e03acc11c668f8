import CZeroMQ

/// One event of a socket monitor (``Socket/monitor(_:on:)``): what happened, its value (an
/// error code for failures) and the endpoint of the monitored socket.
public struct MonitorEvent: Sendable, Equatable {
    public let event: UInt16
    public let value: UInt32
    public let endpoint: String

    /// The events a monitor reports (libzmq's `ZMQ_EVENT_*` bits).
    public struct Kinds: OptionSet, Sendable {
        public let rawValue: UInt16
        public init(rawValue: UInt16) { self.rawValue = rawValue }

        /// A connection completed its handshake (with security, its key was admitted).
        public static let handshakeSucceeded = Kinds(rawValue: UInt16(ZMQ_EVENT_HANDSHAKE_SUCCEEDED))
        /// A security handshake failed before it reached a ZAP handler (a peer without the right
        /// mechanism, a broken handshake).
        public static let handshakeFailed = Kinds(
            rawValue: UInt16(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL))
    }

    /// Whether this event is one of `kinds`.
    public func isOne(of kinds: Kinds) -> Bool { kinds.rawValue & event != 0 }

    /// Decodes a monitor message: a 6-octet frame (event, value; native byte order), then the
    /// endpoint. `nil` for anything else.
    public init?(frames: [[UInt8]]) {
        guard frames.count >= 2, frames[0].count == 6 else { return nil }
        let bytes = frames[0]
        event = bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 0, as: UInt16.self) }
        value = bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 2, as: UInt32.self) }
        endpoint = String(decoding: frames[1], as: UTF8.self)
    }
}
