import Foundation
import StateSync
import StateSyncClient
import Testing

/// Two nodes under one id with real daemons (docs/PROTOCOL.md 7.5, "Two nodes under one id"): a
/// fourth node added with a copy of node2's configuration whose `node.id` was left unchanged,
/// listed as a peer by every node, started together with node2, both with empty data
/// directories. One of them stops, exit 2, saying why; the other goes on with the cluster.
@Suite("Two nodes under one id")
struct DuplicateIDTests {
    @Test func oneOfTwoNodesStartedUnderOneIDStopsAndTheClusterGoesOn() async throws {
        let directory = temporaryDirectory("duplicate-id")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let names = ["node1", "node2", "node3", "copy"]
        let publish = Dictionary(uniqueKeysWithValues: names.map { ($0, "tcp://127.0.0.1:\(freePort())") })
        let api = Dictionary(uniqueKeysWithValues: names.map { ($0, "tcp://127.0.0.1:\(freePort())") })
        func config(_ name: String) throws -> String {
            let path = "\(directory)/\(name).yaml"
            try """
            node:
              id: \(name == "copy" ? "node2" : name)
              data_dir: \(directory)/\(name)
            network:
              publish: \(publish[name]!)
              api: \(api[name]!)
              heartbeat_ms: 100
              peers: [\(names.filter { $0 != name }.map { publish[$0]! }.joined(separator: ", "))]
            """.write(toFile: path, atomically: true, encoding: .utf8)
            return path
        }
        // (A ChildProcess left running when the test ends is killed as it goes.)
        var daemons: [String: ChildProcess] = [:]
        for name in names {
            daemons[name] = try ChildProcess("statesyncd", ["--config", try config(name)], name: name)
        }
        do {
            try await waitUntil("node2 or its copy stops", timeout: .seconds(30)) {
                !daemons["node2"]!.isRunning || !daemons["copy"]!.isRunning
            }
            let (stopped, survivor) = daemons["node2"]!.isRunning ? ("copy", "node2") : ("node2", "copy")
            #expect(await daemons[stopped]!.wait(timeout: .seconds(20)) == 2, "exit 2: restarting would not help")
            let said = daemons[stopped]!.stderr
            #expect(
                said.contains("another node runs with this node's id node2")
                    || said.contains("node id node2 already published deltas"),
                "\(said.suffix(2000))")
            #expect(daemons[survivor]!.isRunning, "the other goes on")

            // The cluster goes on with the survivor: its write reaches node1, and node1's to it.
            let client = try StateSyncClient(endpoint: api[survivor]!, requestTimeout: .seconds(2))
            let node1 = try StateSyncClient(endpoint: api["node1"]!, requestTimeout: .seconds(2))
            defer {
                client.close()
                node1.close()
            }
            let address = ModelAddress(channel: "c", model: "m")
            _ = try await client.set(address, ["from": "node2"])
            _ = try await node1.set(address, ["one": 1])
            try await waitUntil("node1 and the surviving node2 hold each other's writes") {
                let here = try? await node1.get(address)["from"]?.value
                let there = try? await client.get(address)["one"]?.value
                return here == "node2" && there == 1
            }
            for name in names {
                if let daemon = daemons[name], daemon.isRunning { #expect(await daemon.stop() == 0, "\(name)") }
            }
        } catch {
            Issue.record("\(error)")
            for (name, daemon) in daemons.sorted(by: { $0.key < $1.key }) {
                Issue.record("\(name):\n\(daemon.stderr.suffix(3000))")
            }
        }
    }
}
