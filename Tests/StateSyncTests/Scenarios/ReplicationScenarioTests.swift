import StateSyncZeroMQ
import Testing

@testable import StateSync
@testable import StateSyncTesting

/// The nodes a scenario runs on: real nodes over ZeroMQ on loopback (waiting on the wall clock),
/// or the same nodes in the simulator (in simulated time).
protocol ScenarioCluster {
    var nodes: [StateSyncNode] { get }
    /// Lets the cluster run until `condition` holds (a deadline fails the test).
    func waitUntil(_ what: String, _ condition: () -> Bool) async throws
    func stop() async
}

enum Transport: String, CaseIterable, CustomTestStringConvertible {
    case simulated, zeroMQ
    var testDescription: String { rawValue }

    func cluster(_ count: Int, label: String) async throws -> any ScenarioCluster {
        switch self {
        case .simulated: try SimulatedScenarioCluster(count)
        case .zeroMQ: try await ZeroMQScenarioCluster(count, label: label)
        }
    }
}

final class SimulatedScenarioCluster: ScenarioCluster {
    let cluster: SimulatedCluster

    init(_ count: Int) throws {
        cluster = try SimulatedCluster(SimulatedCluster.Configuration(nodes: count, seed: 11))
        cluster.run(for: 500)  // heartbeats: peers connected
    }

    var nodes: [StateSyncNode] { cluster.nodes.compactMap(\.host) }

    func waitUntil(_ what: String, _ condition: () -> Bool) async throws {
        let met = cluster.run(for: 60_000) { _ in condition() }
        if !met { Issue.record("\(what): not within 60 simulated seconds") }
        try #require(met)
    }

    func stop() async {}
}

final class ZeroMQScenarioCluster: ScenarioCluster {
    let nodes: [StateSyncNode]

    init(_ count: Int, label: String) async throws {
        var nodes: [StateSyncNode] = []
        for configuration in meshConfigurations(count, label: label) {
            nodes.append(try await StateSyncNode.start(configuration: configuration))
        }
        self.nodes = nodes
        try await waitUntilMeshed(nodes)
    }

    func waitUntil(_ what: String, _ condition: () -> Bool) async throws {
        try await StateSyncTests.waitUntil(what) { condition() }
    }

    func stop() async {
        for node in nodes { await node.stop() }
    }
}

/// One suite, two transports: the same test bodies on the simulator and on real ZeroMQ.
@Suite("Replication scenarios")
struct ReplicationScenarioTests {
    @Test(arguments: Transport.allCases)
    func aWriteFiresAnotherNodesObserverWithOldNewAndOrigin(transport: Transport) async throws {
        let cluster = try await transport.cluster(2, label: "scenario-observer")
        do {
            let local = try await cluster.nodes[0].model(Counter.self, channel: "counters", id: "room-1")
            let remote = try await cluster.nodes[1].model(Counter.self, channel: "counters", id: "room-1")
            let seen = Shared<[Change<Int>]>([])
            remote.observe(\.count) { change in seen.withLock { $0.append(change) } }
            local.count = 1
            try await cluster.waitUntil("the first change") { seen.value.count == 1 }
            local.count = 2
            try await cluster.waitUntil("the second change") { seen.value.count == 2 }
            #expect(seen.value.map(\.old) == [0, 1] && seen.value.map(\.new) == [1, 2])
            #expect(seen.value.allSatisfy { $0.origin == cluster.nodes[0].configuration.nodeID && $0.isRemote })
            // A transaction arrives as one version with both properties.
            remote.transaction {
                $0.count += 10
                $0.title = "busy"
            }
            try await cluster.waitUntil("the transaction") { local.count == 12 && local.title == "busy" }
            #expect(local.propertyVersions["count"] == local.propertyVersions["title"])
        } catch { Issue.record(error) }
        await cluster.stop()
    }

    @Test(arguments: Transport.allCases)
    func aBurstArrivesCompleteAndInOrder(transport: Transport) async throws {
        let cluster = try await transport.cluster(3, label: "scenario-burst")
        do {
            let writer = try await cluster.nodes[0].model(Counter.self, channel: "c", id: "burst")
            let readers = [
                try await cluster.nodes[1].model(Counter.self, channel: "c", id: "burst"),
                try await cluster.nodes[2].model(Counter.self, channel: "c", id: "burst"),
            ]
            let seen = readers.map { _ in Shared<[Int]>([]) }
            for (reader, log) in zip(readers, seen) {
                reader.observe(\.count) { change in log.withLock { $0.append(change.new) } }
            }
            for value in 1...2000 { writer.count = value }
            try await cluster.waitUntil("both readers have the burst") { seen.allSatisfy { $0.value.count == 2000 } }
            for log in seen { #expect(log.value == Array(1...2000)) }
            #expect(Set(cluster.nodes.map(\.status.stateDigest)).count == 1)
        } catch { Issue.record(error) }
        await cluster.stop()
    }

    /// Generic and hand-declared models (issue: declarations users write) replicate the same.
    @Test(arguments: Transport.allCases)
    func genericModelsReplicate(transport: Transport) async throws {
        let cluster = try await transport.cluster(2, label: "scenario-generic")
        do {
            let local = try await cluster.nodes[0].model(Box<String>.self, channel: "boxes", id: "b")
            let remote = try await cluster.nodes[1].model(Box<String>.self, channel: "boxes", id: "b")
            local.value = "hello"
            try await cluster.waitUntil("the generic model's change") { remote.value == "hello" }
        } catch { Issue.record(error) }
        await cluster.stop()
    }
}
