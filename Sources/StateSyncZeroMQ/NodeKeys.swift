import StateSync
import ZeroMQ

/// A node's CurveZMQ keys, read and checked at start from its ``SecurityConfiguration``: its own
/// pair, each peer's public key, and whom the ZAP handler admits.
struct NodeKeys: Sendable {
    let pair: Curve.KeyPair
    /// Public keys by peer node id.
    let peers: [String: [UInt8]]
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
        var peers: [String: [UInt8]] = [:]
        var admitted: [[UInt8]: String] = [:]
        for (id, text) in security.peerKeys.sorted(by: { $0.key < $1.key }) {
            do {
                let key = try CurveKeyFile.publicKey(text)
                peers[id] = key
                admitted[key] = "node:\(id)"
            } catch {
                throw StateSyncError(.invalidConfiguration, "security.peer_keys: \(id): \(error)")
            }
        }
        var clientAccess: [String: SecurityConfiguration.ClientAccess] = [:]
        for client in security.clients {
            do {
                let key = try CurveKeyFile.publicKey(client.key)
                let identity = "client:" + (try Curve.z85Encode(key))
                admitted[key] = admitted[key] ?? identity
                clientAccess[identity] = client
            } catch {
                throw StateSyncError(.invalidConfiguration, "security.client_keys: \(error)")
            }
        }
        self.peers = peers
        self.admitted = admitted
        self.clientAccess = clientAccess
    }

    /// The ZAP handler's answer to `request`: admitted (with who) or refused.
    func identity(for request: ZAP.Request) -> String? {
        guard let key = request.curvePublicKey else { return nil }
        return admitted[key]
    }
}
