import Foundation
import StateSyncZeroMQ
import Testing
import ZeroMQ

@testable import StateSync

/// A new subscriber of a real node's publish socket hears the member list on the next
/// HEARTBEATs (PROTOCOL.md 7.5, "Spreading"): it may be a node joining through this one, which
/// this node does not subscribe to, and which may ANNOUNCE itself only once it has heard the
/// list. The node learns of it from libzmq's monitor of its publish socket.
@Suite("A new subscriber hears the member list")
struct SubscriberListTests {
    /// A node whose list holds ten entries (more than ride on every HEARTBEAT): a first
    /// subscriber connects and reads until the lists its connection brought are over; a second
    /// then connects, and once the node counted it, the first (subscribed all along, so what it
    /// reads does not depend on when the second's subscription took effect) reads three
    /// HEARTBEATs in a row with the list, among those it holds and the next 15. Without the node
    /// hearing of the connection, only the list's every-tenth HEARTBEAT would carry it, never two
    /// in a row.
    @Test func aNewSubscriberHearsTheListOfALargeClusterOnTheNextHeartbeats() async throws {
        let directory = temporaryDirectory("subscriber-list")
        // Nine members an earlier run knew, all left since: the node keeps them but dials none.
        let earlier = (2...10).map { index in
            Membership.Member(
                id: "node\(index)", publish: "tcp://127.0.0.1:\(freePort())", api: "", state: .left,
                version: Version(milliseconds: 1_000, counter: 0, node: "node\(index)"))
        }
        try Data(Membership.encodeFile(earlier)).write(
            to: URL(fileURLWithPath: directory + "/" + DataDirectory.membersName))
        let configuration = NodeConfiguration(
            nodeID: "node1", dataDirectory: directory, publishEndpoint: "tcp://127.0.0.1:\(freePort())", peers: [],
            heartbeatIntervalMilliseconds: 50)
        let node = try await StateSyncNode.start(configuration: configuration)
        let context = try Context()
        var sockets: [Socket] = []
        defer { for socket in sockets { socket.close() } }
        do {
            #expect(node.status.members.count == 10)
            /// Whether a message is a HEARTBEAT that carries the list (`nil`: not a HEARTBEAT).
            func carriesList(_ frames: [[UInt8]]) throws -> Bool? {
                guard case .heartbeat(let beat) = try PeerMessage.decode(frames) else { return nil }
                return beat.members != nil
            }
            /// The next HEARTBEAT on `socket`: whether it carries the list.
            func nextHeartbeat(on socket: Socket) async throws -> Bool {
                var heard: Bool?
                try await waitUntil("a heartbeat", timeout: .seconds(10)) {
                    guard let frames = try socket.receive(dontWait: true) else { return false }
                    heard = try carriesList(frames)
                    return heard != nil
                }
                guard let heard else { throw CancellationError() }
                return heard
            }
            func subscriber() throws -> Socket {
                let socket = try context.socket(.sub)
                sockets.append(socket)
                try socket.subscribe(PeerMessage.heartbeatTopic)
                try socket.connect(node.publishEndpoint)
                return socket
            }

            let first = try subscriber()
            try await waitUntil("the node heard the first subscriber connect") {
                node.status.counters["subscribers_connected"] ?? 0 >= 1
            }
            // Past the lists the node's start and this connection brought (three HEARTBEATs
            // each): a HEARTBEAT without it.
            var heartbeats = 0
            while try await nextHeartbeat(on: first) {
                heartbeats += 1
                try #require(heartbeats < 20, "the list rides on three heartbeats after a change, then every tenth")
            }

            _ = try subscriber()
            try await waitUntil("the node heard the second subscriber connect") {
                node.status.counters["subscribers_connected"] ?? 0 >= 2
            }
            // What the first holds already, in order (on a busy machine this task may run long
            // after it was sent), then at most 15 HEARTBEATs more as they come.
            var run = 0
            var read = 0
            while run < 3, read < 10_000, let frames = try first.receive(dontWait: true) {
                guard let list = try carriesList(frames) else { continue }
                run = list ? run + 1 : 0
                read += 1
            }
            var live = 0
            while run < 3, live < 15 {
                run = try await nextHeartbeat(on: first) ? run + 1 : 0
                live += 1
            }
            #expect(
                run == 3,
                "three heartbeats in a row with the list after the connection (\(read) held, \(live) more read)")
            #expect(node.status.counters["subscribers_connected"] == 2)
        } catch {
            Issue.record(error)
        }
        await node.stop()
    }
}
