import Logging
import Testing

@testable import StateSync

/// Anti-entropy by state digest (PROTOCOL.md 11.4) on two node machines wired by hand: a node at
/// rest sends its state digest on its HEARTBEATs, a peer at rest at the same progress compares it
/// with its own, and a difference that lasts is counted, logged and shown in the status.
@Suite("Anti-entropy by state digest on the node machine")
struct AntiEntropyMachineTests {
    /// n1 and n2, peers of each other, both taking the deltas of a third origin, n3.
    struct Pair {
        var n1: MachineRunner
        var n2: MachineRunner
        private var sentBy1 = 0
        private var sentBy2 = 0

        init(logs: CapturedLogs? = nil) {
            let quiet = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
            n1 = MachineRunner(MachineRunner.configuration("n1", peers: ["n2", "n3"]), logger: logs?.logger ?? quiet)
            n2 = MachineRunner(MachineRunner.configuration("n2", peers: ["n1", "n3"]), logger: quiet)
            n1.handle(.endpointsBound(publish: "inproc://n1", repair: "inproc://n1.api"))
            n2.handle(.endpointsBound(publish: "inproc://n2", repair: "inproc://n2.api"))
        }

        /// Both take `delta` of n3 (or each its own).
        mutating func take(_ delta: Delta, n2 other: Delta? = nil) {
            n1.handle(.peerMessage(peer: "inproc://n3", frames: PeerMessage.delta(delta).encode()))
            n2.handle(.peerMessage(peer: "inproc://n3", frames: PeerMessage.delta(other ?? delta).encode()))
        }

        /// `beats` heartbeat intervals (100 ms) of both, each delivering what the other published.
        mutating func run(_ beats: Int, step: UInt64 = 100) {
            for _ in 0..<beats {
                n1.advance(step)
                n2.advance(step)
                for frames in n1.published[sentBy1...] { n2.handle(.peerMessage(peer: "inproc://n1", frames: frames)) }
                for frames in n2.published[sentBy2...] { n1.handle(.peerMessage(peer: "inproc://n2", frames: frames)) }
                sentBy1 = n1.published.count
                sentBy2 = n2.published.count
            }
        }
    }

    static func delta(_ sequence: UInt64, value: Int64, timeToLive: UInt64 = 0) -> Delta {
        Delta(
            channel: "c", model: "m",
            version: Version(milliseconds: 1_800_000_000_000 + sequence, counter: 0, node: "n3"),
            sequence: sequence,
            properties: [PropertyWrite(name: "n", value: .int(value), timeToLive: timeToLive)])
    }

    /// The state digests on the HEARTBEATs `node` published from `from` on (`nil`: none).
    static func digests(_ node: MachineRunner, from: Int = 0) -> [UInt64?] {
        node.published[from...].compactMap { frames in
            guard case .heartbeat(let beat)? = try? PeerMessage.decode(frames) else { return nil }
            return beat.stateDigest
        }
    }

    /// Equal deltas give equal digests: the nodes compare, and find nothing.
    @Test func equalStateAtEqualProgressAgrees() {
        var pair = Pair()
        for sequence in 1...3 as ClosedRange<UInt64> { pair.take(Self.delta(sequence, value: Int64(sequence))) }
        pair.run(10)
        #expect(pair.n1.machine.counters.digestComparisons > 0)
        #expect(pair.n2.machine.counters.digestComparisons > 0)
        #expect(pair.n1.machine.counters.stateDivergences == 0 && pair.n2.machine.counters.stateDivergences == 0)
        #expect(pair.n1.machine.status(now: pair.n1.now).divergedPeers.isEmpty)
    }

    /// Two different writes under one number of n3 with one version (what two starts under one
    /// id can write, PROTOCOL.md 7.5): sequence tracking sees nothing missing, and last-writer-
    /// wins keeps each node's own. The digests show it: once three comparisons in a row differ,
    /// each node reports the other, once (a counter, the status, an error in the log); a later
    /// write that overwrites the property on both ends it, and the report with it. A HEARTBEAT
    /// delivered twice is compared once.
    @Test func aDifferentWriteUnderOneNumberIsReportedUntilTheStatesAgree() throws {
        let logs = CapturedLogs()
        var pair = Pair(logs: logs)
        pair.take(Self.delta(1, value: 1))
        pair.take(Self.delta(2, value: 2), n2: Self.delta(2, value: 99))
        pair.run(3)  // the first HEARTBEAT has no digest: its progress is new
        #expect(pair.n1.machine.counters.digestComparisons == 2)
        #expect(pair.n1.machine.status(now: pair.n1.now).divergedPeers.isEmpty, "not after two comparisons")
        let last = try #require(pair.n2.published.last)
        pair.n1.handle(.peerMessage(peer: "inproc://n2", frames: last))
        #expect(pair.n1.machine.counters.digestComparisons == 2, "the same HEARTBEAT again")
        #expect(pair.n1.machine.status(now: pair.n1.now).divergedPeers.isEmpty)
        pair.run(1)
        #expect(pair.n1.machine.status(now: pair.n1.now).divergedPeers == ["n2"], "at the third")
        pair.run(10)
        #expect(pair.n1.machine.status(now: pair.n1.now).divergedPeers == ["n2"])
        #expect(pair.n2.machine.status(now: pair.n2.now).divergedPeers == ["n1"])
        #expect(pair.n1.machine.counters.stateDivergences == 1, "one report, however many comparisons")
        #expect(pair.n1.machine.counters.digestComparisons >= 10)
        let reported = logs.all.filter { $0.level == .error && $0.message.contains("state differs from a peer's") }
        #expect(reported.count == 1 && reported.first?.metadata["peer.id"] == "n2")
        pair.take(Self.delta(3, value: 3))
        pair.run(5)
        #expect(pair.n1.machine.status(now: pair.n1.now).divergedPeers.isEmpty)
        #expect(pair.n2.machine.status(now: pair.n2.now).divergedPeers.isEmpty)
        #expect(pair.n1.machine.counters.stateDivergences == 1)
        #expect(logs.all.contains { $0.level == .notice && $0.message.contains("agrees with a peer's again") })
    }

    /// A node that takes deltas at every interval is not at rest: its HEARTBEATs carry no
    /// digest (and it folds nothing for them); once its progress is the same as on its previous
    /// HEARTBEAT, they carry one.
    @Test func aNodeThatKeepsChangingSendsNoDigest() {
        var pair = Pair()
        for sequence in 1...8 as ClosedRange<UInt64> {
            pair.take(Self.delta(sequence, value: Int64(sequence)))
            pair.run(1)
        }
        #expect(Self.digests(pair.n1).allSatisfy { $0 == nil })
        let from = pair.n1.published.count
        pair.run(2)
        let digest = pair.n1.machine.store.digest
        #expect(Self.digests(pair.n1, from: from) == [digest, digest])
    }

    /// Nor is a node whose own write waits for its sync: its progress does not list it yet (a
    /// peer told of it could give up on it), but its state holds it. It sends no digest, and
    /// compares none of its peer's, equal lists and all.
    @Test func aNodeWhoseOwnWriteWaitsForItsSyncComparesNothing() {
        var pair = Pair()
        pair.take(Self.delta(1, value: 1))
        pair.n1.holdsSyncs = true
        let reply = pair.n1.request(
            .set, id: 1, ClientProtocol.encodeSet(DeletionMachineTests.address, [PropertyWrite(name: "x", value: 1)]))
        #expect(reply == nil, "answered once durable")
        pair.run(6)
        #expect(pair.n1.machine.heartbeatProgress == pair.n2.machine.heartbeatProgress)
        #expect(Self.digests(pair.n1).allSatisfy { $0 == nil })
        #expect(!Self.digests(pair.n2).allSatisfy { $0 == nil }, "n2 is at rest")
        #expect(pair.n1.machine.counters.digestComparisons == 0)
        pair.n1.releaseSyncs()
        pair.run(6)
        #expect(pair.n1.machine.counters.digestComparisons > 0)
        #expect(pair.n1.machine.counters.stateDivergences == 0)
    }

    /// A peer found diverged that then leaves (or is forgotten) is no longer reported: it is not
    /// compared with any more.
    @Test func aDivergedPeerThatLeavesIsNoLongerReported() {
        var pair = Pair()
        pair.take(Self.delta(1, value: 1), n2: Self.delta(1, value: 99))
        pair.run(6)
        #expect(pair.n1.machine.status(now: pair.n1.now).divergedPeers == ["n2"])
        let left = MembershipMachineTests.member("n2", .left, at: pair.n2.wall.milliseconds + 1)
        pair.n1.handle(
            PromptRepairMachineTests.heartbeat("n2", incarnation: pair.n2.machine.incarnation, members: [left]))
        #expect(pair.n1.machine.membership.members["n2"]?.state == .left)
        #expect(pair.n1.machine.status(now: pair.n1.now).divergedPeers.isEmpty)
        #expect(pair.n1.machine.counters.stateDivergences == 1)
    }

    /// A peer's snapshot holds all its server held, also writes above a gap of an origin,
    /// beyond the marks it gives (here n3's 2, covered through 1): until its server is heard at
    /// rest (which has no gap), or 20 heartbeat intervals and at least 10 s have passed, the node
    /// that merged it is not at rest. A server heard at rest ends the wait at once.
    @Test(arguments: [true, false])
    func aNodeThatMergedASnapshotWaitsForItsServerAtRest(serverHeard: Bool) {
        var pair = Pair()
        pair.take(Self.delta(1, value: 1))
        var held = ReplicaStore()
        _ = held.apply(Self.delta(1, value: 1))
        if !serverHeard { _ = held.apply(Self.delta(2, value: 2)) }  // above the server's gap
        _ = pair.n1.machine.merge(StateSnapshot(store: held, latestSequence: 0, progress: ["n3": 1]))
        pair.n1.machine.noteSnapshotMerged(from: serverHeard ? "inproc://n2" : "inproc://n4")
        pair.run(20)
        if serverHeard {
            #expect(pair.n1.machine.counters.digestComparisons > 0, "n2 was heard at rest")
            #expect(pair.n1.machine.counters.stateDivergences == 0)
            return
        }
        #expect(pair.n1.machine.counters.digestComparisons == 0, "n4 never rests")
        #expect(Self.digests(pair.n1).allSatisfy { $0 == nil })
        pair.run(100)  // 10 s
        #expect(pair.n1.machine.status(now: pair.n1.now).divergedPeers == ["n2"], "a difference that lasts")
    }

    /// A streamed snapshot given up after a page keeps what the page merged, and so the wait
    /// for its server; one given up before any page has nothing to wait for.
    @Test(arguments: [0, 1])
    func aSnapshotStreamGivenUpAfterAPageWaitsToo(pages: Int) {
        var pair = Pair()
        pair.take(Self.delta(1, value: 1))
        var stream = NodeMachine.SnapshotStream(peer: "inproc://n4")
        stream.pages = pages
        pair.n1.machine.repair.stream = stream
        pair.n1.machine.abandonStream()
        pair.run(20)
        #expect((pair.n1.machine.counters.digestComparisons == 0) == (pages > 0))
    }

    /// Split writes: peers hold one start's write or the other's under one number until the
    /// start that goes on mends them (PROTOCOL.md 7.5). Nothing is compared meanwhile, by the
    /// node mending them, nor by one that hears two starts of an id take turns (for the quiet
    /// time and the minute mending may take).
    @Test(arguments: ["mending", "hearing two starts"])
    func nothingIsComparedWhileSplitWritesMayBeHeld(what: String) {
        var pair = Pair()
        pair.take(Self.delta(1, value: 1), n2: Self.delta(1, value: 99))
        if what == "mending" {
            pair.n1.machine.splitWritesCheck = NodeMachine.SplitWritesCheck(from: 1, lastSign: pair.n1.now)
        } else {
            for incarnation in [5, 6, 5] as [UInt64] {
                pair.n1.handle(PromptRepairMachineTests.heartbeat("n4", incarnation: incarnation))
            }
        }
        pair.run(10)
        #expect(pair.n1.machine.counters.digestComparisons == 0)
        #expect(pair.n1.machine.status(now: pair.n1.now).divergedPeers.isEmpty)
    }

    /// A node that dropped its state (forgotten while away) or recovers its own deltas after it
    /// is not at rest: its state is not yet what its list says.
    @Test(arguments: ["reset unwritten", "recovering own deltas"])
    func aNodeRecoveringFromAResetSendsNoDigest(what: String) {
        var pair = Pair()
        pair.take(Self.delta(1, value: 1))
        if what == "reset unwritten" {
            pair.n1.machine.resetUnwritten = true
        } else {
            pair.n1.machine.repair.ownRecovery = StateSnapshot.OwnRecovery(through: 3, recovered: nil)
        }
        pair.run(6)
        #expect(Self.digests(pair.n1).allSatisfy { $0 == nil })
        #expect(!Self.digests(pair.n2).allSatisfy { $0 == nil }, "n2, at rest, sends its digest meanwhile")
        #expect(pair.n1.machine.counters.digestComparisons == 0)
    }

    /// A gap is not at rest either: a number known to exist and not held (here, 2 of n3's,
    /// with 3 held above it) keeps the digest off the HEARTBEATs until repair fills it.
    @Test func aNodeWithAGapSendsNoDigest() {
        var pair = Pair()
        pair.take(Self.delta(1, value: 1))
        pair.n1.handle(.peerMessage(peer: "inproc://n3", frames: PeerMessage.delta(Self.delta(3, value: 3)).encode()))
        pair.run(5)
        #expect(Self.digests(pair.n1).allSatisfy { $0 == nil })
        #expect(!Self.digests(pair.n2).allSatisfy { $0 == nil }, "n2, at rest, sends its digest meanwhile")
        #expect(pair.n1.machine.counters.digestComparisons == 0)
    }

    /// Replicas expire a value by their own clocks, a moment apart: while a value a node holds
    /// expires within `clock.max_drift_ms` (60 s) of its clock, or expired so, it compares
    /// nothing; once both are that far past the expiry, it compares again.
    @Test func nothingIsComparedWhileAValueExpiresNearby() {
        var pair = Pair()
        pair.take(Self.delta(1, value: 1, timeToLive: 30_000))
        pair.run(10)
        #expect(!Self.digests(pair.n1).allSatisfy { $0 == nil }, "the digests are sent")
        #expect(pair.n1.machine.counters.digestComparisons == 0, "but not compared: the value expires in 30 s")
        pair.run(100, step: 1000)  // the value expired at 30 s; 60 s more, and some
        #expect(pair.n1.machine.counters.valuesExpired == 1)
        #expect(pair.n1.machine.counters.digestComparisons > 0)
        #expect(pair.n1.machine.counters.stateDivergences == 0)
    }

    /// A replica that merged a value already expired (a peer's snapshot) knows when it expired,
    /// as one that expired it itself does: the expiry may be a moment ago on another clock.
    @Test func aMergedExpiredValueCountsAsAnExpiry() {
        var store = ReplicaStore()
        let register = ReplicaStore.Register(
            value: .int(1), version: Version(milliseconds: 5_000, counter: 0, node: "n3"), timeToLive: 700)
        _ = store.merge(ModelAddress(channel: "c", model: "m"), property: "n", register: register.expired)
        #expect(store.latestExpired == 5_700)
        var other = ReplicaStore()
        _ = other.merge(ModelAddress(channel: "c", model: "m"), property: "n", register: register)
        #expect(other.latestExpired == 0 && other.nextExpiry == 5_700)
        _ = other.expire(through: 6_000)
        #expect(other.latestExpired == 5_700)
    }
}
