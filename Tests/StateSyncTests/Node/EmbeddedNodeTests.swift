import Foundation
import StateSyncClient
import StateSyncZeroMQ
import Testing

@testable import StateSync

/// Two (or three) embedded nodes in one process, talking over real ZeroMQ on loopback.
@Suite("Embedded nodes")
struct EmbeddedNodeTests {
    /// Config/node1.yaml and Config/node2.yaml, moved to free ports and temporary data directories.
    static func exampleConfigurations() throws -> [NodeConfiguration] {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../../Config")
        var configs = try (1...2).map {
            try NodeConfiguration.load(file: root.appendingPathComponent("node\($0).yaml").path, environment: [:])
        }
        let mesh = meshConfigurations(2, label: "example")
        for index in configs.indices {
            configs[index].publishEndpoint = mesh[index].publishEndpoint
            configs[index].peers = mesh[index].peers
            configs[index].apiEndpoint = nil
            configs[index].dataDirectory = mesh[index].dataDirectory
            configs[index].heartbeatIntervalMilliseconds = 50
        }
        return configs
    }

    @Test func setOnNode1FiresNode2ObserverWithOldNewAndOrigin() async throws {
        let configs = try Self.exampleConfigurations()
        #expect(configs.map(\.nodeID) == ["node1", "node2"])
        let node1 = try await StateSyncNode.start(configuration: configs[0])
        let node2 = try await StateSyncNode.start(configuration: configs[1])
        do {
            try await waitUntilMeshed([node1, node2])
            let local = try await node1.model(Counter.self, channel: "counters", id: "room-1")
            let remote = try await node2.model(Counter.self, channel: "counters", id: "room-1")
            let seen = Shared<[Change<Int>]>([])
            remote.observe(\.count) { change in seen.withLock { $0.append(change) } }

            local.count = 1
            try await waitUntil("node2 sees the first change") { seen.value.count == 1 }
            local.count = 2
            try await waitUntil("node2 sees the second change") { seen.value.count == 2 }
            let changes = seen.value
            #expect(changes.map(\.old) == [0, 1])
            #expect(changes.map(\.new) == [1, 2])
            #expect(changes.allSatisfy { $0.origin == "node1" && $0.isRemote })
            #expect(changes[1].version > changes[0].version)
            #expect(remote.count == 2)

            // A transaction on node2 reaches node1 as one version with both properties.
            let titles = Shared<[Change<String>]>([])
            local.observe(\.title) { change in titles.withLock { $0.append(change) } }
            remote.transaction {
                $0.count += 10
                $0.title = "busy"
            }
            try await waitUntil("node1 sees the transaction") { titles.value.count == 1 && local.count == 12 }
            #expect(
                titles.value[0].old == "untitled" && titles.value[0].new == "busy" && titles.value[0].origin == "node2")
            #expect(local.propertyVersions["count"] == local.propertyVersions["title"])
        } catch { Issue.record(error) }
        await node1.stop()
        await node2.stop()
    }

    /// Records every change of `model.count`; the first notification blocks until `gate` is
    /// signalled (30 s at most): an observer stuck in its first call.
    static func observeStuckUntil(_ gate: DispatchSemaphore, _ model: Counter) -> Shared<[Change<Int>]> {
        let seen = Shared<[Change<Int>]>([])
        model.observe(\.count) { change in
            if seen.withLock({ $0.isEmpty }) { _ = gate.wait(timeout: .now() + 30) }
            seen.withLock { $0.append(change) }
        }
        return seen
    }

    /// Observers run off the I/O thread: while one is stuck, the node still receives, applies
    /// (store and model values) and heartbeats; once it returns, it gets every change, in order,
    /// with exact old and new values.
    @Test func aStuckObserverDoesNotHoldUpReplication() async throws {
        let configs = meshConfigurations(2, label: "stuck-observer")
        let node1 = try await StateSyncNode.start(configuration: configs[0])
        let node2 = try await StateSyncNode.start(configuration: configs[1])
        let gate = DispatchSemaphore(value: 0)
        do {
            try await waitUntilMeshed([node1, node2])
            let local = try await node1.model(Counter.self, channel: "counters", id: "stuck")
            let remote = try await node2.model(Counter.self, channel: "counters", id: "stuck")
            let seen = Self.observeStuckUntil(gate, remote)
            for value in 1...50 { local.count = value }
            try await waitUntil("node2 applies every write while its observer is stuck") {
                node2.properties(of: ModelAddress(channel: "counters", model: "stuck"))["count"]?.value == 50
                    && remote.count == 50
            }
            #expect(seen.value.isEmpty, "the observer is still stuck in its first call")
            // And it goes on receiving: a write to another model arrives too.
            let other = try await node1.model(Counter.self, channel: "counters", id: "other")
            other.title = "still flowing"
            try await waitUntil("node2 receives a later write") {
                node2.properties(of: ModelAddress(channel: "counters", model: "other"))["title"]?.value
                    == "still flowing"
            }
            #expect(seen.value.isEmpty)
            gate.signal()
            try await waitUntil("the observer catches up") { seen.value.count == 50 }
            #expect(seen.value.map(\.old) == Array(0...49))
            #expect(seen.value.map(\.new) == Array(1...50))
        } catch { Issue.record(error) }
        gate.signal()
        await node1.stop()
        await node2.stop()
    }

    /// Backpressure: with its observer stuck and the backlog past the limit, a node stops taking
    /// peer deltas (counted) but stays alive; once the observer returns, every change arrives,
    /// in order, with exact old/new.
    @Test func observersFarBehindPauseIntakeAndLoseNothing() async throws {
        var configs = meshConfigurations(2, label: "backpressure")
        configs[1].observerBacklogLimit = 100
        let node1 = try await StateSyncNode.start(configuration: configs[0])
        let node2 = try await StateSyncNode.start(configuration: configs[1])
        let gate = DispatchSemaphore(value: 0)
        do {
            try await waitUntilMeshed([node1, node2])
            let local = try await node1.model(Counter.self, channel: "counters", id: "flood")
            let remote = try await node2.model(Counter.self, channel: "counters", id: "flood")
            let seen = Self.observeStuckUntil(gate, remote)
            for value in 1...1_000 { local.count = value }
            try await waitUntil("node2 pauses its intake") {
                node2.status.counters["observer_backpressure_pauses"] ?? 0 >= 1
            }
            // Still paused (the paused time is added when it resumes) for four heartbeat
            // intervals, and node1 still hears node2's heartbeats: the node is alive.
            let paused = ContinuousClock.now
            try await waitUntil("node2 stays paused yet alive for 4 heartbeat intervals") {
                ContinuousClock.now - paused > .milliseconds(200)
                    && node2.status.counters["observer_backpressure_ms"] == 0
                    && node1.status.peers.allSatisfy(\.connected)
            }
            gate.signal()
            try await waitUntil("every change reaches the observer") { seen.value.last?.new == 1_000 }
            #expect(seen.value.map(\.new) == Array(1...1_000))
            #expect(seen.value.map(\.old) == Array(0...999))
            try await waitUntil("node2 resumes") { node2.status.counters["observer_backpressure_ms"] ?? 0 > 0 }
        } catch { Issue.record(error) }
        gate.signal()
        await node1.stop()
        await node2.stop()
    }

    /// With one delta per message (`network.batch_max_deltas: 1`) and with small batches, a
    /// burst of writes arrives complete and in order.
    @Test(arguments: [1, 3])
    func burstsArriveInOrderWhateverTheBatchSize(batch: Int) async throws {
        var configs = meshConfigurations(2, label: "batch-\(batch)")
        configs[0].batchMaximumDeltas = batch
        let node1 = try await StateSyncNode.start(configuration: configs[0])
        let node2 = try await StateSyncNode.start(configuration: configs[1])
        do {
            try await waitUntilMeshed([node1, node2])
            let local = try await node1.model(Counter.self, channel: "counters", id: "burst")
            let remote = try await node2.model(Counter.self, channel: "counters", id: "burst")
            let seen = Shared<[Int]>([])
            remote.observe(\.count) { change in seen.withLock { $0.append(change.new) } }
            for value in 1...2_000 { local.count = value }
            try await waitUntil("node2 sees the whole burst") { seen.value.count == 2_000 }
            #expect(seen.value == Array(1...2_000), "batch size \(batch)")
        } catch { Issue.record(error) }
        await node1.stop()
        await node2.stop()
    }

    /// Nodes without `network.api` still repair: each serves its peers' FETCH and SNAPSHOT on a
    /// repair endpoint of its own (a free port on its publish host), and refuses client requests
    /// there.
    @Test func nodesWithoutAnAPIRepairMissedDeltas() async throws {
        let configs = meshConfigurations(2, label: "no-api")
        #expect(configs.allSatisfy { $0.apiEndpoint == nil })
        let node1 = try await StateSyncNode.start(configuration: configs[0])
        var node2: StateSyncNode?
        do {
            let writer = try await node1.model(Counter.self, channel: "c", id: "m")
            for value in 1...300 { writer.count = value }  // node2 is not running: it misses them all
            // Published, not only numbered: on a busy machine node1 could still be publishing
            // them when node2 subscribes, and node2 would get them live, with nothing to repair.
            try await waitUntil("node1 published its writes") { node1.status.publishedSequence == 300 }
            let late = try await StateSyncNode.start(configuration: configs[1])
            node2 = late
            try await waitUntil("node2 repairs the 300 deltas it missed") {
                late.properties(of: ModelAddress(channel: "c", model: "m"))["count"]?.value == 300
                    && late.status.missingDeltas == 0
            }
            #expect(late.status.counters["repair_requests"] ?? 0 > 0)
            #expect(late.status.stateDigest == node1.status.stateDigest)
            #expect(node1.apiEndpoint == nil, "no client API was opened")

            // The repair endpoint serves peers only: a client request gets ERROR 7 (denied).
            let client = try StateSyncClient(endpoint: node1.repairEndpoint, requestTimeout: .seconds(5))
            defer { client.close() }
            let error = await #expect(throws: StateSyncError.self) {
                _ = try await client.get(ModelAddress(channel: "c", model: "m"))
            }
            #expect("\(error.map { "\($0)" } ?? "")".contains("repair endpoint"))
        } catch { Issue.record(error) }
        await node1.stop()
        await node2?.stop()
    }

    @Test func sameAddressGivesTheSameInstanceAndANewInstanceAdoptsState() async throws {
        let configs = meshConfigurations(2, label: "adopt")
        let node1 = try await StateSyncNode.start(configuration: configs[0])
        let node2 = try await StateSyncNode.start(configuration: configs[1])
        do {
            try await waitUntilMeshed([node1, node2])
            let writer = try await node1.model(Counter.self, channel: "counters", id: "room-2")
            #expect(try await node1.model(Counter.self, channel: "counters", id: "room-2") === writer)
            writer.transaction {
                $0.count = 41
                $0.title = "kept"
            }
            try await waitUntil("node2 holds the state") {
                node2.properties(of: ModelAddress(channel: "counters", model: "room-2")).count == 2
            }
            // Attaching late: the instance adopts the channel's state, no reset, no delta.
            let published = node2.status.counters["deltas_published"]
            let late = try await node2.model(Counter.self, channel: "counters", id: "room-2")
            #expect(late.count == 41 && late.title == "kept")
            #expect(node2.status.counters["deltas_published"] == published)
            // A different type at a live address is refused with a clear error.
            await #expect(throws: StateSyncError.self) {
                _ = try await node2.model(Everything.self, channel: "counters", id: "room-2")
            }
            withExtendedLifetime(late) {}
        } catch { Issue.record(error) }
        await node1.stop()
        await node2.stop()
    }

    @Test func startFromAConfigFileAndStateSurvivesARestart() async throws {
        let port = freePort()
        let dataDirectory = temporaryDirectory("restart")
        let file = temporaryDirectory("restart-config") + "/node.yaml"
        try """
        node:
          id: solo
          data_dir: \(dataDirectory)
        network:
          publish: tcp://127.0.0.1:\(port)
        """.write(toFile: file, atomically: true, encoding: .utf8)
        let node = try await StateSyncNode.start(configFile: file)
        let counter = try await node.model(Counter.self, channel: "c", id: "m")
        counter.count = 7
        try await waitUntil("the write reached the node's store") {
            node.properties(of: ModelAddress(channel: "c", model: "m"))["count"]?.value == 7
        }
        // A second node on the same data directory is refused while the first runs.
        var clash = try NodeConfiguration.load(file: file, environment: [:])
        clash.publishEndpoint = "tcp://127.0.0.1:\(freePort())"
        await #expect(throws: StateSyncError.self) { _ = try await StateSyncNode.start(configuration: clash) }
        await node.stop()
        let again = try await StateSyncNode.start(configFile: file)
        let reloaded = try await again.model(Counter.self, channel: "c", id: "m")
        #expect(reloaded.count == 7)
        #expect(again.status.latestSequence == 1)
        await again.stop()
    }

    @Test func bindFailureIsAClearError() async throws {
        let configs = meshConfigurations(1, label: "bind")
        let node = try await StateSyncNode.start(configuration: configs[0])
        var clash = configs[0]
        clash.dataDirectory = temporaryDirectory("bind-clash")
        let error = await #expect(throws: StateSyncError.self) {
            _ = try await StateSyncNode.start(configuration: clash)
        }
        #expect(error?.message.contains("cannot bind network.publish \(configs[0].publishEndpoint)") == true)
        await node.stop()
    }
}

@Suite("Embedded nodes and clients")
struct EmbeddedNodeClientTests {
    /// A SET through a node's API reaches the live model the node hosts at that address, and a
    /// model instance made after a write adopts it.
    @Test func aClientSetReachesTheNodesLiveModel() async throws {
        let config = meshConfigurations(1, label: "setmodel", api: true)[0]
        let node = try await StateSyncNode.start(configuration: config)
        let client = try StateSyncClient(endpoint: try #require(node.apiEndpoint))
        do {
            let model = try await node.model(Counter.self, channel: "c", id: "m")
            let seen = Shared<[Change<Int>]>([])
            model.observe(\.count) { change in seen.withLock { $0.append(change) } }
            try await client.set(ModelAddress(channel: "c", model: "m"), ["count": 5])
            try await waitUntil("the model got the SET") { seen.value.count == 1 }
            #expect(model.count == 5)
            #expect(seen.value[0].old == 0 && seen.value[0].new == 5 && seen.value[0].origin == config.nodeID)
            // The model's own writes are not applied to it a second time.
            model.count = 6
            try await waitUntil("the write reached the store") {
                node.properties(of: ModelAddress(channel: "c", model: "m"))["count"]?.value == 6
            }
            #expect(seen.value.map(\.new) == [5, 6])
        } catch {
            Issue.record(error)
        }
        client.close()
        await node.stop()
    }
}
