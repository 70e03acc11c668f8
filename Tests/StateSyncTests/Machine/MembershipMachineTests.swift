import StateSyncTesting
import Testing

@testable import StateSync

/// Membership (PROTOCOL.md 7.5) on the node machine alone: the member list converges whatever
/// the order, a node joins through one seed, and only a node speaks for itself.
@Suite("Membership on the node machine")
struct MembershipMachineTests {
    typealias Member = Membership.Member

    static func member(
        _ id: String, _ state: Membership.State = .alive, at milliseconds: UInt64, by writer: String? = nil
    ) -> Member {
        Member(
            id: id, publish: "inproc://\(id)", api: "inproc://\(id).api", state: state,
            version: Version(milliseconds: milliseconds, counter: 0, node: writer ?? id))
    }

    /// n1, started with peers n2 and n3, having heard n2's list that holds both alive.
    static func hearingN2AndN3() -> MachineRunner {
        var node = started("n1", peers: ["n2", "n3"])
        node.handle(
            .peerMessage(
                peer: "inproc://n2", frames: heartbeat("n2", members: [member("n2", at: 100), member("n3", at: 100)])))
        return node
    }

    /// A HEARTBEAT of `node` carrying `members` as a node of this version sends them (with
    /// capabilities, and the incarnations section when an entry names a start).
    static func heartbeat(_ node: String, members: [Member]?) -> [[UInt8]] {
        PeerMessage.heartbeat(
            PeerMessage.Heartbeat(
                node: node, latestSequence: 0, clock: 0, incarnation: 1, api: "inproc://\(node).api", progress: [:],
                members: members, capabilities: members == nil ? nil : 0)
        ).encode()
    }

    /// A started node: its own entry is written when its endpoints are bound.
    static func started(_ id: String, peers: [String]) -> MachineRunner {
        var node = MachineRunner(MachineRunner.configuration(id, peers: peers))
        node.handle(.endpointsBound(publish: "inproc://\(id)", repair: "inproc://\(id).api"))
        return node
    }

    /// A secured node restarted with a saved member list links the members whose keys it is
    /// configured with as soon as it is bound, before its driver says which keys it read (a
    /// trial's: a restarted joiner warned that it did not trust a peer listed in its
    /// security.peer_keys, then linked it once the driver spoke).
    @Test func aSavedMemberWithAConfiguredKeyIsLinkedAtStart() {
        var configuration = MachineRunner.configuration("n4", peers: ["inproc://n1"])
        configuration.security = SecurityConfiguration(
            secretKeyFile: "unused", peerKeys: ["n1": ["unused"], "n2": ["unused"]])
        var recovery = NodeMachine.Recovery()
        recovery.members = [
            Membership.Member(
                id: "n2", publish: "inproc://n2", api: "inproc://n2.api", state: .alive,
                version: Version(milliseconds: 1_000, counter: 0, node: "n2"), incarnation: 7),
            Membership.Member(
                id: "n3", publish: "inproc://n3", api: "inproc://n3.api", state: .alive,
                version: Version(milliseconds: 1_000, counter: 0, node: "n3"), incarnation: 8),
        ]
        var node = MachineRunner(configuration, recovery: recovery)
        node.handle(.endpointsBound(publish: "inproc://n4", repair: "inproc://n4.api"))
        #expect(node.subscribed.contains { $0.endpoint == "inproc://n2" && $0.node == "n2" }, "\(node.subscribed)")
        // n3's key is not configured: it stays unlinked.
        #expect(!node.subscribed.contains { $0.node == "n3" }, "\(node.subscribed)")
    }

    /// The list is a last-writer-wins map: any order and any repetition of the same entries gives
    /// the same list (seeded permutations; the seed is in the failure message) — also when two
    /// different entries carry one version, as only a faulty writer makes them.
    @Test(arguments: 1...20 as ClosedRange<UInt64>)
    func theListConvergesWhateverTheOrder(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        let entries: [Member] = (0..<40).map { index in
            let id = "n\(random.next() % 6)"
            let state = Membership.State.allCases[Int(random.next() % 3)]
            return Self.member(id, state, at: 1000 + random.next() % 20, by: "n\(index % 4)")
        }
        var reference = Membership()
        for entry in entries { reference.merge(entry) }
        for _ in 0..<5 {
            var shuffled = entries + entries.prefix(Int(random.next() % 10))
            for index in shuffled.indices.reversed() {
                shuffled.swapAt(index, Int(random.next() % UInt64(index + 1)))
            }
            var other = Membership()
            for entry in shuffled { other.merge(entry) }
            #expect(other == reference, "seed \(seed)")
        }
        for (id, entry) in reference.members {
            let newest = entries.filter { $0.id == id }.map(\.version).max()
            #expect(entry.version == newest, "seed \(seed): the newest entry of \(id) wins")
        }
    }

    /// The member list rides at the end of a HEARTBEAT; a HEARTBEAT without it (an older node)
    /// decodes with none, and a bad entry makes the message malformed.
    @Test func theListRoundTripsInAHeartbeatAndOlderHeartbeatsHaveNone() throws {
        let members = [Self.member("n1", at: 5), Self.member("n2", .left, at: 7, by: "n2")]
        guard case .heartbeat(let beat) = try PeerMessage.decode(Self.heartbeat("n1", members: members)) else {
            Issue.record("not a heartbeat")
            return
        }
        #expect(beat.members == members)
        guard case .heartbeat(let old) = try PeerMessage.decode(Self.heartbeat("n1", members: nil)) else {
            Issue.record("not a heartbeat")
            return
        }
        #expect(old.members == nil)
        var frames = Self.heartbeat("n1", members: members)
        frames[1][frames[1].count - 1 - 3 - 8 - 1] = 9  // the second entry's state octet (then capabilities)
        #expect(throws: WireError.self) { try PeerMessage.decode(frames) }
    }

    /// A node configured with one seed learns the members from the seed's HEARTBEAT, subscribes
    /// to them, and ANNOUNCEs itself to the seed (whose list lacks it) once it has a link to the
    /// seed's API; the seed takes the entry and subscribes back.
    @Test func aNodeJoinsThroughOneSeed() throws {
        var joiner = Self.started("n4", peers: ["n1"])
        let cluster = ["n1", "n2", "n3"].map { Self.member($0, at: 100) }
        joiner.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: cluster)))
        #expect(joiner.subscribed.map(\.node) == ["n2", "n3"], "every member but the seed it has")
        #expect(joiner.subscribed.map(\.endpoint) == ["inproc://n2", "inproc://n3"])
        #expect(joiner.machine.peerEndpoints == ["inproc://n1", "inproc://n2", "inproc://n3"])
        joiner.advance(100)  // the tick connects the repair link the HEARTBEAT advertised
        joiner.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: cluster)))
        let announce = try #require(
            joiner.repairRequests.first { frames in
                (try? ClientProtocol.decodeRequestHeader(frames.frames[0]))?.command
                    == ClientProtocol.Command.announce.rawValue
            })
        #expect(announce.peer == "inproc://n1")
        let entry = try Membership.decodeAnnounce(announce.frames[1])
        #expect(entry.id == "n4" && entry.state == .alive && entry.publish == "inproc://n4")

        // At most one ANNOUNCE per heartbeat interval per peer.
        let sent = joiner.repairRequests.count
        joiner.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: cluster)))
        #expect(joiner.repairRequests.count == sent)
        // Once the seed's list holds the entry, no more.
        joiner.advance(100)
        joiner.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: cluster + [entry])))
        #expect(joiner.repairRequests.count == sent)

        var seed = Self.started("n1", peers: ["n2", "n3"])
        let answer = seed.request(.announce, id: 9, Membership.encodeAnnounce(entry))
        #expect(answer?.0.kind == .ok)
        #expect(seed.subscribed.map(\.node) == ["n4"])
        #expect(seed.machine.membership.members["n4"] == entry)
        // Its HEARTBEAT now carries n4 to the others.
        seed.advance(100)
        let beat = try #require(seed.published.last { $0[0] == PeerMessage.heartbeatTopic })
        guard case .heartbeat(let decoded) = try PeerMessage.decode(beat) else { throw CancellationError() }
        #expect(decoded.members?.map(\.id) == ["n1", "n4"])
    }

    /// With security a node may ANNOUNCE only its own entry, and a client key none; without it,
    /// an entry must still be the writer's own and dialable.
    @Test func onlyANodeSpeaksForItself() throws {
        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        configuration.security = SecurityConfiguration(secretKeyFile: "unused", peerKeys: [:])
        var seed = MachineRunner(configuration)
        seed.handle(.endpointsBound(publish: "inproc://n1", repair: "inproc://n1.api"))
        seed.handle(.clientAccessChanged(["client:c": .init(key: "c")], peers: ["n2", "n4"]))
        let n4 = Membership.encodeAnnounce(Self.member("n4", at: 100))
        for identity in ["node:n2", "client:c"] {
            let answer = seed.request(.announce, id: 1, n4, identity: identity)
            let reply = try #require(answer)
            #expect(reply.0.kind == .error, "\(identity)")
            #expect(try ClientProtocol.decodeError(reply.1).code == ClientProtocol.ErrorCode.forbidden.rawValue)
        }
        #expect(seed.machine.membership.members["n4"] == nil)
        let accepted = seed.request(.announce, id: 2, n4, identity: "node:n4")
        #expect(accepted?.0.kind == .ok)
        #expect(seed.subscribed.map(\.node) == ["n4"])

        var open = Self.started("n1", peers: [])
        let forged = Membership.encodeAnnounce(Self.member("n5", at: 100, by: "n2"))
        let refused = open.request(.announce, id: 1, forged)
        #expect(refused?.0.kind == .error)
        var wildcard = Self.member("n6", at: 100)
        wildcard.publish = "tcp://0.0.0.0:7001"
        let answer = open.request(.announce, id: 2, Membership.encodeAnnounce(wildcard))
        let reply = try #require(answer)
        #expect(reply.0.kind == .error)
        #expect(try ClientProtocol.decodeError(reply.1).message.contains("concrete address"))
        #expect(open.subscribed.isEmpty)
    }

    /// A newer entry about this node (a forged leave, its own leave from an earlier run) is
    /// answered with a newer alive entry of its own; a clean stop publishes a HEARTBEAT saying it
    /// left.
    @Test func aNodeSaysItIsAliveAndThatItLeft() throws {
        var node = Self.started("n1", peers: ["n2"])
        let own = try #require(node.machine.membership.members["n1"])
        var forged = own
        forged.state = .left
        forged.version = Version(milliseconds: own.version.milliseconds + 50, counter: 0, node: "n2")
        node.handle(.peerMessage(peer: "inproc://n2", frames: Self.heartbeat("n2", members: [forged])))
        let now = try #require(node.machine.membership.members["n1"])
        #expect(now.state == .alive && now.version > forged.version && now.version.node == "n1")

        // Its own leave from an earlier run at the very version it just wrote (entries are not
        // logged, so a restarted clock can give that version again — the simulator found it):
        // different content, so it says again that it is alive, later.
        let current = try #require(node.machine.membership.members["n1"])
        var stale = current
        stale.state = .left
        node.handle(.peerMessage(peer: "inproc://n2", frames: Self.heartbeat("n2", members: [stale])))
        let reasserted = try #require(node.machine.membership.members["n1"])
        #expect(reasserted.state == .alive && reasserted.version > current.version)

        node.handle(.stop)
        let beat = try #require(node.published.last { $0[0] == PeerMessage.heartbeatTopic })
        guard case .heartbeat(let decoded) = try PeerMessage.decode(beat) else { throw CancellationError() }
        #expect(decoded.members?.first { $0.id == "n1" }?.state == .left)
    }

    /// `status` lists every member with its state as this node sees it.
    @Test func statusListsTheMembers() {
        var node = Self.started("n4", peers: ["n1"])
        node.handle(
            .peerMessage(
                peer: "inproc://n1",
                frames: Self.heartbeat("n1", members: [Self.member("n1", at: 100), Self.member("n2", .left, at: 100)])))
        let members = node.machine.status(now: node.now).members
        #expect(members.map(\.id) == ["n1", "n2", "n4"])
        #expect(members.map(\.state) == ["alive", "left", "alive"])
        #expect(members[0].connected && members[0].lastSeenMillisecondsAgo == 0)
        #expect(members[2].lastSeenMillisecondsAgo == nil, "itself")
        node.advance(400)
        #expect(node.machine.status(now: node.now).members[0].state == "suspect")
        node.advance(1000)
        #expect(node.machine.status(now: node.now).members[0].state == "down")
    }

    /// A member that left and comes back (its new entry, alive) is alive from the moment this
    /// node learns it, until its silence says otherwise; not `down` until its first HEARTBEAT,
    /// counted from the last one before it left (a helper saw `left → down → alive` when a
    /// stopped node restarted: a peer-down alert that blips).
    @Test func aMemberBackFromLeavingIsAliveNotDownUntilHeard() {
        var node = Self.hearingN2AndN3()
        node.handle(
            .peerMessage(
                peer: "inproc://n2",
                frames: Self.heartbeat("n2", members: [Self.member("n2", at: 100), Self.member("n3", .left, at: 200)])))
        func n3() -> String? { node.machine.status(now: node.now).members.first { $0.id == "n3" }?.state }
        #expect(n3() == "left")
        node.advance(10_000)
        node.handle(
            .peerMessage(
                peer: "inproc://n2",
                frames: Self.heartbeat("n2", members: [Self.member("n2", at: 100), Self.member("n3", at: 10_300)])))
        #expect(n3() == "alive", "learned alive just now")
        node.advance(400)
        #expect(n3() == "suspect", "and silent since")
    }

    /// A member that left loses its links, and its deltas that no remaining peer holds are no
    /// longer awaited; when it comes back alive it is linked again.
    @Test func aMemberThatLeftIsUnlinkedAndNoLongerAwaited() {
        var node = Self.started("n1", peers: ["n2", "n3"])
        node.handle(.peerMessage(peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 5)))
        node.handle(.peerMessage(peer: "inproc://n3", frames: RepairMachineTests.heartbeat("n3", latest: 0)))
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(RepairMachineTests.delta("n2", 1)).encode()))
        #expect(node.machine.missingDeltas == 4)
        let left = Self.member("n2", .left, at: 1_800_000_000_100)
        node.handle(.peerMessage(peer: "inproc://n2", frames: Self.heartbeat("n2", members: [left])))
        #expect(node.unsubscribed == ["inproc://n2"])
        #expect(node.machine.peerEndpoints == ["inproc://n3"])
        #expect(node.machine.status(now: node.now).peers.map(\.endpoint) == ["inproc://n3"])
        #expect(node.machine.missingDeltas == 0, "no remaining peer holds n2's 2...5")
        // A remaining peer that holds them keeps them awaited.
        node.handle(
            .peerMessage(
                peer: "inproc://n3", frames: RepairMachineTests.heartbeat("n3", latest: 0, progress: ["n2": 3])))
        #expect(node.machine.missingDeltas == 2)
        // Back, alive, with a newer entry carried by n3: linked again.
        let back = Self.member("n2", at: 1_800_000_000_200)
        node.handle(.peerMessage(peer: "inproc://n3", frames: Self.heartbeat("n3", members: [back])))
        #expect(node.subscribed.map(\.node) == ["n2"])
        #expect(node.machine.peerEndpoints == ["inproc://n3", "inproc://n2"])
    }

    /// 7.5: a node left linked to no peer (its only configured peer left) dials its configured
    /// peers again at its next tick: without that it would hear no member list again (and a
    /// forget made meanwhile, which stops the others from linking to it, would leave it alone for
    /// good: simulator seed 2167, 3 nodes, 10,000 operations).
    @Test func aNodeLinkedToNoPeerDialsItsConfiguredPeersAgain() {
        var node = Self.started("n2", peers: ["n1"])
        node.handle(.peerMessage(peer: "inproc://n1", frames: RepairMachineTests.heartbeat("n1", latest: 0)))
        let left = Self.member("n1", .left, at: 1_800_000_000_100)
        node.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: [left])))
        #expect(node.unsubscribed == ["inproc://n1"])
        #expect(node.machine.peerEndpoints.isEmpty)
        node.advance(100)
        #expect(node.subscribed.map(\.endpoint) == ["inproc://n1"] && node.subscribed.map(\.node) == ["n1"])
        #expect(node.machine.peerEndpoints == ["inproc://n1"])
        // Back, its HEARTBEATs are heard again, and with them the member list.
        let back = Self.member("n1", at: 1_800_000_000_200)
        node.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: [back])))
        #expect(node.machine.membership.members["n1"]?.state == .alive)
        // A node with a peer left does not dial departed ones: one tick more changes nothing.
        node.advance(100)
        #expect(node.subscribed.count == 1)
    }

    /// A stopping node says it left only after its last deltas are published: peers drop their
    /// links to it on that HEARTBEAT and would miss what came after.
    @Test func theLeaveHeartbeatFollowsTheLastDeltas() throws {
        // `always`, no tick: the write waits for its sync, which the stop asks for.
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        node.handle(.endpointsBound(publish: "inproc://n1", repair: "inproc://n1.api"))
        node.handle(.clientRequest(client: [0x53, 1], frames: DurabilityMachineTests.set, identity: nil))
        let before = node.published.count
        node.handle(.stop)
        let kinds = node.published[before...].map { frames in
            frames[0] == PeerMessage.heartbeatTopic ? "heartbeat" : "delta"
        }
        #expect(kinds == ["delta", "heartbeat"])
        guard case .heartbeat(let beat) = try PeerMessage.decode(node.published.last!) else {
            throw CancellationError()
        }
        #expect(beat.members?.first { $0.id == "n1" }?.state == .left)
    }

    /// 7.5: a member this node holds as forgotten is taken back only from itself. An entry of it
    /// that another peer relays (here one newer than the forget, as a restart or a clock ahead
    /// writes it before the member hears of the forget) is not taken: the forget would be
    /// undone here, the member would never hear of it, and it would never drop its state (the
    /// simulator's reset check, 3 nodes × 300 operations, seed 2). Nor is its own HEARTBEAT's
    /// list; its ANNOUNCE is.
    @Test func aForgottenMemberIsTakenBackOnlyFromItself() throws {
        var node = Self.hearingN2AndN3()
        #expect(node.forget("n3")?.0.kind == .ok)
        let forget = try #require(node.machine.membership.members["n3"])
        let newer = Self.member("n3", at: forget.version.milliseconds + 1_000)
        node.handle(
            .peerMessage(
                peer: "inproc://n2", frames: Self.heartbeat("n2", members: [Self.member("n2", at: 100), newer])))
        #expect(node.machine.membership.members["n3"] == forget, "not from a third node")
        // Nor from its own HEARTBEAT (this node may subscribe to it, configured: a restarted
        // node's list goes out before it heard of the forget).
        node.handle(.peerMessage(peer: "inproc://n3", frames: Self.heartbeat("n3", members: [newer])))
        #expect(node.machine.membership.members["n3"] == forget, "not from its HEARTBEAT")
        #expect(node.request(.announce, id: 8, Membership.encodeAnnounce(newer))?.0.kind == .ok)
        #expect(node.machine.membership.members["n3"] == newer, "from its ANNOUNCE")
    }

    /// 7.5: a forget the node answered before (its members file says so) is no reason to
    /// refuse to run, also for a node that has none of its own deltas on disk (it reset and
    /// wrote nothing since): a node holding it as forgotten may still list it until it hears
    /// the node's ANNOUNCE.
    @Test func anAnsweredForgetIsNoReasonToRefuseToRun() throws {
        let forget = Self.member("n1", .forgotten, at: 100, by: "n2")
        var recovery = NodeMachine.Recovery()
        recovery.members = [forget, Self.member("n2", at: 100)]
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]), recovery: recovery)
        node.handle(.endpointsBound(publish: "inproc://n1", repair: "inproc://n1.api"))
        node.handle(
            .peerMessage(
                peer: "inproc://n2", frames: Self.heartbeat("n2", members: [Self.member("n2", at: 100), forget])))
        #expect(node.machine.refusal == nil, "answered before")
        #expect(node.machine.counters.resyncs == 0)
        // A newer forget is not answered: a node with none of its deltas refuses, as before.
        let newer = Self.member("n1", .forgotten, at: 200, by: "n2")
        node.handle(
            .peerMessage(
                peer: "inproc://n2", frames: Self.heartbeat("n2", members: [Self.member("n2", at: 100), newer])))
        #expect(node.machine.refusal != nil)
    }

    /// 7.5: a node that hears of its forget while it stops does not answer it with its leave
    /// (the forget would be gone from the cluster, and the node, back, would never drop its
    /// state); back, it hears the forget again and drops its state then.
    @Test func aForgetHeardWhileStoppingIsNotOverriddenByTheLeave() throws {
        var node = Self.started("n1", peers: ["n2"])
        node.handle(.clientRequest(client: [0x53, 1], frames: DurabilityMachineTests.set, identity: nil))
        node.advance(100)
        // n2 holds n1's entry: n1 is in the cluster (not an id coming back empty).
        let alive = try #require(node.machine.ownEntry)
        node.handle(
            .peerMessage(
                peer: "inproc://n2", frames: Self.heartbeat("n2", members: [Self.member("n2", at: 100), alive])))
        #expect(node.machine.ownEntryAcknowledged)
        let forget = Self.member("n1", .forgotten, at: node.wall.milliseconds + 1_000, by: "n2")
        node.holdsSyncs = true
        node.handle(.stop)
        let leave = try #require(node.machine.ownEntry)
        node.handle(
            .peerMessage(
                peer: "inproc://n2", frames: Self.heartbeat("n2", members: [Self.member("n2", at: 100), forget])))
        #expect(node.machine.ownEntry == leave, "no entry written over the forget")
        #expect(node.machine.counters.resyncs == 0)
        #expect(node.machine.refusal == nil)
    }

    /// FORGET of a member whose last entry is ahead of this node's clock (its writer's clock
    /// ran ahead): the forget's version is above that entry's, else every node, this one first,
    /// would keep the older entry, and the forget the operator was told of would do nothing (the
    /// simulator's reset check found it: 3 nodes × 5,000 operations, seed 21, where the forget
    /// was 6 ms older than the leave it replaced).
    @Test func aForgetIsNewerThanTheEntryItReplaces() throws {
        var node = Self.started("n1", peers: ["n2", "n3"])
        let left = Self.member("n3", .left, at: node.wall.milliseconds + 5_000)
        node.handle(
            .peerMessage(
                peer: "inproc://n2", frames: Self.heartbeat("n2", members: [Self.member("n2", at: 100), left])))
        #expect(node.machine.membership.members["n3"] == left)
        #expect(node.forget("n3")?.0.kind == .ok)
        let entry = try #require(node.machine.membership.members["n3"])
        #expect(entry.state == .forgotten && entry.version > left.version)
    }

    /// FORGET: an operator removes a member; this node writes its entry as forgotten, drops its
    /// links, and its HEARTBEAT carries the entry. Not itself, not an unknown id, and with
    /// security only a key that may write every channel.
    @Test func forgettingAMember() throws {
        var node = Self.hearingN2AndN3()
        #expect(node.forget("n1")?.0.kind == .error)
        #expect(node.forget("n9")?.0.kind == .error)
        #expect(node.forget("n3")?.0.kind == .ok)
        let entry = try #require(node.machine.membership.members["n3"])
        #expect(entry.state == .forgotten && entry.version.node == "n1")
        #expect(node.unsubscribed == ["inproc://n3"])

        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        configuration.peerNodeIDs = ["inproc://n2": "n2"]
        configuration.security = SecurityConfiguration(secretKeyFile: "unused", peerKeys: [:])
        var secured = MachineRunner(configuration)
        secured.handle(.endpointsBound(publish: "inproc://n1", repair: "inproc://n1.api"))
        secured.handle(
            .clientAccessChanged(
                ["client:r": .init(key: "r", read: ["*"], write: ["sensors/*"]), "client:op": .init(key: "op")],
                peers: ["n2"]))
        secured.handle(
            .peerMessage(peer: "inproc://n2", frames: Self.heartbeat("n2", members: [Self.member("n2", at: 100)])))
        var body = WireWriter()
        body.string("n2")
        for identity in ["client:r", "node:n2"] {
            let answer = secured.request(.forget, id: 1, body.bytes, identity: identity)
            #expect(answer?.0.kind == .error, "\(identity)")
            #expect(
                try ClientProtocol.decodeError(answer?.1 ?? []).code == ClientProtocol.ErrorCode.forbidden.rawValue)
        }
        // n2 was heard just now: a running member is not forgotten (it would say it is alive).
        let alive = secured.request(.forget, id: 2, body.bytes, identity: "client:op")
        #expect(alive?.0.kind == .error)
        #expect(try ClientProtocol.decodeError(alive?.1 ?? []).message.contains("is alive"))
        secured.advance(400)
        #expect(secured.request(.forget, id: 3, body.bytes, identity: "client:op")?.0.kind == .ok)
    }

    /// A list of at most eight entries rides on every HEARTBEAT: a node joining through this one,
    /// which does not hear it, waits for the next one before it may ANNOUNCE (section 7.5). A
    /// longer one rides on the three HEARTBEATs after a change of it or after a subscriber
    /// connected (perhaps such a node), and on every tenth, not on every one (it is O(members)
    /// octets per HEARTBEAT per link).
    @Test func theListRidesOnEveryHeartbeatOfASmallClusterElseAfterAChangeOrAConnectionAndOnEveryTenth() throws {
        var small = Self.started("n1", peers: ["n2"])
        small.handle(
            .peerMessage(
                peer: "inproc://n2",
                frames: Self.heartbeat("n2", members: (2...8).map { Self.member("n\($0)", at: 100) })))
        #expect(small.machine.membership.members.count == NodeMachine.membersOnEveryHeartbeatUpTo)
        var withList = 0
        for _ in 0..<25 {
            let before = small.published.count
            small.advance(100)
            let beat = try #require(small.published[before...].last { $0[0] == PeerMessage.heartbeatTopic })
            guard case .heartbeat(let decoded) = try PeerMessage.decode(beat) else { throw CancellationError() }
            if decoded.members?.count == 8 { withList += 1 }
        }
        #expect(withList == 25, "eight entries: the list on every heartbeat")

        var node = Self.started("n1", peers: ["n2"])
        node.handle(
            .peerMessage(
                peer: "inproc://n2",
                frames: Self.heartbeat("n2", members: (2...9).map { Self.member("n\($0)", at: 100) })))
        #expect(node.machine.membership.members.count == NodeMachine.membersOnEveryHeartbeatUpTo + 1)
        func carried(_ beats: Int) throws -> [Int] {
            var indices: [Int] = []
            for index in 0..<beats {
                let before = node.published.count
                node.advance(100)
                let beat = try #require(node.published[before...].last { $0[0] == PeerMessage.heartbeatTopic })
                guard case .heartbeat(let decoded) = try PeerMessage.decode(beat) else { throw CancellationError() }
                if decoded.members != nil { indices.append(index) }
            }
            return indices
        }
        #expect(try carried(25) == [0, 1, 2, 10, 20], "three after the change, then every tenth")
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: Self.heartbeat("n2", members: [Self.member("n2", at: 200)])))
        #expect(try carried(6) == [0, 1, 2, 5], "three after the change (heartbeats 25–27), then the 30th")
        // A subscriber connected (heartbeat 31 went out): perhaps a node joining through this
        // one, which it does not hear, and which may ANNOUNCE only once it has heard the list.
        #expect(try carried(1) == [])
        node.handle(.subscriberConnected)
        #expect(node.machine.counters.subscribersConnected == 1)
        #expect(try carried(6) == [0, 1, 2], "three after the connection (heartbeats 32–34), not the 35th–37th")
    }

    /// A node that started knowing none of its own deltas (an empty data directory) refuses to
    /// run under an id whose earlier deltas a peer holds, or that was forgotten; its own writes of
    /// this run reported back are no reason, and a node with its own deltas on disk fetches the
    /// lost ones back as before (section 7.3).
    @Test func anEmptyDataDirectoryUnderAKnownOrForgottenIdRefusesToRun() throws {
        var empty = Self.started("n1", peers: ["n2"])
        empty.handle(
            .peerMessage(
                peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0, progress: ["n1": 5])))
        #expect(empty.refusals.count == 1)
        #expect(empty.refusals.first?.contains("already published deltas 1…5") == true, "\(empty.refusals)")

        var fresh = Self.started("n1", peers: ["n2"])
        fresh.handle(.clientRequest(client: [0x53, 1], frames: DurabilityMachineTests.set, identity: nil))
        fresh.advance(10)
        #expect(fresh.machine.nextSequence == 2)
        fresh.handle(
            .peerMessage(
                peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0, progress: ["n1": 1])))
        #expect(fresh.refusals.isEmpty, "its own write of this run")

        let configuration = MachineRunner.configuration("n1", peers: ["n2"])
        var withData = MachineRunner(configuration, recovery: .init(deltas: [RepairMachineTests.delta("n1", 1)]))
        withData.handle(.endpointsBound(publish: "inproc://n1", repair: "inproc://n1.api"))
        withData.handle(
            .peerMessage(
                peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0, progress: ["n1": 5])))
        #expect(withData.refusals.isEmpty && withData.machine.nextSequence == 6)

        // Forgotten: refused when empty (even though this start's own entry is newer), back alive
        // with data.
        let forgotten = Self.member("n1", .forgotten, at: 1_000, by: "n2")
        var emptyAgain = Self.started("n1", peers: ["n2"])
        emptyAgain.handle(.peerMessage(peer: "inproc://n2", frames: Self.heartbeat("n2", members: [forgotten])))
        #expect(emptyAgain.refusals.first?.contains("was forgotten") == true, "\(emptyAgain.refusals)")
        withData.handle(.peerMessage(peer: "inproc://n2", frames: Self.heartbeat("n2", members: [forgotten])))
        #expect(withData.refusals.isEmpty)
        #expect(withData.machine.membership.members["n1"]?.state == .alive)

        // A node that is in the cluster (a peer's list held its entry of this start) and is
        // forgotten while it runs says it is alive again, with or without deltas of its own (a
        // new user found it stopping instead).
        var running = Self.started("n1", peers: ["n2"])
        let own = try #require(running.machine.membership.members["n1"])
        running.handle(.peerMessage(peer: "inproc://n2", frames: Self.heartbeat("n2", members: [own])))
        var later = own
        later.state = .forgotten
        later.version = Version(milliseconds: own.version.milliseconds + 10, counter: 0, node: "n2")
        running.handle(.peerMessage(peer: "inproc://n2", frames: Self.heartbeat("n2", members: [later])))
        #expect(running.refusals.isEmpty)
        let reasserted = try #require(running.machine.membership.members["n1"])
        #expect(reasserted.state == .alive && reasserted.version > later.version)
    }

    /// A seed n1 and a new node n4 configured with it: n4 heard n1's list (without itself) twice
    /// and sent n1 its ANNOUNCE, not yet delivered. Returns both, n1's list and the request.
    static func joinerAnnouncingToItsSeed() throws -> (
        seed: MachineRunner, joiner: MachineRunner, list: [Member], announce: (peer: String, frames: [[UInt8]])
    ) {
        let seed = Self.started("n1", peers: [])
        var joiner = Self.started("n4", peers: ["n1"])
        let list = [try #require(seed.machine.membership.members["n1"])]
        joiner.advance(100)
        joiner.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: list)))
        joiner.advance(100)
        joiner.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: list)))
        let announce = try #require(
            joiner.repairRequests.last { request in
                (try? ClientProtocol.decodeRequestHeader(request.frames[0]))?.command
                    == ClientProtocol.Command.announce.rawValue
            })
        return (seed, joiner, list, announce)
    }

    /// 10.11 and 7.5: an ANNOUNCE answered "taken" tells the node that a peer's list holds its
    /// entry of this start, as a HEARTBEAT's list holding it would. A new node that is cut off
    /// and forgotten before any list it heard held its entry then takes the forget as made while
    /// it ran (it resets) instead of as its id coming back empty (the simulator's join and forget
    /// faults: 3 nodes × 300 operations, seeds 188 and 873; × 10,000, seeds 2064 and 2270). An
    /// empty answer (a node of an earlier version) says nothing, and the node refuses as before;
    /// an entry the peer did not take (it holds a newer one) is answered "not taken".
    @Test func anAnnounceAnsweredTakenMakesALaterForgetOneMadeWhileTheNodeRan() throws {
        func joinerAnnouncing(answer body: (inout MachineRunner, [UInt8]) throws -> [UInt8]) throws -> MachineRunner {
            var (seed, joiner, list, announce) = try Self.joinerAnnouncingToItsSeed()
            let id = try ClientProtocol.decodeRequestHeader(announce.frames[0]).requestID
            joiner.handle(
                .repairReply(
                    peer: "inproc://n1",
                    frames: ClientProtocol.encodeReply(.ok, id: id, body: try body(&seed, announce.frames[1]))))
            // Cut off, it is forgotten; the forget reaches it in a list that never held its entry.
            let own = try #require(joiner.machine.membership.members["n4"])
            let forget = Self.member("n4", .forgotten, at: own.version.milliseconds + 500, by: "n1")
            joiner.advance(100)
            joiner.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: list + [forget])))
            return joiner
        }
        let taken = try joinerAnnouncing { seed, entry in
            let reply = seed.request(.announce, id: 7, entry)
            let answer = try #require(reply)
            #expect(answer.0.kind == .ok && answer.1 == [1], "taken")
            return answer.1
        }
        #expect(taken.refusals.isEmpty, "\(taken.refusals)")
        #expect(taken.machine.counters.resyncs == 1, "it dropped its state, as a node forgotten while it ran")
        let older = try joinerAnnouncing { _, _ in [] }
        #expect(older.refusals.first?.contains("was forgotten") == true, "\(older.refusals)")

        // A seed that holds a newer (forgotten) entry of n4 keeps it, and says so.
        var seed = Self.started("n1", peers: ["n2"])
        let entry = Self.member("n4", at: 1_800_000_000_000)
        seed.handle(
            .peerMessage(
                peer: "inproc://n2",
                frames: Self.heartbeat("n2", members: [Self.member("n4", .forgotten, at: 1_800_000_000_500, by: "n2")]))
        )
        let reply = seed.request(.announce, id: 8, Membership.encodeAnnounce(entry))
        let answer = try #require(reply)
        #expect(answer.0.kind == .ok && answer.1 == [0], "not taken")
        #expect(seed.machine.membership.members["n4"]?.state == .forgotten)
    }

    /// 7.5 "Which start a forget removes": a forget names the start of the entry its forgetter
    /// replaced, by that start's incarnation (which the entry carried from its node, in its
    /// ANNOUNCE). A new node whose ANNOUNCE was taken but never answered (no list it heard held
    /// its entry, no "taken" came back) and that is then cut off and forgotten learns from the
    /// forget itself that it was forgotten while it ran: it resets, and keeps running, where it
    /// refused before (a data directory without its own deltas, read as its id coming back
    /// empty). A forget of another start of the id (another incarnation), or one that names none
    /// (from a node of an earlier version), is refused as before. The forget travels in a real
    /// HEARTBEAT list from the forgetter's own `forget`, through the wire form's incarnations
    /// section.
    @Test func aForgetNamingThisStartIsOneMadeWhileTheNodeRan() throws {
        /// `forgetOf` gives the forget for the joiner's own entry; `nil` when the seed's own
        /// FORGET is to write it.
        func joinerForgotten(_ forgetOf: (Member) -> Member?) throws -> MachineRunner {
            var (seed, joiner, list, announce) = try Self.joinerAnnouncingToItsSeed()
            // The seed takes the entry; its answer never reaches the joiner, which is cut off.
            #expect(seed.request(.announce, id: 7, announce.frames[1])?.1 == [1])
            let own = try #require(joiner.machine.membership.members["n4"])
            #expect(own.incarnation == joiner.machine.incarnation)
            #expect(seed.machine.membership.members["n4"]?.incarnation == joiner.machine.incarnation)
            // The forget reaches the joiner in the seed's list, which never held its entry there.
            var forgetList: [Member]
            if let forget = forgetOf(own) {
                forgetList = list + [forget]
            } else {
                #expect(seed.forget("n4")?.0.kind == .ok)
                #expect(seed.machine.membership.members["n4"]?.incarnation == own.incarnation, "the forget names it")
                forgetList = seed.machine.membership.sorted
            }
            #expect(forgetList.last?.state == .forgotten)
            joiner.advance(100)
            joiner.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: forgetList)))
            return joiner
        }
        let ofThisStart = try joinerForgotten { _ in nil }
        #expect(ofThisStart.refusals.isEmpty, "\(ofThisStart.refusals)")
        #expect(ofThisStart.machine.counters.resyncs == 1, "it dropped its state, as a node forgotten while it ran")

        let ofAnotherStart = try joinerForgotten { own in
            var entry = Self.member("n4", .forgotten, at: own.version.milliseconds + 500, by: "n2")
            entry.incarnation = own.incarnation! &+ 1
            return entry
        }
        #expect(ofAnotherStart.refusals.first?.contains("was forgotten") == true, "\(ofAnotherStart.refusals)")
        let namingNone = try joinerForgotten { own in
            Self.member("n4", .forgotten, at: own.version.milliseconds + 500, by: "n2")
        }
        #expect(namingNone.refusals.first?.contains("was forgotten") == true, "\(namingNone.refusals)")

        // An earlier start wrote an entry equal to this start's but for its incarnation (a
        // version can repeat across starts), and a cut-off peer's list still holds it: it does
        // not say this start is in the cluster, and the node writes its entry again (peers could
        // keep the earlier one over it); a forget of that start then stops it, as it must.
        var joiner = Self.started("n4", peers: ["n1"])
        var earlier = try #require(joiner.machine.membership.members["n4"])
        earlier.incarnation = joiner.machine.incarnation &+ 1
        let seedEntry = Self.member("n1", at: 1_800_000_000_000)
        joiner.advance(100)
        joiner.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: [seedEntry, earlier])))
        #expect(!joiner.machine.ownEntryAcknowledged, "an entry of another start acknowledges nothing")
        #expect(try #require(joiner.machine.membership.members["n4"]).version > earlier.version, "written again")
        var forget = Self.member("n4", .forgotten, at: earlier.version.milliseconds + 500, by: "n1")
        forget.incarnation = earlier.incarnation
        joiner.advance(100)
        joiner.handle(.peerMessage(peer: "inproc://n1", frames: Self.heartbeat("n1", members: [seedEntry, forget])))
        #expect(joiner.refusals.first?.contains("was forgotten") == true, "\(joiner.refusals)")
    }

    /// The incarnations section rides after a HEARTBEAT's capabilities and in the members file,
    /// an entry's incarnation after it in ANNOUNCE; a body or a file without it (an earlier
    /// version's) still reads, naming none. The incarnation is not part of what an entry says
    /// (equal without it), and of two copies of one entry the one that names a start is kept.
    @Test func incarnationsRoundTripAndOlderFormsStillRead() throws {
        var alive = Self.member("n1", at: 1_800_000_000_000)
        alive.incarnation = 0xABCD
        var forget = Self.member("n4", .forgotten, at: 1_800_000_000_500, by: "n2")
        forget.incarnation = 0x1234
        let list = [alive, Self.member("n3", at: 1_800_000_000_100), forget]
        let beat = PeerMessage.Heartbeat(
            node: "n1", latestSequence: 0, clock: 0, incarnation: 1, api: "inproc://n1.api", progress: [:],
            members: list, capabilities: 3)
        guard case .heartbeat(let back) = try PeerMessage.decode(PeerMessage.heartbeat(beat).encode()) else {
            Issue.record("not a heartbeat")
            return
        }
        #expect(back.capabilities == 3)
        #expect(back.members?.map(\.incarnation) == [0xABCD, nil, 0x1234])
        // An earlier version's body ends after the capabilities: none named.
        var older = beat
        older.members = list.map { member in
            var copy = member
            copy.incarnation = nil
            return copy
        }
        guard case .heartbeat(let olderBack) = try PeerMessage.decode(PeerMessage.heartbeat(older).encode()) else {
            Issue.record("not a heartbeat")
            return
        }
        #expect(olderBack.members?.allSatisfy { $0.incarnation == nil } == true)
        #expect(olderBack.members == list, "equal without the incarnation")

        // A sender that takes no batches has no capabilities: the section still goes, after a 0.
        var plain = beat
        plain.capabilities = nil
        guard case .heartbeat(let plainBack) = try PeerMessage.decode(PeerMessage.heartbeat(plain).encode()) else {
            Issue.record("not a heartbeat")
            return
        }
        #expect(plainBack.members?.map(\.incarnation) == [0xABCD, nil, 0x1234] && plainBack.capabilities == 0)

        #expect(try Membership.decodeAnnounce(Membership.encodeAnnounce(alive)).incarnation == 0xABCD)
        #expect(try Membership.decodeAnnounce(Membership.encodeAnnounce(older.members![0])).incarnation == nil)

        #expect(try Membership.decodeFile(Membership.encodeFile(list)).map(\.incarnation) == [0xABCD, nil, 0x1234])
        var legacy = WireWriter(capacity: 64)
        for byte in Membership.legacyFileMagic { legacy.byte(byte) }
        legacy.varint(UInt64(list.count))
        for member in list { Membership.write(member, to: &legacy) }
        legacy.uint64(ReplicaStore.fnv1a(legacy.bytes))
        #expect(try Membership.decodeFile(legacy.bytes).allSatisfy { $0.incarnation == nil })

        var membership = Membership()
        let unnamed = try #require(older.members?.last)
        membership.merge(unnamed)
        let namedTaken = membership.merge(forget)
        #expect(namedTaken, "the same forget, naming the start it removes, is kept over the copy that does not")
        let unnamedTaken = membership.merge(unnamed)
        #expect(!unnamedTaken)
        #expect(membership.members["n4"]?.incarnation == 0x1234)
    }

    /// Entries are kept exactly as their node wrote them: a node bound to wildcard addresses is
    /// dialled at the host its stream comes from, but its entry is not rewritten — a rewritten
    /// copy sent back made it restate itself at every heartbeat (found in review).
    @Test func aWildcardEntryIsKeptAsWrittenAndDialledAtItsStreamsHost() throws {
        var configuration = MachineRunner.configuration("n2")
        configuration.peers = ["tcp://10.0.0.1:7001"]
        var node = MachineRunner(configuration)
        node.handle(.endpointsBound(publish: "tcp://10.0.0.2:7001", repair: "tcp://10.0.0.2:7101"))
        let wildcard = Membership.Member(
            id: "n1", publish: "tcp://0.0.0.0:7001", api: "tcp://0.0.0.0:7101", state: .alive,
            version: Version(milliseconds: 100, counter: 0, node: "n1"))
        let n3 = Membership.Member(
            id: "n3", publish: "tcp://0.0.0.0:7003", api: "", state: .alive,
            version: Version(milliseconds: 100, counter: 0, node: "n3"))
        node.handle(.peerMessage(peer: "tcp://10.0.0.1:7001", frames: Self.heartbeat("n1", members: [wildcard, n3])))
        #expect(node.machine.membership.members["n1"] == wildcard, "kept as written")
        #expect(node.subscribed.isEmpty, "n1 is linked at its configured endpoint; n3's wildcard is not dialable")

        var writer = Self.started("n1", peers: ["n2"])
        let before = try #require(writer.machine.membership.members["n1"])
        writer.handle(.peerMessage(peer: "inproc://n2", frames: Self.heartbeat("n2", members: [before])))
        #expect(writer.machine.membership.members["n1"] == before, "its own entry came back unchanged: no restatement")
    }

    /// A node that refused to run publishes no leave entry when it stops (it would undo a forget).
    @Test func aRefusingNodeSaysNothingMoreAboutItself() {
        var node = Self.started("n1", peers: ["n2"])
        node.handle(
            .peerMessage(
                peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0, progress: ["n1": 5])))
        #expect(node.refusals.count == 1)
        let before = node.published.count
        node.handle(.stop)
        #expect(node.published.count == before, "no heartbeat with a leave entry")
    }
}
