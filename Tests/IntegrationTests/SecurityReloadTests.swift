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
        try await keygen(["node1", "node2", "kept", "removed"], in: directory)
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
            daemon.signal(SIGHUP)
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

/// SIGHUP on a node that runs without security: nothing to reload, said as such (not as an
/// error about turning security off); a change of another key is said to need a restart.
@Suite("SIGHUP without security")
struct HangUpWithoutSecurityTests {
    @Test func aHangUpSaysWhatItDidAndWhatNeedsARestart() async throws {
        let directory = temporaryDirectory("hup-plain")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let api = "tcp://127.0.0.1:\(freePort())"
        func config(heartbeat: Int) -> String {
            """
            node:
              id: node1
              data_dir: \(directory)/data
            network:
              publish: tcp://127.0.0.1:\(freePort())
              api: \(api)
              heartbeat_ms: \(heartbeat)
            """
        }
        let path = "\(directory)/node1.yaml"
        try config(heartbeat: 500).write(toFile: path, atomically: true, encoding: .utf8)
        let daemon = try ChildProcess("statesyncd", ["--config", path])
        do {
            try await DurabilityTests.waitUntilAnswering(api)
            daemon.signal(SIGHUP)
            try await waitUntil("the reload is logged") { daemon.stderr.contains("nothing to reload") }
            #expect(!daemon.stderr.contains("turning security off"), "\(daemon.stderr)")
            #expect(!daemon.stderr.contains("take effect when the node restarts"), "the file did not change")
            // (The publish port drawn again: that key changed too.)
            try config(heartbeat: 250).write(toFile: path, atomically: true, encoding: .utf8)
            daemon.signal(SIGHUP)
            try await waitUntil("the other keys' change is logged") {
                daemon.stderr.contains("take effect when the node restarts")
            }
            #expect(daemon.isRunning)
        } catch {
            Issue.record("\(error)\n\(daemon.stderr)")
        }
        #expect(await daemon.stop() == 0)
    }
}

/// A peer's key pair rotated without stopping the others, and a peer removed from the trusted
/// keys cut off at once (docs/PROTOCOL.md section 14, README "Rotating keys"): three real
/// daemons, `kill -HUP`, a restart of the rotating node with its data.
@Suite("Security: rotating and removing peer keys")
struct PeerKeyRotationTests {
    struct Cluster {
        let directory: String
        let publish: [String: Int]
        let api: [String: Int]

        /// node's configuration: its peers and the key files it trusts for each.
        func config(_ node: String, secret: String, peers: [String: [String]]) -> String {
            """
            node:
              id: \(node)
              data_dir: \(directory)/\(node)
            network:
              publish: tcp://127.0.0.1:\(publish[node]!)
              api: tcp://127.0.0.1:\(api[node]!)
              heartbeat_ms: 100
              peers:
            \(peers.keys.sorted().map { "    - \($0)=tcp://127.0.0.1:\(publish[$0]!)" }.joined(separator: "\n"))
            security:
              secret_key: \(directory)/\(secret).key
              peer_keys:
            \(peers.sorted { $0.key < $1.key }.flatMap { id, keys in keys.map { "    - \(id)=\(directory)/\($0).key.pub" } }.joined(separator: "\n"))
              client_keys:
                - \(directory)/cli.key.pub
            """
        }

        func write(_ node: String, secret: String? = nil, peers: [String: [String]]) throws -> String {
            let path = "\(directory)/\(node).yaml"
            try config(node, secret: secret ?? node, peers: peers).write(
                toFile: path, atomically: true, encoding: .utf8)
            return path
        }

        func client(_ node: String, serverKey: String? = nil) throws -> StateSyncClient {
            try StateSyncClient(
                endpoint: "tcp://127.0.0.1:\(api[node]!)", requestTimeout: .seconds(3),
                security: .init(
                    serverKey: "\(directory)/\(serverKey ?? node).key.pub", secretKeyFile: "\(directory)/cli.key"))
        }
    }

    @Test func aPeerRotatesItsKeyWhileTheOthersRunAndARemovedPeerIsCutOff() async throws {
        let directory = temporaryDirectory("rotate")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await keygen(["node1", "node2", "node2-new", "node3", "cli"], in: directory)
        let nodes = ["node1", "node2", "node3"]
        let cluster = Cluster(
            directory: directory, publish: Dictionary(uniqueKeysWithValues: nodes.map { ($0, freePort()) }),
            api: Dictionary(uniqueKeysWithValues: nodes.map { ($0, freePort()) }))
        let all: [String: [String]] = ["node1": ["node1"], "node2": ["node2"], "node3": ["node3"]]
        func others(_ node: String, _ keys: [String: [String]] = all) -> [String: [String]] {
            keys.filter { $0.key != node }
        }
        var daemons: [String: ChildProcess] = [:]
        for node in nodes {
            daemons[node] = try ChildProcess(
                "statesyncd", ["--config", try cluster.write(node, peers: others(node))], name: node)
        }
        let address = ModelAddress(channel: "c", model: "m")
        var clients = try Dictionary(uniqueKeysWithValues: nodes.map { ($0, try cluster.client($0)) })
        func value(_ node: String, _ property: String) async -> Value? {
            try? await clients[node]!.get(address)[property]?.value
        }
        func reload(_ node: String, peers: [String: [String]]) throws {
            _ = try cluster.write(node, peers: peers)
            daemons[node]!.signal(SIGHUP)
        }
        do {
            try await waitUntil("every daemon answers") {
                for node in nodes where (try? await clients[node]!.status()) == nil { return false }
                return true
            }
            _ = try await clients["node1"]!.set(address, ["a": 1])
            try await waitUntil("node2 and node3 have a=1") {
                let (two, three) = (await value("node2", "a"), await value("node3", "a"))
                return two == 1 && three == 1
            }

            // Rotation, step 1: node1 and node3 trust node2's new key as well (kill -HUP).
            let both = all.merging(["node2": ["node2", "node2-new"]]) { $1 }
            try reload("node1", peers: others("node1", both))
            try reload("node3", peers: others("node3", both))
            // Step 2: node2 restarts with its new key pair and its data; the others go on.
            #expect(await daemons["node2"]!.stop() == 0)
            daemons["node2"] = try ChildProcess(
                "statesyncd",
                ["--config", try cluster.write("node2", secret: "node2-new", peers: others("node2"))], name: "node2")
            clients["node2"]!.close()
            clients["node2"] = try cluster.client("node2", serverKey: "node2-new")
            _ = try await clients["node1"]!.set(address, ["a": 2])
            try await waitUntil("node2, on its new key, has a=2") { await value("node2", "a") == 2 }
            _ = try await clients["node2"]!.set(address, ["b": 1])
            try await waitUntil("node1 and node3 dialled node2's new key and have b=1") {
                let (one, three) = (await value("node1", "b"), await value("node3", "b"))
                return one == 1 && three == 1
            }
            // Step 3: the old key is removed; the links on the new key go on.
            let rotated = all.merging(["node2": ["node2-new"]]) { $1 }
            try reload("node1", peers: others("node1", rotated))
            try reload("node3", peers: others("node3", rotated))
            _ = try await clients["node2"]!.set(address, ["b": 2])
            _ = try await clients["node1"]!.set(address, ["a": 3])
            try await waitUntil("b=2 and a=3 everywhere") {
                for node in nodes {
                    let (a, b) = (await value(node, "a"), await value(node, "b"))
                    if a != 3 || b != 2 { return false }
                }
                return true
            }

            // Removal: node1 no longer trusts node3. node3's open subscription to node1 ends, its
            // reconnections are refused and counted, and node1 cannot reach node3 either.
            try reload("node1", peers: ["node2": ["node2-new"]])
            let node3Key = try String(contentsOfFile: "\(directory)/node3.key.pub", encoding: .utf8)
            try await waitUntil("node1 refuses node3's key, and the two are no longer linked") {
                guard let status1 = try? await clients["node1"]!.status(),
                    let status3 = try? await clients["node3"]!.status()
                else { return false }
                let node1Endpoint = "tcp://127.0.0.1:\(cluster.publish["node1"]!)"
                let node3Endpoint = "tcp://127.0.0.1:\(cluster.publish["node3"]!)"
                return (status1.refusedKeys[String(node3Key.prefix(8))] ?? 0) > 0
                    && status3.peers.contains { $0.endpoint == node1Endpoint && !$0.connected }
                    && status1.peers.contains { $0.endpoint == node3Endpoint && !$0.connected }
            }
            // node1 and node2 still replicate both ways.
            _ = try await clients["node1"]!.set(address, ["a": 4])
            _ = try await clients["node2"]!.set(address, ["b": 3])
            try await waitUntil("node1 and node2 still replicate") {
                let (a, b) = (await value("node2", "a"), await value("node1", "b"))
                return a == 4 && b == 3
            }
            for node in nodes { #expect(daemons[node]!.isRunning, "\(node)") }
            // The rotation's reloads changed security.* only; node1's last one also dropped node3
            // from network.peers, which takes effect at its next start: said once.
            let otherKeys = "keys other than security.* changed"
            #expect(!daemons["node3"]!.stderr.contains(otherKeys))
            #expect(daemons["node1"]!.stderr.components(separatedBy: otherKeys).count == 2, "once, at the removal")
            // ... and names the key, and only it.
            let said = daemons["node1"]!.stderr.split(separator: "\n").first { $0.contains(otherKeys) } ?? ""
            #expect(said.contains("keys=network.peers") && !said.contains("keys=network.peers,"), "\(said)")
        } catch {
            for node in nodes { Issue.record("\(node):\n\(daemons[node]!.stderr.suffix(4000))") }
        }
        for client in clients.values { client.close() }
        for node in nodes { #expect(await daemons[node]!.stop() == 0) }
    }
}
