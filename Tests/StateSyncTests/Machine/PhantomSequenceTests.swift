import Testing

@testable import StateSync

/// Announced sequence numbers that do not exist (PROTOCOL.md section 11.3): once every
/// connected peer, the origin among them, answered that it never held them, a node stops
/// fetching them and does not follow the same claims again; numbers that were only dropped from
/// histories still lead to a snapshot.
@Suite("Phantom sequence numbers")
struct PhantomSequenceTests {
    /// Answers every FETCH sent since `from` with nothing held and `droppedThrough`.
    static func answerEmpty(_ node: inout MachineRunner, from: Int, droppedThrough: UInt64) throws -> Int {
        let sent = node.repairRequests.count
        for index in from..<sent {
            let (peer, frames) = node.repairRequests[index]
            let header = try ClientProtocol.decodeRequestHeader(frames[0])
            guard header.command == ClientProtocol.Command.fetch.rawValue else { continue }
            node.handle(
                .repairReply(
                    peer: peer,
                    frames: ClientProtocol.encodeReply(
                        .ok, id: header.requestID,
                        body: ClientProtocol.encodeFetched([], droppedThrough: droppedThrough))))
        }
        return sent
    }

    static func heartbeats(_ node: inout MachineRunner, n1Latest: UInt64) {
        node.handle(.peerMessage(peer: "inproc://n1", frames: RepairMachineTests.heartbeat("n1", latest: n1Latest)))
        for peer in ["n2", "n3"] {
            node.handle(.peerMessage(peer: "inproc://\(peer)", frames: RepairMachineTests.heartbeat(peer, latest: 0)))
        }
    }

    /// n4, connected to n1, n2 and n3, holding n3's third delta but not the two before, once n1's
    /// list says n3 was forgotten (its links dropped).
    static func missingAForgottenMembersDeltas() -> MachineRunner {
        var node = RepairMachineTests.connectedNode()
        node.handle(
            .peerMessage(peer: "inproc://n3", frames: PeerMessage.delta(RepairMachineTests.delta("n3", 3)).encode()))
        let forgotten = MembershipMachineTests.member("n3", .forgotten, at: 1_800_000_000_500, by: "n1")
        node.handle(
            .peerMessage(
                peer: "inproc://n1",
                frames: MembershipMachineTests.heartbeat(
                    "n1", members: [MembershipMachineTests.member("n1", at: 1_800_000_000_400), forgotten])))
        return node
    }

    /// Rounds until `node` (``missingAForgottenMembersDeltas()``) gave up n3's missing numbers:
    /// n1 and n2 answer every FETCH that they hold none, and say so in their HEARTBEATs.
    static func giveUpTheForgottenGap(_ node: inout MachineRunner) throws {
        var answered = 0
        for _ in 0..<10 where node.machine.missingDeltas > 0 {
            node.advance(60)
            answered = try Self.answerEmpty(&node, from: answered, droppedThrough: 0)
            for peer in ["n1", "n2"] {
                node.handle(
                    .peerMessage(peer: "inproc://\(peer)", frames: RepairMachineTests.heartbeat(peer, latest: 0)))
            }
        }
    }

    /// 7.5: a forgotten member's deltas that no connected peer holds are given up, also below
    /// one this node received before the forget (simulator seed 2064: n1 held n3's 552nd delta,
    /// lacked 1...551, and asked for them and for snapshots for ever). No snapshot is asked for.
    @Test func aForgottenMembersGapNoPeerHoldsIsGivenUp() throws {
        var node = Self.missingAForgottenMembersDeltas()
        #expect(node.machine.missingDeltas == 2)
        #expect(!node.machine.peerEndpoints.contains("inproc://n3"))
        try Self.giveUpTheForgottenGap(&node)
        #expect(node.machine.missingDeltas == 0)
        #expect(!RepairMachineTests.requests(node).contains { $0.command == .snapshot })
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "m"))["n"]?.value == 3)
    }

    /// n1 announces 5,000 deltas it never wrote: every peer, n1 included, answers it never held
    /// them; the node stops waiting, counts them, and n1's same claim is not followed again. A
    /// real later delta of n1 still arrives.
    @Test func numbersNoPeerEverHeldAreNoLongerAwaited() throws {
        var node = RepairMachineTests.connectedNode()
        Self.heartbeats(&node, n1Latest: 5000)
        #expect(node.machine.missingDeltas == 5000)
        var answered = 0
        for _ in 0..<20 where node.machine.missingDeltas > 0 {
            node.advance(60)
            answered = try Self.answerEmpty(&node, from: answered, droppedThrough: 0)
            Self.heartbeats(&node, n1Latest: 5000)
        }
        #expect(node.machine.missingDeltas == 0)
        #expect(node.machine.counters.phantomSequences == 5000)
        #expect(
            !RepairMachineTests.requests(node).contains { $0.command == .snapshot },
            "no snapshot for numbers that never existed")
        // The same claim again changes nothing; fetching has stopped.
        let requestsBefore = node.repairRequests.count
        Self.heartbeats(&node, n1Latest: 5000)
        node.advance(60)
        node.advance(60)
        #expect(node.machine.missingDeltas == 0 && node.repairRequests.count == requestsBefore)
        // A real delta of n1 is taken as usual.
        node.handle(
            .peerMessage(peer: "inproc://n1", frames: PeerMessage.delta(RepairMachineTests.delta("n1", 1)).encode()))
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "m"))["n"]?.value == 1)
        // A new claim is followed: an honest origin's latest grows as it writes.
        Self.heartbeats(&node, n1Latest: 2)
        #expect(node.machine.missingDeltas == 1)
        node.advance(60)
        #expect(RepairMachineTests.requests(node, from: requestsBefore).contains { $0.fetch?.range == 2...2 })
    }

    /// Numbers the peers dropped from their histories (not never held) still lead to a snapshot,
    /// as before: nothing is given up that a peer once had.
    @Test func droppedNumbersStillLeadToASnapshot() throws {
        var node = RepairMachineTests.connectedNode()
        Self.heartbeats(&node, n1Latest: 5000)
        var answered = 0
        for _ in 0..<20 where !RepairMachineTests.requests(node).contains(where: { $0.command == .snapshot }) {
            node.advance(60)
            answered = try Self.answerEmpty(&node, from: answered, droppedThrough: 4000)
            Self.heartbeats(&node, n1Latest: 5000)
        }
        #expect(RepairMachineTests.requests(node).contains { $0.command == .snapshot })
        #expect(node.machine.counters.phantomSequences == 0)
        #expect(node.machine.missingDeltas == 5000)
    }
}
