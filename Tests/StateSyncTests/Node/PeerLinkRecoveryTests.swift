import Foundation
import StateSyncZeroMQ
import Testing
import ZeroMQ

@testable import StateSync

/// A peer link recovers from whatever arrives on it, over real sockets (PROTOCOL.md sections 3
/// and 12): libzmq drops a connection for good on some input (a frame over the SUB socket's
/// maximum message size is a protocol error it does not reconnect after).
@Suite("Peer links recover from any input")
struct PeerLinkRecoveryTests {
    /// A fake peer publishes one message with a frame over 64 MiB, then goes on as a good peer:
    /// its later deltas still reach the node, and the node says what happened.
    @Test func aFrameOverTheMaximumSizeDoesNotCutThePeerOffForGood() async throws {
        let context = try Context()
        let ghost = try context.socket(.pub)
        try ghost.setSendHighWaterMark(0)
        try ghost.bind("tcp://127.0.0.1:*")
        let ghostEndpoint = try ghost.lastEndpoint()
        var configuration = NodeConfiguration(
            nodeID: "node1", dataDirectory: temporaryDirectory("oversized"),
            publishEndpoint: "tcp://127.0.0.1:\(freePort())", peers: [ghostEndpoint], heartbeatIntervalMilliseconds: 50)
        configuration.historyDeltas = 1000
        let node = try await StateSyncNode.start(configuration: configuration)
        defer { ghost.close() }
        do {
            var beat = PeerMessage.Heartbeat(node: "ghost", latestSequence: 0, clock: 0, incarnation: 7)
            try await waitUntil("the ghost's heartbeats arrive") {
                _ = try ghost.send(PeerMessage.heartbeat(beat).encode())
                return node.status.peers.first?.connected == true
            }
            // One message with a frame past ZMQ_MAXMSGSIZE (64 MiB).
            _ = try ghost.send([Array("H".utf8), [UInt8](repeating: 1, count: (64 << 20) + 1024)])
            let address = ModelAddress(channel: "c", model: "m")
            let delta = Delta(
                channel: "c", model: "m", version: Version(milliseconds: 1_800_000_000_000, counter: 0, node: "ghost"),
                sequence: 1, properties: [PropertyWrite(name: "x", value: 42)])
            beat.latestSequence = 1
            try await waitUntil("a delta sent after the oversized message arrives", timeout: .seconds(30)) {
                _ = try ghost.send(PeerMessage.delta(delta).encode())
                _ = try ghost.send(PeerMessage.heartbeat(beat).encode())
                return node.properties(of: address)["x"]?.value == 42
            }
            #expect(node.status.counters["peer_link_resets"] ?? 0 >= 1)
        } catch {
            Issue.record(error)
        }
        await node.stop()
    }
}
