import Testing

@testable import StateSync
@testable import StateSyncTesting

/// Two nodes under one id (PROTOCOL.md 7.5, "Two nodes under one id") on the simulator: a fourth
/// node added with a copy of n2's configuration, its `node.id` unchanged, and listed as a peer by
/// every node (as a new node is) — or, in the runs that say so, joining through n1 and listed by
/// no one.
@Suite("Two nodes under one id, simulated")
struct DuplicateIDSimulationTests {
    static func cluster(seed: UInt64, throughSeed: Bool = false) throws -> SimulatedCluster {
        var configuration = SimulatedCluster.Configuration(nodes: 4, seed: seed)
        configuration.copies = [3: 1]
        configuration.copiesJoinThroughSeed = throughSeed
        return try SimulatedCluster(configuration)
    }

    /// A model on n2 ("a") and one on its copy ("b"), by node index.
    static func modelsOfBoth(_ cluster: SimulatedCluster) async throws -> [Int: Counter] {
        [
            1: try await #require(cluster.nodes[1].host).model(Counter.self, channel: "c", id: "a"),
            3: try await #require(cluster.nodes[3].host).model(Counter.self, channel: "c", id: "b"),
        ]
    }

    /// The nodes that run, all caught up, hold one state.
    static func runningAgree(_ cluster: SimulatedCluster) -> Bool {
        let running = cluster.nodes.compactMap { $0.host?.status }
        return running.allSatisfy { $0.missingDeltas == 0 } && Set(running.map(\.stateDigest)).count == 1
    }

    /// The copy starts after n2 wrote: it stops (at n2's progress, or at the second sign of
    /// n2's start), n2 goes on, and what n2 acknowledged is everywhere.
    @Test(arguments: 1...5 as ClosedRange<UInt64>)
    func aCopyStartedUnderTheIDOfANodeWithDataStops(seed: UInt64) async throws {
        let cluster = try Self.cluster(seed: seed)
        let original = try await #require(cluster.nodes[1].host).model(Counter.self, channel: "c", id: "m")
        for value in 1...50 { original.count = value }
        cluster.run(for: 1_000)
        try cluster.join(3)
        let copy = try await #require(cluster.nodes[3].host).model(Counter.self, channel: "c", id: "copy")
        copy.count = 1
        let stopped = cluster.run(for: 10_000) { $0.nodes[3].host == nil }
        #expect(stopped, "seed \(seed): the copy still runs")
        #expect(cluster.nodes[1].isUp && cluster.nodes[1].refusals.isEmpty, "seed \(seed): n2 goes on")
        let reason = try #require(cluster.nodes[3].refusals.first, "seed \(seed)")
        #expect(reason.contains("n2"), "seed \(seed): \(reason)")
        original.count = 51
        #expect(cluster.run(for: 10_000, stoppingWhen: Self.runningAgree), "seed \(seed)")
        for index in [0, 2] {
            let host = try #require(cluster.nodes[index].host)
            #expect(host.properties(of: ModelAddress(channel: "c", model: "m"))["count"]?.value == 51, "seed \(seed)")
        }
    }

    /// Both start at once with empty data directories. Without writes, exactly one stops,
    /// within a few heartbeat intervals (100 ms here), and the other goes on with the cluster.
    /// With writes on both, each may also stop at the other's numbers its peers report (section
    /// 7.5, "Ids do not come back empty"): at least one stops, each saying why, and one that goes
    /// on has its next write taken everywhere, and the running nodes come to one state (before
    /// split writes were mended, they differed in every seed).
    @Test(arguments: [false, true], 1...10 as ClosedRange<UInt64>)
    func twoNewNodesUnderOneID(writing: Bool, seed: UInt64) async throws {
        let cluster = try Self.cluster(seed: seed)
        try cluster.join(3)
        let models = try await Self.modelsOfBoth(cluster)
        var written = 0
        let oneStopped = cluster.run(for: 5_000) { cluster in
            if writing {
                written += 1
                for (index, model) in models where cluster.nodes[index].isUp { model.count = written }
            }
            return !cluster.nodes[1].isUp || !cluster.nodes[3].isUp
        }
        #expect(oneStopped, "seed \(seed): both still run after 5 s")
        cluster.run(for: 2_000)
        let stopped = [1, 3].filter { !cluster.nodes[$0].isUp }
        if !writing { #expect(stopped.count == 1, "seed \(seed): exactly one stops") }
        for index in stopped {
            let reason = try #require(cluster.nodes[index].refusals.first, "seed \(seed)")
            #expect(reason.contains("n2"), "seed \(seed): \(reason)")
        }
        // Both may stop (a known issue of section 7.5: then no one mends what they took).
        guard let survivor = [1, 3].first(where: { cluster.nodes[$0].isUp }) else { return }
        models[survivor]!.count = 1_000_000
        let address = ModelAddress(channel: "c", model: survivor == 1 ? "a" : "b")
        let everywhere = cluster.run(for: 10_000) { cluster in
            [0, 2].allSatisfy { cluster.nodes[$0].host?.properties(of: address)["count"]?.value == 1_000_000 }
        }
        #expect(everywhere, "seed \(seed): the survivor's write reaches n1 and n3")
        // Under numbers both took, each peer kept the first write it got (section 7.5, "Mending
        // split writes"): once the other stopped, the survivor publishes both again.
        #expect(cluster.run(for: 10_000, stoppingWhen: Self.runningAgree), "seed \(seed): the running nodes differ")
    }

    /// Both start empty and write, each to its own model, and an operator stops both before
    /// either stops by itself: peers kept, under each number both took, the write they got
    /// first. n2 restarted with its data holds its own writes in its snapshot, not as deltas it
    /// could compare with its peers', and nothing mends them (section 7.5, "Mending split
    /// writes", known issue): the running nodes differ. Recorded as a known issue, so that a fix
    /// shows (seeds 1 to 10 in one test; the writes split in each).
    @Test func bothStoppedAndOneRestartedUnderTheIDIsNotMended() async throws {
        var differing: [UInt64] = []
        for seed: UInt64 in 1...10 {
            let cluster = try Self.cluster(seed: seed)
            try cluster.join(3)
            let models = try await Self.modelsOfBoth(cluster)
            var written = 0
            cluster.run(for: 150) { cluster in
                written += 1
                for (index, model) in models where cluster.nodes[index].isUp { model.count = written }
                return false
            }
            cluster.stopCleanly(1)
            cluster.stopCleanly(3)
            cluster.run(for: 1_000)
            try cluster.restart(1)
            if !cluster.run(for: 10_000, stoppingWhen: Self.runningAgree) { differing.append(seed) }
        }
        withKnownIssue("two starts under one id that both stopped: their split writes are not mended") {
            #expect(differing.isEmpty, "the running nodes differ in seeds \(differing)")
        }
    }

    /// The copy knows only n1 and no node lists it: it joins through membership, and no peer
    /// links to it (one endpoint per id), so neither hears the other's HEARTBEATs. Without
    /// writes, their entries alone, each superseding the other's as n1 relays them, stop one of
    /// them. When n2 has written, the copy stops (at n2's progress, section 7.5 "Ids do not come
    /// back empty", or at the entries' second sign), and n2 goes on.
    @Test(arguments: [false, true], 1...10 as ClosedRange<UInt64>)
    func aCopyJoiningThroughASeedIsStoppedByTheEntriesAlone(originalWrote: Bool, seed: UInt64) async throws {
        let cluster = try Self.cluster(seed: seed, throughSeed: true)
        let original = try await #require(cluster.nodes[1].host).model(Counter.self, channel: "c", id: "m")
        if originalWrote {
            original.count = 1
            cluster.run(for: 1_000)
        }
        try cluster.join(3)
        let oneStopped = cluster.run(for: 10_000) { !$0.nodes[1].isUp || !$0.nodes[3].isUp }
        #expect(oneStopped, "seed \(seed): both still run after 10 s")
        cluster.run(for: 2_000)
        #expect(cluster.nodes[1].isUp != cluster.nodes[3].isUp, "seed \(seed): exactly one stops")
        if originalWrote { #expect(cluster.nodes[1].isUp, "seed \(seed): the node holding the id's writes goes on") }
        let stopped = cluster.nodes[1].isUp ? cluster.nodes[3] : cluster.nodes[1]
        let reason = try #require(stopped.refusals.first, "seed \(seed)")
        #expect(
            reason.contains("member entry was written again") || reason.contains("already published deltas"),
            "seed \(seed): \(reason)")
    }

    /// A copy made with n2's data directory (`cp -a`), joining through n1 while n2 runs: both
    /// hold writes of the id, but no peer subscribes to the copy (they link n2's endpoint for
    /// the id), so what it takes reaches no one: it is the one that stops, and n2 goes on. (An
    /// operator trial saw n2, the long-running node, stop, and the copy run on linked by no one.)
    @Test(arguments: 1...10 as ClosedRange<UInt64>)
    func aCopyOfANodesDataDirectoryJoiningThroughASeedStops(seed: UInt64) async throws {
        let cluster = try Self.cluster(seed: seed, throughSeed: true)
        let original = try await #require(cluster.nodes[1].host).model(Counter.self, channel: "c", id: "m")
        original.count = 1
        // n2 has run for over a minute: it is no newcomer (it started empty, as every node here).
        cluster.run(for: NodeMachine.newcomerMilliseconds + 1_000)
        cluster.copyDisk(of: 1, to: 3)
        try cluster.join(3)
        let copy = try await #require(cluster.nodes[3].host).model(Counter.self, channel: "c", id: "copy")
        copy.count = 1
        let oneStopped = cluster.run(for: 20_000) { !$0.nodes[1].isUp || !$0.nodes[3].isUp }
        #expect(oneStopped, "seed \(seed): both still run after 20 s")
        #expect(
            cluster.nodes[1].isUp && !cluster.nodes[3].isUp,
            "seed \(seed): the copy stops, n2 goes on: \(cluster.nodes[1].refusals) \(cluster.nodes[3].refusals)")
        original.count = 2
        let everywhere = cluster.run(for: 10_000) { cluster in
            [0, 2].allSatisfy {
                cluster.nodes[$0].host?.properties(of: ModelAddress(channel: "c", model: "m"))["count"]?.value == 2
            }
        }
        #expect(everywhere, "seed \(seed): n2's writes reach n1 and n3")
    }
}
