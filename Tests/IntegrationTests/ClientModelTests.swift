import Foundation
import Observation
import StateSync
import StateSyncClient
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

@Replicated
final class Scoreboard {
    var score = 0
    var title = "untitled"
}

/// Typed models in a client app (issue #16): `client.model(...)` mirrors a model from a daemon,
/// its writes are acknowledged with their versions, and when its daemon dies it fails over to the
/// next without missing or repeating a change.
@Suite("Typed models in client apps")
struct ClientModelTests {
    /// An app on two daemons of a 3-node cluster; another client writes 1...600 through the
    /// third; the app's daemon is killed (kill -9) a third of the way in. The model's observer
    /// sees every value once, in order, old always the previous new; its own writes are
    /// acknowledged by the daemon it is on, before and after the failover.
    @Test func aModelFailsOverWithAnUnbrokenChainAndItsWritesAreAcknowledged() async throws {
        let cluster = try ModelLifecycleTests.Cluster()
        do {
            let writer = try StateSyncClient(endpoint: cluster.api[2], requestTimeout: .seconds(5))
            defer { writer.close() }
            try await waitUntil("every node sees its two peers") {
                for api in cluster.api {
                    let client = try StateSyncClient(endpoint: api, requestTimeout: .milliseconds(500))
                    defer { client.close() }
                    guard let status = try? await client.status(), status.peers.allSatisfy(\.meshed),
                        status.peers.count == 2
                    else { return false }
                }
                return true
            }
            let address = ModelAddress(channel: "app", model: "board")
            try await writer.set(address, ["score": 0, "title": "set before the app started"])
            try await waitUntil("node1 holds the model") {
                let client = try StateSyncClient(endpoint: cluster.api[0], requestTimeout: .milliseconds(500))
                defer { client.close() }
                return (try? await client.get(address))?["title"] != nil
            }

            let app = try StateSyncClient(endpoints: [cluster.api[0], cluster.api[1]], requestTimeout: .seconds(1))
            defer { app.close() }
            let board = try await app.model(Scoreboard.self, channel: "app", id: "board")
            #expect(board.title == "set before the app started", "it starts with the daemon's state")
            #expect(try await app.model(Scoreboard.self, channel: "app", id: "board") === board)

            let seen = Mutex<[Change<Int>]>([])
            let token = board.observe(\.score) { change in seen.withLock { $0.append(change) } }
            defer { token.cancel() }
            // Observation tracking fires once, after the value is there.
            let tracked = Mutex<[Int]>([])
            withObservationTracking {
                _ = board.score
            } onChange: {
                tracked.withLock { $0.append(board.score) }
            }

            // A local write: applied at once, then acknowledged by node1 with its version.
            board.title = "the app's"
            #expect(board.title == "the app's")
            let before = try #require(try await app.synchronize(board))
            #expect(before.node == "node1")
            try await waitUntil("node3 has the app's write") {
                (try? await writer.get(address))?["title"]?.value == "the app's"
            }

            let total = 600
            for value in 1...total {
                try await writer.set(address, ["score": .int(Int64(value))])
                if value == total / 3 {
                    try await waitUntil("the app saw a first part") { seen.withLock { $0.count } >= 20 }
                    // Local writes still in flight when the daemon dies: sent again to the next.
                    for step in 1...50 { board.title = "app \(step)" }
                    _ = await cluster.daemons[0].stop(SIGKILL)
                }
            }
            try await waitUntil("the app's observer saw the last value", timeout: .seconds(60)) {
                seen.withLock { $0.last?.new } == total
            }
            #expect(board.score == total)

            let chain = seen.withLock { $0 }
            #expect(chain.map(\.new) == Array(1...total), "every value once, in order: \(chain.map(\.new).prefix(20))…")
            var broken: [String] = []
            for (index, change) in chain.enumerated() {
                let previous = index == 0 ? 0 : chain[index - 1].new
                if change.old != previous { broken.append("\(change.old) -> \(change.new) after \(previous)") }
                if !change.isRemote { broken.append("\(change.new) is not remote") }
            }
            #expect(broken.isEmpty, "\(broken.prefix(5))")
            #expect(tracked.withLock { $0 }.count == 1 && tracked.withLock { $0 }.first ?? 0 >= 1)

            // The writes in flight at the kill reached the cluster; the last one stands.
            try await app.synchronize(board)
            #expect(board.title == "app 50")
            try await waitUntil("node3 has the app's last write from before the kill") {
                (try? await writer.get(address))?["title"]?.value == "app 50"
            }
            // After the failover, the app's writes go to node2.
            board.title = "after the failover"
            let after = try #require(try await app.synchronize(board))
            #expect(after.node == "node2" && after > before)
            try await waitUntil("node3 has the app's write") {
                (try? await writer.get(address))?["title"]?.value == "after the failover"
            }
            #expect(board.score == total && board.title == "after the failover")
        } catch {
            Issue.record("\(error)\n\(cluster.logs)")
        }
        _ = await cluster.stop()
    }

    /// Deletions and expiries reach a client model like remote writes; the app's own deletion is
    /// acknowledged and reaches the other nodes.
    @Test func deletionsAndExpiriesReachAClientModel() async throws {
        let cluster = try ModelLifecycleTests.Cluster()
        do {
            let writer = try StateSyncClient(endpoint: cluster.api[1], requestTimeout: .seconds(5))
            defer { writer.close() }
            let app = try StateSyncClient(endpoint: cluster.api[0], requestTimeout: .seconds(2))
            defer { app.close() }
            try await waitUntil("node1 answers") { (try? await app.status()) != nil }
            let board = try await app.model(Scoreboard.self, channel: "app", id: "b2")
            let changes = Mutex<[Change<String>]>([])
            board.observe(\.title) { change in changes.withLock { $0.append(change) } }

            board.title = "mine"
            try await app.synchronize(board)
            let address = ModelAddress(channel: "app", model: "b2")
            try await waitUntil("node2 holds the app's write") {
                (try? await writer.get(address))?["title"]?.value == "mine"
            }
            try await writer.delete(address)
            try await waitUntil("the app's observer sees the deletion") {
                changes.withLock { $0.last?.kind } == .deleted
            }
            #expect(board.isDeleted && board.title == "untitled")
            #expect(changes.withLock { $0.last?.kind } == .deleted && changes.withLock { $0.last?.old } == "mine")

            try await writer.set(address, ["title": "briefly"], timeToLive: .seconds(3))
            try await waitUntil("the app sees the value expire") { changes.withLock { $0.last?.kind } == .expired }
            #expect(changes.withLock { $0.map(\.kind) } == [.set, .deleted, .set, .expired])
            #expect(changes.withLock { $0.last?.old } == "briefly" && board.title == "untitled")

            board.score = 7
            try await app.synchronize(board)
            try await waitUntil("node2 has the app's write") { (try? await writer.get(address))?["score"]?.value == 7 }
            board.delete()
            #expect(board.isDeleted && board.score == 0)
            try await app.synchronize(board)
            try await waitUntil("node2 has the app's deletion") { (try? await writer.get(address))?.isEmpty == true }
            #expect(board.isDeleted, "the app's own deletion came back from the daemon and changed nothing")
        } catch {
            Issue.record("\(error)\n\(cluster.logs)")
        }
        _ = await cluster.stop()
    }

    /// A daemon refuses the app's writes (its key may read the channel, not write it): each
    /// write is undone in the model, its observers see the value go back, `synchronize` throws
    /// the refusal once, and a refused deletion of the model gives every value back.
    @Test func aRefusedWriteIsUndoneInTheModel() async throws {
        let directory = temporaryDirectory("client-model-refused")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await keygen(["node1", "node2", "app", "writer"], in: directory)
        let api = "tcp://127.0.0.1:\(freePort())"
        let path = "\(directory)/node1.yaml"
        try """
        node:
          id: node1
          data_dir: \(directory)/data
        network:
          publish: tcp://127.0.0.1:\(freePort())
          api: \(api)
          peers:
            - node2=tcp://127.0.0.1:\(freePort())
        security:
          secret_key: \(directory)/node1.key
          peer_keys:
            - node2=\(directory)/node2.key.pub
          client_keys:
            - \(directory)/app.key.pub read=app write=elsewhere
            - \(directory)/writer.key.pub
        """.write(toFile: path, atomically: true, encoding: .utf8)
        let daemon = try ChildProcess("statesyncd", ["--config", path])
        do {
            func security(_ key: String) -> StateSyncClient.Security {
                .init(serverKey: "\(directory)/node1.key.pub", secretKeyFile: "\(directory)/\(key).key")
            }
            let writer = try StateSyncClient(endpoint: api, requestTimeout: .seconds(3), security: security("writer"))
            defer { writer.close() }
            let address = ModelAddress(channel: "app", model: "r")
            try await waitUntil("the daemon takes the writer's write") {
                (try? await writer.set(address, ["score": 3, "title": "theirs"])) != nil
            }
            let app = try StateSyncClient(endpoint: api, requestTimeout: .seconds(3), security: security("app"))
            defer { app.close() }
            let board = try await app.model(Scoreboard.self, channel: "app", id: "r")
            #expect(board.score == 3 && board.title == "theirs")
            let scores = Mutex<[Change<Int>]>([])
            board.observe(\.score) { change in scores.withLock { $0.append(change) } }

            // Applied at once, then undone when the refusal comes back (which can be before the
            // next line runs: the observers' chain shows both, in order).
            board.score = 10
            await #expect(throws: StateSyncError.self) { try await app.synchronize(board) }
            #expect(board.score == 3, "undone: the daemon holds 3")
            #expect(scores.withLock { $0.map { [$0.old, $0.new] } } == [[3, 10], [10, 3]])
            #expect(try await app.synchronize(board) == nil, "the refusal is told once; nothing was applied")

            board.delete()
            await #expect(throws: StateSyncError.self) { try await app.synchronize(board) }
            #expect(!board.isDeleted && board.score == 3 && board.title == "theirs")
            #expect(
                scores.withLock { $0.suffix(2).map { [$0.old, $0.new] } } == [[3, 0], [0, 3]],
                "deleted, then given back")
            #expect(try await writer.get(address)["score"]?.value == 3, "the daemon never changed")
        } catch {
            Issue.record("\(error)\n\(daemon.stderr)")
        }
        _ = await daemon.stop()
    }
}
