import CZeroMQ

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// CurveZMQ key files (RFC 26): a secret key file holds one line, the secret key in Z85; the
/// public key sits next to it in `PATH.pub`, one line of Z85. A secret key file must be readable
/// by its owner only (mode 0600).
public enum CurveKeyFile {
    /// Why a key file cannot be written or used, as one line naming the file and the fix.
    public struct Problem: Error, Equatable, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = description }
    }

    /// Generates a key pair and writes it: `path` (the secret key, created with mode 0600) and
    /// `path.pub` (the public key). Refuses to overwrite either file: a key that others trust
    /// must not be replaced by accident.
    @discardableResult
    public static func generate(at path: String) throws(Problem) -> Curve.KeyPair {
        let publicPath = path + ".pub"
        for existing in [path, publicPath] where access(existing, F_OK) == 0 {
            throw Problem("\(existing) exists; refusing to overwrite a key (remove it first, or choose another path)")
        }
        let pair: Curve.KeyPair
        let secretText: String
        let publicText: String
        do {
            pair = try Curve.generateKeyPair()
            secretText = try Curve.z85Encode(pair.secretKey)
            publicText = try Curve.z85Encode(pair.publicKey)
        } catch {
            throw Problem("cannot generate a CURVE key pair: \(error)")
        }
        try write(secretText + "\n", to: path, mode: 0o600)
        do {
            try write(publicText + "\n", to: publicPath, mode: 0o644)
        } catch {
            unlink(path)  // no secret key without its public half
            throw error
        }
        return pair
    }

    /// Reads a secret key file: its key pair (the public key derived from the secret one).
    /// Refuses a file that others may read, that another user owns, that is not a regular file
    /// (a symbolic link is not followed), that is not one Z85 key, and a missing file. The checks
    /// are made on the opened file, not on its name again.
    public static func readSecretKey(at path: String) throws(Problem) -> Curve.KeyPair {
        // Never echo what looks like a key itself (someone put the secret where its path goes).
        let shown = decodeKey(path) == nil ? path : "(a 40-character key, not a path)"
        // The public half given for the secret one (keygen writes KEY and KEY.pub): said before
        // its mode, whose chmod would only lead to a handshake that never ends.
        if path.hasSuffix(".pub"), access(String(path.dropLast(4)), F_OK) == 0 {
            throw Problem(
                "\(shown) is a public key file (statesync keygen writes the secret key without .pub): give \(path.dropLast(4))"
            )
        }
        let text = try readLine(path, shown: shown, what: "secret key file") { info throws(Problem) in
            let permissions = info.st_mode & 0o777
            guard permissions & 0o077 == 0 else {
                throw Problem(
                    "the secret key file \(shown) is readable by its group or others (mode \(String(permissions, radix: 8))); run: chmod 600 \(shown)"
                )
            }
            guard info.st_uid == geteuid() else {
                throw Problem(
                    "the secret key file \(shown) belongs to uid \(info.st_uid), not to this user (uid \(geteuid())), who uses it: chown it to the user that runs this node or client"
                )
            }
        }
        guard let secretKey = decodeKey(text) else {
            throw Problem(
                "\(shown) does not hold a CURVE secret key (one line of 40 Z85 characters, as statesync keygen writes)")
        }
        guard let publicKey = derivedPublicKey(text) else { throw Problem("cannot derive the public key of \(shown)") }
        return Curve.KeyPair(publicKey: publicKey, secretKey: secretKey)
    }

    /// The public key of the secret key `text` (40 Z85 characters), or `nil`.
    private static func derivedPublicKey(_ text: String) -> [UInt8]? {
        var publicText = [CChar](repeating: 0, count: 41)
        var secretText = Array(text.trimmingWhitespace().utf8CString)
        guard zmq_curve_public(&publicText, &secretText) == 0 else { return nil }
        return decodeKey(String(zeroTerminated: publicText))
    }

    /// A public key given as its 40 Z85 characters, or as the path of a file holding them (such
    /// as the `.pub` file ``generate(at:)`` writes).
    /// An existing file wins: a 40-character path can be valid Z85 too.
    public static func publicKey(_ keyOrPath: String) throws(Problem) -> [UInt8] {
        if access(keyOrPath, F_OK) != 0 {
            if let key = decodeKey(keyOrPath) { return key }
            throw Problem("'\(keyOrPath)' is neither a CURVE public key (40 Z85 characters) nor a readable file")
        }
        let text = try readLine(keyOrPath, shown: keyOrPath, what: "public key file") { _ throws(Problem) in }
        guard let key = decodeKey(text) else {
            throw Problem("\(keyOrPath) does not hold a CURVE public key (one line of 40 Z85 characters)")
        }
        // The secret half given for the public one: its key derives what KEY.pub next to it
        // holds (a node would never link, and the secret key would be copied where keys travel).
        let sibling = try? readLine(keyOrPath + ".pub", shown: keyOrPath + ".pub", what: "public key file") {
            _ throws(Problem) in
        }
        if let sibling, let derived = derivedPublicKey(text), decodeKey(sibling) == derived {
            throw Problem(
                "\(keyOrPath) is a secret key file (its public key is in \(keyOrPath).pub): give \(keyOrPath).pub, and keep the secret key file to its owner"
            )
        }
        return key
    }

    /// A short, stable name of a public key for logs and status: its first 8 Z85 characters.
    public static func fingerprint(_ publicKey: [UInt8]) -> String {
        ((try? Curve.z85Encode(publicKey)) ?? "?").prefix(8).description
    }

    /// A 32-byte key from 40 Z85 characters (surrounding whitespace ignored).
    static func decodeKey(_ text: String) -> [UInt8]? {
        let trimmed = text.trimmingWhitespace()
        guard trimmed.utf8.count == 40, let key = try? Curve.z85Decode(trimmed), key.count == 32 else { return nil }
        return key
    }

    /// Reads the one line of a key file, opened without following a symbolic link and without
    /// blocking (a FIFO), after `check` accepted what `fstat` says of the opened file.
    private static func readLine(
        _ path: String, shown: String, what: String, check: (stat) throws(Problem) -> Void
    ) throws(Problem) -> String {
        let descriptor = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)
        guard descriptor >= 0 else {
            let reason =
                switch errno {
                case ELOOP: "it is a symbolic link (give the file itself)"
                case EACCES:
                    "permission denied (a secret key file must belong to the user that uses it, this one: uid \(geteuid()))"
                default: String(cString: strerror(errno))
                }
            throw Problem("cannot read the \(what) \(shown): \(reason)")
        }
        defer { close(descriptor) }
        var info = stat()
        guard fstat(descriptor, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
            throw Problem("the \(what) \(shown) is not a regular file")
        }
        try check(info)
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 256)
        while bytes.count <= 4096 {
            let count = read(descriptor, &buffer, buffer.count)
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            bytes += buffer[..<count]
        }
        guard bytes.count <= 4096 else { throw Problem("the \(what) \(shown) is too large to be a key") }
        return String(decoding: bytes, as: UTF8.self).trimmingWhitespace()
    }

    private static func write(_ text: String, to path: String, mode: mode_t) throws(Problem) {
        // O_EXCL: never follow or replace an existing file, even one created since the check.
        let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL, mode)
        guard descriptor >= 0 else {
            throw Problem("cannot create \(path): \(String(cString: strerror(errno)))")
        }
        defer { close(descriptor) }
        let bytes = Array(text.utf8)
        var written = 0
        while written < bytes.count {
            let count = bytes[written...].withUnsafeBytes { systemWrite(descriptor, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else {
                let reason = String(cString: strerror(errno))
                unlink(path)
                throw Problem("cannot write \(path): \(reason)")
            }
            written += count
        }
        // The umask may have narrowed the mode; make it exact. Then make the key durable: a key
        // that others will trust must not vanish in a power loss after keygen said it was written.
        guard fchmod(descriptor, mode) == 0, fsync(descriptor) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(path)
            throw Problem("cannot write \(path): \(reason)")
        }
    }
}

/// `write(2)` (the name is taken by the function that calls it).
private func systemWrite(_ descriptor: Int32, _ buffer: UnsafeRawPointer?, _ count: Int) -> Int {
    write(descriptor, buffer, count)
}

extension String {
    /// Without leading and trailing spaces, tabs and line breaks.
    func trimmingWhitespace() -> String {
        let isSpace: (UInt8) -> Bool = { $0 == 0x20 || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D }
        let utf8 = Array(self.utf8)
        guard let first = utf8.firstIndex(where: { !isSpace($0) }), let last = utf8.lastIndex(where: { !isSpace($0) })
        else { return "" }
        return String(decoding: utf8[first...last], as: UTF8.self)
    }
}
