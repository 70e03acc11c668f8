import Foundation
import StateSyncClient
import StateSyncHarness
import StateSyncZeroMQ
import Testing

/// What an eavesdropper on the wire between two nodes sees (docs/PROTOCOL.md section 14): the
/// bytes node1 sends node2, captured by a relay on the link, hold a written value in clear
/// without security and nowhere with it.
@Suite("Security: the traffic itself")
struct WireCaptureTests {
    static func captureALink(secure: Bool) async throws -> (captured: [UInt8], value: String) {
        let directory = temporaryDirectory("capture")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        if secure {
            try await keygen(["node1", "node2", "client"], in: directory)
        }
        let publish = [freePort(), freePort()]
        // node2 subscribes to node1 through the relay; node1 to node2 directly.
        let relay = try LinkProxy(name: "node2<node1", targetPort: publish[0], capture: true)
        defer { relay.stop() }
        let peers = [["node2": "tcp://127.0.0.1:\(publish[1])"], ["node1": relay.endpoint]]
        let configurations = (0..<2).map { index in
            let me = "node\(index + 1)"
            let (peerID, peerEndpoint) = peers[index].first!
            var configuration = NodeConfiguration(
                nodeID: me, dataDirectory: "\(directory)/\(me)", publishEndpoint: "tcp://127.0.0.1:\(publish[index])",
                peers: [peerEndpoint], apiEndpoint: "tcp://127.0.0.1:\(freePort())", heartbeatIntervalMilliseconds: 50)
            if secure {
                configuration.peerNodeIDs = [peerEndpoint: peerID]
                configuration.security = SecurityConfiguration(
                    secretKeyFile: "\(directory)/\(me).key", peerKeys: [peerID: ["\(directory)/\(peerID).key.pub"]],
                    clients: [.init(key: "\(directory)/client.key.pub")])
            }
            return configuration
        }
        let node1 = try await StateSyncNode.start(configuration: configurations[0])
        let node2 = try await StateSyncNode.start(configuration: configurations[1])
        let value = "unique-\(UUID().uuidString)"
        do {
            let client = try StateSyncClient(
                endpoint: try #require(node1.apiEndpoint),
                security: secure
                    ? .init(serverKey: "\(directory)/node1.key.pub", secretKeyFile: "\(directory)/client.key") : nil)
            defer { client.close() }
            let address = ModelAddress(channel: "c", model: "m")
            try await waitUntil("node2 is connected to node1 through the relay") {
                node2.status.peers.allSatisfy(\.meshed)
            }
            _ = try await client.set(address, [PropertyWrite(name: "secret", value: .string(value))])
            try await waitUntil("node2 has the value") {
                node2.properties(of: address)["secret"]?.value == .string(value)
            }
        } catch {
            Issue.record(error)
        }
        await node1.stop()
        await node2.stop()
        return (relay.capturedBytes, value)
    }

    static func contains(_ haystack: [UInt8], _ needle: String) -> Bool {
        let needle = Array(needle.utf8)
        guard haystack.count >= needle.count else { return false }
        return (0...(haystack.count - needle.count)).contains {
            haystack[$0..<($0 + needle.count)].elementsEqual(needle)
        }
    }

    @Test func withoutSecurityTheValueCrossesTheWireInClear() async throws {
        let (captured, value) = try await Self.captureALink(secure: false)
        #expect(Self.contains(captured, value), "the capture can see it (\(captured.count) bytes)")
    }

    @Test func withSecurityNoByteOfTheValueIsOnTheWire() async throws {
        let (captured, value) = try await Self.captureALink(secure: true)
        #expect(captured.count > 100, "the link carried traffic (\(captured.count) bytes)")
        #expect(!Self.contains(captured, value), "the value is not on the wire")
        #expect(!Self.contains(captured, "secret"), "nor the property's name")
    }
}
