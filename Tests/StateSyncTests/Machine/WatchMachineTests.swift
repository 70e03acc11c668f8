import Testing

@testable import StateSync

/// Watches on the node machine alone (PROTOCOL.md section 10.5): no socket, no thread, no
/// waiting — the test decides how much a client's queue takes.
@Suite("Watches on the node machine")
struct WatchMachineTests {
    static let address = ModelAddress(channel: "c", model: "m")

    static func set(_ node: inout MachineRunner, _ id: UInt64, _ properties: [String: Value], model: String = "m") {
        let writes = properties.keys.sorted().map { PropertyWrite(name: $0, value: properties[$0]!) }
        _ = node.request(.set, id: id, ClientProtocol.encodeSet(ModelAddress(channel: "c", model: model), writes))
    }

    /// What a client makes of the events: the same code as StateSyncClient.
    static func replay(_ events: [ClientProtocol.WatchEventBody]) throws -> (WatchSession, [WatchEvent]) {
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        var meanings: [WatchEvent] = []
        for event in events { meanings += try session.handle(event, from: "test") }
        return (session, meanings)
    }

    /// 10.5.4: the channel's state, then a marker whose count and digest the client verifies,
    /// then a caught-up marker.
    @Test func aWatchStartsWithTheStateAndAVerifiedMarker() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        Self.set(&node, 1, ["a": 1, "b": "two"])
        _ = node.request(
            .set, id: 2,
            ClientProtocol.encodeSet(ModelAddress(channel: "other", model: "x"), [PropertyWrite(name: "z", value: 0)]))
        let reply = node.request(.watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: nil))
        #expect(reply?.0.kind == .ok)
        let events = node.events(watch: 7)
        guard case .snapshotBegin(.initial) = events.first, case .caughtUp(_, _, let missing, _) = events.last else {
            Issue.record("unexpected events \(events)")
            return
        }
        #expect(missing == 0)
        let (session, meanings) = try Self.replay(events)
        #expect(meanings.contains { if case .initialStateComplete(2, _) = $0 { true } else { false } })
        #expect(session.replica.models == ["m"] && session.replica.properties(of: "m")["b"]?.value == "two")
    }

    /// 10.5.4: an empty channel still gets its begin and its "initial state complete" (0
    /// records), so a client can tell "empty" from "not yet sent".
    @Test func anEmptyChannelStillGetsItsInitialMarker() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        _ = node.request(.watch, id: 3, ClientProtocol.encodeWatch(channel: "nothing-here", from: nil))
        var session = WatchSession(replica: ChannelReplica(channel: "nothing-here"))
        var meanings: [WatchEvent] = []
        for event in node.events(watch: 3) { meanings += try session.handle(event, from: "n1") }
        #expect(meanings.contains { if case .initialStateComplete(0, _) = $0 { true } else { false } })
    }

    /// 10.5.3 and 10.5.6: a client whose queue takes 3 events at a time still gets every delta
    /// of the channel exactly once, in the node's apply order: the watch resumes exactly where
    /// the client's queue refused.
    @Test func aSlowClientGetsEveryDeltaOnceInOrder() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        _ = node.request(.watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: nil))
        node.clientCapacity = 3
        for value in 1...50 { Self.set(&node, UInt64(100 + value), ["n": .int(Int64(value))]) }
        for _ in 0..<40 { node.advance(5) }
        let deltas = node.events(watch: 7).compactMap { event -> Delta? in
            if case .delta(let delta, _) = event { delta } else { nil }
        }
        #expect(deltas.map(\.sequence) == Array(1...50))
        let (session, _) = try Self.replay(node.events(watch: 7))
        #expect(session.replica.properties(of: "m")["n"]?.value == 50)
        #expect(node.machine.watches.lagging == 0)
    }

    /// 10.5.1 flag bit 3: a watch that takes batched events gets runs of deltas as one message
    /// (one header, at most 32 bodies), and a message its client's queue refuses is sent again
    /// from exactly where it stopped: every delta once, in order. A watch without the flag still
    /// gets one event per message.
    @Test func batchedEventsComeManyToAMessageAndResumeExactlyWhereRefused() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        #expect(
            node.request(.watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: nil, batchedEvents: true))?.0
                .kind == .ok)
        _ = node.request(.watch, id: 8, ClientProtocol.encodeWatch(channel: "c", from: nil))
        // The clients take nothing while 100 writes are made, then one message per attempt.
        node.clientCapacity = 0
        let before = node.sent.count
        for value in 1...100 { Self.set(&node, UInt64(100 + value), ["n": .int(Int64(value))]) }
        node.clientCapacity = 1
        for _ in 0..<200 where node.machine.watches.lagging > 0 { node.advance(50) }
        #expect(node.machine.watches.lagging == 0)

        func deltas(_ watch: UInt64) -> [UInt64] {
            node.events(watch: watch, from: before).compactMap { event -> UInt64? in
                if case .delta(let delta, _) = event { delta.sequence } else { nil }
            }
        }
        #expect(deltas(7) == Array(1...100), "the batched watch: every delta once, in order")
        #expect(deltas(8) == Array(1...100))
        func bodies(_ watch: UInt64) -> [Int] {
            node.sent[before...].compactMap { _, frames in
                guard let header = try? ClientProtocol.decodeReplyHeader(frames[0]), header.kind == .event,
                    header.requestID == watch
                else { return nil }
                return frames.count - 1
            }
        }
        let batched = bodies(7)
        #expect(batched.max() ?? 0 > 1, "runs of events share a message: \(batched)")
        #expect(batched.max() ?? 0 <= NodeMachine.eventsPerMessage)
        #expect(Set(bodies(8)) == [1], "without the flag, one event per message")
        let (session, _) = try Self.replay(node.events(watch: 7))
        #expect(session.replica.properties(of: "m")["n"]?.value == 100)
    }

    /// 10.5.6: a client that takes nothing lags; past the history it is resynchronised with a
    /// snapshot (reason `lagged`) and ends with the exact current state.
    @Test func aClientFallingBehindTheHistoryIsResynced() throws {
        var configuration = MachineRunner.configuration("n1")
        configuration.historyDeltas = 20
        var node = MachineRunner(configuration)
        _ = node.request(.watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: nil))
        node.clientCapacity = 0
        for value in 1...100 { Self.set(&node, UInt64(100 + value), ["n": .int(Int64(value))], model: "m\(value % 3)") }
        node.advance(5)
        #expect(node.machine.status(now: node.now).laggingWatches == 1)
        node.clientCapacity = .max
        node.advance(5)
        let events = node.events(watch: 7)
        #expect(events.contains { if case .snapshotBegin(.lagged) = $0 { true } else { false } })
        let (session, _) = try Self.replay(events)
        for model in 0..<3 {
            #expect(
                session.replica.properties(of: "m\(model)")
                    == node.machine.store.properties(of: ModelAddress(channel: "c", model: "m\(model)")))
        }
        #expect(node.machine.status(now: node.now).laggingWatches == 0)
    }

    /// 10.5.6 and 10.10: with the "end" policy the lagging watch ends with ERROR 6 once the
    /// client's queue takes it, and the node forgets it.
    @Test func withTheEndPolicyALaggingWatchEndsWithErrorSix() throws {
        var configuration = MachineRunner.configuration("n1")
        configuration.historyDeltas = 20
        var node = MachineRunner(configuration)
        _ = node.request(.watch, id: 9, ClientProtocol.encodeWatch(channel: "c", from: nil, onLag: .end))
        node.clientCapacity = 0
        for value in 1...100 { Self.set(&node, UInt64(100 + value), ["n": .int(Int64(value))]) }
        node.advance(5)
        #expect(node.machine.watches.count == 1, "still waiting for the client's queue")
        node.clientCapacity = .max
        node.advance(5)
        let errors = node.sent.compactMap { _, frames -> UInt64? in
            guard let header = try? ClientProtocol.decodeReplyHeader(frames[0]), header.kind == .error,
                header.requestID == 9
            else { return nil }
            return try? ClientProtocol.decodeError(frames[1]).code
        }
        #expect(errors == [ClientProtocol.ErrorCode.lagged.rawValue])
        #expect(node.machine.watches.count == 0)
    }

    /// 10.5.2 and 10.5.4: a watch resumed on another node from a cursor gets every later delta
    /// exactly once — old → new exact against the replica — and nothing it already had.
    @Test func aWatchResumedOnAnotherNodeGetsEveryLaterDeltaOnce() throws {
        var writer = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        var other = MachineRunner(MachineRunner.configuration("n2", peers: ["n1"]))
        _ = writer.request(.watch, id: 1, ClientProtocol.encodeWatch(channel: "c", from: nil))
        for value in 1...10 { Self.set(&writer, UInt64(100 + value), ["n": .int(Int64(value))]) }
        let (first, _) = try Self.replay(writer.events(watch: 1))
        #expect(first.replica.properties(of: "m")["n"]?.value == 10)
        for value in 11...25 { Self.set(&writer, UInt64(100 + value), ["n": .int(Int64(value))]) }
        // n2 gets everything n1 published, in order.
        for frames in writer.published { other.handle(.peerMessage(peer: "inproc://n1", frames: frames)) }
        other.handle(.tick(observerBacklog: 0))
        let resume = other.request(.watch, id: 2, ClientProtocol.encodeWatch(channel: "c", from: first.replica.cursor))
        #expect(resume?.0.kind == .ok)
        var session = first
        var changes: [PropertyChange] = []
        for event in other.events(watch: 2) {
            for case .change(let change, _, _) in try session.handle(event, from: "n2") { changes.append(change) }
        }
        #expect(changes.map(\.new) == (11...25).map { .int(Int64($0)) })
        #expect(changes.map(\.old) == (10...24).map { Value.int(Int64($0)) })
        #expect(!other.events(watch: 2).contains { if case .snapshotBegin = $0 { true } else { false } })
    }

    /// 10.5.4: resuming from a cursor older than the node's history gets a snapshot flagged
    /// `history gone`, and exact old → new from the replica.
    @Test func resumingPastTheHistoryResyncs() throws {
        var configuration = MachineRunner.configuration("n1")
        configuration.historyDeltas = 4
        var node = MachineRunner(configuration)
        Self.set(&node, 1, ["n": 1])
        _ = node.request(.watch, id: 1, ClientProtocol.encodeWatch(channel: "c", from: nil))
        let (before, _) = try Self.replay(node.events(watch: 1))
        for value in 2...30 { Self.set(&node, UInt64(100 + value), ["n": .int(Int64(value))]) }
        let from = node.sent.count
        _ = node.request(.watch, id: 2, ClientProtocol.encodeWatch(channel: "c", from: before.replica.cursor))
        var session = before
        var meanings: [WatchEvent] = []
        for event in node.events(watch: 2, from: from) { meanings += try session.handle(event, from: "n1") }
        #expect(meanings.contains { if case .resyncStarted(.historyGone) = $0 { true } else { false } })
        let changes = meanings.compactMap { meaning -> PropertyChange? in
            if case .change(let change, .resync, _) = meaning { change } else { nil }
        }
        #expect(changes.count == 1 && changes.first?.old == 1 && changes.first?.new == 30)
    }

    /// 10.5.1 and 10.5.4: a watch's client holds a delta its node then lost (a power loss): it
    /// names it when it resumes (held above its cursor, WATCH flag bit 5). Should the node come
    /// to cover that number without the delta — here a peer's snapshot covers it, the write
    /// given up at its origin — the watch gets a `reset` snapshot and the client ends with the
    /// node's state; a merged (`lagged`) one left it with the lost write (the simulator, 3 nodes ×
    /// 300 operations, seed 1794). A delta the node gets back instead comes as usual, no reset.
    @Test func aDeltaOnlyTheClientHoldsGetsAResetOnceTheNodeCoversItWithoutIt() throws {
        var node = MachineRunner(MachineRunner.configuration("n3", peers: ["n2"]))
        _ = node.request(.watch, id: 1, ClientProtocol.encodeWatch(channel: "c", from: nil, takesResets: true))
        for delta in [RepairMachineTests.delta("n2", 1), RepairMachineTests.delta("n2", 3, value: 33)] {
            node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(delta).encode()))
        }
        node.advance(10)
        let (session, _) = try Self.replay(node.events(watch: 1))
        #expect(session.replica.properties(of: "m")["n"]?.value == 33)
        #expect(session.replica.cursor["n2"] == 1 && session.replica.heldAbove == ["n2": [3]])
        let body = ClientProtocol.encodeWatch(
            channel: "c", from: session.replica.cursor, takesResets: true, heldAbove: session.replica.heldAbove)
        #expect(try ClientProtocol.decodeWatchRequest(body).heldAbove == ["n2": [3]])

        // The node lost delta 3 (its log holds 1); the client resumes on it.
        func restarted() -> MachineRunner {
            var node = MachineRunner(
                MachineRunner.configuration("n3", peers: ["n2"]),
                recovery: .init(deltas: [RepairMachineTests.delta("n2", 1)]))
            _ = node.request(.watch, id: 2, body)
            return node
        }
        // A peer's snapshot covers n2 through 3 without delta 3's write.
        var covered = restarted()
        covered.handle(.peerMessage(peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 3)))
        covered.advance(50)
        var answered = 0
        try Self.mergeSnapshot(
            &covered, answered: &answered, progress: ["n2": 3],
            registers: ["n": ReplicaStore.Register(value: 1, version: RepairMachineTests.delta("n2", 1).version)])
        #expect(covered.machine.counters.snapshotsApplied == 1)
        var after = session
        var meanings: [WatchEvent] = []
        for event in covered.events(watch: 2) { meanings += try after.handle(event, from: "n3") }
        #expect(meanings.contains { if case .resyncStarted(.reset) = $0 { true } else { false } })
        #expect(after.replica.properties(of: "m")["n"]?.value == 1, "the node's state, not the lost write")

        // The node gets delta 3 back (and 2): no reset, the client's chain goes on.
        var fetched = restarted()
        for sequence in [2, 3] as [UInt64] {
            let delta = RepairMachineTests.delta("n2", sequence, value: sequence == 3 ? 33 : 2)
            fetched.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(delta).encode()))
        }
        fetched.advance(10)
        #expect(!fetched.events(watch: 2).contains { if case .snapshotBegin = $0 { true } else { false } })
        var caughtUp = session
        for event in fetched.events(watch: 2) { _ = try caughtUp.handle(event, from: "n3") }
        #expect(caughtUp.replica.cursor["n2"] == 3 && caughtUp.replica.heldAbove.isEmpty, "covered by the cursor now")

        // A cursor far ahead (a client's, unchecked) is noted up to the limit, not walked.
        var far = MachineRunner(MachineRunner.configuration("n3", peers: ["n2"]))
        _ = far.request(
            .watch, id: 3, ClientProtocol.encodeWatch(channel: "c", from: WatchCursor(["n9": .max]), takesResets: true))
        let noted = far.machine.watches[WatchKey(client: [0x53, 1], requestID: 3)]?.clientOnly["n9"]?.count
        #expect(noted == NodeMachine.clientOnlyLimit)
    }

    /// Answers the snapshot `node` asks for (from `answered` on in its repair requests) with one
    /// page of `registers` of ``address`` claiming `progress`, until it is merged.
    static func mergeSnapshot(
        _ node: inout MachineRunner, answered: inout Int, progress: [String: UInt64],
        registers: [String: ReplicaStore.Register]
    ) throws {
        let applied = node.machine.counters.snapshotsApplied
        node.machine.repair.needsSnapshot = true
        for _ in 0..<20 where node.machine.counters.snapshotsApplied == applied {
            node.advance(100)
            while answered < node.repairRequests.count {
                let request = node.repairRequests[answered]
                answered += 1
                guard (try? SnapshotPage.decodeRequest(request.frames[1])) != nil else { continue }
                let page = SnapshotPage.encode(
                    latestSequence: progress.values.max() ?? 0, progress: progress, maximumOctets: 1 << 20,
                    models: [(Self.address, registers)])
                let id = try ClientProtocol.decodeRequestHeader(request.frames[0]).requestID
                node.handle(
                    .repairReply(peer: request.peer, frames: ClientProtocol.encodeReply(.ok, id: id, body: page.bytes)))
            }
        }
        #expect(node.machine.counters.snapshotsApplied == applied + 1, "the snapshot was merged")
        node.advance(10)
    }

    /// 10.5.4 and 10.9: a snapshot's page may hold registers newer than its progress (written
    /// after it was taken). Merged while a watch's client was away, such a write reaches no
    /// watch; the client resumes from its cursor, and the write's delta, once a later snapshot
    /// covers its number, never comes either. The resumed watch then gets a resync snapshot
    /// (the simulator, 3 nodes × 300 operations, seed 1154, with the snapshot asked for at the
    /// end of a round: n3's watcher ended without a change). A watch that began with a snapshot
    /// is not resent one; a delta that comes as a delta is told as usual.
    @Test func aResumedWatchIsResyncedWhenASnapshotCoversAWriteAnEarlierOneMerged() throws {
        let first = RepairMachineTests.delta("n2", 1)
        let second = RepairMachineTests.delta("n2", 2)
        func start() throws -> (MachineRunner, WatchSession, Int) {
            var node = MachineRunner(MachineRunner.configuration("n3", peers: ["n2"]))
            _ = node.request(.watch, id: 1, ClientProtocol.encodeWatch(channel: "c", from: nil))
            node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(first).encode()))
            node.advance(10)
            let (session, _) = try Self.replay(node.events(watch: 1))
            #expect(session.replica.cursor["n2"] == 1 && session.replica.properties(of: "m")["n"]?.value == 1)
            // The client goes away. A peer's snapshot claims n2 through 1, and holds delta 2's write.
            node.handle(.peerMessage(peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 2)))
            var answered = 0
            try Self.mergeSnapshot(
                &node, answered: &answered, progress: ["n2": 1],
                registers: ["n": ReplicaStore.Register(value: 2, version: second.version)])
            #expect(node.machine.store.properties(of: Self.address)["n"]?.value == 2)
            // It resumes from its cursor: the journal lacks nothing it lacks.
            _ = node.request(.watch, id: 2, ClientProtocol.encodeWatch(channel: "c", from: session.replica.cursor))
            #expect(!node.events(watch: 2).contains { if case .snapshotBegin = $0 { true } else { false } })
            return (node, session, answered)
        }
        func snapshots(_ node: MachineRunner, watch: UInt64) -> Int {
            node.events(watch: watch).filter { if case .snapshotBegin = $0 { true } else { false } }.count
        }

        // A later snapshot covers n2 through 2 and changes nothing: the resumed watch is resynced.
        var (covered, session, answered) = try start()
        let snapshotsOfTheFirst = snapshots(covered, watch: 1)
        try Self.mergeSnapshot(
            &covered, answered: &answered, progress: ["n2": 2],
            registers: ["n": ReplicaStore.Register(value: 2, version: second.version)])
        var resumed = session
        var meanings: [WatchEvent] = []
        for event in covered.events(watch: 2) { meanings += try resumed.handle(event, from: "n3") }
        #expect(meanings.contains { if case .resyncStarted(.lagged) = $0 { true } else { false } })
        #expect(resumed.replica.properties(of: "m")["n"]?.value == 2, "the write the first snapshot brought")
        #expect(snapshots(covered, watch: 1) == snapshotsOfTheFirst, "a watch that began with a snapshot holds it")

        // The delta comes as a delta instead: told as usual, no snapshot.
        var delivered = try start().0
        delivered.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(second).encode()))
        delivered.advance(10)
        var told = session
        for event in delivered.events(watch: 2) { _ = try told.handle(event, from: "n3") }
        #expect(snapshots(delivered, watch: 2) == 0)
        #expect(told.replica.properties(of: "m")["n"]?.value == 2 && told.replica.cursor["n2"] == 2)
        // A later snapshot covering what it was delivered sends it nothing more.
        var next = delivered.repairRequests.count
        try Self.mergeSnapshot(
            &delivered, answered: &next, progress: ["n2": 2],
            registers: ["n": ReplicaStore.Register(value: 2, version: second.version)])
        #expect(snapshots(delivered, watch: 2) == 0, "it was delivered every number the snapshot covers")
    }

    /// 7.5 and 10.5.4: a forgotten member's numbers this node gives up may have written what its
    /// state holds from a peer's snapshot page (here put in the store directly, as a page merged
    /// while the watch's client was away would): a watch resumed from a cursor that lacks them
    /// gets a resync snapshot, and its client ends with that write.
    @Test func aResumedWatchIsResyncedWhenAForgottenMembersNumbersAreGivenUp() throws {
        var node = PhantomSequenceTests.missingAForgottenMembersDeltas()
        _ = node.request(.watch, id: 1, ClientProtocol.encodeWatch(channel: "c", from: nil))
        let (session, _) = try Self.replay(node.events(watch: 1))
        let written = RepairMachineTests.delta("n3", 2).version
        _ = node.machine.store.merge(
            Self.address, property: "x", register: ReplicaStore.Register(value: 2, version: written))
        _ = node.request(
            .watch, id: 2,
            ClientProtocol.encodeWatch(channel: "c", from: session.replica.cursor, heldAbove: session.replica.heldAbove)
        )
        #expect(node.events(watch: 2).allSatisfy { if case .snapshotBegin = $0 { false } else { true } })
        try PhantomSequenceTests.giveUpTheForgottenGap(&node)
        #expect(node.machine.missingDeltas == 0, "given up")
        node.advance(10)
        var resumed = session
        var meanings: [WatchEvent] = []
        for event in node.events(watch: 2) { meanings += try resumed.handle(event, from: "n4") }
        #expect(meanings.contains { if case .resyncStarted(.lagged) = $0 { true } else { false } })
        #expect(resumed.replica.properties(of: "m")["x"]?.value == 2)
    }

    /// 10.5.1: a cursor naming more of this node's own writes than it numbered (another
    /// cluster's, an earlier life of its id) is refused with ERROR 3 — resumed, it would skip
    /// this node's writes up to that number. Its own last number, and another origin ahead (this
    /// node may be behind), are taken.
    @Test func aCursorAheadOfTheNodesOwnWritesIsRefused() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        for id in 1...3 as ClosedRange<UInt64> { Self.set(&node, id, ["x": .int(Int64(id))]) }
        let ahead = node.request(.watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: WatchCursor(["n1": 30])))
        let refused = try #require(ahead)
        #expect(refused.0.kind == .error)
        let error = try ClientProtocol.decodeError(refused.1)
        #expect(error.code == ClientProtocol.ErrorCode.invalidArgument.rawValue)
        #expect(error.message.contains("n1:30") && error.message.contains("numbered only 3"), "\(error.message)")
        #expect(node.events(watch: 7).isEmpty, "no watch was registered")
        for cursor in [WatchCursor(["n1": 3]), WatchCursor(["n1": 3, "n2": 500])] {
            #expect(node.request(.watch, id: 8, ClientProtocol.encodeWatch(channel: "c", from: cursor))?.0.kind == .ok)
        }
    }

    /// 10.5.8: a watch resumed with its cursor alone (`statesync watch --from`) past the node's
    /// history gets a resync; a model deleted meanwhile is in it as a deletion (one change, the
    /// empty property name, no old value), not left out: the client holds it from before the
    /// cursor. (An operator trial saw `--state` print it and `--from` keep the model for good.)
    @Test func aResyncTellsACursorOnlyWatchOfADeletedModel() throws {
        var configuration = MachineRunner.configuration("n1")
        configuration.historyDeltas = 5
        var node = MachineRunner(configuration)
        Self.set(&node, 1, ["x": 1], model: "kept")
        Self.set(&node, 2, ["x": 1], model: "gone")
        _ = node.request(.watch, id: 3, ClientProtocol.encodeWatch(channel: "c", from: nil))
        let (first, _) = try Self.replay(node.events(watch: 3))
        let cursor = first.replica.cursor
        for id in 4...20 as ClosedRange<UInt64> { Self.set(&node, id, ["x": .int(Int64(id))], model: "kept") }
        _ = node.request(
            .delete, id: 21, ClientProtocol.encodeDelete(ModelAddress(channel: "c", model: "gone"), properties: []))
        let from = node.sent.count
        _ = node.request(.watch, id: 22, ClientProtocol.encodeWatch(channel: "c", from: cursor))
        var resumed = WatchSession(replica: ChannelReplica(channel: "c", cursor: cursor))
        var meanings: [WatchEvent] = []
        for event in node.events(watch: 22, from: from) { meanings += try resumed.handle(event, from: "n1") }
        #expect(meanings.contains { if case .resyncStarted(.historyGone) = $0 { true } else { false } })
        let deletions = meanings.compactMap { meaning -> PropertyChange? in
            guard case .change(let change, .resync, _) = meaning, change.kind == .deleted else { return nil }
            return change
        }
        #expect(
            deletions.map(\.model) == ["gone"] && deletions.first?.property == "" && deletions.first?.old == nil,
            "\(meanings)")
    }
}
