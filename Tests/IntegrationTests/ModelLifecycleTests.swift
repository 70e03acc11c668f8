import Foundation
import StateSync
import StateSyncClient
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The life of a model through the CLI on three real daemons (issue #16): a deletion through
/// node1 seen by a watch on node3 with its old value, a deletion and a concurrent set that end
/// alike everywhere, `ls` listing exactly the live models, and a value set with `--ttl` that
/// every node deletes at its expiry, told once to every watch.
@Suite("The life of a model, through the CLI")
struct ModelLifecycleTests {
    /// Three daemons on free loopback ports, 100 ms heartbeats; stopped by `stop()`.
    struct Cluster {
        let directory: String
        let api: [String]
        var daemons: [ChildProcess] = []

        /// `grace`: `storage.tombstone_grace_ms` (`nil`: the default).
        init(grace: Int? = nil) throws {
            directory = temporaryDirectory("lifecycle")
            let publish = (0..<3).map { _ in "tcp://127.0.0.1:\(freePort())" }
            api = (0..<3).map { _ in "tcp://127.0.0.1:\(freePort())" }
            for index in 0..<3 {
                let path = "\(directory)/node\(index + 1).yaml"
                try """
                node:
                  id: node\(index + 1)
                  data_dir: \(directory)/node\(index + 1)
                network:
                  publish: \(publish[index])
                  api: \(api[index])
                  heartbeat_ms: 100
                  peers: [\(publish.enumerated().filter { $0.offset != index }.map(\.element).joined(separator: ", "))]
                \(grace.map { "storage:\n  tombstone_grace_ms: \($0)" } ?? "")
                """.write(toFile: path, atomically: true, encoding: .utf8)
                daemons.append(try ChildProcess("statesyncd", ["--config", path], name: "node\(index + 1)"))
            }
        }

        /// Starts node `index` again, with its configuration and data directory.
        mutating func restart(_ index: Int) throws {
            daemons[index] = try ChildProcess(
                "statesyncd", ["--config", "\(directory)/node\(index + 1).yaml"], name: "node\(index + 1)")
        }

        func stop() async -> [Int32] {
            var statuses: [Int32] = []
            for daemon in daemons { statuses.append(await daemon.stop()) }
            try? FileManager.default.removeItem(atPath: directory)
            return statuses
        }

        var logs: String { daemons.map { "--- \($0.name) ---\n\($0.stderr)" }.joined(separator: "\n") }
    }

    /// The JSON lines a watch printed.
    static func lines(_ watch: ChildProcess) -> [[String: Any]] {
        watch.stdout.split(separator: "\n").compactMap(jsonObject)
    }

    @Test func deleteListAndExpireOnAThreeNodeCluster() async throws {
        let cluster = try Cluster()
        var watches: [ChildProcess] = []
        do {
            let clients = try cluster.api.map { try StateSyncClient(endpoint: $0, requestTimeout: .seconds(2)) }
            defer { for client in clients { client.close() } }
            try await waitUntil("every node sees its two peers") {
                for client in clients {
                    guard let status = try? await client.status(), status.peers.count == 2,
                        status.peers.allSatisfy(\.meshed)
                    else { return false }
                }
                return true
            }
            for api in cluster.api {
                watches.append(try ChildProcess("statesync", ["watch", "demo", "--json", "--daemon", api]))
            }
            try await waitUntil("the three watches are registered") {
                for client in clients where (try? await client.status().watchers) != 1 { return false }
                return true
            }
            let node3Watch = watches[2]

            // A deletion through node1, seen on node3 with its old value and kind "deleted".
            #expect(try await cli(["set", "demo/doc", "a=1", "b=\"keep\"", "--daemon", cluster.api[0]]).status == 0)
            let deleted = try await cli(["delete", "demo/doc", "a", "--json", "--daemon", cluster.api[0]])
            #expect(deleted.status == 0, "\(deleted.stderr)")
            #expect(jsonObject(Substring(deleted.stdout))?["outcome"] as? String == "changed")
            try await waitUntil("node3's watch prints the deletion") {
                Self.lines(node3Watch).contains { $0["kind"] as? String == "deleted" }
            }
            let deletion = Self.lines(node3Watch).first { $0["kind"] as? String == "deleted" }
            #expect(deletion?["property"] as? String == "a" && deletion?["old"] as? Int == 1)
            #expect(deletion?["deleted"] as? Bool == true && deletion?["new"] is NSNull)
            #expect(deletion?["origin"] as? String == "node1")

            // A deletion of the model and a concurrent set, through two nodes at once: every node
            // ends the same, with whichever has the later version.
            #expect(try await cli(["set", "demo/race", "x=1", "--daemon", cluster.api[2]]).status == 0)
            let deleting = try ChildProcess("statesync", ["delete", "demo/race", "--json", "--daemon", cluster.api[0]])
            let setting = try ChildProcess(
                "statesync", ["set", "demo/race", "x=2", "--json", "--daemon", cluster.api[1]])
            let (deletingStatus, settingStatus) = (await deleting.wait(), await setting.wait())
            #expect(deletingStatus == 0 && settingStatus == 0, "\(deleting.stderr)\(setting.stderr)")
            let deletionVersion = (jsonObject(Substring(deleting.stdout))?["version"] as? String).flatMap {
                Version($0)
            }
            let setVersion = (jsonObject(Substring(setting.stdout))?["version"] as? String).flatMap { Version($0) }
            let race = ModelAddress(channel: "demo", model: "race")
            let expected: Value? = (setVersion ?? .zero) > (deletionVersion ?? .zero) ? 2 : nil
            try await waitUntil("every node ends the race alike") {
                for client in clients where (try? await client.get(race))?["x"]?.value != expected { return false }
                return true
            }

            // ls: exactly the live models, on every node.
            for model in ["l1", "l2", "l3"] {
                #expect(try await cli(["set", "listing/\(model)", "v=1", "--daemon", cluster.api[1]]).status == 0)
            }
            #expect(try await cli(["delete", "listing/l2", "--daemon", cluster.api[0]]).status == 0)
            for api in cluster.api {
                try await waitUntil("ls on \(api) lists l1 and l3") {
                    let listed = try await cli(["ls", "listing", "--json", "--daemon", api])
                    return listed.stdout.split(separator: "\n").compactMap { jsonObject($0)?["name"] as? String }
                        == ["l1", "l3"]
                }
            }

            // A property set with --ttl 2s: there until its expiry, then gone from every node,
            // and told once to every watch as "expired".
            let ttl = try await cli([
                "set", "demo/session", "user=\"ann\"", "--ttl", "2s", "--json", "--daemon", cluster.api[0],
            ])
            let version = jsonObject(Substring(ttl.stdout))?["version"] as? String
            let written = try #require(version.flatMap { Version($0) }, "\(ttl.stdout)\(ttl.stderr)")
            let expiresAt = written.milliseconds + 2_000
            let session = ModelAddress(channel: "demo", model: "session")
            // Every node held it, with its expiry: told by each node's watch (asking with GET
            // instead could come too late on a busy machine, when it is already gone).
            for (index, watch) in watches.enumerated() {
                try await waitUntil("watch \(index + 1) prints the session with its expiry") {
                    Self.lines(watch).contains {
                        $0["model"] as? String == "session" && $0["kind"] as? String == "live"
                            && $0["expires_at"] as? Int == Int(expiresAt)
                    }
                }
            }
            try await waitUntil("every node deleted the session", timeout: .seconds(10)) {
                for client in clients where (try? await client.get(session))?.isEmpty != true { return false }
                return true
            }
            let gone = UInt64(Date().timeIntervalSince1970 * 1000)
            #expect(gone >= expiresAt, "deleted before its expiry")
            for (index, watch) in watches.enumerated() {
                try await waitUntil("watch \(index + 1) prints the expiry") {
                    Self.lines(watch).contains { $0["kind"] as? String == "expired" }
                }
            }
            // A later write, and the markers that follow it, reach every watch: still one expiry.
            #expect(try await cli(["set", "demo/after", "x=1", "--daemon", cluster.api[1]]).status == 0)
            for (index, watch) in watches.enumerated() {
                try await waitUntil("watch \(index + 1) prints the later write") {
                    Self.lines(watch).contains { $0["model"] as? String == "after" }
                }
            }
            for (index, watch) in watches.enumerated() {
                let expiries = Self.lines(watch).filter { $0["kind"] as? String == "expired" }
                #expect(expiries.count == 1, "watch \(index + 1): \(watch.stdout)")
                #expect(expiries.first?["old"] as? String == "ann" && expiries.first?["property"] as? String == "user")
                #expect(expiries.first?["version"] as? String == "\(expiresAt).0@node1")
            }
        } catch {
            Issue.record("\(error)\n\(cluster.logs)")
        }
        for watch in watches { _ = await watch.stop(SIGKILL) }
        #expect(await cluster.stop() == [0, 0, 0], "\(cluster.logs)")
    }

    /// PROTOCOL.md 8.4: a deletion is kept while a member that is away could still need it; once
    /// that member is forgotten the others collect it, and when the member comes back with its
    /// old data it takes the cluster's state instead of bringing the deleted model back.
    @Test func aNodeAwayLongerThanTheDeletionsAreKeptIsResyncedNotResurrecting() async throws {
        var cluster = try Cluster(grace: 0)
        do {
            let clients = try cluster.api.map { try StateSyncClient(endpoint: $0, requestTimeout: .seconds(2)) }
            defer { for client in clients { client.close() } }
            func status(_ index: Int) async -> NodeStatus? { try? await clients[index].status() }
            try await waitUntil("every node sees its two peers") {
                for index in 0..<3 {
                    guard let status = await status(index), status.peers.allSatisfy(\.meshed) else { return false }
                }
                return true
            }
            let gone = ModelAddress(channel: "demo", model: "gone")
            #expect(try await cli(["set", "demo/gone", "x=1", "--daemon", cluster.api[0]]).status == 0)
            // (Through node3: a node that never wrote does not come back once forgotten, 7.5.)
            #expect(try await cli(["set", "demo/kept", "y=2", "--daemon", cluster.api[2]]).status == 0)
            try await waitUntil("node3 holds both models") {
                let first = (try? await clients[2].get(gone))?["x"]
                let second = (try? await clients[2].get(ModelAddress(channel: "demo", model: "kept")))?["y"]
                return first != nil && second != nil
            }
            // node3 stops (it leaves cleanly), holding demo/gone.
            #expect(await cluster.daemons[2].stop() == 0)
            #expect(try await cli(["delete", "demo/gone", "--daemon", cluster.api[0]]).status == 0)
            try await waitUntil("node2 has the deletion") { (try? await clients[1].get(gone))?.isEmpty == true }
            // Held back by node3, which may come back needing it.
            try await waitUntil("node1 says node3 holds collection back") {
                await status(0)?.collectionHeldBy == "node3"
            }
            #expect((await status(0)?.tombstones ?? 0) >= 1)
            let forget = try await cli(["forget", "node3", "--daemon", cluster.api[0]])
            #expect(forget.status == 0, "\(forget.stderr)")
            try await waitUntil("node1 and node2 collect the deletion") {
                guard let one = await status(0), let two = await status(1) else { return false }
                return one.tombstones == 0 && two.tombstones == 0 && one.collectedThrough > 0
            }
            // node3 comes back with its data directory, which still holds demo/gone.
            try cluster.restart(2)
            try await waitUntil("node3 resyncs and holds what the others hold") {
                guard let three = await status(2), let one = await status(0) else { return false }
                return three.counters["resyncs"] == 1 && three.missingDeltas == 0
                    && three.stateDigest == one.stateDigest
            }
            #expect(try await clients[2].get(gone).isEmpty, "node3 did not bring demo/gone back")
            for index in 0..<2 { #expect(try await clients[index].get(gone).isEmpty, "node\(index + 1)") }
            #expect(try await clients[2].get(ModelAddress(channel: "demo", model: "kept"))["y"]?.value == 2)
            #expect(cluster.daemons[2].stderr.contains("forgotten while away"), "\(cluster.daemons[2].stderr)")
        } catch {
            Issue.record("\(error)\n\(cluster.logs)")
        }
        #expect(await cluster.stop() == [0, 0, 0], "\(cluster.logs)")
    }
}
