import StateSync
import ZeroMQ

/// A node's CurveZMQ keys, read and checked at start from its ``SecurityConfiguration``: its own
/// pair, each peer's public key, and whom the ZAP handler admits.
struct NodeKeys: Sendable {
    let pair: Curve.KeyPair
    /// Public keys by peer node id, in configuration order (several while a peer rotates).
    let peers: [String: [[UInt8]]]
    /// Every admitted public key and who it is (`node:ID`, or `client:` and the key's Z85 text):
    /// the user id of its messages, which the machine checks access by.
    let admitted: [[UInt8]: String]
    /// What each admitted client may do, by identity.
    let clientAccess: [String: SecurityConfiguration.ClientAccess]

    /// Reads every key the configuration names; throws one line naming the key and the fix.
    init(_ security: SecurityConfiguration) throws(StateSyncError) {
        do {
            pair = try CurveKeyFile.readSecretKey(at: security.secretKeyFile)
        } catch {
            throw StateSyncError(.invalidConfiguration, "security.secret_key: \(error)")
        }
        var peers: [String: [[UInt8]]] = [:]
        var admitted: [[UInt8]: String] = [:]
        for (id, texts) in security.peerKeys.sorted(by: { $0.key < $1.key }) {
            for text in texts {
                let key: [UInt8]
                do {
                    key = try CurveKeyFile.publicKey(text)
                } catch {
                    throw StateSyncError(.invalidConfiguration, "security.peer_keys: \(id): \(error)")
                }
                if let existing = admitted[key] {
                    let whose = existing == "node:\(id)" ? "another of its entries" : String(existing.dropFirst(5))
                    throw StateSyncError(
                        .invalidConfiguration,
                        "security.peer_keys: \(id) has the same key as \(whose); every node needs its own key pair"
                    )
                }
                peers[id, default: []].append(key)
                admitted[key] = "node:\(id)"
            }
        }
        var clientAccess: [String: SecurityConfiguration.ClientAccess] = [:]
        for client in security.clients {
            let key: [UInt8]
            let identity: String
            do {
                key = try CurveKeyFile.publicKey(client.key)
                identity = "client:" + (try Curve.z85Encode(key))
            } catch {
                throw StateSyncError(.invalidConfiguration, "security.client_keys: \(error)")
            }
            if let existing = admitted[key] {
                let role = existing.hasPrefix("node:") ? "peer \(existing.dropFirst(5))" : "another client_keys entry"
                throw StateSyncError(
                    .invalidConfiguration,
                    "security.client_keys: \(client.key) is already admitted as \(role); give each key one role and one entry"
                )
            }
            admitted[key] = identity
            clientAccess[identity] = client
        }
        self.peers = peers
        self.admitted = admitted
        self.clientAccess = clientAccess
    }

    /// The ZAP domains of the node's server sockets: its publish socket serves only peers, its
    /// client API peers (repairs) and clients.
    static let peerDomain = "statesync-peer"
    static let apiDomain = "statesync-api"

    /// The ZAP handler's answer to `request`: admitted (with who) or refused. A client key is
    /// admitted only on the client API, never on the publish socket (which carries every
    /// channel).
    func identity(for request: ZAP.Request) -> String? {
        guard let key = request.curvePublicKey, let identity = admitted[key] else { return nil }
        if identity.hasPrefix("client:"), request.domain != Self.apiDomain { return nil }
        return identity
    }
}
