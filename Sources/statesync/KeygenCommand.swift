import ArgumentParser
import Foundation
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

        func run() async throws {
            try await failingClearly {
                let pair = try CurveKeyFile.generate(at: out)
                let publicText = try Curve.z85Encode(pair.publicKey)
                emit("secret key: \(out) (mode 0600; keep it private)")
                emit("public key: \(out).pub")
                emit(publicText)
            }
        }
    }
}
