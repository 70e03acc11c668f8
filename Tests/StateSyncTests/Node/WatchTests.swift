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
            // Every node holds 40 before node1 writes 41: else node2 could get node1's 41 before
            // node3's 40 (a gap being repaired) and rightly drop 40 as older, and the chain this
            // test expects would not be the one node2 applied.
            try await waitUntil("every node holds 40") {
                nodes.allSatisfy { $0.properties(of: address)["n"]?.value == 40 }
            }
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

    /// A watch read in batches gets exactly the events of a watch read one by one, in the same
    /// order, in fewer elements than events (the point of it), and never an empty one.
    @Test func aWatchReadInBatchesGetsTheSameEventsInOrder() async throws {
        let configs = meshConfigurations(1, label: "batches", api: true)
        let node = try await StateSyncNode.start(configuration: configs[0])
        do {
            let endpoint = try #require(node.apiEndpoint)
            let writer = try StateSyncClient(endpoint: endpoint)
            defer { writer.close() }
            // A state to start from: its snapshot arrives as one burst of events.
            for model in 0..<50 {
                try await writer.set(
                    ModelAddress(channel: "c", model: "m\(model)"),
                    Dictionary(uniqueKeysWithValues: (0..<20).map { ("p\($0)", Value.int(Int64($0))) }))
            }
            let eachClient = try StateSyncClient(endpoint: endpoint)
            defer { eachClient.close() }
            let batchedClient = try StateSyncClient(endpoint: endpoint)
            defer { batchedClient.close() }
            let (events, _) = try await eachClient.watch(channel: "c")
            let (batches, replica) = try await batchedClient.watchInBatches(channel: "c")
            let each = Collector()
            let eachTask = each.collect(events)
            let batched = Mutex<(batches: [[WatchEvent]], failure: String?)>(([], nil))
            let batchedTask = Task {
                do {
                    for try await batch in batches { batched.withLock { $0.batches.append(batch) } }
                } catch {
                    batched.withLock { $0.failure = "\(error)" }
                }
            }
            // Both initial states complete before the live changes: a WATCH is answered before
            // its snapshot is built, and a write made in between would be in one watch's state
            // and a live change of the other (a difference of timing, not of the two ways).
            func complete(_ events: [WatchEvent]) -> Bool {
                events.contains { if case .initialStateComplete = $0 { true } else { false } }
            }
            try await waitUntil("both initial states") {
                complete(each.lock.withLock { each.events })
                    && complete(batched.withLock { Array($0.batches.joined()) })
            }
            // Live changes after the state, some of them concurrent.
            let address = ModelAddress(channel: "c", model: "m0")
            await withTaskGroup(of: Void.self) { group in
                for lane in 0..<4 {
                    group.addTask {
                        for i in 0..<50 { _ = try? await writer.set(address, ["lane\(lane)": .int(Int64(i))]) }
                    }
                }
            }
            let expected = 1_000 + 200
            try await waitUntil("both watches saw the state and every change") {
                each.changes.count == expected
                    && batched.withLock { $0.batches.joined().filter { if case .change = $0 { true } else { false } } }
                        .count == expected
            }
            eachTask.cancel()
            batchedTask.cancel()
            let (got, failure) = batched.withLock { ($0.batches, $0.failure) }
            #expect(failure == nil)
            #expect(!got.contains { $0.isEmpty }, "an empty batch")
            let flat = got.joined().map(Self.describe)
            let one = each.lock.withLock { each.events }.map(Self.describe)
            // The markers a watch is sent once per interval may differ in number: compare the rest.
            #expect(flat.filter { !$0.hasPrefix("caught-up") } == one.filter { !$0.hasPrefix("caught-up") })
            #expect(got.count < got.joined().count, "\(got.count) batches for \(got.joined().count) events")
            #expect(replica.properties(of: "m0")["lane3"]?.value == 49)
        } catch {
            Issue.record(error)
        }
        await node.stop()
    }

    /// A consumer that stops taking its events does not make the client hold them all, and holds
    /// nothing else back: once it left its bound untaken, the client ends the watch at the node
    /// and applies no more of it, requests on the same client are still answered, and once the
    /// consumer takes its events the client watches again from its replica: every change
    /// arrives, in order, with its exact old value. (Before, the client read on and held every
    /// event: 120 MB for 300,000 changes of a stalled `statesync watch`, its node seeing a
    /// watcher that kept up.) Both ways of reading a watch: one event at a time, and in batches
    /// (`statesync watch`).
    @Test(arguments: [false, true])
    func aConsumerThatFallsBehindLagsAtTheClientAndMissesNothing(batched: Bool) async throws {
        let setup = try await LagSetup(label: "backlog")
        let (node, writer, watcher, address) = (setup.node, setup.writer, setup.watcher, setup.address)
        do {
            var events: AsyncThrowingStream<WatchEvent, any Error>?
            var batches: AsyncThrowingStream<[WatchEvent], any Error>?
            let replica: ChannelReplica
            if batched {
                (batches, replica) = try await watcher.watchInBatches(channel: "c")
            } else {
                (events, replica) = try await watcher.watch(channel: "c")
            }
            // Nobody takes the events while 2,000 writes are made, 8 at a time.
            let written = 2_000
            try await withThrowingTaskGroup(of: Void.self) { group in
                for lane in 0..<8 {
                    group.addTask {
                        for i in stride(from: lane + 1, through: written, by: 8) {
                            try await writer.set(address, ["n": .int(Int64(i))])
                        }
                    }
                }
                try await group.waitForAll()
            }
            try await waitUntil("the client ended its watch at the node") { node.status.watchers == 0 }
            // The client applied (its replica moves as it reads) the bound's 64 events and at
            // most a round's 288 more, with the initial state.
            let read = replica.cursor.positions["node1"] ?? 0
            #expect(read <= 1 + 64 + 288, "the client read \(read) of \(written + 1) changes")
            // A request on the same client is answered meanwhile.
            let current = try await watcher.get(address)["n"]?.value
            // Taken again: every change, in order, each with the value before it.
            let seen = Mutex<(values: [Int64], exact: Bool)>(([], true))
            func take(_ event: WatchEvent) {
                guard case .change(let change, let kind, _) = event, kind == .live, case .int(let new) = change.new
                else { return }
                seen.withLock {
                    if change.old != .int($0.values.last ?? 0) { $0.exact = false }
                    $0.values.append(new)
                }
            }
            let reading = Task {
                if let batches {
                    for try await batch in batches { batch.forEach(take) }
                } else if let events {
                    for try await event in events { take(event) }
                }
            }
            try await waitUntil("every change taken") { seen.withLock { $0.values.count } >= written }
            reading.cancel()
            let (values, exact) = seen.withLock { ($0.values, $0.exact) }
            #expect(
                values.count == written && exact, "\(values.count) of \(written) changes, old values exact: \(exact)")
            #expect(Set(values).count == written, "every write once")
            #expect(current != nil && values.last.map { .int($0) } == current, "the last change is the value read")
        } catch {
            Issue.record(error)
        }
        await setup.close()
    }

    /// With `onLag: .end`, a watch the client lagged that is watched again past the node's
    /// history ends with an error, as the node ends one that falls behind while it holds it,
    /// instead of resyncing; what came before it was given exactly.
    @Test func aLaggedWatchWithTheEndPolicyEndsWhenTheHistoryIsGone() async throws {
        // A history the node-side watch keeps up with, which the writes made after the client
        // lagged the watch outrun.
        let setup = try await LagSetup(label: "backlog-end", historyDeltas: 1_000)
        let (node, writer, watcher, address) = (setup.node, setup.writer, setup.watcher, setup.address)
        do {
            let (events, _) = try await watcher.watch(channel: "c", onLag: .end)
            for i in 1...3_000 { try await writer.set(address, ["n": .int(Int64(i))]) }
            try await waitUntil("the client ended its watch at the node") { node.status.watchers == 0 }
            let seen = Mutex<(values: [Int64], exact: Bool, resynced: Bool, ended: String?)>(([], true, false, nil))
            let reading = Task {
                do {
                    for try await event in events {
                        guard case .change(let change, let kind, _) = event, kind != .initial,
                            case .int(let new) = change.new
                        else { continue }
                        seen.withLock {
                            if kind == .resync { $0.resynced = true }
                            if change.old != .int($0.values.last ?? 0) { $0.exact = false }
                            $0.values.append(new)
                        }
                    }
                } catch {
                    seen.withLock { $0.ended = "\(error)" }
                }
            }
            try await waitUntil("the watch ended") { seen.withLock { $0.ended != nil } }
            reading.cancel()
            let (values, exact, resynced, ended) = seen.withLock { ($0.values, $0.exact, $0.resynced, $0.ended) }
            #expect(!resynced, "a watch whose policy is to end was resynced")
            #expect(ended?.contains("while its consumer caught up") == true, "\(ended ?? "")")
            #expect(
                !values.isEmpty && exact && values == values.indices.map { Int64($0 + 1) },
                "the changes before the end, in order: \(values.count)")
            try await waitUntil("the node holds no watch for it") { node.status.watchers == 0 }
        } catch {
            Issue.record(error)
        }
        await setup.close()
    }

    /// A node with a client API (`fsync: interval`: these tests write thousands of changes), a
    /// writer, a watcher whose watches lag once 64 events are left untaken, and `n = 0` in model
    /// m of channel c.
    struct LagSetup {
        let node: StateSyncNode
        let writer: StateSyncClient
        let watcher: StateSyncClient
        let address = ModelAddress(channel: "c", model: "m")

        init(label: String, historyDeltas: Int = 100_000) async throws {
            var configs = meshConfigurations(1, label: label, api: true)
            configs[0].fsync = .interval
            configs[0].historyDeltas = historyDeltas
            node = try await StateSyncNode.start(configuration: configs[0])
            let endpoint = try #require(node.apiEndpoint)
            writer = try StateSyncClient(endpoint: endpoint)
            watcher = try StateSyncClient(endpoint: endpoint, watchBacklog: 64)
            try await writer.set(address, ["n": 0])
        }

        func close() async {
            writer.close()
            watcher.close()
            await node.stop()
        }
    }

    /// An event as text, for comparing two watches' sequences.
    static func describe(_ event: WatchEvent) -> String {
        switch event {
        case .change(let change, let kind, let cursor):
            "\(kind) \(change.model).\(change.property) \(String(describing: change.old)) -> \(change.new) at \(change.version) \(cursor)"
        case .caughtUp: "caught-up"
        default: "\(event)"
        }
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
}
