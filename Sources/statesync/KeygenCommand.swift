import ArgumentParser
import Foundation
import StateSync
import StateSyncHTTP
import ZeroMQ

extension StateSyncCLI {
    struct Keygen: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write a new CurveZMQ key pair: PATH (secret key, mode 0600) and PATH.pub (public key).",
            discussion: """
                Both files hold one line of Z85 text. Refuses to overwrite an existing key. Give \
                PATH.pub (or its text) to whoever must trust this node or client; keep PATH secret.
                """)

        @Option(
            name: .long,
            help: ArgumentHelp("Where to write the secret key (the public key goes to PATH.pub).", valueName: "PATH"))
        var out: String

        @Flag(name: .long, help: "Print one JSON object.")
        var json = false

        func run() async throws {
            try await failingClearly {
                // A key's directory (keys/ in the example configs) is made, private to its owner.
                // Said, not done silently: a mistyped --out would otherwise leave a tree behind.
                let directory = URL(fileURLWithPath: out).deletingLastPathComponent().path
                let made = FileManager.default.fileExists(atPath: directory) ? nil : directory
                if let made {
                    try FileManager.default.createDirectory(
                        atPath: made, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
                }
                let pair = try CurveKeyFile.generate(at: out)
                let publicText = try Curve.z85Encode(pair.publicKey)
                if json {
                    emit(
                        Value.map([
                            "secret_key_file": .string(out), "public_key_file": .string(out + ".pub"),
                            "public_key": .string(publicText), "made_directory": made.map(Value.string) ?? .null,
                        ]).jsonText())
                    return
                }
                if let made { emit("made the directory \(made) (mode 0700)") }
                emit("secret key: \(out) (mode 0600; keep it private)")
                emit("public key: \(out).pub")
                emit(publicText)
            }
        }
    }
}

extension StateSyncCLI {
    struct ViewTokenCommand: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "view-token",
            abstract: "Print a token that lets a browser use a client key in a node's live view (security on).",
            discussion: """
                The token proves this client key to one node (it is made from the client's secret \
                key and the node's public key; nothing is sent). The live view then shows the \
                channels that key may read (security.client_keys), never more. Open \
                http://HOST:PORT/?token=TOKEN on the node's http.listen. Treat the token like a \
                password until it expires.
                """)

        @Option(help: ArgumentHelp("This client's secret key file (statesync keygen).", valueName: "PATH"))
        var key: String

        @Option(help: ArgumentHelp("The node's public key: its .pub file or the 40 Z85 characters.", valueName: "KEY"))
        var serverKey: String

        @Option(help: ArgumentHelp("How long the token is valid: 30m, 12h, 7d, or seconds.", valueName: "DURATION"))
        var ttl: String = "12h"

        @Option(
            help: ArgumentHelp(
                "Print the live view's URL at this base (e.g. http://127.0.0.1:9461/).", valueName: "URL"))
        var url: String?

        @Flag(name: .long, help: "Print one JSON object: the token, when it expires, and the URL.")
        var json = false

        func validate() throws {
            guard let seconds = Self.seconds(ttl), seconds.isFinite else {
                throw ValidationError("--ttl '\(ttl)' is not a duration: 30m, 12h, 7d or seconds")
            }
            guard seconds >= 1 else { throw ValidationError("--ttl \(ttl) must be at least 1s (the token's lifetime)") }
            guard seconds <= 366 * 86_400 else { throw ValidationError("--ttl \(ttl) is too long: at most 366d") }
        }

        static func seconds(_ text: String) -> Double? {
            let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600, "d": 86_400]
            if let unit = text.last.flatMap({ units[$0] }) { return Double(text.dropLast()).map { $0 * unit } }
            return Double(text)
        }

        func run() async throws {
            try await failingClearly {
                let pair = try CurveKeyFile.readSecretKey(at: key)
                let server = try CurveKeyFile.publicKey(serverKey)
                let expires = Date().addingTimeInterval(Self.seconds(ttl) ?? 0)
                let token = try ViewToken.make(client: pair, serverPublicKey: server, expires: expires)
                let link = url.map { ($0.hasSuffix("/") ? $0 : $0 + "/") + "?token=" + token }
                if json {
                    emit(
                        Value.map([
                            "token": .string(token), "expires": .int(Int64(expires.timeIntervalSince1970)),
                            "url": link.map(Value.string) ?? .null,
                        ]).jsonText())
                } else {
                    emit(link ?? token)
                }
            }
        }
    }
}
