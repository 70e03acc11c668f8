/// CurveZMQ security of a node (docs/PROTOCOL.md section 14): when configured, every socket of the
/// node is encrypted and authenticated, and only the listed public keys are admitted — its peers'
/// on the publish and repair sockets and the API, its clients' on the API.
///
/// Keys are given as their 40 Z85 characters or as the path of a file holding them (the `.pub`
/// file `statesync keygen` writes); the node reads and checks them when it starts.
public struct SecurityConfiguration: Sendable, Equatable {
    /// This node's secret key file (`statesync keygen --out PATH`), readable by its owner only.
    public var secretKeyFile: String
    /// Every peer's public key, by node id.
    public var peerKeys: [String: String]
    /// The public keys of the clients admitted to the client API. Each may read and write every
    /// channel (per-channel permissions are not built yet).
    public var clientKeys: [String]

    /// A security configuration with these keys.
    public init(secretKeyFile: String, peerKeys: [String: String], clientKeys: [String] = []) {
        self.secretKeyFile = secretKeyFile
        self.peerKeys = peerKeys
        self.clientKeys = clientKeys
    }
}
