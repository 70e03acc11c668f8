import Foundation
import Testing
import ZeroMQ

/// CURVE key files and the ZAP gate, on real files and real libzmq sockets.
@Suite("CURVE keys and the ZAP gate")
struct CurveSecurityTests {
    static func directory() -> String {
        let path = NSTemporaryDirectory() + "statesync-keys-\(UUID().uuidString.prefix(8))"
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    static func mode(_ path: String) throws -> Int {
        try #require(FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int)
    }

    /// A generated pair: the secret key file is 0600, the public key next to it, both read back
    /// to the same keys; an existing key is never overwritten.
    @Test func aGeneratedKeyPairIsWrittenPrivatelyAndReadBack() throws {
        let directory = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/node1.key"
        let pair = try CurveKeyFile.generate(at: path)
        #expect(try Self.mode(path) == 0o600)
        #expect(try Self.mode(path + ".pub") == 0o644)
        #expect(try CurveKeyFile.readSecretKey(at: path) == pair)
        #expect(try CurveKeyFile.publicKey(path + ".pub") == pair.publicKey)
        #expect(try CurveKeyFile.publicKey(Curve.z85Encode(pair.publicKey)) == pair.publicKey)
        #expect(CurveKeyFile.fingerprint(pair.publicKey).count == 8)
        // Each half given for the other is named as such (a trial's: a secret key file as a
        // peer's key passed --check-config, and a .pub as --key was told to chmod 600).
        #expect {
            try CurveKeyFile.publicKey(path)
        } throws: { error in
            "\(error)"
                == "\(path) is a secret key file (its public key is in \(path).pub): give \(path).pub, and keep the secret key file to its owner"
        }
        #expect {
            try CurveKeyFile.readSecretKey(at: path + ".pub")
        } throws: { error in
            "\(error)"
                == "\(path).pub is a public key file (statesync keygen writes the secret key without .pub): give \(path)"
        }

        let secretBefore = try String(contentsOfFile: path, encoding: .utf8)
        #expect(throws: CurveKeyFile.Problem.self) { try CurveKeyFile.generate(at: path) }
        #expect(try String(contentsOfFile: path, encoding: .utf8) == secretBefore, "the old key is intact")
        // A lone public file blocks a new pair too (no secret key without its public half).
        try FileManager.default.removeItem(atPath: path)
        #expect(throws: CurveKeyFile.Problem.self) { try CurveKeyFile.generate(at: path) }
        #expect(!FileManager.default.fileExists(atPath: path))
    }

    /// A secret key others can read, a file that is not a key, and a public key that does not
    /// parse are refused with the file and the fix named.
    @Test func unsafeOrMalformedKeysAreRefusedClearly() throws {
        let directory = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/node1.key"
        try CurveKeyFile.generate(at: path)
        chmod(path, 0o644)
        do {
            _ = try CurveKeyFile.readSecretKey(at: path)
            Issue.record("a world-readable secret key was accepted")
        } catch {
            #expect(error.description.contains(path) && error.description.contains("chmod 600"), "\(error)")
        }
        // Another user's key: the owner is named, and the fix fits a client as well as a node
        // (a client's key was told to go to "the user the node runs as").
        chmod(path, 0o600)
        if geteuid() == 0, chown(path, 65_534, 65_534) == 0 {
            do {
                _ = try CurveKeyFile.readSecretKey(at: path)
                Issue.record("another user's secret key was accepted")
            } catch {
                #expect(
                    error.description.contains("uid 65534") && error.description.contains("this node or client"),
                    "\(error)")
            }
            chown(path, 0, 0)
        }
        let garbage = directory + "/garbage.key"
        _ = FileManager.default.createFile(
            atPath: garbage, contents: Data("not a key\n".utf8), attributes: [.posixPermissions: 0o600])
        #expect(throws: CurveKeyFile.Problem.self) { try CurveKeyFile.readSecretKey(at: garbage) }
        #expect(throws: CurveKeyFile.Problem.self) { try CurveKeyFile.publicKey(garbage) }
        #expect(throws: CurveKeyFile.Problem.self) { try CurveKeyFile.publicKey("tooShort") }
        #expect(throws: CurveKeyFile.Problem.self) { try CurveKeyFile.readSecretKey(at: directory + "/missing.key") }
        // A symbolic link to a good key is not followed, a FIFO does not hang, and a key given
        // where its path belongs is not echoed.
        chmod(path, 0o600)
        let link = directory + "/link.key"
        symlink(path, link)
        do {
            _ = try CurveKeyFile.readSecretKey(at: link)
            Issue.record("a symbolic link was followed")
        } catch {
            #expect(error.description.contains("symbolic link"), "\(error)")
        }
        let fifo = directory + "/fifo.key"
        mkfifo(fifo, 0o600)
        #expect(throws: CurveKeyFile.Problem.self) { try CurveKeyFile.readSecretKey(at: fifo) }
        let secretText = try String(contentsOfFile: path, encoding: .utf8).trimmingCharacters(
            in: .whitespacesAndNewlines)
        do {
            _ = try CurveKeyFile.readSecretKey(at: secretText)
            Issue.record("a key was taken as a path")
        } catch {
            #expect(!error.description.contains(secretText), "the secret is not echoed: \(error)")
        }
    }

    /// The ZAP codec: a CURVE request's key is read; replies carry the request id, the status
    /// and the user id; a malformed request gets a 500 when it can be answered at all.
    @Test func zapRequestsDecodeAndRepliesEncode() throws {
        let key = [UInt8](repeating: 7, count: 32)
        let frames: [[UInt8]] = [
            Array("1.0".utf8), [1, 2], Array("global".utf8), Array("127.0.0.1".utf8), [], Array("CURVE".utf8), key,
        ]
        let request = try ZAP.Request(frames: frames)
        #expect(request.curvePublicKey == key && request.address == "127.0.0.1" && request.domain == "global")
        let admitted = ZAP.reply(to: request, admit: true, userID: "node2")
        #expect(admitted[0] == Array("1.0".utf8) && admitted[1] == [1, 2] && admitted[2] == Array("200".utf8))
        #expect(admitted[4] == Array("node2".utf8))
        #expect(ZAP.reply(to: request, admit: false, reason: "unknown key")[2] == Array("400".utf8))
        #expect(throws: ZeroMQError.self) { try ZAP.Request(frames: [Array("2.0".utf8)] + frames.dropFirst()) }
        #expect(ZAP.replyToMalformed([Array("2.0".utf8), [9]])?[2] == Array("500".utf8))
        #expect(ZAP.replyToMalformed([[1]]) == nil)
    }

    /// A CURVE publisher behind a ZAP handler that admits one key: the admitted subscriber gets
    /// the messages; a subscriber with another key and one without CURVE get nothing, and the
    /// handler saw (and refused) the unknown key.
    @Test func theZapGateAdmitsOnlyAllowListedKeys() throws {
        let server = try Curve.generateKeyPair()
        let trusted = try Curve.generateKeyPair()
        let stranger = try Curve.generateKeyPair()
        let context = try Context()
        let zap = try context.socket(.rep)
        try zap.bind(ZAP.endpoint)  // before the secured socket accepts anyone
        let pub = try context.socket(.pub)
        try pub.setCurveServer(secretKey: server.secretKey)
        try pub.bind("tcp://127.0.0.1:*")
        let endpoint = try pub.lastEndpoint()
        func subscriber(_ pair: Curve.KeyPair?) throws -> Socket {
            let sub = try context.socket(.sub)
            if let pair {
                try sub.setCurveClient(
                    serverKey: server.publicKey, publicKey: pair.publicKey, secretKey: pair.secretKey)
            }
            try sub.subscribe()
            try sub.connect(endpoint)
            return sub
        }
        let admitted = try subscriber(trusted)
        let refused = try subscriber(stranger)
        let plain = try subscriber(nil)

        var seenKeys: [[UInt8]: String] = [:]
        var received = 0
        var leaked = 0
        var poller = Poller([
            .socket(zap, .readable), .socket(admitted, .readable), .socket(refused, .readable),
            .socket(plain, .readable),
        ])
        let deadline = Date().addingTimeInterval(10)
        // Until the stranger was refused and the trusted subscriber got 20 messages published
        // after that: bounded by the deadline.
        while Date() < deadline, received < 20 || seenKeys[stranger.publicKey] == nil {
            try pub.send([Array("value:secret-\(received)".utf8)])
            let ready = try poller.poll(timeoutMilliseconds: 10)
            if ready[0].contains(.readable), let frames = try zap.receive(dontWait: true) {
                let request = try ZAP.Request(frames: frames)
                let key = try #require(request.curvePublicKey)
                let admit = key == trusted.publicKey
                seenKeys[key] = admit ? "admitted" : "refused"
                try zap.send(
                    ZAP.reply(to: request, admit: admit, userID: admit ? "trusted" : "", reason: "unknown key"))
            }
            while try admitted.receive(dontWait: true) != nil {
                if seenKeys[stranger.publicKey] != nil { received += 1 }
            }
            while try refused.receive(dontWait: true) != nil { leaked += 1 }
            while try plain.receive(dontWait: true) != nil { leaked += 1 }
        }
        #expect(seenKeys[trusted.publicKey] == "admitted")
        #expect(seenKeys[stranger.publicKey] == "refused")
        #expect(received >= 20, "the admitted subscriber receives")
        #expect(leaked == 0, "a refused or plain subscriber receives nothing")
        for socket in [admitted, refused, plain, pub, zap] { socket.close() }
    }
}
