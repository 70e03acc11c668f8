import Foundation
import StateSync
import StateSyncClient
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Real `statesyncd` processes on loopback, driven by the real `statesync` CLI and client.
@Suite("Real daemons")
struct ClusterTests {
    /// A set of daemons started by a test; `stopAll` ends every one of them.
    final class Daemons: @unchecked Sendable {
        // Safe: used by one test task only.
        var processes: [ChildProcess] = []
        /// The data directories of the daemons started (removed by ``stopAll()``).
        private var dataDirectories: Set<String> = []

        func start(config: String, environment: [String: String], name: String) throws -> ChildProcess {
            // The example configs listen for HTTP on fixed ports: off unless a test asks for it, so
            // tests running side by side do not collide.
            let environment = ["STATESYNC_HTTP_LISTEN": ""].merging(environment) { $1 }
            let daemon = try ChildProcess("statesyncd", ["--config", config], environment: environment, name: name)
            processes.append(daemon)
            if let data = environment["STATESYNC_NODE_DATA_DIR"] { dataDirectories.insert(data) }
            return daemon
        }

        /// Starts three daemons from the example configs on free loopback ports, each with the
        /// other two as peers and a 100 ms heartbeat, data in fresh directories named after
        /// `label`; returns their API endpoints once each sees both peers connected. `extra`:
        /// more environment for some of them, by index.
        func startThree(_ label: String, extra: [Int: [String: String]] = [:]) async throws -> [String] {
            let ports = (0..<3).map { _ in (publish: freePort(), api: freePort()) }
            for i in 0..<3 {
                let peers = ports.enumerated().filter { $0.offset != i }.map { "tcp://127.0.0.1:\($0.element.publish)" }
                _ = try start(
                    config: "Config/node\(i + 1).yaml",
                    environment: [
                        "STATESYNC_NODE_DATA_DIR": temporaryPath("\(label)-\(i)"),
                        "STATESYNC_NETWORK_PUBLISH": "tcp://127.0.0.1:\(ports[i].publish)",
                        "STATESYNC_NETWORK_API": "tcp://127.0.0.1:\(ports[i].api)",
                        "STATESYNC_NETWORK_PEERS": peers.joined(separator: ","),
                        "STATESYNC_NETWORK_HEARTBEAT_MS": "100",
                    ].merging(extra[i] ?? [:]) { $1 }, name: "node\(i + 1)")
            }
            let apis = ports.map { "tcp://127.0.0.1:\($0.api)" }
            for api in apis { try await ClusterTests.waitUntilReady(api, peers: 2) }
            return apis
        }

        /// SIGTERM every daemon; returns their exit statuses. `keepingData`: leave their data
        /// directories for the test to inspect (it removes them); otherwise they are removed.
        func stopAll(keepingData: Bool = false) async -> [Int32] {
            var statuses: [Int32] = []
            for daemon in processes { statuses.append(await daemon.stop()) }
            if !keepingData {
                for directory in dataDirectories { try? FileManager.default.removeItem(atPath: directory) }
            }
            return statuses
        }

        func logs() -> String {
            processes.map { "--- \($0.name) ---\n\($0.stderr)" }.joined(separator: "\n")
        }
    }

    /// Waits until the daemon at `api` answers and sees all its peers connected.
    static func waitUntilReady(_ api: String, peers: Int) async throws {
        let client = try StateSyncClient(endpoint: api, requestTimeout: .milliseconds(300))
        defer { client.close() }
        try await waitUntil("\(api) ready with \(peers) peers connected") {
            guard let status = try? await client.status() else { return false }
            return status.peers.count == peers && status.peers.allSatisfy(\.meshed)
        }
    }

    /// Issue #2's walking skeleton: the three example configs, a set through node1, a watch on
    /// node3 that sees old and new.
    @Test func exampleClusterPropagatesOldAndNewFromNode1ToNode3() async throws {
        let daemons = Daemons()
        let dataRoot = temporaryDirectory("example")
        var watcher: ChildProcess?
        do {
            for i in 1...3 {
                _ = try daemons.start(
                    config: "Config/node\(i).yaml", environment: ["STATESYNC_NODE_DATA_DIR": "\(dataRoot)/node\(i)"],
                    name: "node\(i)")
            }
            for i in 1...3 { try await Self.waitUntilReady("tcp://127.0.0.1:710\(i)", peers: 2) }

            let watch = try ChildProcess(
                "statesync", ["watch", "demo", "--json", "--daemon", "tcp://127.0.0.1:7103"], name: "watch")
            watcher = watch
            let node3 = try StateSyncClient(endpoint: "tcp://127.0.0.1:7103")
            defer { node3.close() }
            try await waitUntil("the watch is registered on node3") { (try? await node3.status().watchers) == 1 }

            let first = try await cli(["set", "demo/greeting", "text=\"hello\""])
            #expect(first.status == 0, "\(first.stderr)")
            #expect(Version(first.stdout.trimmingCharacters(in: .whitespacesAndNewlines))?.node == "node1")
            try await waitUntil("node3's watch prints the first change") {
                watch.stdout.split(separator: "\n").count == 1
            }
            let second = try await cli(["set", "demo/greeting", "text=\"world\"", "--daemon", "tcp://127.0.0.1:7101"])
            #expect(second.status == 0, "\(second.stderr)")
            try await waitUntil("node3's watch prints the second change") {
                watch.stdout.split(separator: "\n").count == 2
            }

            let lines = watch.stdout.split(separator: "\n").compactMap(jsonObject)
            #expect(lines.count == 2)
            #expect(lines[0]["channel"] as? String == "demo" && lines[0]["model"] as? String == "greeting")
            #expect(lines[0]["property"] as? String == "text")
            #expect(lines[0]["old"] is NSNull, "a first set has old = null")
            #expect(lines[0]["new"] as? String == "hello")
            #expect(lines[1]["old"] as? String == "hello", "a second set has old = the first value")
            #expect(lines[1]["new"] as? String == "world")
            #expect(lines.allSatisfy { $0["origin"] as? String == "node1" })
            #expect(lines[1]["version"] as? String == second.stdout.trimmingCharacters(in: .whitespacesAndNewlines))

            let got = try await cli(["get", "demo/greeting", "--json", "--daemon", "tcp://127.0.0.1:7102"])
            let properties = jsonObject(Substring(got.stdout))?["properties"] as? [String: Any]
            #expect(properties?["text"] as? String == "world")

            let status = try await cli(["status", "--json", "--daemon", "tcp://127.0.0.1:7103"])
            let statusObject = jsonObject(Substring(status.stdout))
            #expect(statusObject?["node"] as? String == "node3")
            #expect(
                (statusObject?["peers"] as? [[String: Any]])?.allSatisfy { $0["connected"] as? Bool == true } == true)
            #expect((statusObject?["channels"] as? [String: Any])?["demo"] as? Int == 1)
        } catch {
            Issue.record("\(error)\n\(daemons.logs())")
        }
        if let watcher { _ = await watcher.stop(SIGINT) }
        let statuses = await daemons.stopAll(keepingData: true)
        #expect(statuses == [0, 0, 0], "SIGTERM must stop every daemon cleanly (exit 0)\n\(daemons.logs())")
        for i in 1...3 {
            #expect(
                FileManager.default.fileExists(atPath: "\(dataRoot)/node\(i)/state.snapshot"), "state flushed at stop")
        }
        try? FileManager.default.removeItem(atPath: dataRoot)
    }

    /// PROTOCOL.md 7.7 between real daemons: once the nodes have heard each other's HEARTBEATs,
    /// bursts of sets to many models on node1 go out as packed batches (one frame each, through
    /// real ZeroMQ sockets), and the other two end with every model's last value.
    @Test func packedBatchesFlowBetweenDaemons() async throws {
        let daemons = Daemons()
        do {
            let apis = try await daemons.startThree("packed-batches")
            let clients = try apis.map { try StateSyncClient(endpoint: $0) }
            defer { for client in clients { client.close() } }

            let models = 32
            var burst = 0
            try await waitUntil("node1 publishes a packed batch") {
                burst += 1
                let value = Int64(burst)
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for model in 0..<models {
                        group.addTask {
                            _ = try await clients[0].set(
                                ModelAddress(channel: "wide", model: "m\(model)"), ["burst": .int(value)])
                        }
                    }
                    try await group.waitForAll()
                }
                return try await clients[0].status().counters["packed_batches_published", default: 0] > 0
            }
            let last = Int64(burst)
            for (index, client) in clients.enumerated().dropFirst() {
                try await waitUntil("node\(index + 1) holds burst \(last) of every model") {
                    for model in 0..<models {
                        let view = try await client.get(ModelAddress(channel: "wide", model: "m\(model)"))
                        guard view["burst"]?.value == .int(last) else { return false }
                    }
                    return true
                }
            }
            let receiver = try await clients[1].status().counters
            #expect(
                receiver["delta_messages_received", default: 0] < receiver["deltas_received", default: 0],
                "fewer messages than deltas: \(receiver)")
        } catch {
            Issue.record("\(error)\n\(daemons.logs())")
        }
        #expect(await daemons.stopAll() == [0, 0, 0])
    }

    /// Issue #4: many concurrent writers of the same properties through all three nodes; once
    /// quiet, every node holds the same values.
    @Test func concurrentSetsThroughThreeNodesConverge() async throws {
        let daemons = Daemons()
        do {
            let apis = try await daemons.startThree("converge")
            let clients = try apis.map { try StateSyncClient(endpoint: $0) }
            defer { for client in clients { client.close() } }

            let writersPerNode = 4
            let setsPerWriter = 150
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (nodeIndex, client) in clients.enumerated() {
                    for writer in 0..<writersPerNode {
                        group.addTask {
                            for i in 0..<setsPerWriter {
                                let tag = "n\(nodeIndex)w\(writer)i\(i)"
                                let model = "m\(i % 3)"
                                try await client.set(
                                    ModelAddress(channel: "race", model: model),
                                    [
                                        PropertyWrite(name: "a", value: .string(tag)),
                                        PropertyWrite(name: "b", value: .int(Int64(i))),
                                    ])
                            }
                        }
                    }
                }
                try await group.waitForAll()
            }
            try await waitUntil("all three nodes hold the same state") {
                let digests = try await clients.asyncMap { try await $0.status().stateDigest }
                return Set(digests).count == 1
            }
            for model in ["m0", "m1", "m2"] {
                let views = try await clients.asyncMap { try await $0.get(ModelAddress(channel: "race", model: model)) }
                #expect(views[0].count == 2)
                #expect(views[0] == views[1] && views[1] == views[2], "\(model) differs: \(views)")
            }
        } catch {
            Issue.record("\(error)\n\(daemons.logs())")
        }
        #expect(await daemons.stopAll() == [0, 0, 0])
    }

    /// PROTOCOL.md 11.4 between real daemons: node3 takes its peers' deltas without applying
    /// them (the harness's drop-deltas fault, every one), so its progress is theirs and its
    /// state is not. Their state digests, on the HEARTBEATs of nodes at rest, show it: node1 and
    /// node2 report node3 diverged (and not each other), node3 reports both, and `statesync
    /// status` says so.
    @Test func aNodeWhoseStateDiffersAtEqualProgressIsReportedDiverged() async throws {
        let daemons = Daemons()
        do {
            let apis = try await daemons.startThree(
                "diverged", extra: [2: ["STATESYNC_TEST_DROP_REMOTE_DELTAS": "1"]])
            let set = try await cli(["set", "demo/greeting", "text=\"hello\"", "--daemon", apis[0]])
            #expect(set.status == 0, "\(set.stderr)")
            let clients = try apis.map { try StateSyncClient(endpoint: $0) }
            defer { for client in clients { client.close() } }
            try await waitUntil("node1 and node2 report node3, node3 reports both") {
                let diverged = try await clients.asyncMap { try await $0.status().divergedPeers }
                return diverged == [["node3"], ["node3"], ["node1", "node2"]]
            }
            let node3 = try await clients[2].status()
            #expect(node3.missingDeltas == 0 && node3.counters["digest_comparisons", default: 0] >= 3)
            #expect(node3.stateDigest != (try await clients[0].status().stateDigest))
            #expect((try await clients[0].status().counters["state_divergences"]) == 1)
            let text = try await cli(["status", "--daemon", apis[0]])
            #expect(text.stdout.contains("DIVERGED:  this node's state differs from node3's"), "\(text.stdout)")
            #expect(daemons.logs().contains("state differs from a peer's at equal progress"))
        } catch {
            Issue.record("\(error)\n\(daemons.logs())")
        }
        #expect(await daemons.stopAll() == [0, 0, 0])
    }

    @Test func statusReadyIsAReadinessProbe() async throws {
        let daemons = Daemons()
        let api = "tcp://127.0.0.1:\(freePort())"
        do {
            _ = try daemons.start(
                config: "Config/node1.yaml",
                environment: [
                    "STATESYNC_NODE_DATA_DIR": temporaryDirectory("ready"),
                    "STATESYNC_NETWORK_PUBLISH": "tcp://127.0.0.1:\(freePort())", "STATESYNC_NETWORK_API": api,
                    "STATESYNC_NETWORK_PEERS": "tcp://127.0.0.1:\(freePort())",  // nobody is there
                ], name: "lonely")
            try await waitUntil("the daemon answers") {
                try await cli(["status", "--daemon", api, "--timeout", "0.3"]).status == 0
            }
            let probe = try await cli(["status", "--ready", "--daemon", api])
            #expect(probe.status == 3)
            #expect(probe.stderr.contains("not ready: peers not connected"), "\(probe.stderr)")
        } catch {
            Issue.record("\(error)\n\(daemons.logs())")
        }
        #expect(await daemons.stopAll() == [0])
    }

    @Test func invalidConfigStopsTheDaemonWithOneLineAndExitTwo() async throws {
        let path = NSTemporaryDirectory() + "statesync-bad-\(UUID().uuidString).yaml"
        defer { try? FileManager.default.removeItem(atPath: path) }
        try "node:\n  id: x\n  data_dir: /tmp/x\nnetwork:\n  publish: tcp://127.0.0.1:notaport\n".write(
            toFile: path, atomically: true, encoding: .utf8)
        let daemon = try ChildProcess("statesyncd", ["--config", path])
        #expect(await daemon.wait() == 2)
        let lines = daemon.stderr.split(separator: "\n")
        #expect(lines.count == 1, "\(daemon.stderr)")
        #expect(daemon.stderr.contains(path) && daemon.stderr.contains("network.publish"))
    }

    /// A key file the configuration names but that is missing is a bad configuration like any
    /// other: exit 2 and one line, as `--check-config` says, before the node locks or writes its
    /// data directory (it exited 1 after creating LOCK and deltas.log).
    @Test func aMissingKeyFileStopsTheDaemonWithExitTwoBeforeItTouchesItsData() async throws {
        let directory = temporaryDirectory("missing-key")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/node.yaml"
        try """
        node:
          id: node1
          data_dir: \(directory)/data
        network:
          publish: tcp://127.0.0.1:\(freePort())
          peers: [node2=tcp://127.0.0.1:\(freePort())]
        security:
          secret_key: \(directory)/node1.key
          peer_keys: [node2=\(directory)/node2.key.pub]
        """.write(toFile: path, atomically: true, encoding: .utf8)
        for arguments in [["--config", path], ["--check-config", path]] {
            let daemon = try ChildProcess("statesyncd", arguments)
            #expect(await daemon.wait() == 2, "\(arguments): \(daemon.stderr)")
            #expect(daemon.stderr.split(separator: "\n").count == 1, "\(daemon.stderr)")
            #expect(daemon.stderr.contains("node1.key"), "\(daemon.stderr)")
        }
        #expect(!FileManager.default.fileExists(atPath: directory + "/data"), "the data directory was not made")
    }

    @Test func cliRejectsBadInputWithOneClearLine() async throws {
        let malformed = try await cli(["set", "demo/x", "title=hello"])
        #expect(malformed.status != 0)
        #expect(malformed.stderr.contains("value of 'title'"), "\(malformed.stderr)")

        let noModel = try await cli(["get", "justachannel"])
        #expect(noModel.status != 0)
        #expect(noModel.stderr.contains("CHANNEL/MODEL"))

        let unknown = try await cli(["frobnicate"])
        #expect(unknown.status != 0)
        #expect(!unknown.stderr.isEmpty)

        let port = freePort()
        let unreachable = try await cli(["status", "--daemon", "tcp://127.0.0.1:\(port)", "--timeout", "0.3"])
        #expect(unreachable.status == 1)
        #expect(unreachable.stderr.split(separator: "\n").count == 1)
        #expect(unreachable.stderr.contains("no answer from tcp://127.0.0.1:\(port)"), "\(unreachable.stderr)")
        #expect(!unreachable.stderr.contains("may still be applied"), "a read says nothing of writes")
        // A write with no answer may still be applied (a settling node holds it): the message says so.
        let unanswered = try await cli(["set", "c/m", "x=1", "--daemon", "tcp://127.0.0.1:\(port)", "--timeout", "0.3"])
        #expect(unanswered.status == 1)
        #expect(unanswered.stderr.contains("the write may still be applied"), "\(unanswered.stderr)")
    }
}

extension Array {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var result: [T] = []
        for element in self { result.append(try await transform(element)) }
        return result
    }
}
