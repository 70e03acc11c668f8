import Testing

@testable import StateSync

/// Settling after a power loss on the node machine alone (PROTOCOL.md section 11.2): a node that
/// published before syncing (`storage.fsync: interval`, or `always` with `storage.publish:
/// written`) and whose OS went down since numbers no
/// write until every peer said which of its possibly lost deltas it holds.
@Suite("Settling after a power loss on the node machine")
struct SettlingMachineTests {
    static let set = ClientProtocol.encodeRequest(
        .set, id: 7,
        body: ClientProtocol.encodeSet(ModelAddress(channel: "c", model: "m"), [PropertyWrite(name: "n", value: 100)]))

    /// Node n1, which had reserved 1…`reserved` in an earlier boot and recovered `recovered` own
    /// deltas, with peers n2 and n3.
    static func restarted(
        reserved: UInt64, inThisBoot: Bool = false, recovered: UInt64 = 2, policy: Policy = .interval
    ) -> MachineRunner {
        var configuration = MachineRunner.configuration("n1", peers: ["n2", "n3"])
        configuration.fsync = policy == .interval ? .interval : .always
        configuration.publishBeforeSync = policy == .alwaysWritten
        var recovery = NodeMachine.Recovery(deltas: (1...recovered).map { RepairMachineTests.delta("n1", $0) })
        recovery.reservedSequence = reserved
        recovery.reservedInThisBoot = inThisBoot
        return MachineRunner(configuration, recovery: recovery)
    }

    /// How the node publishes now: the reservation, not the setting, says whether it settles
    /// (a node restarted with `synced` after a power loss while it ran with `written` settles).
    enum Policy: CaseIterable, Sendable { case interval, alwaysWritten, alwaysSynced }

    static func status(_ node: inout MachineRunner) -> NodeStatus {
        let now = node.now
        return node.machine.status(now: now)
    }

    static func connect(_ node: inout MachineRunner, _ peers: [String]) {
        for peer in peers {
            node.handle(.peerMessage(peer: "inproc://\(peer)", frames: RepairMachineTests.heartbeat(peer, latest: 0)))
        }
    }

    /// The FETCHes of the node's own origin sent since `from`: (peer, range, request id).
    static func ownFetches(_ node: MachineRunner, from: Int = 0) -> [(
        peer: String, range: ClosedRange<UInt64>, id: UInt64
    )] {
        node.repairRequests[from...].compactMap { peer, frames in
            guard let header = try? ClientProtocol.decodeRequestHeader(frames[0]),
                header.command == ClientProtocol.Command.fetch.rawValue,
                let fetch = try? ClientProtocol.decodeFetch(frames[1]), fetch.origin == "n1"
            else { return nil }
            return (peer, fetch.range, header.requestID)
        }
    }

    static func answer(
        _ node: inout MachineRunner, _ fetch: (peer: String, range: ClosedRange<UInt64>, id: UInt64), holding: [UInt64],
        droppedThrough: UInt64 = 0
    ) {
        let deltas = holding.filter(fetch.range.contains).map { RepairMachineTests.delta("n1", $0) }
        node.handle(
            .repairReply(
                peer: fetch.peer,
                frames: ClientProtocol.encodeReply(
                    .ok, id: fetch.id, body: ClientProtocol.encodeFetched(deltas, droppedThrough: droppedThrough))))
    }

    /// A SET waits while the node settles; every peer is asked for 3…reservation, page by page;
    /// the deltas they hold come back (also one above a gap, which no contiguous mark shows); the
    /// SET is then numbered after the highest any of them held.
    @Test(arguments: Policy.allCases)
    func aSetWaitsUntilEveryPeerSaidWhatItHolds(policy: Policy) throws {
        var node = Self.restarted(reserved: 2 + 2500, policy: policy)
        #expect(Self.status(&node).settling)
        let storage = Self.status(&node).storage
        switch policy {
        case .interval:
            #expect(storage == NodeStatus.Storage(fsync: "interval", publish: "written", intervalMilliseconds: 50))
        case .alwaysWritten: #expect(storage == NodeStatus.Storage(fsync: "always", publish: "written"))
        case .alwaysSynced: #expect(storage == NodeStatus.Storage(fsync: "always", publish: "synced"))
        }
        node.handle(.clientRequest(client: [9], frames: Self.set))
        #expect(node.sent.isEmpty && node.logBytes.isEmpty, "held: not logged, not answered")
        #expect(Self.status(&node).writesHeld == 1)
        Self.connect(&node, ["n2", "n3"])
        node.advance(60)
        var fetches = Self.ownFetches(node)
        #expect(fetches.map(\.peer).sorted() == ["inproc://n2", "inproc://n3"])
        #expect(fetches.allSatisfy { $0.range == 3...2002 }, "at most 2000 numbers a FETCH")
        // n2 holds 3, 4 and 6 (5 was lost everywhere); n3 holds 3 and 4.
        for fetch in fetches { Self.answer(&node, fetch, holding: fetch.peer.hasSuffix("n2") ? [3, 4, 6] : [3, 4]) }
        let second = Self.ownFetches(node, from: fetches.count)
        #expect(second.count == 2 && second.allSatisfy { $0.range == 2003...2502 }, "the next page at once")
        #expect(node.sent.isEmpty, "still held: not every peer answered all of it")
        fetches = second
        Self.answer(&node, fetches[0], holding: [])
        #expect(node.sent.isEmpty)
        Self.answer(&node, fetches[1], holding: [])
        #expect(!Self.status(&node).settling)
        node.advance(1)  // with `always`, the OK waits for the sync of the turn's end
        let reply = try #require(node.sent.first)
        #expect(reply.client == [9])
        let header = try ClientProtocol.decodeReplyHeader(reply.frames[0])
        #expect(header.kind == .ok && header.requestID == 7)
        #expect(node.machine.nextSequence == 8, "numbered 7, after the 6 a peer held")
        #expect(Self.status(&node).counters["own_deltas_taken_back"] == 3, "3, 4 and 6")
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "m"))["n"]?.value == 100)
    }

    /// Live models' writes wait too, as the round they came in (a single set's property in the
    /// round's array, a transaction's in its own): counted while held, then numbered in order
    /// after the highest number a peer held, each with exactly its properties.
    @Test func aRoundOfLocalWritesWaitsAndIsNumberedInOrderOnceSettled() throws {
        var node = Self.restarted(reserved: 40)
        let address = ModelAddress(channel: "c", model: "m")
        var round = LocalWriteRound(capacity: 64)
        round.append(
            address: address, version: node.machine.clock.next(), property: PropertyWrite(name: "a", value: 1),
            emitter: 0)
        round.append(
            LocalWrite(
                address: address, version: node.machine.clock.next(),
                writes: [PropertyWrite(name: "b", value: 2), PropertyWrite(name: "c", value: 3)]))
        node.handle(.localRound(round))
        #expect(Self.status(&node).settling)
        #expect(Self.status(&node).writesHeld == 2)
        #expect(node.logBytes.isEmpty, "held: not logged")
        Self.connect(&node, ["n2", "n3"])
        node.advance(60)
        for fetch in Self.ownFetches(node) {
            Self.answer(&node, fetch, holding: fetch.peer.hasSuffix("n2") ? [3, 5] : [])
        }
        #expect(!Self.status(&node).settling)
        #expect(node.machine.nextSequence == 8, "numbered 6 and 7, after the 5 a peer held")
        let held = node.machine.store.properties(of: address)
        #expect(held["a"]?.value == 1 && held["b"]?.value == 2 && held["c"]?.value == 3)
        #expect(held["a"]?.version == round.entries[0].version && held["c"]?.version == round.entries[1].version)
    }

    /// Numbers a peer held and dropped from its history exist too: the next number goes past
    /// them.
    @Test func numbersAPeerDroppedAreNotReused() {
        var node = Self.restarted(reserved: 40)
        Self.connect(&node, ["n2", "n3"])
        node.advance(60)
        for fetch in Self.ownFetches(node) {
            Self.answer(&node, fetch, holding: [], droppedThrough: fetch.peer.hasSuffix("n3") ? 9 : 0)
        }
        #expect(!Self.status(&node).settling)
        #expect(node.machine.nextSequence == 10)
    }

    /// A peer that does not answer holds the writes back: a FETCH unanswered for 1000 ms is sent
    /// again, and the writes wait until it is answered.
    @Test func aPeerThatDoesNotAnswerHoldsWritesBack() throws {
        var node = Self.restarted(reserved: 40)
        node.handle(.clientRequest(client: [9], frames: Self.set))
        #expect(
            Self.status(&node).settlingWaitsFor == [
                .init(endpoint: "inproc://n2", node: nil, reachable: false),
                .init(endpoint: "inproc://n3", node: nil, reachable: false),
            ], "configured, not heard yet")
        Self.connect(&node, ["n2", "n3"])
        node.advance(60)
        for fetch in Self.ownFetches(node) where fetch.peer.hasSuffix("n2") { Self.answer(&node, fetch, holding: []) }
        let waiting = Self.status(&node)
        #expect(waiting.settlingWaitsFor == [.init(endpoint: "inproc://n3", node: "n3", reachable: true)])
        #expect(NodeStatus(waiting.value) == waiting, "read back from its wire form")
        #expect(waiting.notReadyReasons.last?.hasSuffix(" — waiting for n3") == true, "\(waiting.notReadyReasons)")
        // An older node's status has neither key: it says nothing of what it waits for.
        guard case .map(var older) = waiting.value else {
            Issue.record("not a map")
            return
        }
        older["settling_waits_for"] = nil
        older["storage"] = nil
        let read = try #require(NodeStatus(.map(older)))
        #expect(read.settlingWaitsFor == nil && read.storage == nil && read.settlingWaitsText.isEmpty)
        #expect(read.notReadyReasons.last?.hasSuffix("this node's deltas it holds") == true)
        let asked = Self.ownFetches(node).count
        for _ in 0..<11 {
            Self.connect(&node, ["n2", "n3"])  // alive: heartbeats, but no answer
            node.advance(100)
        }
        #expect(Self.status(&node).settling)
        #expect(node.sent.isEmpty)
        let again = Self.ownFetches(node, from: asked)
        #expect(again.map(\.peer) == ["inproc://n3"] && again.first?.range == 3...40, "asked again after the timeout")
        let retry = try #require(again.first)
        Self.answer(&node, retry, holding: [])
        #expect(!Self.status(&node).settling && node.sent.count == 1)
        #expect(Self.status(&node).settlingWaitsFor == [])
    }

    /// A reservation made in this boot (a process crash: what the node wrote survived it), or
    /// none beyond the log (a clean stop released it), leaves nothing to settle.
    @Test func aProcessCrashOrACleanStopLeavesNothingToSettle() {
        var crashed = Self.restarted(reserved: 40, inThisBoot: true)
        #expect(!Self.status(&crashed).settling)
        var stopped = Self.restarted(reserved: 2, inThisBoot: false)
        #expect(!Self.status(&stopped).settling)
    }

    /// A node with no peers has no one to ask: it settles at its first tick.
    @Test func aLoneNodeSettlesAtOnce() {
        var configuration = MachineRunner.configuration("n1")
        configuration.fsync = .interval
        var recovery = NodeMachine.Recovery()
        recovery.reservedSequence = 40
        recovery.reservedInThisBoot = false
        var node = MachineRunner(configuration, recovery: recovery)
        node.handle(.clientRequest(client: [9], frames: Self.set))
        #expect(node.sent.isEmpty)
        node.advance(60)
        #expect(node.sent.count == 1 && node.machine.nextSequence == 2)
    }

    /// A member that left (stopped cleanly) may hold the lost deltas and come back with them:
    /// the node waits for it too, and asks it once it is back.
    @Test func aMemberThatLeftIsWaitedFor() throws {
        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        configuration.fsync = .interval
        var recovery = NodeMachine.Recovery(deltas: [RepairMachineTests.delta("n1", 1)])
        recovery.reservedSequence = 30
        recovery.reservedInThisBoot = false
        recovery.members = [MembershipMachineTests.member("n3", .left, at: 1_700_000_000_000)]
        var node = MachineRunner(configuration, recovery: recovery)
        node.handle(.clientRequest(client: [9], frames: Self.set))
        Self.connect(&node, ["n2"])
        node.advance(60)
        for fetch in Self.ownFetches(node) { Self.answer(&node, fetch, holding: []) }
        node.advance(60)
        #expect(Self.status(&node).settling, "n3 left and has not said what it holds")
        let waits = try #require(Self.status(&node).settlingWaitsFor)
        #expect(
            waits.map(\.name) == ["n3"] && waits.allSatisfy { !$0.reachable }, "named by its member entry: \(waits)")
        #expect(node.sent.isEmpty)
        // n3 comes back (a newer alive entry), is linked, asked, and answers: it holds 2 and 3.
        let back = MembershipMachineTests.member("n3", at: 1_800_000_000_000)
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: MembershipMachineTests.heartbeat("n2", members: [back])))
        node.handle(.peerMessage(peer: "inproc://n3", frames: RepairMachineTests.heartbeat("n3", latest: 0)))
        let asked = node.repairRequests.count
        node.advance(60)
        let fetches = Self.ownFetches(node, from: asked)
        #expect(fetches.map(\.peer) == ["inproc://n3"])
        for fetch in fetches { Self.answer(&node, fetch, holding: [2, 3]) }
        #expect(!Self.status(&node).settling)
        #expect(node.machine.nextSequence == 5, "the held SET took 4")
    }

    /// While settling, a SET is checked before it is held (a malformed one is refused at once),
    /// and a node stopped before it settled tells the held SET's client, and keeps its
    /// reservation (it must settle at its next start).
    @Test func heldWritesAreCheckedFirstAndRefusedAtStop() throws {
        var node = Self.restarted(reserved: 40)
        node.handle(
            .clientRequest(
                client: [8], frames: ClientProtocol.encodeRequest(.set, id: 5, body: [0xFF, 0xFF, 0xFF])))
        let refused = try #require(node.sent.first)
        #expect(refused.client == [8])
        #expect(try ClientProtocol.decodeReplyHeader(refused.frames[0]).kind == .error)
        node.handle(.clientRequest(client: [9], frames: Self.set))
        #expect(node.sent.count == 1, "the valid SET is held")
        node.handle(.stop)
        let answer = try #require(node.sent.last)
        #expect(answer.client == [9])
        #expect(try ClientProtocol.decodeReplyHeader(answer.frames[0]).kind == .error)
        #expect(node.reservations.allSatisfy { $0 >= 40 }, "the reservation is not lowered: \(node.reservations)")
    }

    /// Settled, the node writes its reservation again, made in this boot: a process crash later
    /// has nothing to settle.
    @Test func settlingRenewsTheReservationInThisBoot() {
        var node = Self.restarted(reserved: 40)
        Self.connect(&node, ["n2", "n3"])
        node.advance(60)
        for fetch in Self.ownFetches(node) { Self.answer(&node, fetch, holding: []) }
        #expect(!Self.status(&node).settling)
        #expect(node.reservations == [40])
    }

    /// Every peer answered, the new reservation not yet durable: still settling, and waiting for
    /// no peer (not even one linked since, which is not asked); STATUS says so.
    @Test func onceEveryPeerAnsweredItWaitsOnlyForItsReservation() {
        var node = Self.restarted(reserved: 40)
        node.reportsReservations = false
        Self.connect(&node, ["n2", "n3"])
        node.advance(60)
        for fetch in Self.ownFetches(node) { Self.answer(&node, fetch, holding: []) }
        let status = Self.status(&node)
        #expect(status.settling && status.settlingWaitsFor == [])
        #expect(status.settlingWaitsText == " — no peer left to hear from: making its new reservation durable")
        #expect(node.reservations == [40])
    }
}
