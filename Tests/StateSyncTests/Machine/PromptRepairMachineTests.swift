import Testing

@testable import StateSync

/// How soon a node that starts, restarts or falls behind takes what it lacks, on the node machine
/// alone: each step that waits for the one before goes as soon as that one is answered, not at
/// the next repair round (50 ms) or the next tenth HEARTBEAT (ten intervals). A late joiner of 1 M
/// properties spent about half of `statesync bench`'s one-second join waiting so (issue #17).
@Suite("Repairs that follow an answer at once")
struct PromptRepairMachineTests {
    static func heartbeat(
        _ node: String, latest: UInt64 = 0, incarnation: UInt64 = 1, members: [Membership.Member]? = nil
    ) -> NodeInput {
        .peerMessage(
            peer: "inproc://\(node)",
            frames: PeerMessage.heartbeat(
                PeerMessage.Heartbeat(
                    node: node, latestSequence: latest, clock: 0, incarnation: incarnation, api: "inproc://\(node).api",
                    progress: [:], members: members)
            ).encode())
    }

    /// Whether each HEARTBEAT published since `from` carried the member list.
    static func listsPublished(_ node: MachineRunner, from: Int) -> [Bool] {
        node.published[from...].compactMap { frames in
            guard case .heartbeat(let beat)? = try? PeerMessage.decode(frames) else { return nil }
            return beat.members != nil
        }
    }

    static func reply(_ node: inout MachineRunner, at index: Int, from peer: String, _ body: [UInt8]) throws {
        let id = try RepairMachineTests.requestID(node, at: index)
        node.handle(.repairReply(peer: "inproc://\(peer)", frames: ClientProtocol.encodeReply(.ok, id: id, body: body)))
    }

    /// n1, knowing n2 (heard, its repair link connected) and known by it, with a gap of n2's
    /// deltas 1…`latest` and the FETCH of its first 2,000 sent.
    static func fetching(latest: UInt64) -> MachineRunner {
        var node = MembershipMachineTests.started("n1", peers: ["n2"])
        node.handle(Self.heartbeat("n2"))
        node.advance(100)  // the repair link
        node.handle(Self.heartbeat("n2", latest: latest))
        node.advance(100)
        return node
    }

    /// A peer that started or restarted (a new incarnation) may ANNOUNCE itself only once it has
    /// heard this node's member list (PROTOCOL.md 7.5): the list rides on this node's next
    /// HEARTBEAT and the two after it, as after a change of the list, instead of on the next
    /// tenth. The same incarnation heard again changes nothing. (A list of more than eight
    /// entries: a shorter one rides on every HEARTBEAT.)
    @Test func aPeerHeardInANewIncarnationGetsTheListOnTheNextHeartbeat() {
        var node = MembershipMachineTests.started("n1", peers: ["n2"])
        node.handle(Self.heartbeat("n2", members: (2...9).map { MembershipMachineTests.member("n\($0)", at: 100) }))
        #expect(node.machine.membership.members.count > NodeMachine.membersOnEveryHeartbeatUpTo)
        for _ in 0..<5 { node.advance(100) }
        #expect(Self.listsPublished(node, from: 0) == [true, true, true, false, false], "after the start's three")
        var from = node.published.count
        node.handle(Self.heartbeat("n2"))
        node.advance(100)
        #expect(Self.listsPublished(node, from: from) == [false], "the same start of n2")
        from = node.published.count
        node.handle(Self.heartbeat("n2", incarnation: 2))
        for _ in 0..<4 { node.advance(100) }
        #expect(Self.listsPublished(node, from: from) == [true, true, true, false], "n2 restarted")
    }

    /// A joiner's FETCH of a peer's own deltas waits until the peer knows it (PROTOCOL.md 7.5,
    /// "Known before taken"); the peer's answer to its ANNOUNCE says it does, and the FETCH goes
    /// on the next tick.
    @Test func anAnnounceTakenLetsTheWaitingFetchGoAtOnce() throws {
        var node = KnownBeforeTakenMachineTests.joiner()
        node.handle(Self.heartbeat("n1", latest: 3))
        node.advance(0)
        #expect(RepairMachineTests.requests(node).allSatisfy { $0.command != .fetch }, "n1 does not know n3 yet")
        let announce = try #require(KnownBeforeTakenMachineTests.announces(node, to: "inproc://n1").last)
        node.handle(
            .repairReply(peer: "inproc://n1", frames: ClientProtocol.encodeReply(.ok, id: announce, body: [1])))
        node.advance(0)
        let fetch = RepairMachineTests.requests(node).last { $0.command == .fetch }
        #expect(fetch?.peer == "inproc://n1" && fetch?.fetch?.origin == "n1" && fetch?.fetch?.range == 1...3)
    }

    /// The same when the peer's member list names the node (it knew it before this start).
    @Test func aListNamingTheNodeLetsTheWaitingFetchGoAtOnce() throws {
        var node = KnownBeforeTakenMachineTests.joiner()
        node.handle(Self.heartbeat("n1", latest: 3))
        node.advance(0)
        #expect(RepairMachineTests.requests(node).allSatisfy { $0.command != .fetch })
        let own = try #require(node.machine.ownEntry)
        node.handle(Self.heartbeat("n1", latest: 3, members: KnownBeforeTakenMachineTests.cluster + [own]))
        node.advance(0)
        #expect(RepairMachineTests.requests(node).last { $0.command == .fetch }?.fetch?.range == 1...3)
    }

    /// A peer that answers a FETCH with nothing (its history is gone) leaves a snapshot as the
    /// only way: the tick after the answer finds no other peer to ask, and the one after it asks
    /// for the snapshot, in the same instant (a driver ticks again at once: the deadline is now),
    /// and alone: a round that asks for a snapshot asks for nothing else.
    @Test func aFetchAnsweredWithNothingByTheLastPeerAsksForTheSnapshotAtOnce() throws {
        var node = Self.fetching(latest: 5)
        let sent = RepairMachineTests.requests(node)
        #expect(sent.count == 1 && sent[0].fetch?.range == 1...5)
        try Self.reply(&node, at: 0, from: "n2", ClientProtocol.encodeFetched([], droppedThrough: 5))
        node.advance(0)
        #expect(node.repairRequests.count == 1)
        #expect(node.machine.nextDeadline() == node.now, "a snapshot is needed: the next tick is now")
        node.advance(0)
        #expect(RepairMachineTests.requests(node, from: 1).map(\.command) == [.snapshot])
    }

    /// What a FETCH brings does not make the next one go at once: the rest of a gap longer than a
    /// FETCH (2,000 numbers) waits for the round, which bounds what repair adds to a node that
    /// fell behind; so does an answer that brings nothing new (a peer that keeps answering so is
    /// asked 20 times a second, not at network speed).
    @Test func aLongGapIsFetchedAPieceARound() throws {
        var node = Self.fetching(latest: 5000)
        #expect(RepairMachineTests.requests(node).map(\.fetch?.range) == [1...2000])
        let first = (1...2000 as ClosedRange<UInt64>).map { RepairMachineTests.delta("n2", $0) }
        try Self.reply(&node, at: 0, from: "n2", ClientProtocol.encodeFetched(first, droppedThrough: 0))
        node.advance(0)
        #expect(node.repairRequests.count == 1, "the rest at the round")
        node.advance(50)
        #expect(RepairMachineTests.requests(node, from: 1).map(\.fetch?.range) == [2001...4000])
        try Self.reply(
            &node, at: 1, from: "n2", ClientProtocol.encodeFetched(Array(first.suffix(1)), droppedThrough: 0))
        node.advance(0)
        #expect(node.repairRequests.count == 2, "nothing new came: no request before the round")
        node.advance(50)
        #expect(RepairMachineTests.requests(node, from: 2).map(\.fetch?.range) == [2001...4000])
    }

    /// A run at once after an answer gives nothing up: once every peer answered that it does not
    /// hold a forgotten member's missing numbers, they are given up at the next round, not in
    /// the same instant (simulator, 3 nodes × 300 operations, seed 10: every peer exhausted
    /// within a few round trips, a forgotten member that came back had its first writes given up
    /// before its entry saying it was alive again arrived).
    @Test func aForgottenMembersNumbersAreGivenUpAtARoundNotAtOnce() throws {
        var node = PhantomSequenceTests.missingAForgottenMembersDeltas()
        node.advance(60)
        var answered = 0
        for _ in 0..<3 {
            answered = try PhantomSequenceTests.answerEmpty(&node, from: answered, droppedThrough: 0)
            node.advance(0)
        }
        #expect(RepairMachineTests.requests(node).filter { $0.command == .fetch }.count == 2, "n1 and n2, at once")
        #expect(node.machine.missingDeltas == 2, "not given up in the instant of the last answer")
        node.advance(50)
        #expect(node.machine.missingDeltas == 0, "given up at the round")
    }

    /// A peer heard in a new incarnation restarted: its repair link is replaced, and the FETCH in
    /// flight on the old one goes again on the new one at once, the peer not marked exhausted
    /// (PROTOCOL.md 11.3, step 1). The old connection may be half-open (a host that lost power
    /// sent no FIN): a request on it would be lost, and a second later the peer marked
    /// exhausted, so its last writes, which only it holds, would come by snapshot.
    @Test func aRestartedPeerGetsANewRepairLinkAndTheFetchInFlightGoesAgainOnIt() throws {
        var node = Self.fetching(latest: 5)
        #expect(node.repairLinksConnected == ["inproc://n2"])
        #expect(RepairMachineTests.requests(node).map(\.fetch?.range) == [1...5])
        node.handle(Self.heartbeat("n2", latest: 7, incarnation: 2))
        node.advance(0)
        #expect(node.repairLinksConnected == ["inproc://n2", "inproc://n2"], "replaced")
        let sent = RepairMachineTests.requests(node)
        #expect(sent.count == 2 && sent[1].peer == "inproc://n2" && sent[1].fetch?.range == 1...7, "at once, on it")
        #expect(node.machine.repair.exhausted["n2"] == nil)
        #expect(node.machine.counters.repairLinkResets == 1)
        // A reply to the forgotten request changes nothing; the one in flight is answered.
        try Self.reply(&node, at: 0, from: "n2", ClientProtocol.encodeFetched([], droppedThrough: 0))
        node.advance(0)
        #expect(node.machine.repair.exhausted["n2"] == nil && node.repairRequests.count == 2)
        // The same run heard again replaces nothing.
        node.handle(Self.heartbeat("n2", latest: 7, incarnation: 2))
        node.advance(0)
        #expect(node.repairLinksConnected.count == 2)
    }
}
