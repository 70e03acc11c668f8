import Foundation

/// An error of the StateSync library, with an extensible code and the context it happened in.
public struct StateSyncError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What kind of error this is. Extensible: match on the static members, expect new ones.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A short name of the code.
        public let description: String
        init(_ description: String) { self.description = description }

        /// A configuration file or environment variable is invalid.
        public static let invalidConfiguration = Code("invalid configuration")
        /// A channel, model or property name, or a request, breaks the rules.
        public static let invalidName = Code("invalid name")
        /// A live model of another type holds the address.
        public static let modelTypeMismatch = Code("model type mismatch")
        /// A socket could not be set up or bound.
        public static let transport = Code("transport")
        /// The node or client is stopped or closed.
        public static let stopped = Code("stopped")
        /// The data directory, its log or its snapshot cannot be used.
        public static let dataDirectory = Code("data directory")
        /// No answer came in time.
        public static let timeout = Code("timeout")
        /// The node answered with an error.
        public static let remote = Code("remote error")
        /// A message broke the protocol (malformed, or a snapshot cut short).
        public static let protocolError = Code("protocol error")
        /// The connection to the node was lost, or the node restarted.
        public static let connectionLost = Code("connection lost")
        /// A request too large for one message: the node would drop the connection
        /// (``ClientProtocol/maximumFrameOctets``).
        public static let tooLarge = Code("too large")
    }

    /// What kind of error this is.
    public var code: Code
    /// One line a person can act on: what, where, what to do.
    public var message: String

    /// An error of kind `code`, described by `message` (one line a person can act on).
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}

/// The rules for channel, model and property names (docs/PROTOCOL.md, "Names").
public enum Names {
    /// Checks a channel name: 1–255 bytes of UTF-8, without NUL or `/`.
    public static func validateChannel(_ name: String) throws(StateSyncError) {
        try validate(name, what: "channel", forbidSlash: true)
    }

    /// Checks a model id: 1–255 bytes of UTF-8, without NUL.
    public static func validateModel(_ name: String) throws(StateSyncError) {
        try validate(name, what: "model id", forbidSlash: false)
    }

    /// Checks a property name: 1–255 bytes of UTF-8, without NUL.
    public static func validateProperty(_ name: String) throws(StateSyncError) {
        try validate(name, what: "property name", forbidSlash: false)
    }

    /// Checks the name of a write: a property name, or the empty name of a model's deletion.
    public static func validateWrite(_ write: PropertyWrite) throws(StateSyncError) {
        if write.isModelDeletion { return }
        try validateProperty(write.name)
    }

    private static func validate(_ name: String, what: String, forbidSlash: Bool) throws(StateSyncError) {
        // One pass over the bytes in place (every received delta's names come through here;
        // three walks of the UTF-8 view cost a reader of transactions 2 % of its samples).
        var name = name
        let (count, hasNUL, hasSlash, isASCII) = name.withUTF8 { bytes in
            var hasNUL = false
            var hasSlash = false
            var high: UInt8 = 0
            for byte in bytes {
                hasNUL = hasNUL || byte == 0
                hasSlash = hasSlash || byte == UInt8(ascii: "/")
                high |= byte
            }
            return (bytes.count, hasNUL, hasSlash, high < 0x80)
        }
        guard count > 0 else { throw StateSyncError(.invalidName, "\(what) is empty") }
        guard count <= 255 else {
            throw StateSyncError(.invalidName, "\(what) '\(name.prefix(32))…' is longer than 255 bytes")
        }
        guard !hasNUL else { throw StateSyncError(.invalidName, "\(what) contains a NUL byte") }
        if forbidSlash && hasSlash {
            throw StateSyncError(.invalidName, "\(what) '\(name)' contains '/'")
        }
        // Names compare as bytes on the wire and in digests: canonically equivalent spellings
        // must not both exist, so only the composed form (NFC) is accepted.
        // (ASCII is always NFC: the usual names skip the normalisation on the delta path.)
        guard isASCII || name.utf8.elementsEqual(name.precomposedStringWithCanonicalMapping.utf8) else {
            throw StateSyncError(.invalidName, "\(what) '\(name)' is not in Unicode NFC form; normalize it (NFC) first")
        }
    }
}
