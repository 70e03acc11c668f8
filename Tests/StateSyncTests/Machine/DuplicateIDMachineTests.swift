import Testing

@testable import StateSync

/// Two nodes under one id (PROTOCOL.md 7.5, "Two nodes under one id") on the node machine alone:
/// the start whose superseded entry is written again refuses to run; a peer that hears the id's
/// HEARTBEATs go back and forth between two incarnations says so; a restart is neither.
@Suite("Two nodes under one id on the node machine")
struct DuplicateIDMachineTests {
    typealias Member = Membership.Member

    /// An entry of `id`, alive unless said, written by `id` itself in `incarnation`, publishing
    /// at `publish`.
    static func entry(
        _ id: String, incarnation: UInt64, publish: String, after version: Version, _ state: Membership.State = .alive
    ) -> Member {
        Member(
            id: id, publish: publish, api: "\(publish).api", state: state,
            version: Version(milliseconds: version.milliseconds + 10, counter: 0, node: id), incarnation: incarnation)
    }

    /// `node` hears, one at a time, `signs` live entries of its id n1 written by `incarnation`,
    /// each newer than its own answer to the last: it refuses to run at the `refusesAt`th, not
    /// before (0: never).
    static func hearSigns(
        _ node: inout MachineRunner, of incarnation: UInt64, publish: String = "inproc://n1-copy", signs: Int,
        refusesAt: Int, sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        for heard in 1...signs {
            let own = try #require(node.machine.ownEntry, sourceLocation: sourceLocation)
            hear(entry("n1", incarnation: incarnation, publish: publish, after: own.version), at: &node)
            #expect(
                node.refusals.count == (refusesAt > 0 && heard >= refusesAt ? 1 : 0), "entry \(heard)",
                sourceLocation: sourceLocation)
        }
    }

    /// n1, started with its own delta 1 in its log, publishing at `publish`.
    static func startedWithAnOwnDelta(publish: String = "inproc://n1") -> MachineRunner {
        var recovery = NodeMachine.Recovery()
        recovery.deltas = [RepairMachineTests.delta("n1", 1)]
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]), recovery: recovery)
        node.handle(.endpointsBound(publish: publish, repair: "\(publish).api"))
        return node
    }

    /// `node` hears, in a HEARTBEAT of n2, a member list holding `member`.
    static func hear(_ member: Member, at node: inout MachineRunner) {
        node.handle(
            .peerMessage(
                peer: "inproc://n2", frames: MembershipMachineTests.heartbeat("n2", members: [member])))
    }

    @Test func aStartWhoseSupersededEntryIsWrittenAgainRefusesToRun() throws {
        var node = MembershipMachineTests.started("n1", peers: ["n2"])
        let other: UInt64 = 0x5EC0_0D00_0000_0000
        let first = try #require(node.machine.ownEntry)
        // Its first entry is superseded: it could be an earlier start's, heard late.
        Self.hear(Self.entry("n1", incarnation: other, publish: "inproc://n1-copy", after: first.version), at: &node)
        let answer = try #require(node.machine.ownEntry)
        #expect(node.refusals.isEmpty)
        #expect(answer.incarnation == node.machine.incarnation && answer.version > first.version)
        // The same entry again, and an older one of that start: nothing new from it.
        Self.hear(Self.entry("n1", incarnation: other, publish: "inproc://n1-copy", after: first.version), at: &node)
        #expect(node.refusals.isEmpty)

        // A newer entry of that start, written after this one superseded it: it runs.
        Self.hear(Self.entry("n1", incarnation: other, publish: "inproc://n1-copy", after: answer.version), at: &node)
        let refusal = try #require(node.refusals.first)
        #expect(node.refusals.count == 1)
        #expect(refusal.contains("another node runs with this node's id n1"), "\(refusal)")
        #expect(refusal.contains("inproc://n1-copy"), "names where the other publishes: \(refusal)")
        #expect(refusal.contains("another node.id"), "says what to do: \(refusal)")
        #expect(node.machine.counters.duplicateNodeIDs == 1)
        #expect(node.machine.ownEntry?.version == answer.version, "a refusing node writes nothing more about itself")
    }

    /// A node that started with deltas of its own holds the id's writes: it answers more of the
    /// other start's entries (which stops first, if it started without), and refuses at the
    /// eighth.
    @Test func aNodeWithItsOwnDeltasIsTheLastToRefuse() throws {
        var node = Self.startedWithAnOwnDelta()
        node.handle(.subscriberConnected)  // its peers take its stream
        try Self.hearSigns(&node, of: 0x5EC0_0D00_0000_0000, signs: 8, refusesAt: 8)
    }

    /// A node with writes of its own that no peer ever subscribed to (a copy of a node's data
    /// directory that joined through a seed: the peers link the other's endpoint for the id)
    /// holds nothing its peers take: it stops at the second sign. (An operator trial saw the
    /// long-running node stop and such a copy run on, linked by no one, its writes lost.)
    @Test func aNodeNoPeerSubscribesToStopsAtTheSecondSign() throws {
        var node = Self.startedWithAnOwnDelta(publish: "inproc://n1-copy")
        try Self.hearSigns(&node, of: 0x5EC0_0D00_0000_0000, publish: "inproc://n1", signs: 2, refusesAt: 2)
    }

    /// A node started empty holds the id's writes once it has numbered some and run for a
    /// minute (the cluster started empty: its nodes are the ids' holders); before that minute
    /// it is a newcomer, whatever it wrote, and stops at the second sign.
    @Test(arguments: [false, true])
    func aNodeStartedEmptyHoldsTheIDOnceItWroteAndRanAMinute(ranAMinute: Bool) throws {
        var node = MembershipMachineTests.started("n1", peers: ["n2"])
        node.handle(.subscriberConnected)
        let set = ClientProtocol.encodeSet(ModelAddress(channel: "c", model: "m"), [PropertyWrite(name: "x", value: 1)])
        #expect(node.request(.set, id: 1, set)?.0.kind == .ok)
        if ranAMinute { node.advance(NodeMachine.newcomerMilliseconds) }
        try Self.hearSigns(&node, of: 0x5EC0_0D00_0000_0000, signs: 8, refusesAt: ranAMinute ? 8 : 2)
    }

    /// A node started empty that holds writes its peers take (it wrote, ran a minute, is
    /// subscribed to) is not stopped by a peer's progress past its numbers once a peer's progress
    /// covered its numbering: those are another start's (the signs decide), and it numbers past
    /// them. Without that cover — a node wiped and cut off for a minute, whose first HEARTBEAT
    /// heard reports its earlier life's numbers — it stops as "Ids do not come back empty" says.
    /// (A review found the first version let the wiped node run on over its earlier numbers.)
    @Test(arguments: [false, true])
    func anEmptyStartStopsAtItsEarlierLifeUnlessPeersTookItsNumbering(taken: Bool) throws {
        var node = MembershipMachineTests.started("n1", peers: ["n2"])
        let set = ClientProtocol.encodeSet(ModelAddress(channel: "c", model: "m"), [PropertyWrite(name: "x", value: 1)])
        #expect(node.request(.set, id: 1, set)?.0.kind == .ok)
        node.advance(NodeMachine.newcomerMilliseconds + 1_000)
        node.handle(.subscriberConnected)
        if taken {
            node.handle(
                .peerMessage(
                    peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0, progress: ["n1": 1])))
        }
        node.handle(
            .peerMessage(
                peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0, progress: ["n1": 5])))
        #expect(node.refusals.count == (taken ? 0 : 1), "\(node.refusals)")
        if taken { #expect(node.machine.nextSequence == 6, "numbers past the other start's") }
    }

    /// Between two alike, the higher incarnation takes more signs: the lower stops first.
    @Test func theHigherIncarnationWaitsForMoreSigns() throws {
        var node = MembershipMachineTests.started("n1", peers: ["n2"])
        try Self.hearSigns(&node, of: 1, signs: 6, refusesAt: 6)
    }

    /// A node that lists the other start's endpoint among its peers hears its HEARTBEATs in its
    /// own id: the first is a sign, once (one each interval would outpace the entries' signs);
    /// with an entry of that start, two.
    @Test func aHeartbeatInItsOwnIDFromAnotherStartIsOneSign() throws {
        var node = MembershipMachineTests.started("n1", peers: ["n1", "n1-copy"])
        Self.hearBeats([("inproc://n1", node.machine.incarnation)], of: "n1", at: &node)
        #expect(node.refusals.isEmpty, "its own HEARTBEAT")
        let other: UInt64 = 0xC0B1_0000_0000_0000
        Self.hearBeats([("inproc://n1-copy", other), ("inproc://n1-copy", other)], of: "n1", at: &node)
        #expect(node.refusals.isEmpty, "one sign: it could be a stopped start's, late")
        let own = try #require(node.machine.ownEntry)
        Self.hear(Self.entry("n1", incarnation: other, publish: "inproc://n1-copy", after: own.version), at: &node)
        let refusal = try #require(node.refusals.first)
        #expect(refusal.contains("publishing at inproc://n1-copy"), "\(refusal)")
    }

    /// What a restart leaves behind is not another node: an earlier start's entries (its leave
    /// after its alive, its alive at a version its clock gave ahead), each superseded once, and
    /// entries of several earlier starts.
    @Test func earlierStartsEntriesAreSupersededWithoutRefusing() throws {
        var node = MembershipMachineTests.started("n1", peers: ["n2"])
        let start = try #require(node.machine.ownEntry)
        let earlier: UInt64 = 0xEA21
        Self.hear(Self.entry("n1", incarnation: earlier, publish: "inproc://n1", after: start.version), at: &node)
        var own = try #require(node.machine.ownEntry)
        // Its leave, later than this start's answer (its clock was ahead): not alive, no sign.
        Self.hear(Self.entry("n1", incarnation: earlier, publish: "inproc://n1", after: own.version, .left), at: &node)
        own = try #require(node.machine.ownEntry)
        // Another earlier start's alive entry, once.
        Self.hear(Self.entry("n1", incarnation: 0xEA22, publish: "inproc://n1", after: own.version), at: &node)
        // A forged alive entry in n1's name written by n2 is no start of n1's.
        own = try #require(node.machine.ownEntry)
        var forged = Self.entry("n1", incarnation: earlier, publish: "inproc://n1", after: own.version)
        forged.version = Version(milliseconds: forged.version.milliseconds, counter: 0, node: "n2")
        Self.hear(forged, at: &node)
        #expect(node.refusals.isEmpty, "\(node.refusals)")
        #expect(node.machine.counters.duplicateNodeIDs == 0)
        #expect(
            node.machine.ownEntry?.state == .alive && node.machine.ownEntry?.incarnation == node.machine.incarnation)
    }

    /// n1 hears HEARTBEATs of `id` from `endpoint` in `incarnation`, 100 ms apart (its heartbeat
    /// interval), in the order given.
    static func hearBeats(
        _ beats: [(endpoint: String, incarnation: UInt64)], of id: String, at node: inout MachineRunner
    ) {
        for beat in beats {
            node.advance(100)
            node.handle(
                .peerMessage(
                    peer: beat.endpoint,
                    frames: PeerMessage.heartbeat(
                        PeerMessage.Heartbeat(
                            node: id, latestSequence: 0, clock: 0, incarnation: beat.incarnation,
                            api: "\(beat.endpoint).api")
                    ).encode()))
        }
    }

    @Test func aPeerHearingOneIDAlternateBetweenTwoIncarnationsSaysSo() {
        var node = MembershipMachineTests.started("n1", peers: ["n2"])
        let a = (endpoint: "inproc://n2", incarnation: UInt64(0xA))
        let b = (endpoint: "inproc://n2-copy", incarnation: UInt64(0xB))
        Self.hearBeats([a, b, a, b], of: "n2", at: &node)
        #expect(
            node.machine.status(now: node.now).duplicateNodeIDs.isEmpty,
            "two returns could be a restart's overtaken beat")
        Self.hearBeats([a], of: "n2", at: &node)
        let status = node.machine.status(now: node.now)
        #expect(status.duplicateNodeIDs == ["n2": ["inproc://n2", "inproc://n2-copy"]])
        #expect(node.machine.counters.duplicateNodeIDs == 1)
        // Said once while it lasts, and in the status's wire form.
        Self.hearBeats([b, a, b, a], of: "n2", at: &node)
        #expect(node.machine.counters.duplicateNodeIDs == 1)
        #expect(NodeStatus(node.machine.status(now: node.now).value)?.duplicateNodeIDs == status.duplicateNodeIDs)

        // The copy stopped: once only one is heard for three intervals, it is over.
        Self.hearBeats([a, a, a, a], of: "n2", at: &node)
        #expect(node.machine.status(now: node.now).duplicateNodeIDs.isEmpty)
        // And said again if it comes back.
        Self.hearBeats([b, a, b, a, b], of: "n2", at: &node)
        #expect(node.machine.counters.duplicateNodeIDs == 2)
    }

    /// Two nodes that beat eight times slower than the one hearing them (its window of three of
    /// its own intervals would lose each between two beats) are still two nodes.
    @Test func twoSlowerNodesUnderOneIDAreSaidToo() {
        var node = MembershipMachineTests.started("n1", peers: ["n2"])
        let a = (endpoint: "inproc://n2", incarnation: UInt64(0xA))
        let b = (endpoint: "inproc://n2-copy", incarnation: UInt64(0xB))
        for beat in [a, b, a, b, a, b, a] {
            Self.hearBeats([beat], of: "n2", at: &node)
            node.advance(300)  // each beats every 800 ms, the two 400 ms apart
        }
        #expect(node.machine.counters.duplicateNodeIDs == 1)
    }

    /// A node restarted (at another endpoint: its port was chosen at bind), with the last
    /// HEARTBEAT of its stopped start overtaken by its new start's first, and restarted again:
    /// never two nodes.
    @Test func restartsAreNotTwoNodes() {
        var node = MembershipMachineTests.started("n1", peers: ["n2"])
        let first = (endpoint: "inproc://n2", incarnation: UInt64(0x1))
        let second = (endpoint: "inproc://n2-new", incarnation: UInt64(0x2))
        let third = (endpoint: "inproc://n2", incarnation: UInt64(0x3))
        Self.hearBeats(
            [first, first, first, second, first, second, second, second, second, second], of: "n2", at: &node)
        Self.hearBeats([third, second, third, third, third], of: "n2", at: &node)
        #expect(node.machine.status(now: node.now).duplicateNodeIDs.isEmpty)
        #expect(node.machine.counters.duplicateNodeIDs == 0)
    }
}
