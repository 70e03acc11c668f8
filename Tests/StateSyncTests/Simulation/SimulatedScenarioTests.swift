import Testing

@testable import StateSync
@testable import StateSyncTesting

/// Node behaviour that used to be tested over TCP with wall-clock polling, now on the simulator:
/// the same nodes, deterministic, in simulated time.
@Suite("Repair and late join, simulated")
struct SimulatedRepairTests {
    static let channel = "c"

    static func quiet(_ cluster: SimulatedCluster) -> Bool { ClusterSimulator.isQuiet(cluster) }

    /// A node started after the writes gets everything from its peers' history (FETCH), no
    /// snapshot needed.
    @Test func aNodeStartedAfterTheWritesGetsEverythingFromHistory() async throws {
        let cluster = try SimulatedCluster(SimulatedCluster.Configuration(nodes: 3, seed: 1))
        cluster.crash(2)  // "not started yet"
        let writer = try await #require(cluster.nodes[0].host).model(Counter.self, channel: "c", id: "m")
        for value in 1...200 { writer.count = value }
        cluster.run(for: 500)
        try cluster.restart(2)
        #expect(cluster.run(for: 10_000, stoppingWhen: Self.quiet))
        let late = try #require(cluster.nodes[2].host)
        #expect(late.properties(of: ModelAddress(channel: "c", model: "m"))["count"]?.value == 200)
        #expect(late.status.counters["repair_requests"] ?? 0 > 0)
        #expect(late.status.counters["snapshots_applied"] == 0, "history was enough")
    }

    /// Writers can outrun the node: a long queue of a model's writes is taken in rounds of
    /// bounded size, each synced and published before the next (not one giant round), and
    /// every write arrives.
    @Test func aLongQueueOfLocalWritesGoesOutInRounds() async throws {
        let cluster = try SimulatedCluster(SimulatedCluster.Configuration(nodes: 2, seed: 3))
        let writer = try await #require(cluster.nodes[0].host).model(Counter.self, channel: "c", id: "m")
        let writes = 3 * NodeMachine.localWritesPerRound + 1
        let syncsBefore = cluster.nodes[0].disk.syncCount
        for value in 1...writes { writer.count = value }
        #expect(cluster.run(for: 10_000, stoppingWhen: Self.quiet))
        #expect(cluster.nodes[0].disk.syncCount - syncsBefore >= 4, "one sync per round of at most 4096 writes")
        let reader = try #require(cluster.nodes[1].host)
        #expect(reader.properties(of: ModelAddress(channel: "c", model: "m"))["count"]?.value == .int(Int64(writes)))
        #expect(reader.status.counters["deltas_received"] == writes)
    }

    /// When no peer holds the missing deltas any more, a snapshot fills the gap; live deltas keep
    /// flowing after it.
    @Test func whenHistoryIsGoneALateJoinerGetsASnapshot() async throws {
        var configuration = SimulatedCluster.Configuration(nodes: 2, seed: 2)
        configuration.historyDeltas = 5
        let cluster = try SimulatedCluster(configuration)
        cluster.crash(1)
        let writer = try await #require(cluster.nodes[0].host).model(Counter.self, channel: "c", id: "m")
        for value in 1...100 {
            writer.transaction {
                $0.count = value
                $0.title = "t\(value)"
            }
        }
        cluster.run(for: 500)
        try cluster.restart(1)
        #expect(cluster.run(for: 10_000, stoppingWhen: Self.quiet))
        let joiner = try #require(cluster.nodes[1].host)
        #expect(joiner.status.counters["snapshots_applied"] ?? 0 >= 1)
        let model = try await joiner.model(Counter.self, channel: "c", id: "m")
        #expect(model.count == 100 && model.title == "t100")
        writer.count = 101
        #expect(cluster.run(for: 1000) { _ in model.count == 101 })
    }

    /// Deltas lost on a link (loss, a partition) are seen by their sequence numbers and repaired.
    @Test func deltasLostOnALinkAreRepaired() async throws {
        let cluster = try SimulatedCluster(SimulatedCluster.Configuration(nodes: 2, seed: 3))
        cluster.run(for: 300)
        cluster.network.setConditions(.init(delay: 1...2, loss: 0.5), from: "n1", to: "n2")
        let writer = try await #require(cluster.nodes[0].host).model(Counter.self, channel: "c", id: "m")
        let reader = try await #require(cluster.nodes[1].host).model(Counter.self, channel: "c", id: "m")
        let seen = Shared<[Int]>([])
        reader.observe(\.count) { change in seen.withLock { $0.append(change.new) } }
        for value in 1...500 {
            writer.count = value
            cluster.run(for: 1)
        }
        cluster.network.setConditions(nil, from: "n1", to: "n2")
        #expect(cluster.run(for: 10_000, stoppingWhen: Self.quiet))
        let counters = try #require(cluster.nodes[1].host).status.counters
        #expect(counters["sequence_gaps"] ?? 0 > 0 && counters["repair_requests"] ?? 0 > 0)
        #expect(reader.count == 500)
        #expect(
            seen.value.last == 500 && seen.value == seen.value.sorted(), "one increasing chain: \(seen.value.count)")
    }

    /// A live watch sees state its node merged from a peer's snapshot (no deltas to show it):
    /// it is resynced, never silently skipped.
    @Test func aLiveWatchSeesStateMergedFromAPeersSnapshot() async throws {
        var configuration = SimulatedCluster.Configuration(nodes: 2, seed: 4)
        configuration.historyDeltas = 3
        let cluster = try SimulatedCluster(configuration)
        cluster.crash(1)
        let writer = try await #require(cluster.nodes[0].host).model(Counter.self, channel: "c", id: "m")
        for value in 1...20 { writer.count = value }
        cluster.run(for: 300)
        try cluster.restart(1)
        let watcher = SimulatedWatcher(node: 1, channel: "c", name: "watcher", capacity: 1000)
        watcher.start(in: cluster)
        #expect(cluster.run(for: 10_000) { _ in watcher.replica.properties(of: "m")["count"]?.value == 20 })
        #expect(watcher.violations.isEmpty, "\(watcher.violations)")
        #expect(watcher.changes.last?.new == 20)
    }
}
