import Foundation
import StateSyncClient
import StateSyncZeroMQ
import Synchronization
import Testing
import ZeroMQ

@testable import StateSync

/// Watches: initial state with a verifiable marker, caught-up markers, resume on another node
/// exactly once with exact old/new, resync when history is gone or the client lags.
@Suite("Watches")
struct WatchTests {
    static func start(_ configs: [NodeConfiguration]) async throws -> [StateSyncNode] {
        var nodes: [StateSyncNode] = []
        for config in configs { nodes.append(try await StateSyncNode.start(configuration: config)) }
        return nodes
    }

    /// Collects events until `until` holds (with a deadline).
    final class Collector: @unchecked Sendable {
        // Safe: written by the collecting task, read after `waitUntil` saw it complete, under the lock.
        let lock = NSLock()
        var events: [WatchEvent] = []
        var failure: (any Error)?
        var changes: [PropertyChange] {
            lock.withLock { events.compactMap { if case .change(let c, _, _) = $0 { c } else { nil } } }
        }

        func collect(_ stream: AsyncThrowingStream<WatchEvent, any Error>) -> Task<Void, Never> {
            Task {
                do {
                    for try await event in stream { lock.withLock { events.append(event) } }
                } catch {
                    lock.withLock { failure = error }
                }
            }
        }
    }

    @Test func aWatchStartsWithTheStateAndAVerifiedInitialMarker() async throws {
        let configs = meshConfigurations(1, label: "initial", api: true)
        let node = try await StateSyncNode.start(configuration: configs[0])
        let client = try StateSyncClient(endpoint: try #require(node.apiEndpoint))
        do {
            let address = ModelAddress(channel: "c", model: "m")
            try await client.set(address, ["a": 1, "b": "two"])
            try await client.set(ModelAddress(channel: "other", model: "x"), ["z": 0])
            let (events, replica) = try await client.watch(channel: "c")
            let collector = Collector()
            let task = collector.collect(events)
            try await waitUntil("initial state and a caught-up marker") {
                collector.lock.withLock { collector.events.contains { if case .caughtUp = $0 { true } else { false } } }
            }
            let initial = collector.lock.withLock { collector.events }
            guard
                case .initialStateComplete(let records, _) = initial.first(where: {
                    if case .initialStateComplete = $0 { true } else { false }
                })
            else {
                Issue.record("no initial-state marker in \(initial)")
                return
            }
            #expect(records == 2)
            #expect(collector.changes.map(\.property).sorted() == ["a", "b"])
            #expect(replica.properties(of: "m")["b"]?.value == "two")
            try await client.set(address, ["a": 2])
            try await waitUntil("the live change") { collector.changes.count == 3 }
            #expect(collector.changes.last?.old == 1 && collector.changes.last?.new == 2)
            task.cancel()
        } catch {
            Issue.record(error)
        }
        client.close()
        await node.stop()
    }

    @Test func anEmptyChannelStillGetsItsInitialMarker() async throws {
        let configs = meshConfigurations(1, label: "empty", api: true)
        let node = try await StateSyncNode.start(configuration: configs[0])
        let client = try StateSyncClient(endpoint: try #require(node.apiEndpoint))
        let (events, _) = try await client.watch(channel: "nothing")
        var sawInitial = false
        for try await event in events {
            if case .initialStateComplete(let records, _) = event {
                #expect(records == 0)
                sawInitial = true
            }
            if case .caughtUp(_, _, let missing) = event {
                #expect(missing == 0)
                break
            }
        }
        #expect(sawInitial)
        client.close()
        await node.stop()
    }

    /// A client whose node died resumes on another node: every later change exactly once, and
    /// old → new continues the same chain.
    @Test func aWatchResumedOnAnotherNodeSeesEveryLaterChangeOnceWithExactOldNew() async throws {
        let configs = meshConfigurations(3, label: "resume", api: true)
        let nodes = try await Self.start(configs)
        do {
            try await waitUntilMeshed(nodes)
            let writer = try StateSyncClient(endpoint: try #require(nodes[2].apiEndpoint))
            defer { writer.close() }
            let address = ModelAddress(channel: "c", model: "m")
            let first = try StateSyncClient(endpoint: try #require(nodes[0].apiEndpoint))
            let (events, replica) = try await first.watch(channel: "c")
            let before = Collector()
            let task = before.collect(events)
            for i in 1...20 { try await writer.set(address, ["n": .int(Int64(i))]) }
            try await waitUntil("the first watch saw 20 changes") { before.changes.count == 20 }
            task.cancel()
            first.close()
            // Meanwhile, more writes, from two nodes.
            for i in 21...40 { try await writer.set(address, ["n": .int(Int64(i))]) }
            let other = try StateSyncClient(endpoint: try #require(nodes[0].apiEndpoint))
            defer { other.close() }
            for i in 41...45 { try await other.set(address, ["n": .int(Int64(i))]) }
            try await waitUntil("node2 holds everything") {
                nodes[1].properties(of: address)["n"]?.value == 45 && nodes[1].status.missingDeltas == 0
            }

            let second = try StateSyncClient(endpoint: try #require(nodes[1].apiEndpoint))
            defer { second.close() }
            let (resumed, _) = try await second.watch(channel: "c", replica: replica)
            let after = Collector()
            let resumedTask = after.collect(resumed)
            do {
                try await waitUntil("the resumed watch saw 25 changes") { after.changes.count >= 25 }
            } catch {
                Issue.record(
                    "resumed from \(replica.cursor): got \(after.lock.withLock { after.events }), node2 status \(nodes[1].status.value)"
                )
                throw error
            }
            resumedTask.cancel()
            let changes = after.changes
            #expect(changes.count == 25, "exactly once: \(changes.map(\.new))")
            #expect(changes.map(\.new) == (21...45).map { Value.int(Int64($0)) })
            #expect(changes.first?.old == 20, "old continues the chain across the gap")
            for index in changes.indices.dropFirst() { #expect(changes[index].old == changes[index - 1].new) }
            #expect(
                after.lock.withLock { after.events.allSatisfy { if case .resyncStarted = $0 { false } else { true } } })
        } catch {
            Issue.record(error)
        }
        for node in nodes { await node.stop() }
    }

    /// close() returns once the client's thread stopped: writes made afterwards never reach the
    /// replica, so it can be handed to another client exactly as it stands.
    @Test func afterCloseTheReplicaNoLongerChanges() async throws {
        let configs = meshConfigurations(1, label: "close", api: true)
        let node = try await StateSyncNode.start(configuration: configs[0])
        do {
            let endpoint = try #require(node.apiEndpoint)
            let writer = try StateSyncClient(endpoint: endpoint)
            defer { writer.close() }
            let address = ModelAddress(channel: "c", model: "m")
            try await writer.set(address, ["n": 0])
            let watcher = try StateSyncClient(endpoint: endpoint)
            let (events, replica) = try await watcher.watch(channel: "c")
            let collector = Collector()
            let task = collector.collect(events)
            try await waitUntil("the initial state") { collector.changes.count == 1 }
            // Writes in flight while the watcher closes.
            let burst = Task { for i in 1...3_000 { _ = try? await writer.set(address, ["n": .int(Int64(i))]) } }
            try await waitUntil("writes are streaming to the watch") { replica.cursor.positions["node1"] ?? 0 >= 100 }
            watcher.close()
            let frozen = replica.cursor
            await burst.value
            try await writer.set(address, ["n": 1_000])
            // The node published everything; the closed watcher's replica did not move.
            #expect(replica.cursor == frozen, "the replica changed after close(): \(frozen) -> \(replica.cursor)")
            task.cancel()
        } catch { Issue.record(error) }
        await node.stop()
    }

    /// When the node's history no longer reaches back to the cursor, the watch says so and
    /// resyncs with exact old → new from the replica.
    @Test func resumingPastTheHistoryResyncsWithExactOldNew() async throws {
        var configs = meshConfigurations(1, label: "gone", api: true)
        configs[0].historyDeltas = 4
        let node = try await StateSyncNode.start(configuration: configs[0])
        do {
            let client = try StateSyncClient(endpoint: try #require(node.apiEndpoint))
            defer { client.close() }
            let address = ModelAddress(channel: "c", model: "m")
            try await client.set(address, ["n": 1])
            let (events, replica) = try await client.watch(channel: "c")
            let before = Collector()
            let task = before.collect(events)
            try await waitUntil("the initial state") { before.changes.count == 1 }
            task.cancel()
            for i in 2...30 { try await client.set(address, ["n": .int(Int64(i))]) }
            let (resumed, _) = try await client.watch(channel: "c", replica: replica)
            let after = Collector()
            let resumedTask = after.collect(resumed)
            try await waitUntil("the resync") { after.changes.count == 1 }
            resumedTask.cancel()
            let seen = after.lock.withLock { after.events }
            #expect(seen.contains { if case .resyncStarted(.historyGone) = $0 { true } else { false } })
            guard
                case .change(let change, let kind, _) = seen.first(where: {
                    if case .change = $0 { true } else { false }
                })
            else {
                Issue.record("no change in \(seen)")
                return
            }
            #expect(kind == .resync && change.old == 1 && change.new == 30)
        } catch {
            Issue.record(error)
        }
        await node.stop()
    }

    /// A raw watcher that never reads (small queues, small kernel buffer), then 3,000 large
    /// writes on 7 models: far more than the watch's queue and the node's history hold.
    static func floodAStalledWatcher(
        _ node: StateSyncNode, watchID: UInt64, onLag: ClientProtocol.LagPolicy
    ) async throws -> (Context, Socket) {
        let context = try Context()
        let dealer = try context.socket(.dealer)
        try dealer.setReceiveHighWaterMark(5)
        // A small kernel buffer: otherwise Linux autotunes it to tens of MB and nothing lags.
        try dealer.setReceiveBufferSize(bytes: 16_384)
        try dealer.connect(try #require(node.apiEndpoint))
        try dealer.send(
            ClientProtocol.encodeRequest(
                .watch, id: watchID, body: ClientProtocol.encodeWatch(channel: "c", from: nil, onLag: onLag)))
        try await waitUntil("the watch is registered") { node.status.watchers == 1 }
        let writer = try StateSyncClient(endpoint: try #require(node.apiEndpoint))
        defer { writer.close() }
        // Large, distinct values: the kernel's buffers must fill too, not only libzmq's queue.
        let padding = String(repeating: "x", count: 16_000)
        for i in 1...3000 {
            try await writer.set(
                ModelAddress(channel: "c", model: "m\(i % 7)"), ["n": .int(Int64(i)), "pad": .string(padding + "\(i)")])
        }
        return (context, dealer)
    }

    /// With the "end" policy, a watch that falls behind the history ends with ERROR lagged.
    @Test func withTheEndPolicyALaggingWatchEndsWithAClearError() async throws {
        var configs = meshConfigurations(1, label: "lagend", api: true)
        configs[0].historyDeltas = 20
        configs[0].clientHighWaterMark = 10
        let node = try await StateSyncNode.start(configuration: configs[0])
        do {
            let (context, dealer) = try await Self.floodAStalledWatcher(node, watchID: 9, onLag: .end)
            defer { withExtendedLifetime(context) {} }
            var ended: String?
            var kinds: [String: Int] = [:]
            defer { if ended == nil { Issue.record("received \(kinds), status \(node.status.value)") } }
            try await waitUntil("the watch ended with ERROR lagged") {
                while ended == nil, let frames = try dealer.receive(dontWait: true) {
                    let header = try ClientProtocol.decodeReplyHeader(frames[0])
                    kinds["\(header.kind)-\(frames[1].first ?? 0)", default: 0] += 1
                    if header.kind == .error && header.requestID == 9 {
                        let error = try ClientProtocol.decodeError(frames[1])
                        #expect(error.code == ClientProtocol.ErrorCode.lagged.rawValue)
                        ended = error.message
                    }
                }
                return ended != nil
            }
            #expect(ended?.contains("fell behind") == true)
            #expect(node.status.watchers == 0)
        } catch {
            Issue.record(error)
        }
        await node.stop()
    }

    /// A client that does not read: the node keeps nothing for it but a cursor, marks it lagging,
    /// and once it reads again resyncs it (its history is short) to the exact current state.
    @Test func aClientThatDoesNotReadLagsThenResyncs() async throws {
        var configs = meshConfigurations(1, label: "lag", api: true)
        configs[0].historyDeltas = 50
        configs[0].clientHighWaterMark = 10
        let node = try await StateSyncNode.start(configuration: configs[0])
        do {
            let (context, dealer) = try await Self.floodAStalledWatcher(node, watchID: 1, onLag: .resync)
            defer { withExtendedLifetime(context) {} }
            try await waitUntil("the watch is lagging") { node.status.laggingWatches == 1 }
            // Now read everything: a resync brings the client to the exact current state.
            var kinds: [UInt8] = []
            var state: [String: Value] = [:]
            var reason: ClientProtocol.SnapshotReason?
            try await waitUntil("the client caught up after a resync", timeout: .seconds(30)) {
                while let frames = try dealer.receive(dontWait: true) {
                    guard try ClientProtocol.decodeReplyHeader(frames[0]).kind == .event else { continue }
                    let event = try ClientProtocol.decodeWatchEvent(frames[1])
                    switch event {
                    case .delta(let delta, _): state[delta.model] = delta.properties[0].value
                    case .records(let models):
                        for (model, properties) in models { state[model] = properties.first { $0.0 == "n" }?.1.value }
                    case .snapshotBegin(let r): if r != .initial { reason = r }
                    default: break
                    }
                    kinds.append(frames[1][0])
                }
                return reason == .lagged && state.count == 7 && node.status.laggingWatches == 0
                    && (0..<7).allSatisfy {
                        state["m\($0)"] == node.properties(of: ModelAddress(channel: "c", model: "m\($0)"))["n"]?.value
                    }
            }
        } catch {
            Issue.record(error)
        }
        await node.stop()
    }
}

/// State a node holds only through a snapshot (its own after a restart, or a peer's it merged)
/// has no deltas to replay: watches must be resynced, never silently skip it.
@Suite("Watches and snapshots")
struct WatchSnapshotTests {
    @Test func aLiveWatchSeesStateMergedFromAPeersSnapshot() async throws {
        let configs = meshConfigurations(2, label: "merge", api: true)
        // node1 writes, then restarts: its state now comes from its snapshot file, without deltas.
        var first = try await StateSyncNode.start(configuration: configs[0])
        let writer = try await first.model(Counter.self, channel: "c", id: "m")
        writer.count = 6
        writer.count = 7
        try await waitUntil("node1 published") { first.status.publishedSequence == 2 }
        await first.stop()
        // node2 is up and watched before node1 comes back.
        let node2 = try await StateSyncNode.start(configuration: configs[1])
        let client = try StateSyncClient(endpoint: try #require(node2.apiEndpoint))
        do {
            let (events, replica) = try await client.watch(channel: "c")
            let collector = WatchTests.Collector()
            let task = collector.collect(events)
            try await waitUntil("the empty initial state") {
                collector.lock.withLock {
                    collector.events.contains { if case .initialStateComplete = $0 { true } else { false } }
                }
            }
            first = try await StateSyncNode.start(configuration: configs[0])
            try await waitUntil("node2's watch got node1's state by resync") {
                collector.changes.contains { $0.new == 7 }
            }
            task.cancel()
            let change = try #require(
                collector.lock.withLock { collector.events }.compactMap { event -> (PropertyChange, WatchEvent.Kind)? in
                    if case .change(let c, let kind, _) = event { (c, kind) } else { nil }
                }.first)
            #expect(change.1 == .resync && change.0.old == nil && change.0.new == 7)
            #expect(replica.properties(of: "m")["count"]?.value == 7)

            // A watch resuming from before node1's restart cannot be served from its journal:
            // it is told so and resynced, not skipped.
            let node1Client = try StateSyncClient(endpoint: try #require(first.apiEndpoint))
            defer { node1Client.close() }
            let (resumed, _) = try await node1Client.watch(
                channel: "c", replica: ChannelReplica(channel: "c", cursor: WatchCursor(["node1": 1])))
            var sawHistoryGone = false
            for try await event in resumed {
                if case .resyncStarted(.historyGone) = event { sawHistoryGone = true }
                if case .caughtUp = event { break }
            }
            #expect(sawHistoryGone)
        } catch {
            Issue.record(error)
        }
        client.close()
        await first.stop()
        await node2.stop()
    }
}
