import Foundation
import StateSyncClient
import StateSyncZeroMQ
import Testing
import ZeroMQ

@testable import StateSync

/// CurveZMQ security on real sockets (docs/PROTOCOL.md section 14): nodes with keys replicate and
/// serve admitted clients; everyone else gets nothing, and the node counts the refusals.
@Suite("Security: CURVE between nodes and clients")
struct SecurityTests {
    /// Keys for two nodes, an admitted client and a stranger, in a fresh directory.
    struct Keys {
        let directory = temporaryDirectory("keys")
        var path: [String: String] = [:]
        var pair: [String: Curve.KeyPair] = [:]

        init() throws {
            for name in ["node1", "node2", "client", "stranger", "reader"] {
                let file = directory + "/\(name).key"
                pair[name] = try CurveKeyFile.generate(at: file)
                path[name] = file
            }
        }
    }

    /// A client of `node` holding the key `name`.
    static func client(_ keys: Keys, _ name: String, of node: String, endpoint: String, timeout: Duration = .seconds(5))
        throws -> StateSyncClient
    {
        try StateSyncClient(
            endpoint: endpoint, requestTimeout: timeout,
            security: .init(serverKey: keys.path[node]! + ".pub", secretKeyFile: keys.path[name]!))
    }

    static func configurations(_ keys: Keys) -> [NodeConfiguration] {
        let publish = ["tcp://127.0.0.1:\(freePort())", "tcp://127.0.0.1:\(freePort())"]
        return (0..<2).map { index in
            let me = "node\(index + 1)"
            let other = "node\(2 - index)"
            var configuration = NodeConfiguration(
                nodeID: me, dataDirectory: temporaryDirectory("secure-\(me)"), publishEndpoint: publish[index],
                peers: [publish[1 - index]], apiEndpoint: "tcp://127.0.0.1:\(freePort())",
                heartbeatIntervalMilliseconds: 50)
            configuration.peerNodeIDs = [publish[1 - index]: other]
            configuration.security = SecurityConfiguration(
                secretKeyFile: keys.path[me]!, peerKeys: [other: [keys.path[other]! + ".pub"]],
                clients: [
                    .init(key: keys.path["client"]! + ".pub"),
                    .init(key: keys.path["reader"]! + ".pub", read: ["sensors*"], write: []),
                ])
            return configuration
        }
    }

    /// Two keyed nodes connect, replicate a client's write, and serve the admitted client; a
    /// client with an unknown key and one without CURVE get no answer, and the node counts them;
    /// subscribers without the right key receive nothing of the stream.
    @Test func keyedNodesReplicateAndAdmitOnlyTheirKeys() async throws {
        let keys = try Keys()
        defer { try? FileManager.default.removeItem(atPath: keys.directory) }
        let configurations = Self.configurations(keys)
        let node1 = try await StateSyncNode.start(configuration: configurations[0])
        let node2 = try await StateSyncNode.start(configuration: configurations[1])
        let context = try Context()
        var sockets: [Socket] = []
        defer { for socket in sockets { socket.close() } }
        do {
            try await waitUntilMeshed([node1, node2])
            let api1 = try #require(node1.apiEndpoint)
            let client = try Self.client(keys, "client", of: "node1", endpoint: api1)
            defer { client.close() }

            // Eavesdroppers on node1's stream: no CURVE, and CURVE with a key node1 does not admit.
            let plain = try context.socket(.sub)
            try plain.subscribe()
            try plain.connect(node1.publishEndpoint)
            let stranger = try context.socket(.sub)
            try stranger.setCurveClient(
                serverKey: keys.pair["node1"]!.publicKey, publicKey: keys.pair["stranger"]!.publicKey,
                secretKey: keys.pair["stranger"]!.secretKey)
            try stranger.subscribe()
            try stranger.connect(node1.publishEndpoint)
            // An admitted client's key is for the API only: on the publish socket (every channel)
            // it is refused too.
            let clientSub = try context.socket(.sub)
            try clientSub.setCurveClient(
                serverKey: keys.pair["node1"]!.publicKey, publicKey: keys.pair["client"]!.publicKey,
                secretKey: keys.pair["client"]!.secretKey)
            try clientSub.subscribe()
            try clientSub.connect(node1.publishEndpoint)
            sockets += [plain, stranger, clientSub]

            let address = ModelAddress(channel: "secret", model: "m")
            try await waitUntil("the stranger and the client-key subscribers were refused") {
                node1.status.counters["authentication_refusals"] ?? 0 >= 2
            }
            for value in 1...20 {
                _ = try await client.set(address, [PropertyWrite(name: "x", value: .string("unique-value-\(value)"))])
            }
            try await waitUntil("node2 has the writes") {
                node2.properties(of: address)["x"]?.value == .string("unique-value-20")
            }
            var leaked = 0
            while try plain.receive(dontWait: true) != nil { leaked += 1 }
            while try stranger.receive(dontWait: true) != nil { leaked += 1 }
            while try clientSub.receive(dontWait: true) != nil { leaked += 1 }
            #expect(leaked == 0, "subscribers without an admitted key receive nothing")

            // A client with a key the node does not admit, and one without CURVE: no answer.
            let refusedBefore = node1.status.counters["authentication_refusals"] ?? 0
            let unknown = try Self.client(keys, "stranger", of: "node1", endpoint: api1, timeout: .milliseconds(1500))
            defer { unknown.close() }
            await #expect(throws: StateSyncError.self) { _ = try await unknown.get(address) }
            let open = try StateSyncClient(endpoint: api1, requestTimeout: .milliseconds(1500))
            defer { open.close() }
            await #expect(throws: StateSyncError.self) { _ = try await open.get(address) }
            #expect(node1.status.counters["authentication_refusals"] ?? 0 > refusedBefore)
            let strangerPrint = String(try Curve.z85Encode(keys.pair["stranger"]!.publicKey).prefix(8))
            #expect(
                node1.status.refusedKeys[strangerPrint] ?? 0 >= 1,
                "status names the refused key: \(node1.status.refusedKeys)")
            // Connections without CURVE never reach ZAP; their failed handshakes are counted too.
            try await waitUntil("the connections without CURVE are counted") {
                node1.status.refusedKeys["no-curve"] ?? 0 >= 1
            }
            // Of the subscribers of node1's publish socket, only node2's link was admitted (a
            // refused one does not bring the member list on node1's next heartbeats).
            #expect(node1.status.counters["subscribers_connected"] == 1)
            // The admitted client still reads.
            #expect(try await client.get(address)["x"]?.value == .string("unique-value-20"))
        } catch {
            Issue.record(error)
        }
        await node1.stop()
        await node2.stop()
    }

    /// A peer holding node2's key (here a raw CURVE publisher at node2's endpoint) may publish
    /// node2's deltas, not another node's: those are dropped and counted.
    @Test func aKeyedPeerCannotPublishInAnotherNodesName() async throws {
        let keys = try Keys()
        defer { try? FileManager.default.removeItem(atPath: keys.directory) }
        let configurations = Self.configurations(keys)
        let context = try Context()
        let fake = try context.socket(.pub)
        defer { fake.close() }
        try fake.setCurveServer(secretKey: keys.pair["node2"]!.secretKey)
        try fake.bind(configurations[1].publishEndpoint)
        let node1 = try await StateSyncNode.start(configuration: configurations[0])
        do {
            func delta(_ origin: String, _ value: String) -> [[UInt8]] {
                PeerMessage.delta(
                    Delta(
                        channel: "c", model: origin,
                        version: Version(milliseconds: 1_800_000_000_000, counter: 0, node: origin),
                        sequence: 1, properties: [PropertyWrite(name: "x", value: .string(value))])
                ).encode()
            }
            // A HEARTBEAT first, advertising no API: a peer this node cannot tell about itself,
            // whose deltas it takes as they come (PROTOCOL.md 7.5, "Known before taken").
            let heartbeat = PeerMessage.heartbeat(
                PeerMessage.Heartbeat(
                    node: "node2", latestSequence: 0, clock: 0, incarnation: 1, api: "", progress: [:])
            ).encode()
            try await waitUntil("node2's own delta arrives over CURVE") {
                _ = try fake.send(heartbeat)
                _ = try fake.send(delta("node3", "forged"))
                _ = try fake.send(delta("node2", "genuine"))
                return node1.properties(of: ModelAddress(channel: "c", model: "node2"))["x"]?.value
                    == .string("genuine")
            }
            #expect(node1.properties(of: ModelAddress(channel: "c", model: "node3")).isEmpty)
            #expect(node1.status.counters["forged_origins"] ?? 0 >= 1)
        } catch {
            Issue.record(error)
        }
        await node1.stop()
    }

    /// Per-channel access: a key that may only read `sensors*` can GET and WATCH there, and gets
    /// ERROR 8 (forbidden) naming the permission and the channel for a SET or for another channel.
    @Test func aReadOnlyClientReadsItsChannelsAndNothingElse() async throws {
        let keys = try Keys()
        defer { try? FileManager.default.removeItem(atPath: keys.directory) }
        let configuration = Self.configurations(keys)[0]
        let node = try await StateSyncNode.start(configuration: configuration)
        do {
            let api = try #require(node.apiEndpoint)
            let writer = try Self.client(keys, "client", of: "node1", endpoint: api)
            defer { writer.close() }
            let reader = try Self.client(keys, "reader", of: "node1", endpoint: api)
            defer { reader.close() }
            let sensor = ModelAddress(channel: "sensors", model: "t1")
            let other = ModelAddress(channel: "billing", model: "b1")
            _ = try await writer.set(sensor, [PropertyWrite(name: "celsius", value: 21)])
            _ = try await writer.set(other, [PropertyWrite(name: "total", value: 9)])
            #expect(try await reader.get(sensor)["celsius"]?.value == 21)
            await #expect {
                _ = try await reader.set(sensor, [PropertyWrite(name: "celsius", value: 99)])
            } throws: { error in
                "\(error)".contains("may not write channel 'sensors'")
            }
            await #expect {
                _ = try await reader.get(other)
            } throws: { error in
                "\(error)".contains("may not read channel 'billing'")
            }
            #expect(try await writer.get(sensor)["celsius"]?.value == 21, "the refused write changed nothing")
            _ = try await reader.watch(channel: "sensors")
            await #expect {
                _ = try await reader.watch(channel: "billing")
            } throws: { error in
                "\(error)".contains("may not read channel 'billing'")
            }
        } catch {
            Issue.record(error)
        }
        await node.stop()
    }

    /// Bad keys stop the node at start with one line naming the key and the fix.
    @Test func unusableKeysStopTheNodeClearly() async throws {
        let keys = try Keys()
        defer { try? FileManager.default.removeItem(atPath: keys.directory) }
        var configuration = Self.configurations(keys)[0]
        chmod(keys.path["node1"]!, 0o644)
        await #expect {
            _ = try await StateSyncNode.start(configuration: configuration)
        } throws: { error in
            "\(error)".contains("security.secret_key") && "\(error)".contains("chmod 600")
        }
        chmod(keys.path["node1"]!, 0o600)
        configuration.security?.peerKeys["node2"] = ["not-a-key"]
        await #expect {
            _ = try await StateSyncNode.start(configuration: configuration)
        } throws: { error in
            "\(error)".contains("security.peer_keys: node2")
        }
        // Two nodes with one key pair, or a key both a peer's and a client's: refused.
        configuration.security?.peerKeys = [
            "node2": [keys.path["node2"]! + ".pub"], "node3": [keys.path["node2"]! + ".pub"],
        ]
        await #expect {
            _ = try await StateSyncNode.start(configuration: configuration)
        } throws: { error in
            "\(error)".contains("same key as node2")
        }
        // One node's two keys may not be one key either.
        configuration.security?.peerKeys = ["node2": [keys.path["node2"]! + ".pub", keys.path["node2"]! + ".pub"]]
        await #expect {
            _ = try await StateSyncNode.start(configuration: configuration)
        } throws: { error in
            "\(error)".contains("same key as another of its entries")
        }
        configuration.security?.peerKeys = ["node2": [keys.path["node2"]! + ".pub"]]
        configuration.security?.clients.append(.init(key: keys.path["node2"]! + ".pub"))
        await #expect {
            _ = try await StateSyncNode.start(configuration: configuration)
        } throws: { error in
            "\(error)".contains("already admitted as peer node2")
        }
    }
}
