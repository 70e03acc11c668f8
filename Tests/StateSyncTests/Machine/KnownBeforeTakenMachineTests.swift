import Testing

@testable import StateSync

/// "Known before taken" (PROTOCOL.md 7.5) on the node machine alone: a node takes a peer's own
/// deltas from that peer only once the peer knows it — its member list names the node, or it
/// took the node's ANNOUNCE, having saved its list first. A node that publishes before its log
/// is durable (`storage.fsync: interval`) and loses power settles by asking the members it knows
/// for what it lost (section 11.2); a node it never knew must not hold numbers it would reuse
/// (simulator seed 2273: a node joined through one seed, took its deltas, and the seed, back from
/// a power loss, settled without asking it and numbered new writes over them).
@Suite("Known before taken on the node machine")
struct KnownBeforeTakenMachineTests {
    typealias Member = Membership.Member

    static let cluster = ["n1", "n2"].map { MembershipMachineTests.member($0, at: 100) }
    static let address = ModelAddress(channel: "c", model: "m")

    static func heartbeat(_ node: String, latest: UInt64 = 0, members: [Member]?) -> [[UInt8]] {
        PeerMessage.heartbeat(
            PeerMessage.Heartbeat(
                node: node, latestSequence: latest, clock: 0, incarnation: 1, api: "inproc://\(node).api",
                progress: [:], members: members)
        ).encode()
    }

    static func deltaMessage(_ origin: String, _ sequence: UInt64) -> NodeInput {
        .peerMessage(
            peer: "inproc://\(origin)", frames: PeerMessage.delta(RepairMachineTests.delta(origin, sequence)).encode())
    }

    /// n3, which joined through n1: n1's HEARTBEAT (its list lacks n3) arrived, and the repair
    /// link it advertised is connected.
    static func joiner() -> MachineRunner {
        var node = MembershipMachineTests.started("n3", peers: ["n1"])
        node.peersKnowThisNode = false
        node.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: Self.cluster)))
        node.advance(100)
        return node
    }

    static func announces(_ node: MachineRunner, to peer: String) -> [UInt64] {
        node.repairRequests.compactMap { request in
            guard request.peer == peer, let header = try? ClientProtocol.decodeRequestHeader(request.frames[0]),
                header.command == ClientProtocol.Command.announce.rawValue
            else { return nil }
            return header.requestID
        }
    }

    static func peer(_ node: inout MachineRunner, _ endpoint: String) -> NodeStatus.Peer? {
        let now = node.now
        return node.machine.status(now: now).peers.first { $0.endpoint == endpoint }
    }

    /// A joiner ANNOUNCEs itself on the first list it hears from its seed: the repair link that
    /// goes over is made on that HEARTBEAT, not at the next repair round (which left the ANNOUNCE
    /// to the seed's next list, a heartbeat interval later).
    @Test func theFirstListHeardIsAnsweredWithAnAnnounceOverALinkMadeAtOnce() {
        var node = MembershipMachineTests.started("n3", peers: ["n1"])
        node.peersKnowThisNode = false
        node.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: Self.cluster)))
        #expect(node.repairLinksConnected == ["inproc://n1"])
        #expect(Self.announces(node, to: "inproc://n1").count == 1, "with no tick between")
    }

    /// A peer's live deltas wait until its list names the node: not applied, not taken as
    /// received, counted; the peer is told the node's entry; status and readiness say so. Once
    /// its list names the node, its deltas are taken, and the one left out is repaired.
    @Test func aPeersDeltasWaitUntilItsListNamesTheNode() throws {
        var node = Self.joiner()
        node.handle(Self.deltaMessage("n1", 1))
        #expect(node.machine.store.properties(of: Self.address).isEmpty, "not taken")
        #expect(node.machine.counters.deltasBeforeKnown == 1)
        #expect(node.machine.counters.deltasReceived == 0)
        #expect(!Self.announces(node, to: "inproc://n1").isEmpty, "told at once")
        let before = try #require(Self.peer(&node, "inproc://n1"))
        #expect(before.connected && !before.knowsThisNode && !before.meshed)
        let now = node.now
        #expect(
            node.machine.status(now: now).notReadyReasons.contains { $0.contains("do not know this node yet") })

        let own = try #require(node.machine.ownEntry)
        node.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: Self.cluster + [own])))
        #expect(try #require(Self.peer(&node, "inproc://n1")).meshed)
        node.handle(Self.deltaMessage("n1", 2))
        #expect(node.machine.store.properties(of: Self.address)["n"]?.value == 2, "taken now")
        node.advance(100)
        let fetch = try #require(
            RepairMachineTests.requests(node).last { $0.command == .fetch && $0.fetch?.origin == "n1" })
        #expect(fetch.peer == "inproc://n1" && fetch.fetch?.range == 1...1, "the one left out is repaired")
        let id = try RepairMachineTests.requestID(node, at: node.repairRequests.count - 1)
        node.handle(
            .repairReply(
                peer: "inproc://n1",
                frames: ClientProtocol.encodeReply(
                    .ok, id: id,
                    body: ClientProtocol.encodeFetched([RepairMachineTests.delta("n1", 1)], droppedThrough: 0))))
        #expect(node.machine.missingDeltas == 0)
        #expect(node.machine.counters.deltasBeforeKnown == 1)
    }

    /// A peer is told the node's entry unasked only once its member list was heard: that list
    /// may say the node was forgotten while away, which the node must take first (told before,
    /// the peer would take the node's newer entry over the forget, and the node would keep what
    /// it held: a real-process test, aNodeAwayLongerThanTheDeletionsAreKept…, caught this).
    @Test func aPeerIsToldOnlyAfterItsListWasHeard() {
        var node = MembershipMachineTests.started("n3", peers: ["n1"])
        node.peersKnowThisNode = false
        node.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: nil)))
        node.advance(100)  // the repair link the HEARTBEAT advertised
        node.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: nil)))
        node.handle(Self.deltaMessage("n1", 1))
        #expect(node.machine.counters.deltasBeforeKnown == 1)
        #expect(Self.announces(node, to: "inproc://n1").isEmpty, "not before its list")
        node.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: Self.cluster)))
        #expect(Self.announces(node, to: "inproc://n1").count == 1, "its list lacks n3")
        node.advance(100)
        node.handle(Self.deltaMessage("n1", 2))
        #expect(Self.announces(node, to: "inproc://n1").count == 2, "told again on its deltas, once an interval")
    }

    /// A peer that never sends a member list predates membership: it cannot be told, and after
    /// 50 HEARTBEATs without one its deltas are taken as they come. A list naming the node
    /// forgotten makes a peer that knew it a stranger again.
    @Test func aPeerWithoutListsIsTakenAsItComesAndAForgetUnknowsTheNode() throws {
        var node = MembershipMachineTests.started("n3", peers: ["n1"])
        node.peersKnowThisNode = false
        for _ in 0..<NodeMachine.heartbeatsWithoutListOfAnOldNode {
            node.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: nil)))
        }
        node.handle(Self.deltaMessage("n1", 1))
        #expect(node.machine.store.properties(of: Self.address).isEmpty, "50 without a list: not yet")
        node.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: nil)))
        node.handle(Self.deltaMessage("n1", 2))
        #expect(node.machine.store.properties(of: Self.address)["n"]?.value == 2, "51: an old node")

        var other = Self.joiner()
        let own = try #require(other.machine.ownEntry)
        other.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: Self.cluster + [own])))
        #expect(try #require(Self.peer(&other, "inproc://n1")).knowsThisNode)
        var forgotten = own
        forgotten.state = .forgotten
        forgotten.version = Version(milliseconds: (own.version.timestamp >> 16) + 1000, counter: 0, node: "n1")
        other.handle(
            .peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: Self.cluster + [forgotten])))
        #expect(try #require(Self.peer(&other, "inproc://n1")).knowsThisNode == false)
    }

    /// The peer's answer to the ANNOUNCE says it knows the node (it saved its list first): its
    /// deltas are taken from then on. A refusal says it never will: they are taken all the same.
    @Test func anAnnounceAnsweredMakesThePeerKnown() throws {
        for kind in [ClientProtocol.ReplyKind.ok, .error] {
            var node = Self.joiner()
            node.handle(Self.deltaMessage("n1", 1))
            let id = try #require(Self.announces(node, to: "inproc://n1").last)
            let body = kind == .ok ? [] : ClientProtocol.encodeError(.invalidArgument, "no")
            node.handle(
                .repairReply(peer: "inproc://n1", frames: ClientProtocol.encodeReply(kind, id: id, body: body)))
            #expect(try #require(Self.peer(&node, "inproc://n1")).knowsThisNode, "\(kind)")
            node.handle(Self.deltaMessage("n1", 2))
            #expect(node.machine.store.properties(of: Self.address)["n"]?.value == 2, "\(kind)")
        }
    }

    /// Repair asks another peer for the origin's deltas while the origin does not know the node
    /// (the origin is asked first otherwise). A request in flight to the origin when it restarts
    /// (a stranger again, until its list says otherwise) is forgotten with the link it went on
    /// (PROTOCOL.md 11.3, step 1): a reply to it is ignored, and the deltas are asked of
    /// another peer. (Until 2026-11-30 such a reply was taken as one from a stranger: held.)
    @Test func repairAsksAnotherPeerWhileTheOriginDoesNotKnowTheNode() throws {
        var node = MembershipMachineTests.started("n3", peers: ["n1", "n2"])
        node.peersKnowThisNode = false
        let own = try #require(node.machine.ownEntry)
        node.handle(.peerMessage(peer: "inproc://n2", frames: Self.heartbeat("n2", members: Self.cluster + [own])))
        node.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", latest: 2, members: nil)))
        node.advance(100)
        var requests = RepairMachineTests.requests(node)
        let fetch = try #require(requests.lastIndex { $0.command == .fetch && $0.fetch?.origin == "n1" })
        #expect(requests[fetch].peer == "inproc://n2", "not the origin, which does not know n3")
        let deltas = [RepairMachineTests.delta("n1", 1), RepairMachineTests.delta("n1", 2)]
        func answer(_ index: Int, from peer: String) throws {
            let id = try RepairMachineTests.requestID(node, at: index)
            node.handle(
                .repairReply(
                    peer: peer,
                    frames: ClientProtocol.encodeReply(
                        .ok, id: id, body: ClientProtocol.encodeFetched(deltas, droppedThrough: 0))))
        }
        try answer(fetch, from: "inproc://n2")
        #expect(node.machine.missingDeltas == 0)
        #expect(node.machine.store.properties(of: Self.address)["n"]?.value == 2)

        // n1 now knows n3 and is asked first; then it restarts (a new incarnation: a stranger
        // until its list says otherwise) before its answer arrives.
        node.handle(
            .peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", latest: 4, members: Self.cluster + [own])))
        node.advance(100)
        requests = RepairMachineTests.requests(node)
        let second = try #require(requests.lastIndex { $0.command == .fetch && $0.fetch?.origin == "n1" })
        #expect(requests[second].peer == "inproc://n1", "the origin first, once it knows the node")
        node.handle(
            .peerMessage(
                peer: "inproc://n1",
                frames: PeerMessage.heartbeat(
                    PeerMessage.Heartbeat(
                        node: "n1", latestSequence: 4, clock: 0, incarnation: 2, api: "inproc://n1.api",
                        progress: [:])
                ).encode()))
        node.advance(0)
        let asked = RepairMachineTests.requests(node).count
        let again = try #require(RepairMachineTests.requests(node).last { $0.fetch?.origin == "n1" })
        #expect(again.peer == "inproc://n2" && again.fetch?.range == 3...4, "asked again at once, of n2")
        let later = [RepairMachineTests.delta("n1", 3), RepairMachineTests.delta("n1", 4)]
        try PromptRepairMachineTests.reply(
            &node, at: second, from: "n1", ClientProtocol.encodeFetched(later, droppedThrough: 0))
        #expect(node.machine.store.properties(of: Self.address)["n"]?.value == 2, "the forgotten request's reply")
        #expect(node.machine.missingDeltas == 2)
        #expect(RepairMachineTests.requests(node).count == asked)
    }

    /// A reply from the origin to a FETCH sent while it knew the node, arriving after a later
    /// list of the same run lacks the node (it does not know it any more), waits like its
    /// stream: its deltas are not taken from it, and are counted.
    @Test func aFetchReplyFromAnOriginThatNoLongerKnowsTheNodeIsNotTaken() throws {
        var node = MembershipMachineTests.started("n3", peers: ["n1", "n2"])
        node.peersKnowThisNode = false
        let own = try #require(node.machine.ownEntry)
        node.handle(.peerMessage(peer: "inproc://n2", frames: Self.heartbeat("n2", members: Self.cluster + [own])))
        node.handle(
            .peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", latest: 2, members: Self.cluster + [own])))
        node.advance(100)
        let requests = RepairMachineTests.requests(node)
        let fetch = try #require(requests.lastIndex { $0.command == .fetch && $0.fetch?.origin == "n1" })
        #expect(requests[fetch].peer == "inproc://n1", "the origin, which knows n3")
        node.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", latest: 2, members: Self.cluster)))
        let deltas = [RepairMachineTests.delta("n1", 1), RepairMachineTests.delta("n1", 2)]
        try PromptRepairMachineTests.reply(
            &node, at: fetch, from: "n1", ClientProtocol.encodeFetched(deltas, droppedThrough: 0))
        #expect(node.machine.counters.deltasBeforeKnown == 2)
        #expect(node.machine.missingDeltas == 2, "not taken from an origin that does not know the node")
    }

    /// A node answers an ANNOUNCE only once the list holding the entry is saved: the sender takes
    /// its deltas from then on, and it must still know the sender after a power loss.
    @Test func anAnnounceIsSavedBeforeItIsAnswered() throws {
        var seed = MembershipMachineTests.started("n1", peers: ["n2"])
        let entry = MembershipMachineTests.member("n3", at: 100)
        let actions = seed.machine.handle(
            .clientRequest(
                client: [1],
                frames: ClientProtocol.encodeRequest(.announce, id: 4, body: Membership.encodeAnnounce(entry)),
                identity: nil),
            now: seed.now)
        let saved = try #require(
            actions.firstIndex {
                if case .saveMembers(let bytes) = $0 {
                    (try? Membership.decodeFile(bytes))?.contains(entry) == true
                } else {
                    false
                }
            })
        let answered = try #require(
            actions.firstIndex {
                if case .reply(let client, _) = $0 { client == [1] } else { false }
            })
        #expect(saved < answered)
    }

    /// The chain the rule exists for: n1 (`fsync: interval`) took n3's ANNOUNCE and saved it;
    /// back from a power loss with that list, it asks n3 too before it numbers a write, and
    /// numbers past the delta n3 alone holds.
    @Test func aNodeBackFromAPowerLossAsksTheMemberItWasAnnounced() throws {
        var seed = MembershipMachineTests.started("n1", peers: ["n2"])
        let entry = MembershipMachineTests.member("n3", at: 100)
        #expect(seed.request(.announce, id: 4, Membership.encodeAnnounce(entry))?.0.kind == .ok)
        let saved = try Membership.decodeFile(try #require(seed.savedMembers))
        #expect(saved.contains(entry))

        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        configuration.fsync = .interval
        var recovery = NodeMachine.Recovery(deltas: (1...2).map { RepairMachineTests.delta("n1", $0) })
        recovery.reservedSequence = 40
        recovery.reservedInThisBoot = false
        recovery.members = saved
        var node = MachineRunner(configuration, recovery: recovery)
        node.handle(.endpointsBound(publish: "inproc://n1", repair: "inproc://n1.api"))
        #expect(node.machine.peerEndpoints.contains("inproc://n3"))
        SettlingMachineTests.connect(&node, ["n2", "n3"])
        node.advance(60)
        let fetches = SettlingMachineTests.ownFetches(node)
        #expect(fetches.map(\.peer).sorted() == ["inproc://n2", "inproc://n3"])
        for fetch in fetches {
            SettlingMachineTests.answer(&node, fetch, holding: fetch.peer.hasSuffix("n3") ? [3, 4, 5, 6] : [3])
        }
        #expect(!SettlingMachineTests.status(&node).settling)
        #expect(node.machine.nextSequence == 7, "past the 6 only n3 held")
    }
}
