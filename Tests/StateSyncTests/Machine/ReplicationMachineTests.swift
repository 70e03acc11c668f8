import Testing

@testable import StateSync

/// Replication on the node machine alone (PROTOCOL.md sections 7 and 8).
@Suite("Replication on the node machine")
struct ReplicationMachineTests {
    static func delta(_ origin: String, _ sequence: UInt64, _ value: Int64, at milliseconds: UInt64) -> Delta {
        Delta(
            channel: "c", model: "m", version: Version(milliseconds: milliseconds, counter: 0, node: origin),
            sequence: sequence, properties: [PropertyWrite(name: "x", value: .int(value))])
    }

    /// 7.3: a heartbeat at the first tick and every interval, carrying the repair endpoint and
    /// what the node holds of each origin.
    @Test func heartbeatsCarryTheRepairEndpointAndProgress() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        node.handle(.endpointsBound(publish: "inproc://n1", repair: "tcp://10.0.0.1:7101"))
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(Self.delta("n2", 1, 1, at: 5)).encode()))
        node.handle(.tick(observerBacklog: 0))
        node.advance(50)
        node.advance(50)
        let beats = node.published.compactMap { frames -> PeerMessage.Heartbeat? in
            guard case .heartbeat(let beat)? = try? PeerMessage.decode(frames) else { return nil }
            return beat
        }
        #expect(beats.count == 2, "one at the first tick, one 100 ms later")
        #expect(beats.last?.api == "tcp://10.0.0.1:7101" && beats.last?.progress == ["n2": 1])
    }

    /// 7.3: a heartbeat never announces this node's own deltas before they are published (they
    /// wait for their fsync): peers would see a gap that is not there, and one far behind could
    /// give up fetching it and take a snapshot (the bench found it).
    @Test func aHeartbeatAnnouncesOnlyPublishedOwnDeltas() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        let write = LocalWrite(
            address: ModelAddress(channel: "c", model: "m"), version: node.machine.clock.next(),
            writes: [PropertyWrite(name: "x", value: 1)])
        func heartbeats(_ actions: [NodeAction]) -> [PeerMessage.Heartbeat] {
            actions.compactMap { action in
                guard case .publish(let frames) = action, case .heartbeat(let beat)? = try? PeerMessage.decode(frames)
                else { return nil }
                return beat
            }
        }
        // The write is taken and logged; the turn's tick publishes a heartbeat (before the
        // delta, which waits for its sync) and asks for the sync.
        var actions = node.machine.handle(.localWrites([write]), now: node.now)
        actions += node.machine.handle(.tick(observerBacklog: 0), now: node.now)
        let before = heartbeats(actions)
        #expect(before.count == 1)
        #expect(before.first?.latestSequence == 0 && before.first?.progress["n1"] == nil)
        // Once durable and published, the next heartbeat announces it.
        let sync = actions.compactMap { action -> UInt64? in
            if case .syncLog(let position, _) = action { position } else { nil }
        }
        let position = try #require(sync.first)
        _ = node.machine.handle(.logDurable(through: position), now: node.now)
        let after = heartbeats(node.machine.handle(.tick(observerBacklog: 0), now: node.now + 10_000))
        #expect(after.first?.latestSequence == 1 && after.first?.progress["n1"] == 1)
    }

    /// A local write reaches the live model at its address unless that instance made it: an
    /// older instance's late write reaches the newer one, a client SET (no instance) reaches
    /// it, and the writer's own write is not handed back to it.
    @Test func aLocalWriteIsDeliveredToEveryInstanceButTheOneThatMadeIt() {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        let address = ModelAddress(channel: "c", model: "m")
        node.machine.attachedModels[address] = 7
        func delivered(_ actions: [NodeAction]) -> [ModelDelivery] {
            actions.flatMap { action -> [ModelDelivery] in
                if case .deliver(let deliveries) = action { deliveries } else { [] }
            }
        }
        func write(_ value: Int64, emitter: UInt64) -> LocalWrite {
            LocalWrite(
                address: address, version: node.machine.clock.next(),
                writes: [PropertyWrite(name: "x", value: .int(value))],
                emitter: emitter)
        }
        #expect(delivered(node.machine.handle(.localWrites([write(1, emitter: 7)]), now: node.now)).isEmpty)
        let older = delivered(node.machine.handle(.localWrites([write(2, emitter: 5)]), now: node.now))
        #expect(older.map(\.address) == [address])
        #expect(older.first?.sets.first?.writes.first?.value == .int(2))
        let set = ClientProtocol.encodeRequest(
            .set, id: 1, body: ClientProtocol.encodeSet(address, [PropertyWrite(name: "x", value: 3)]))
        let fromClient = delivered(node.machine.handle(.clientRequest(client: [1], frames: set), now: node.now))
        #expect(fromClient.first?.sets.first?.writes.first?.value == .int(3))
    }

    /// A round of local writes: single sets put their one property in the round's array, a
    /// transaction keeps its own; each write is numbered in order and its delta carries exactly
    /// its properties (issue #17: no array per single set).
    @Test func aRoundOfSingleSetsAndATransactionGivesEachDeltaExactlyItsProperties() {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        let a = ModelAddress(channel: "c", model: "a")
        let b = ModelAddress(channel: "c", model: "b")
        var round = LocalWriteRound(capacity: 3)
        round.append(
            address: a, version: node.machine.clock.next(), property: PropertyWrite(name: "x", value: 1), emitter: 0)
        round.append(
            LocalWrite(
                address: b, version: node.machine.clock.next(),
                writes: [PropertyWrite(name: "x", value: 2), PropertyWrite(name: "y", value: 3)], emitter: 9))
        round.append(
            address: a, version: node.machine.clock.next(), property: PropertyWrite(name: "y", value: 4), emitter: 0)
        #expect(round.properties.count == 2, "the single sets' properties are in the round's array")
        let expected: [[PropertyWrite]] = [
            [PropertyWrite(name: "x", value: 1)],
            [PropertyWrite(name: "x", value: 2), PropertyWrite(name: "y", value: 3)],
            [PropertyWrite(name: "y", value: 4)],
        ]
        #expect(round.localWrites.map(\.writes) == expected)
        #expect(round.localWrites.map(\.emitter) == [0, 9, 0])
        let applied = node.machine.applyLocal(round).deltas
        let first = applied.first?.sequence ?? 0
        #expect(applied.map(\.sequence) == [first, first + 1, first + 2])
        #expect(applied.map(\.model) == ["a", "b", "a"])
        #expect(applied.map(\.properties) == expected)
        #expect(applied.map(\.version) == round.localWrites.map(\.version))
    }

    /// A batch's deltas reach the live models in runs of one model: one delivery per run, in
    /// order, each write once; a model that comes back after a run of one not attached here is
    /// still one delivery, and one that comes back after another attached model is a new one.
    @Test func aBatchIsDeliveredInRunsOfOneModel() {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        node.machine.attachedModels[ModelAddress(channel: "c", model: "a")] = 7
        node.machine.attachedModels[ModelAddress(channel: "c", model: "c")] = 8
        let models = ["a", "a", "b", "a", "c", "a"]
        let deltas = models.enumerated().map { index, model in
            PackedBatchMachineTests.delta(model, sequence: UInt64(index + 1))
        }
        node.machine.peers["inproc://n2", default: PeerProgress()].listsThisNode = true
        node.machine.actions = []
        node.machine.applyRemote(deltas, from: "inproc://n2")
        let deliveries = node.machine.actions.flatMap { action -> [ModelDelivery] in
            if case .deliver(let deliveries) = action { deliveries } else { [] }
        }
        #expect(deliveries.map(\.address.model) == ["a", "c", "a"])
        #expect(
            deliveries.map { $0.sets.map { $0.writes.first?.value } } == [
                [.int(1), .int(2), .int(4)], [.int(5)], [.int(6)],
            ])
    }

    /// A received batch delivers, of each delta, exactly the writes that won: all of them (the
    /// node keeps no copy of them then), some, or none (nothing delivered, each counted stale);
    /// through the merge of a run of one shape and through the merge one delta at a time.
    @Test func aBatchDeliversExactlyTheWritesThatWon() {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2", "n3"]))
        let address = ModelAddress(channel: "c", model: "m")
        node.machine.attachedModels[address] = 7
        func delta(_ origin: String, _ sequence: UInt64, at milliseconds: UInt64, _ writes: [(String, Int64)])
            -> Delta
        {
            Delta(
                channel: "c", model: "m", version: Version(milliseconds: milliseconds, counter: 0, node: origin),
                sequence: sequence, properties: writes.map { PropertyWrite(name: $0.0, value: .int($0.1)) })
        }
        for peer in ["inproc://n2", "inproc://n3"] {
            node.machine.peers[peer, default: PeerProgress()].listsThisNode = true
        }
        // Held: x written at 500, y at 700.
        node.machine.applyRemote([delta("n3", 1, at: 500, [("x", 100)])], from: "inproc://n3")
        node.machine.applyRemote([delta("n3", 2, at: 700, [("y", 100)])], from: "inproc://n3")
        node.machine.actions = []
        let (staleBefore, appliedBefore) = (node.machine.counters.propertiesStale, node.machine.counters.deltasApplied)
        let runsBefore = node.machine.store.repeatedRunsMerged
        // One shape (x, y), held already: the run's merge. Older than both; newer than x only;
        // newer than both.
        let run = node.machine.applyRemote(
            [
                delta("n2", 1, at: 400, [("x", 1), ("y", 1)]), delta("n2", 2, at: 600, [("x", 2), ("y", 2)]),
                delta("n2", 3, at: 800, [("x", 3), ("y", 3)]),
            ], from: "inproc://n2")
        #expect(node.machine.store.repeatedRunsMerged == runsBefore + 1, "merged as a run of one shape")
        #expect(run.entries.map { $0.wonSubset == nil } == [false, false, true], "no copy of the writes when all won")
        #expect(run.entries.map(\.offset) == [0, 1, 2] && run.deltas.map(\.sequence) == [1, 2, 3])
        // z and q are not held yet: one delta at a time. Newer than all; older than that one;
        // a new property with one older than what is held.
        let oneByOne = node.machine.applyRemote(
            [
                delta("n2", 4, at: 900, [("z", 4), ("x", 4)]), delta("n2", 5, at: 850, [("z", 5), ("x", 5)]),
                delta("n2", 6, at: 880, [("q", 6), ("x", 6)]),
            ], from: "inproc://n2")
        #expect(node.machine.store.repeatedRunsMerged == runsBefore + 1, "merged one delta at a time")
        #expect(oneByOne.entries.map { $0.wonSubset == nil } == [true, false, false])
        let delivered = node.machine.actions.flatMap { action -> [[PropertyWrite]] in
            guard case .deliver(let deliveries) = action else { return [] }
            return deliveries.flatMap { $0.sets.map { Array($0.writes) } }
        }
        let write = { (name: String, value: Int64) in PropertyWrite(name: name, value: .int(value)) }
        #expect(
            oneByOne.indices.map { Array(oneByOne.won($0)) } == [[write("z", 4), write("x", 4)], [], [write("q", 6)]])
        #expect(
            delivered == [
                [write("x", 2)], [write("x", 3), write("y", 3)], [write("z", 4), write("x", 4)], [write("q", 6)],
            ])
        #expect(node.machine.counters.propertiesStale - staleBefore == 2 + 1 + 2 + 1)
        #expect(node.machine.counters.deltasApplied - appliedBefore == 4)
        let held = node.machine.store.properties(of: address)
        #expect(held["x"]?.value == 4 && held["y"]?.value == 3 && held["z"]?.value == 4 && held["q"]?.value == 6)
    }

    /// 8: a delta of this node's own origin coming back through a peer is ignored; a duplicate
    /// is counted and applied once; a stale write changes nothing.
    @Test func echoesDuplicatesAndStaleWritesChangeNothing() {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        let echo = Self.delta("n1", 1, 99, at: 9_999_999_999_999)
        node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(echo).encode()))
        #expect(node.machine.store.channelModelCounts.isEmpty)
        let newer = Self.delta("n2", 2, 2, at: 200)
        let older = Self.delta("n2", 1, 1, at: 100)
        for delta in [newer, newer, older] {
            node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(delta).encode()))
        }
        #expect(node.machine.counters.duplicateDeltas == 1)
        #expect(node.machine.counters.propertiesStale == 1)
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "m"))["x"]?.value == 2)
        #expect(node.machine.missingDeltas == 0)
    }

    /// Backpressure: past the observers' backlog limit the node stops reading peers' deltas;
    /// below half of it, it reads again, and counts the pause.
    @Test func observersFarBehindPauseIntake() {
        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        configuration.observerBacklogLimit = 100
        var node = MachineRunner(configuration)
        node.handle(.tick(observerBacklog: 101))
        #expect(node.intakePaused)
        node.now += 40
        node.handle(.tick(observerBacklog: 60))
        #expect(node.intakePaused, "not yet under half")
        node.now += 10
        node.handle(.tick(observerBacklog: 50))
        #expect(!node.intakePaused)
        #expect(node.machine.counters.observerBackpressurePauses == 1)
        #expect(node.machine.counters.observerBackpressureMilliseconds == 50)
    }

    /// 7.1 and 7.2: consecutive local writes of one model go out as one DELTA batch, numbered
    /// 1, 2, 3…; other models start a new batch.
    @Test func localWritesArePublishedInBatchesInSequenceOrder() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        let clock = node.machine.clock
        let writes = ["a", "a", "a", "b", "a"].map { model in
            LocalWrite(
                address: ModelAddress(channel: "c", model: model), version: clock.next(),
                writes: [PropertyWrite(name: "x", value: 1)])
        }
        node.handle(.localWrites(writes))
        node.handle(.tick(observerBacklog: 0))
        let batches = try node.published.compactMap { try PeerMessage.decodeDeltas($0) }
        #expect(batches.map { $0.map(\.sequence) } == [[1, 2, 3], [4], [5]])
    }

    /// 11.2 / Appendix B: a received delta is logged as the body frame it arrived in (channel,
    /// model, then those bytes), not re-encoded; in a batch, only the new, accepted deltas, each
    /// with its own body. Recovery reads them back as the deltas the peer sent.
    @Test func aReceivedDeltaIsLoggedAsTheBodyItCameIn() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        let held = Self.delta("n2", 2, 20, at: 6)
        node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(held).encode()))
        let logBefore = node.logBytes.count
        let first = Self.delta("n2", 1, 10, at: 5)
        let echo = Self.delta("n1", 1, 99, at: 7)  // this node's own write, echoed: refused
        let last = Self.delta("n2", 3, 30, at: 8)
        var frames = PeerMessage.encodeBatch([first, echo, held, last])
        // Bytes after the fields a version knows are ignored on the wire (section 7.1): a body
        // that carries some is not what re-encoding its delta would give.
        frames[1] += [0xEE, 0xEE]
        frames[4] += [0xEE]
        node.handle(.peerMessage(peer: "inproc://n2", frames: frames))

        func record(_ body: [UInt8]) -> [UInt8] {
            var payload = WireWriter()
            payload.string("c")
            payload.string("m")
            payload.bytes(body)
            var record = WireWriter()
            record.uint64(UInt64(payload.bytes.count) << 32 | UInt64(CRC32C.checksum(payload.bytes)))
            return record.bytes + payload.bytes
        }
        #expect(Array(node.logBytes[logBefore...]) == record(frames[1]) + record(frames[4]))
        let recovered = try DeltaLog.parse(DeltaLog.magic + node.logBytes, path: "test")
        #expect(recovered.deltas == [held, first, last] && recovered.cutBytes == 0)
    }
}
