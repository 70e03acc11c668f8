import Foundation
import StateSync
import StateSyncClient
import Testing

/// Membership with real daemons (docs/PROTOCOL.md 7.5): a fourth node whose configuration names
/// only one member joins a running three-node cluster that never heard of it.
@Suite("Membership: joining a running cluster")
struct MembershipTests {
    @Test func aNodeJoinsThroughOneSeedLeavesComesBackAndIsForgotten() async throws {
        let directory = temporaryDirectory("join")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let nodes = ["node1", "node2", "node3", "node4"]
        let publish = Dictionary(uniqueKeysWithValues: nodes.map { ($0, "tcp://127.0.0.1:\(freePort())") })
        let api = Dictionary(uniqueKeysWithValues: nodes.map { ($0, "tcp://127.0.0.1:\(freePort())") })
        func config(_ node: String, peers: [String]) throws -> String {
            let path = "\(directory)/\(node).yaml"
            try """
            node:
              id: \(node)
              data_dir: \(directory)/\(node)
            network:
              publish: \(publish[node]!)
              api: \(api[node]!)
              heartbeat_ms: 100
              peers: [\(peers.map { publish[$0]! }.joined(separator: ", "))]
            """.write(toFile: path, atomically: true, encoding: .utf8)
            return path
        }
        var daemons: [String: ChildProcess] = [:]
        for node in nodes.prefix(3) {
            let others = nodes.prefix(3).filter { $0 != node }
            daemons[node] = try ChildProcess(
                "statesyncd", ["--config", try config(node, peers: Array(others))], name: node)
        }
        let clients = try Dictionary(
            uniqueKeysWithValues: nodes.map {
                ($0, try StateSyncClient(endpoint: api[$0]!, requestTimeout: .seconds(2)))
            })
        defer { for client in clients.values { client.close() } }
        let address = ModelAddress(channel: "c", model: "m")
        func value(_ node: String, _ property: String) async -> Value? {
            try? await clients[node]!.get(address)[property]?.value
        }
        do {
            _ = try await clients["node3"]!.set(address, ["before": 1])
            try await waitUntil("the cluster of three has the first write") {
                let (one, two) = (await value("node1", "before"), await value("node2", "before"))
                return one == 1 && two == 1
            }
            // node4 knows only node1; node1, node2 and node3 do not know node4.
            daemons["node4"] = try ChildProcess(
                "statesyncd", ["--config", try config("node4", peers: ["node1"])], name: "node4")
            try await waitUntil("node4 catches up on what was written before it joined") {
                await value("node4", "before") == 1
            }
            _ = try await clients["node4"]!.set(address, ["from4": 4])
            _ = try await clients["node2"]!.set(address, ["from2": 2])
            try await waitUntil("node4's write reaches every node, node2's reaches node4") {
                for node in nodes where await value(node, "from4") != 4 { return false }
                return await value("node4", "from2") == 2
            }
            // Every node lists four members, alive, and is linked to node4 directly.
            try await waitUntil("every node lists node4 alive, and node2 and node3 subscribe to it") {
                for node in nodes {
                    guard let status = try? await clients[node]!.status() else { return false }
                    let states = Dictionary(uniqueKeysWithValues: status.members.map { ($0.id, $0.state) })
                    guard states == ["node1": "alive", "node2": "alive", "node3": "alive", "node4": "alive"] else {
                        return false
                    }
                    if node != "node4",
                        !status.peers.contains(where: { $0.endpoint == publish["node4"]! && $0.connected })
                    {
                        return false
                    }
                }
                return true
            }
            let listed = try await cli(["members", "--json", "--daemon", api["node2"]!])
            #expect(listed.status == 0, "\(listed.stderr)")
            #expect(listed.stdout.contains("\"node4\"") && listed.stdout.contains(publish["node4"]!))
            let table = try await cli(["members", "--daemon", api["node3"]!])
            #expect(table.stdout.split(separator: "\n").count == 4, "\(table.stdout)")

            // A clean stop says it left: every node drops its links to it.
            #expect(await daemons["node4"]!.stop() == 0)
            func everyNode(_ what: String, _ condition: @escaping (NodeStatus) -> Bool) async throws {
                try await waitUntil(what) {
                    for node in nodes.prefix(3) {
                        guard let status = try? await clients[node]!.status(), condition(status) else { return false }
                    }
                    return true
                }
            }
            try await everyNode("every node lists node4 as left and is no longer linked to it") { status in
                status.members.first { $0.id == "node4" }?.state == "left"
                    && !status.peers.contains { $0.endpoint == publish["node4"]! }
            }
            // It comes back with its data: alive and linked again.
            daemons["node4"] = try ChildProcess(
                "statesyncd", ["--config", "\(directory)/node4.yaml"], name: "node4")
            _ = try await clients["node4"]!.set(address, ["again": 4])
            try await waitUntil("node4's write after its return reaches node3") { await value("node3", "again") == 4 }
            try await everyNode("every node lists node4 alive again") { status in
                status.members.first { $0.id == "node4" }?.state == "alive"
            }
            // It dies for good (kill -9): an operator forgets it on node2, and every node drops it.
            #expect(await daemons["node4"]!.stop(SIGKILL) == SIGKILL)
            try await waitUntil("node2 no longer hears node4") {
                let status = try? await clients["node2"]!.status()
                return status?.members.first { $0.id == "node4" }.map { !$0.connected } ?? false
            }
            let forgot = try await cli(["forget", "node4", "--daemon", api["node2"]!])
            #expect(forgot.status == 0, "\(forgot.stderr)")
            try await everyNode("every node lists node4 as forgotten and awaits nothing of it") { status in
                status.members.first { $0.id == "node4" }?.state == "forgotten"
                    && !status.peers.contains { $0.endpoint == publish["node4"]! } && status.missingDeltas == 0
            }
            // node4's id cannot come back with an empty data directory: it refuses, exit 2.
            let freshConfig = try config("node4", peers: ["node1"])
            try String(contentsOfFile: freshConfig, encoding: .utf8)
                .replacingOccurrences(of: "data_dir: \(directory)/node4", with: "data_dir: \(directory)/node4-empty")
                .write(toFile: "\(directory)/node4-empty.yaml", atomically: true, encoding: .utf8)
            let comeback = try ChildProcess(
                "statesyncd", ["--config", "\(directory)/node4-empty.yaml"], name: "node4-empty")
            #expect(await comeback.wait(timeout: .seconds(30)) == 2)
            // (Its earlier deltas or its forgotten entry, whichever it hears of first.)
            #expect(
                comeback.stderr.contains("was forgotten") || comeback.stderr.contains("already published deltas"),
                "\(comeback.stderr.suffix(2000))")
            // The snapshot it wrote at that stop holds none of its own deltas: it refuses again.
            let again = try ChildProcess(
                "statesyncd", ["--config", "\(directory)/node4-empty.yaml"], name: "node4-empty-again")
            #expect(await again.wait(timeout: .seconds(30)) == 2)
            let refused = try await cli(["forget", "node9", "--daemon", api["node2"]!])
            #expect(refused.status != 0 && refused.stderr.contains("no member 'node9'"), "\(refused.stderr)")
            // A member that runs is not forgotten.
            let running = try await cli(["forget", "node3", "--daemon", api["node1"]!])
            #expect(running.status != 0 && running.stderr.contains("is alive"), "\(running.stderr)")
        } catch {
            Issue.record("\(error)")
            for (node, daemon) in daemons.sorted(by: { $0.key < $1.key }) {
                Issue.record("\(node):\n\(daemon.stderr.suffix(3000))")
            }
        }
        for node in nodes.prefix(3) { #expect(await daemons[node]!.stop() == 0) }
        _ = await daemons["node4"]?.stop()
    }
}
