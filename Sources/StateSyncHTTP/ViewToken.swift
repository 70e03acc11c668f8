import Crypto
public import Foundation
public import StateSync
import Synchronization
public import ZeroMQ

/// A viewer's proof that it holds a client key, for the live view of a node with security
/// (`statesync view-token`): `v1-PUBLIC-EXPIRES-MAC`, where PUBLIC is the client's public key (64
/// hex digits), EXPIRES the Unix second it stops being valid, and MAC the HMAC-SHA256 of
/// `v1-PUBLIC-EXPIRES` under a key both sides derive from the X25519 agreement of the client's
/// secret key with the node's public key (HKDF-SHA256, info `statesync view token v1`). Only the
/// holder of the client's secret key, or the node, can make one; the node admits it for what
/// that client key may read (`security.client_keys`), never more.
public enum ViewToken {
    /// Makes a token for the client `pair` to view the node whose public key is `serverPublicKey`,
    /// valid until `expires`.
    public static func make(client pair: Curve.KeyPair, serverPublicKey: [UInt8], expires: Date) throws -> String {
        let seconds = Int64(expires.timeIntervalSince1970.rounded(.down))
        let message = "v1-\(hex(pair.publicKey))-\(seconds)"
        let key = try macKey(secret: pair.secretKey, public: serverPublicKey)
        let mac = HMAC<SHA256>.authenticationCode(for: Array(message.utf8), using: key)
        return "\(message)-\(hex(Array(mac)))"
    }

    /// Why a token is not admitted.
    public enum Refusal: Error, Equatable, Sendable, CustomStringConvertible {
        /// Not `v1-PUBLIC-EXPIRES-MAC` with a 64-hex-digit key and MAC (cut short when copied?).
        case malformed
        /// Its MAC does not check out under this node's key: made with another node's public key
        /// (`statesync view-token --server-key`), or changed.
        case notForThisNode
        /// Made for this node, and expired at this Unix second.
        case expired(at: Int64)
        /// Made for this node by a client key that `security.client_keys` does not list (any more).
        case keyNotAdmitted(String)

        public var description: String {
            switch self {
            case .malformed: "the token is not a view token (v1-KEY-EXPIRES-MAC; copied whole?)"
            case .notForThisNode:
                "the token was not made for this node (statesync view-token --server-key must be this node's public key), or was changed"
            case .expired(let at):
                "the token expired at \(Date(timeIntervalSince1970: Double(at)).formatted(.iso8601)) (make a new one: statesync view-token)"
            case .keyNotAdmitted(let fingerprint):
                "the token's client key \(fingerprint)… is not in this node's security.client_keys"
            }
        }
    }

    /// The client public key `token` proves, if it was made for the node with `serverSecretKey`
    /// and has not expired at `now`; `nil` otherwise (malformed, forged, expired).
    public static func verify(_ token: String, serverSecretKey: [UInt8], now: Date = Date()) -> [UInt8]? {
        try? check(token, serverSecretKey: serverSecretKey, now: now).get()
    }

    /// The client public key `token` proves, or why it proves none: the MAC is checked before the
    /// expiry, so "expired" is said only of a token this node's key made.
    public static func check(_ token: String, serverSecretKey: [UInt8], now: Date = Date()) -> Result<
        [UInt8], Refusal
    > {
        let parts = token.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 4, parts[0] == "v1", let client = bytes(parts[1]), client.count == 32,
            let expires = Int64(parts[2]), let mac = bytes(parts[3]), mac.count == 32
        else { return .failure(.malformed) }
        guard let key = try? macKey(secret: serverSecretKey, public: client) else { return .failure(.notForThisNode) }
        let message = Array("v1-\(parts[1])-\(parts[2])".utf8)
        guard HMAC<SHA256>.isValidAuthenticationCode(mac, authenticating: message, using: key) else {
            return .failure(.notForThisNode)
        }
        guard Double(expires) > now.timeIntervalSince1970 else { return .failure(.expired(at: expires)) }
        return .success(client)
    }

    private static func macKey(secret: [UInt8], public: [UInt8]) throws -> SymmetricKey {
        let ours = try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: secret)
        let theirs = try Curve25519.KeyAgreement.PublicKey(rawRepresentation: `public`)
        return try ours.sharedSecretFromKeyAgreement(with: theirs).hkdfDerivedSymmetricKey(
            using: SHA256.self, salt: [UInt8](), sharedInfo: Array("statesync view token v1".utf8),
            outputByteCount: 32)
    }

    static func hex(_ bytes: [UInt8]) -> String {
        bytes.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
    }

    static func bytes(_ text: Substring) -> [UInt8]? {
        guard text.count % 2 == 0 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(text.count / 2)
        var index = text.startIndex
        while index < text.endIndex {
            let next = text.index(index, offsetBy: 2)
            guard let byte = UInt8(text[index..<next], radix: 16) else { return nil }
            out.append(byte)
            index = next
        }
        return out
    }
}

/// Who may see which channel in the live view of a node with security: the node's secret key
/// (to check ``ViewToken``s) and the client keys' read permissions, replaced on a reload. Also
/// the live view's own client credentials: a key pair made in memory at every start (never
/// written anywhere), admitted by the node to read every channel, which the view uses only for
/// channels the viewer's key may read.
public final class ViewerAuthority: Sendable {
    let serverSecretKey: [UInt8]
    /// The node's public key, for the view's own client connection.
    let serverPublicKey: [UInt8]
    /// The view's own key pair.
    let viewKeys: Curve.KeyPair
    /// The view's own client entry: the daemon admits it (read every channel, write none).
    public let viewAccess: SecurityConfiguration.ClientAccess
    private let clients: Mutex<[(key: [UInt8], read: [String])]>

    /// Reads the node's secret key and makes the view's key pair.
    public init(security: SecurityConfiguration) throws {
        let server = try CurveKeyFile.readSecretKey(at: security.secretKeyFile)
        serverSecretKey = server.secretKey
        serverPublicKey = server.publicKey
        viewKeys = try Curve.generateKeyPair()
        viewAccess = .init(key: try Curve.z85Encode(viewKeys.publicKey), read: ["*"], write: [])
        clients = Mutex([])
        try update(security)
    }

    /// Takes the client keys and permissions of a (re)loaded configuration.
    public func update(_ security: SecurityConfiguration) throws {
        let list = try security.clients.filter { $0 != viewAccess }.map {
            (key: try CurveKeyFile.publicKey($0.key), read: $0.read)
        }
        clients.withLock { $0 = list }
    }

    /// The channel patterns the holder of `token` may read now, or why it may read none.
    func readPatterns(token: String) -> Result<[String], ViewToken.Refusal> {
        ViewToken.check(token, serverSecretKey: serverSecretKey).flatMap { key in
            guard let read = clients.withLock({ list in list.first { $0.key == key }?.read }) else {
                return .failure(.keyNotAdmitted(CurveKeyFile.fingerprint(key)))
            }
            return .success(read)
        }
    }
}
