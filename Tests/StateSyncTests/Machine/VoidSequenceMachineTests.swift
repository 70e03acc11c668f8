import Testing

@testable import StateSync

/// Void sequence numbers on the node machine alone (PROTOCOL.md sections 10.8 and 11.2): an own
/// number that settling after a power loss finds held by no peer, below one a peer holds, was
/// lost everywhere; its origin declares it void, and peers close the gap it left.
@Suite("Void sequence numbers on the node machine")
struct VoidSequenceMachineTests {
    typealias Settling = SettlingMachineTests

    /// n1 (`fsync: interval`, peers n2 and n3) restarted holding its own deltas `recovered`,
    /// with a reservation through 40 made in another boot (unless `inThisBoot`) and `void`.
    static func restarted(
        recovered: [UInt64] = [1, 2], inThisBoot: Bool = false, void: [ClosedRange<UInt64>] = [],
        faults: NodeFaults = NodeFaults()
    ) -> MachineRunner {
        var configuration = MachineRunner.configuration("n1", peers: ["n2", "n3"])
        configuration.fsync = .interval
        var recovery = NodeMachine.Recovery(deltas: recovered.map { RepairMachineTests.delta("n1", $0) })
        recovery.reservedSequence = 40
        recovery.reservedInThisBoot = inThisBoot
        recovery.voidSequences = void
        return MachineRunner(configuration, recovery: recovery, faults: faults)
    }

    /// n4, linked to n1, n2 and n3, got n1's 1, 2 and 4 on n1's live stream; repair asked n1 for
    /// 3 (the first repair request), and n1 answered with no delta and 3 void.
    static func peerWithVoid3() throws -> MachineRunner {
        var node = Self.peerMissing3()
        try Self.answer(&node, request: 0, void: [3...3])
        return node
    }

    /// Answers the repair request at `index` (as sent, from the peer it went to) with no delta
    /// and `void`.
    static func answer(_ node: inout MachineRunner, request index: Int, void: [ClosedRange<UInt64>]) throws {
        node.handle(
            .repairReply(
                peer: node.repairRequests[index].peer,
                frames: ClientProtocol.encodeReply(
                    .ok, id: try RepairMachineTests.requestID(node, at: index),
                    body: ClientProtocol.encodeFetched([], droppedThrough: 0, void: void))))
    }

    /// n4, linked to n1, n2 and n3, with n1's 1, 2 and 4 from n1's live stream, a repair round
    /// later.
    static func peerMissing3() -> MachineRunner {
        var node = RepairMachineTests.connectedNode()
        for sequence: UInt64 in [1, 2, 4] { Self.live(&node, sequence) }
        node.advance(60)
        return node
    }

    /// n1's delta `sequence` on n1's live stream.
    static func live(_ node: inout MachineRunner, _ sequence: UInt64) {
        node.handle(
            .peerMessage(
                peer: "inproc://n1", frames: PeerMessage.delta(RepairMachineTests.delta("n1", sequence)).encode()))
    }

    /// The cursors of the DELTA events of watch `id` sent since `from`.
    static func cursors(_ node: MachineRunner, watch id: UInt64, from: Int) -> [WatchCursor] {
        node.events(watch: id, from: from).compactMap { event -> WatchCursor? in
            if case .delta(_, let cursor) = event { return cursor }
            return nil
        }
    }

    /// n1 settles after a power loss (it recovered 1…2, reserved through 40): n2 holds 3, 4 and
    /// 6, n3 holds 3 and 4 and `n3Dropped` (its history's dropped-through mark).
    static func settled(n3Dropped: UInt64 = 0, faults: NodeFaults = NodeFaults()) -> MachineRunner {
        var node = Self.restarted(faults: faults)
        Settling.connect(&node, ["n2", "n3"])
        node.advance(60)
        for fetch in Settling.ownFetches(node) {
            let n2 = fetch.peer.hasSuffix("n2")
            Settling.answer(&node, fetch, holding: n2 ? [3, 4, 6] : [3, 4], droppedThrough: n2 ? 0 : n3Dropped)
        }
        return node
    }

    /// A FETCH of n1's deltas 1…10 served by `node`: (deltas' numbers, dropped-through, void).
    static func served(_ node: inout MachineRunner, origin: String = "n1") throws -> (
        [UInt64], UInt64, [ClosedRange<UInt64>]
    ) {
        let reply = node.request(.fetch, id: 99, ClientProtocol.encodeFetch(origin: origin, range: 1...10))
        let (header, body) = try #require(reply)
        #expect(header.kind == .ok)
        let (deltas, dropped, void) = try ClientProtocol.decodeFetched(body)
        return (deltas.map(\.sequence), dropped, void)
    }

    /// 5 was published, missed by both peers on the live stream, then lost from n1's log: no one
    /// holds it, and 6 is held. n1 takes 5 as void (nothing missing of its own), numbers on
    /// after 6, keeps 5 with its reservation (so a restart still knows it) and says so in FETCH
    /// replies.
    @Test func aNumberHeldByNoPeerBelowOneAPeerHeldIsDeclaredVoid() throws {
        var node = Self.settled()
        #expect(Settling.ownFetches(node).count == 2, "it settled: both peers were asked")
        #expect(!Settling.status(&node).settling)
        #expect(node.machine.missingDeltas == 0)
        #expect(node.machine.counters.voidSequences == 1)
        #expect(node.machine.nextSequence == 7)
        #expect(node.reservationVoids.last == [5...5])
        let (deltas, _, void) = try Self.served(&node)
        #expect(deltas == [1, 2, 3, 4, 6])
        #expect(void == [5...5])
        // Only the origin's own numbers are ever declared void.
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(RepairMachineTests.delta("n2", 1)).encode()))
        #expect(try Self.served(&node, origin: "n2").2.isEmpty)
    }

    /// Numbers at or below a peer's dropped-through mark exist (inside its state): never void,
    /// even when no reply held them as deltas. Without void (the planted fault) 5 stays missing.
    @Test func numbersAPeerDroppedAreNeverVoidAndTheFaultLeavesTheGap() throws {
        var dropped = Self.settled(n3Dropped: 5)
        #expect(dropped.machine.counters.voidSequences == 0)
        #expect(try Self.served(&dropped).2.isEmpty)
        var faulty = Self.settled(faults: NodeFaults(skipVoid: true))
        #expect(!Settling.status(&faulty).settling)
        #expect(faulty.machine.counters.voidSequences == 0 && faulty.machine.missingDeltas == 1)
    }

    /// n4 got n1's 1, 2 and 4 live, then repair asks n1 for 3: n1 answers with no delta and 3
    /// void. The gap closes, and a watch's cursor goes past 3 (it would otherwise stop at 2 and
    /// pile up every later number above it).
    @Test func aPeerClosesTheGapWithTheOriginsVoidAndWatchesGoPastIt() throws {
        var node = RepairMachineTests.connectedNode()
        _ = node.request(.watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: nil))
        for sequence: UInt64 in [1, 2, 4] { Self.live(&node, sequence) }
        node.advance(60)
        let fetch = try #require(RepairMachineTests.requests(node).first)
        #expect(fetch.peer == "inproc://n1" && fetch.fetch?.range == 3...3)
        try Self.answer(&node, request: 0, void: [3...3])
        #expect(node.machine.missingDeltas == 0)
        #expect(node.machine.counters.voidSequences == 1)
        let before = node.sent.count
        Self.live(&node, 5)
        node.advance(1)
        let cursors = Self.cursors(node, watch: 7, from: before)
        #expect(cursors.last?["n1"] == 5, "the watch's cursor went past the void 3: \(cursors)")
    }

    /// Only the origin may declare its numbers void: the same reply from another peer leaves the
    /// gap open (that peer is exhausted for it instead).
    @Test func voidFromAnotherPeerIsIgnored() throws {
        var node = Self.peerMissing3()
        // The origin n1 answers that it holds nothing (and declares nothing): the next peer is
        // asked.
        try Self.answer(&node, request: 0, void: [])
        node.advance(60)
        let requests = RepairMachineTests.requests(node)
        let index = try #require(requests.lastIndex { $0.peer != "inproc://n1" && $0.fetch?.origin == "n1" })
        try Self.answer(&node, request: index, void: [3...3])
        #expect(node.machine.missingDeltas == 1)
        #expect(node.machine.counters.voidSequences == 0)
    }

    /// The void numbers travel with the reservation written when settling ends, and the held
    /// writes are numbered only once it is durable: a crash before then settles again.
    @Test func settlingEndsWhenTheReservationWithTheVoidNumbersIsDurable() throws {
        var node = Self.restarted()
        node.reportsReservations = false
        node.handle(.clientRequest(client: [9], frames: Settling.set))
        Settling.connect(&node, ["n2", "n3"])
        node.advance(60)
        for fetch in Settling.ownFetches(node) {
            Settling.answer(&node, fetch, holding: fetch.peer.hasSuffix("n2") ? [3, 4, 6] : [3, 4])
        }
        #expect(node.reservations.last == 40 && node.reservationVoids.last == [5...5])
        #expect(Settling.status(&node).settling && node.sent.isEmpty, "the SET waits for the reservation")
        node.handle(.sequencesReserved(through: 40))
        #expect(!Settling.status(&node).settling && node.sent.count == 1)
    }

    /// A settling cut short (a crash) may have logged own deltas taken back above ones still
    /// missing: the next settling starts at the first number the node lacks, not after the
    /// greatest it holds, and still finds the one lost everywhere.
    @Test func aSettlingCutShortStartsAgainAtTheFirstNumberLacking() throws {
        var node = Self.restarted(recovered: [1, 2, 3, 6])
        Settling.connect(&node, ["n2", "n3"])
        node.advance(60)
        // (Repair asks for the own gap 4…5 too; the settling requests run through the reservation.)
        let fetches = Settling.ownFetches(node).filter { $0.range.upperBound == 40 }
        #expect(fetches.count == 2 && fetches.allSatisfy { $0.range == 4...40 }, "\(fetches.map(\.range))")
        for fetch in fetches { Settling.answer(&node, fetch, holding: fetch.peer.hasSuffix("n2") ? [4, 6] : []) }
        #expect(!Settling.status(&node).settling)
        #expect(node.reservationVoids.last == [5...5] && node.machine.missingDeltas == 0)
    }

    /// A restart reads the void numbers back: nothing of its own is missing, and FETCH replies
    /// still declare them.
    @Test func aRestartKeepsDeclaringTheVoidNumbers() throws {
        var node = Self.restarted(recovered: [1, 2, 3, 4, 6], inThisBoot: true, void: [5...5])
        #expect(!Settling.status(&node).settling && node.machine.missingDeltas == 0)
        #expect(node.machine.nextSequence == 7)
        #expect(try Self.served(&node).2 == [5...5])
    }

    /// A watch resumed from a cursor below a void number goes past it (the number is in no
    /// journal): its cursor reaches the next delta.
    @Test func aResumedWatchGoesPastAVoidNumber() throws {
        var node = try Self.peerWithVoid3()
        let before = node.sent.count
        _ = node.request(.watch, id: 8, ClientProtocol.encodeWatch(channel: "c", from: WatchCursor(["n1": 1])))
        Self.live(&node, 5)
        node.advance(1)
        let cursors = Self.cursors(node, watch: 8, from: before)
        #expect(cursors.last?["n1"] == 5, "resumed at 1: 2 and 4 replayed, 3 void, 5 live: \(cursors)")
    }

    /// A compaction keeps a peer's deltas held above a gap in the log (11.5 item 6): the snapshot
    /// says only "n1 through 2", so without them a restart would forget it holds n1's 4, and
    /// could not return it to n1 settling after a power loss. Restarted from the snapshot and the
    /// kept records, the node knows 4 again and serves it.
    @Test func aCompactionKeepsTheDeltasHeldAboveAGap() throws {
        var node = Self.peerMissing3()
        node.machine.compact()
        guard case .compact(let snapshot, let records, _)? = node.machine.actions.last else {
            Issue.record("no compaction asked for")
            return
        }
        let kept = try DeltaLog.parse(DeltaLog.magic + records, path: "kept").deltas
        #expect(kept == [RepairMachineTests.delta("n1", 4)])
        #expect(snapshot.progress["n1"] == 2)
        var restarted = MachineRunner(
            node.machine.configuration, recovery: NodeMachine.Recovery(snapshot: snapshot, deltas: kept))
        #expect(restarted.machine.origins["n1"]?.contiguous == 2)
        #expect(restarted.machine.origins["n1"]?.above == [4])
        #expect(restarted.machine.history["n1"]?[4] == RepairMachineTests.delta("n1", 4), "served to a FETCH")
        #expect(restarted.machine.status(now: restarted.now).missingDeltas == 1, "3 is still missing")
    }

    /// Kept records do not count towards the next compaction: with more of them than
    /// `storage.compact_bytes`, a node compacts once, not at every repair round while the gap
    /// lasts, nor again after a restart.
    @Test func keptRecordsDoNotMakeTheNodeCompactAgain() throws {
        var configuration = MachineRunner.configuration("n4", peers: ["n1"])
        configuration.compactBytes = 4096
        var node = MachineRunner(configuration)
        node.handle(.peerMessage(peer: "inproc://n1", frames: RepairMachineTests.heartbeat("n1", latest: 0)))
        for sequence: UInt64 in [1] + Array(3...200) { Self.live(&node, sequence) }
        node.advance(60)
        #expect(node.compactions == 1)
        #expect(node.machine.durability.keptBytes > 4096, "every delta above the gap at 2 kept")
        for _ in 0..<5 { node.advance(60) }
        #expect(node.compactions == 1, "not again while 2 is missing")
        // Nor after a restart from the snapshot and the kept records.
        guard case .compact(let snapshot, let records, _)? = node.lastCompaction else {
            Issue.record("no compaction seen")
            return
        }
        var recovery = NodeMachine.Recovery(
            snapshot: snapshot, deltas: try DeltaLog.parse(DeltaLog.magic + records, path: "kept").deltas)
        recovery.logSize = DeltaLog.magic.count + records.count
        var restarted = MachineRunner(configuration, recovery: recovery)
        for _ in 0..<5 { restarted.advance(60) }
        #expect(restarted.compactions == 0, "the kept records alone do not make it compact")
    }

    /// The kept records follow the runs held above the gaps, origin by origin and in sequence
    /// order, and stop once past the budget (a quarter of `storage.compact_bytes`, at least 64
    /// KiB), not at the end of a long run.
    @Test func keptRecordsFollowTheRunsInOrderUpToTheBudget() throws {
        var configuration = MachineRunner.configuration("n4", peers: ["n1", "n2"])
        configuration.compactBytes = 4096
        configuration.historyDeltas = 10_000
        var node = MachineRunner(configuration)
        for peer in ["n1", "n2"] {
            node.handle(.peerMessage(peer: "inproc://\(peer)", frames: RepairMachineTests.heartbeat(peer, latest: 0)))
        }
        for sequence: UInt64 in [1, 3, 4, 5, 8, 9] { Self.live(&node, sequence) }
        for sequence: UInt64 in 2...4_000 {
            node.handle(
                .peerMessage(
                    peer: "inproc://n2", frames: PeerMessage.delta(RepairMachineTests.delta("n2", sequence)).encode()))
        }
        #expect(node.machine.origins["n1"]?.above.runs == [3...5, 8...9])
        #expect(node.machine.origins["n2"]?.above.runs == [2...4_000])
        let records = node.machine.recordsAboveGaps
        let kept = try DeltaLog.parse(DeltaLog.magic + records, path: "kept").deltas
        #expect(kept.prefix(5).map { "\($0.origin):\($0.sequence)" } == ["n1:3", "n1:4", "n1:5", "n1:8", "n1:9"])
        let fromN2 = kept.dropFirst(5)
        #expect(fromN2.allSatisfy { $0.origin == "n2" })
        #expect(fromN2.map(\.sequence) == Array(2..<(2 + UInt64(fromN2.count))), "n2's run from its lowest number")
        #expect(fromN2.count > 100 && fromN2.count < 3_999, "stopped at the budget: \(fromN2.count) of n2's 3,999")
        let last = DeltaLog.encodePayload(try #require(kept.last)).count + 8
        #expect(records.count >= 64 << 10 && records.count - last < 64 << 10, "\(records.count) octets")
    }
}
