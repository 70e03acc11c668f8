import CZeroMQ

/// CURVE key pairs and their Z85 text form (ZeroMQ RFC 32).
public enum Curve {
    /// A CURVE key pair, 32 raw bytes each.
    public struct KeyPair: Sendable, Equatable {
        public let publicKey: [UInt8]
        public let secretKey: [UInt8]
    }

    /// Generates a new key pair (`zmq_curve_keypair`).
    public static func generateKeyPair() throws(ZeroMQError) -> KeyPair {
        var publicText = [CChar](repeating: 0, count: 41)
        var secretText = [CChar](repeating: 0, count: 41)
        try zmqCheck("zmq_curve_keypair") { zmq_curve_keypair(&publicText, &secretText) }
        let publicKey = try z85Decode(String(zeroTerminated: publicText))
        let secretKey = try z85Decode(String(zeroTerminated: secretText))
        return KeyPair(publicKey: publicKey, secretKey: secretKey)
    }

    /// Encodes `bytes` (a multiple of 4 long) as Z85 text.
    public static func z85Encode(_ bytes: [UInt8]) throws(ZeroMQError) -> String {
        guard bytes.count % 4 == 0 else { throw ZeroMQError(code: EINVAL, operation: "zmq_z85_encode") }
        var text = [CChar](repeating: 0, count: bytes.count * 5 / 4 + 1)
        guard zmq_z85_encode(&text, bytes, bytes.count) != nil else {
            throw ZeroMQError(code: EINVAL, operation: "zmq_z85_encode")
        }
        return String(zeroTerminated: text)
    }

    /// Decodes Z85 `text` (a multiple of 5 long).
    public static func z85Decode(_ text: String) throws(ZeroMQError) -> [UInt8] {
        let utf8 = Array(text.utf8)
        guard utf8.count % 5 == 0 else { throw ZeroMQError(code: EINVAL, operation: "zmq_z85_decode") }
        var bytes = [UInt8](repeating: 0, count: utf8.count * 4 / 5)
        guard zmq_z85_decode(&bytes, text) != nil else {
            throw ZeroMQError(code: EINVAL, operation: "zmq_z85_decode")
        }
        return bytes
    }
}

extension String {
    /// Decodes a zero-terminated C character buffer as UTF-8.
    init(zeroTerminated buffer: [CChar]) {
        self.init(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
