import Foundation
import Testing

/// `statesync keygen` as a user runs it.
@Suite("statesync keygen")
struct KeygenCommandTests {
    /// Writes the pair (secret 0600, public one line of Z85, also printed), then refuses to
    /// overwrite it with one clear line and exit status 1.
    @Test func writesAPairAndNeverOverwritesIt() async throws {
        let directory = temporaryDirectory("keygen")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/client.key"
        let first = try await cli(["keygen", "--out", path])
        #expect(first.status == 0, "\(first.stderr)")
        let attributes = try FileManager.default.attributesOfItem(atPath: path)
        #expect(attributes[.posixPermissions] as? Int == 0o600)
        let publicKey = try String(contentsOfFile: path + ".pub", encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(publicKey.count == 40)
        #expect(first.stdout.contains(publicKey), "the public key is printed")
        let secret = try String(contentsOfFile: path, encoding: .utf8)

        let second = try await cli(["keygen", "--out", path])
        #expect(second.status == 1)
        #expect(second.stderr.contains("refusing to overwrite") && second.stderr.contains(path), "\(second.stderr)")
        #expect(second.stderr.split(separator: "\n").count == 1, "one line: \(second.stderr)")
        #expect(try String(contentsOfFile: path, encoding: .utf8) == secret)
    }
}
