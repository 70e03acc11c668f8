/// CurveZMQ security of a node (docs/PROTOCOL.md section 14): when configured, every socket of the
/// node is encrypted and authenticated, and only the listed public keys are admitted — its peers'
/// on the publish and repair sockets and the API, its clients' on the API.
///
/// Keys are given as their 40 Z85 characters or as the path of a file holding them (the `.pub`
/// file `statesync keygen` writes); the node reads and checks them when it starts.
public struct SecurityConfiguration: Sendable, Equatable {
    /// This node's secret key file (`statesync keygen --out PATH`), readable by its owner only.
    public var secretKeyFile: String
    /// Every peer's public keys, by node id: usually one; two while a peer rotates its key pair
    /// (the new key is added, the peer restarts with it, the old key is removed — README,
    /// "Rotating keys"). Any of them is admitted as that node.
    public var peerKeys: [String: [String]]
    /// The clients admitted to the client API, with what each may do.
    public var clients: [ClientAccess]

    /// A client key and the channels it may read and write.
    public struct ClientAccess: Sendable, Equatable {
        /// The client's public key (Z85 text or a `.pub` path).
        public var key: String
        /// Channel patterns GET and WATCH are allowed on: a channel, `channel/*` (the same: every
        /// model of it, as the CLI writes addresses), `prefix*`, or `*` for all.
        public var read: [String]
        /// Channel patterns SET is allowed on.
        public var write: [String]

        /// A client that may read `read` and write `write` (by default: every channel).
        public init(key: String, read: [String] = ["*"], write: [String] = ["*"]) {
            self.key = key
            self.read = read
            self.write = write
        }

        /// Whether `channel` matches one of `patterns`.
        public static func allows(_ patterns: [String], _ channel: String) -> Bool {
            patterns.contains { pattern in
                if pattern.hasSuffix("/*") { return channel == pattern.dropLast(2) }
                return pattern.hasSuffix("*") ? channel.hasPrefix(pattern.dropLast()) : channel == pattern
            }
        }
    }

    /// A security configuration with these keys.
    public init(secretKeyFile: String, peerKeys: [String: [String]], clients: [ClientAccess] = []) {
        self.secretKeyFile = secretKeyFile
        self.peerKeys = peerKeys
        self.clients = clients
    }
}
