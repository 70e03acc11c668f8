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
    static let names = ["node1", "node2", "node3", "copy"]

    /// node1 to node3 and the copy of node2, each listing the three others, in `directory`.
    struct Cluster {
        let directory: String
        let publish = Dictionary(
            uniqueKeysWithValues: DuplicateIDTests.names.map { ($0, "tcp://127.0.0.1:\(freePort())") })
        let api = Dictionary(uniqueKeysWithValues: DuplicateIDTests.names.map { ($0, "tcp://127.0.0.1:\(freePort())") })

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

        /// Every daemon, started at once. (A ChildProcess left running when the test ends is
        /// killed as it goes.)
        func start() throws -> [String: ChildProcess] {
            var daemons: [String: ChildProcess] = [:]
            for name in names {
                daemons[name] = try ChildProcess("statesyncd", ["--config", try config(name)], name: name)
            }
            return daemons
        }
    }

    @Test func oneOfTwoNodesStartedUnderOneIDStopsAndTheClusterGoesOn() async throws {
        let directory = temporaryDirectory("duplicate-id")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let names = Self.names
        let cluster = Cluster(directory: directory)
        let api = cluster.api
        let daemons = try cluster.start()
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

    /// Both write from their start until one stops, each to its own model: under the numbers
    /// both took, each peer keeps the write it got first. The survivor then publishes again what
    /// its peers hold in place of its own writes, and its own (section 7.5, "Mending split
    /// writes"): the three running nodes come to one state.
    @Test func theNodesThatRunAgreeAfterTwoNodesUnderOneIDWrote() async throws {
        let directory = temporaryDirectory("duplicate-id-writes")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cluster = Cluster(directory: directory)
        let daemons = try cluster.start()
        let clients = try Dictionary(
            uniqueKeysWithValues: Self.names.map {
                ($0, try StateSyncClient(endpoint: cluster.api[$0]!, requestTimeout: .milliseconds(500)))
            })
        defer { for client in clients.values { client.close() } }
        do {
            var written = 0
            try await waitUntil("node2 or its copy stops", timeout: .seconds(30)) {
                written += 1
                for name in ["node2", "copy"] where daemons[name]!.isRunning {
                    _ = try? await clients[name]!.set(
                        ModelAddress(channel: "c", model: name), ["n": .int(Int64(written))])
                }
                return !daemons["node2"]!.isRunning || !daemons["copy"]!.isRunning
            }
            let survivor = daemons["node2"]!.isRunning ? "node2" : "copy"
            let stopped = survivor == "node2" ? "copy" : "node2"
            #expect(await daemons[stopped]!.wait(timeout: .seconds(20)) == 2)
            let running = ["node1", survivor, "node3"]
            var digests: [UInt64] = []
            try await waitUntil("node1, node3 and the surviving node2 hold one state", timeout: .seconds(30)) {
                // Both new, both with writes: the survivor too may stop, at the other's numbers
                // its peers report (section 7.5, "Ids do not come back empty"). Then no one mends
                // what the two took (a known issue); the runs where one goes on are the test.
                guard daemons[survivor]!.isRunning else { return true }
                var statuses: [NodeStatus] = []
                for name in running {
                    guard let status = try? await clients[name]!.status() else { return false }
                    statuses.append(status)
                }
                digests = statuses.map(\.stateDigest)
                return statuses.allSatisfy { $0.missingDeltas == 0 } && Set(digests).count == 1
            }
            guard daemons[survivor]!.isRunning else {
                #expect(await daemons[survivor]!.wait(timeout: .seconds(20)) == 2)
                for name in ["node1", "node3"] { #expect(await daemons[name]!.stop() == 0, "\(name)") }
                return
            }
            for name in running { #expect(await daemons[name]!.stop() == 0, "\(name)") }
        } catch {
            Issue.record("\(error)")
            for (name, daemon) in daemons.sorted(by: { $0.key < $1.key }) {
                Issue.record("\(name):\n\(daemon.stderr.suffix(3000))")
            }
        }
    }
}
