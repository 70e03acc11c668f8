import Foundation
import StateSyncClient
import Testing

/// `kill -HUP` of a secured `statesyncd` (docs/PROTOCOL.md section 14): the admitted keys change
/// without a restart; a kept key's open watch goes on, a removed key is cut off.
@Suite("Security: reloading keys with kill -HUP")
struct SecurityReloadTests {
    @Test func aReloadKeepsTrustedWatchesAndCutsARemovedKeyOff() async throws {
        let directory = temporaryDirectory("reload")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        for name in ["node1", "node2", "kept", "removed"] {
            let made = try await cli(["keygen", "--out", "\(directory)/\(name).key"])
            #expect(made.status == 0, "\(made.stderr)")
        }
        let api = "tcp://127.0.0.1:\(freePort())"
        func config(clients: [String]) -> String {
            """
            node:
              id: node1
              data_dir: \(directory)/data
            network:
              publish: tcp://127.0.0.1:\(publishPort)
              api: \(api)
              peers:
                - node2=tcp://127.0.0.1:\(peerPort)
            security:
              secret_key: \(directory)/node1.key
              peer_keys:
                - node2=\(directory)/node2.key.pub
              client_keys:
            \(clients.map { "    - \(directory)/\($0).key.pub" }.joined(separator: "\n"))
            """
        }
        let publishPort = freePort()
        let peerPort = freePort()
        let path = "\(directory)/node1.yaml"
        try config(clients: ["kept", "removed"]).write(toFile: path, atomically: true, encoding: .utf8)
        let daemon = try ChildProcess("statesyncd", ["--config", path])
        do {
            func client(_ name: String) throws -> StateSyncClient {
                try StateSyncClient(
                    endpoint: api, requestTimeout: .seconds(3),
                    security: .init(serverKey: "\(directory)/node1.key.pub", secretKeyFile: "\(directory)/\(name).key"))
            }
            let kept = try client("kept")
            defer { kept.close() }
            let removed = try client("removed")
            defer { removed.close() }
            let address = ModelAddress(channel: "c", model: "m")
            try await waitUntil("the daemon answers the kept key") { (try? await kept.get(address)) != nil }
            _ = try await removed.get(address)
            let changes = try await kept.changes(channel: "c")

            try config(clients: ["kept"]).write(toFile: path, atomically: true, encoding: .utf8)
            kill(daemon.process.processIdentifier, SIGHUP)
            try await waitUntil("the removed key is refused") {
                do {
                    _ = try await removed.get(address)
                    return false
                } catch {
                    return "\(error)".contains("no longer admitted")
                }
            }
            _ = try await kept.set(address, [PropertyWrite(name: "x", value: 7)])
            var iterator = changes.makeAsyncIterator()
            let change = try await iterator.next()
            #expect(change?.property == "x" && change?.new == 7, "the kept key's watch goes on")
            #expect(daemon.isRunning)
        } catch {
            Issue.record("\(error)\n\(daemon.stderr)")
        }
        #expect(await daemon.stop() == 0)
    }
}
