import Testing

@testable import StateSync

/// The collection of deletions (PROTOCOL.md 8.4) on node machines wired by hand: a deletion goes
/// once every member holds it and everything before it, and it is old enough; a member that is
/// down holds it back until it is forgotten; a node that was forgotten while away takes the
/// cluster's state instead of bringing deleted data back; a watch whose client missed a collected
/// deletion is told of it.
@Suite("Collecting deletions on the node machine")
struct CollectionMachineTests {
    static let address = ModelAddress(channel: "c", model: "m")

    /// Machines that deliver each other's published messages when `exchange` says so (no repair
    /// here: a node cut off gets what it missed once it is back, in order).
    struct Cluster {
        var nodes: [MachineRunner]
        /// Per sender, per receiver, how many of the sender's messages were delivered.
        var delivered: [[Int]]
        /// Nodes cut off: nothing reaches them or comes from them until they are back.
        var silent: Set<Int> = []

        init(
            _ ids: [String], grace: Int = 0, fsync: NodeConfiguration.FsyncPolicy = .always, historyDeltas: Int? = nil,
            logs: CapturedLogs? = nil
        ) {
            nodes = ids.map { id in
                var configuration = MachineRunner.configuration(id, peers: ids.filter { $0 != id })
                configuration.tombstoneGraceMilliseconds = grace
                configuration.fsync = fsync
                if let historyDeltas { configuration.historyDeltas = historyDeltas }
                var node = logs.map { MachineRunner(configuration, logger: $0.logger) } ?? MachineRunner(configuration)
                // The nodes learn that their peers know them from the member lists they exchange
                // (PROTOCOL.md 7.5), as real nodes do.
                node.peersKnowThisNode = false
                node.handle(.endpointsBound(publish: "inproc://\(id)", repair: "inproc://\(id).api"))
                return node
            }
            delivered = ids.map { _ in ids.map { _ in 0 } }
        }

        /// `rounds` heartbeat intervals: every node ticks, then gets what the others published.
        mutating func exchange(rounds: Int) {
            for _ in 0..<rounds {
                for index in nodes.indices { nodes[index].advance(100) }
                for from in nodes.indices where !silent.contains(from) {
                    for to in nodes.indices where to != from && !silent.contains(to) { deliver(from: from, to: to) }
                }
            }
        }

        /// After the members met, cuts node `index` off, forgets it on node 0 (FORGET, accepted
        /// once node 0 stops hearing it) and lets the others go on; `index` stays cut off.
        /// Returns whether the FORGET was accepted.
        mutating func forgetCutOffNode(_ index: Int) -> Bool {
            exchange(rounds: 12)
            silent = [index]
            exchange(rounds: 5)
            var body = WireWriter()
            body.string(nodes[index].machine.configuration.nodeID)
            let accepted = nodes[0].request(.forget, id: 9, body.bytes)?.0.kind == .ok
            exchange(rounds: 5)
            return accepted
        }

        /// Node `index` restarts on `recovery` (what its files held): what it and its peers had
        /// published before is gone with the process.
        mutating func restart(_ index: Int, on recovery: NodeMachine.Recovery) {
            let configuration = nodes[index].machine.configuration
            var node = MachineRunner(configuration, recovery: recovery)
            node.peersKnowThisNode = false
            let id = configuration.nodeID
            node.handle(.endpointsBound(publish: "inproc://\(id)", repair: "inproc://\(id).api"))
            nodes[index] = node
            for other in nodes.indices {
                delivered[index][other] = 0
                delivered[other][index] = nodes[other].published.count
            }
        }

        /// Hands node `to` what node `from` published since it last did, without a tick.
        mutating func deliver(from: Int, to: Int) {
            let peer = "inproc://\(nodes[from].machine.configuration.nodeID)"
            for frames in nodes[from].published[delivered[from][to]...] {
                nodes[to].handle(.peerMessage(peer: peer, frames: frames))
            }
            delivered[from][to] = nodes[from].published.count
        }

        mutating func set(on index: Int, _ id: UInt64, _ writes: [PropertyWrite]) -> Version? {
            let reply = nodes[index].request(
                .set, id: id, ClientProtocol.encodeSet(CollectionMachineTests.address, writes))
            return reply.flatMap { try? ClientProtocol.decodeVersion(Array($0.1.dropLast())) }
        }

        mutating func delete(on index: Int, _ id: UInt64, _ names: [String] = []) -> Version? {
            let reply = nodes[index].request(
                .delete, id: id, ClientProtocol.encodeDelete(CollectionMachineTests.address, properties: names))
            return reply.flatMap { try? ClientProtocol.decodeVersion(Array($0.1.dropLast())) }
        }

        func tombstones(_ index: Int) -> Int { nodes[index].machine.store.tombstones }
    }

    @Test func aDeletionIsCollectedOnceEveryMemberHoldsItAndEverythingBefore() throws {
        var cluster = Cluster(["n1", "n2"])
        cluster.exchange(rounds: 12)  // member lists and floors
        _ = cluster.set(on: 0, 1, [PropertyWrite(name: "x", value: 1)])
        cluster.exchange(rounds: 2)
        let deleted = cluster.delete(on: 0, 2, ["x"])
        let deletion = try #require(deleted)
        #expect(cluster.tombstones(0) == 1)
        // n2 has not heard of it: n1 keeps it, however long.
        cluster.silent = [1]
        cluster.exchange(rounds: 30)
        #expect(cluster.tombstones(0) == 1, "n2 does not hold the deletion yet")
        #expect(cluster.nodes[0].machine.status(now: cluster.nodes[0].now).collectionHeldBy == "n2")
        cluster.silent = []
        cluster.exchange(rounds: 25)
        #expect(cluster.tombstones(0) == 0 && cluster.tombstones(1) == 0)
        for node in cluster.nodes {
            #expect(node.machine.store.collectedThrough >= deletion.timestamp)
            #expect(node.machine.counters.tombstonesCollected == 1)
        }
        // What it deleted stays deleted: an older write arriving now would be a bug upstream, but
        // a newer one wins as always.
        _ = cluster.set(on: 1, 3, [PropertyWrite(name: "x", value: 2)])
        cluster.exchange(rounds: 2)
        #expect(cluster.nodes[0].machine.store.properties(of: Self.address)["x"]?.value == 2)
    }

    @Test func aMemberThatIsDownHoldsCollectionBackUntilItIsForgotten() throws {
        var cluster = Cluster(["n1", "n2", "n3"])
        cluster.exchange(rounds: 12)
        _ = cluster.set(on: 0, 1, [PropertyWrite(name: "x", value: 1)])
        cluster.exchange(rounds: 2)
        cluster.silent = [2]  // n3 goes down
        _ = cluster.delete(on: 0, 2)
        cluster.exchange(rounds: 40)
        #expect(cluster.tombstones(0) == 1 && cluster.tombstones(1) == 1)
        #expect(cluster.nodes[0].machine.status(now: cluster.nodes[0].now).collectionHeldBy == "n3")
        var body = WireWriter()
        body.string("n3")
        let forget = cluster.nodes[0].request(.forget, id: 9, body.bytes)
        #expect(forget?.0.kind == .ok, "\(forget.map { (try? ClientProtocol.decodeError($0.1).message) ?? "" } ?? "")")
        cluster.exchange(rounds: 25)
        #expect(cluster.tombstones(0) == 0 && cluster.tombstones(1) == 0)
    }

    @Test func aStableDeletionWaitsForTheGracePeriod() throws {
        var cluster = Cluster(["n1", "n2"], grace: 5_000)
        cluster.exchange(rounds: 12)
        _ = cluster.delete(on: 0, 1, ["x"])
        cluster.exchange(rounds: 30)  // 3 s: stable, not old enough
        #expect(cluster.tombstones(0) == 1)
        cluster.exchange(rounds: 30)  // 6 s
        #expect(cluster.tombstones(0) == 0)
    }

    /// 8.4: a HEARTBEAT's floor is below every own write not yet published (here, with
    /// `storage.fsync: interval`, waiting for a sequence reservation the host has not made yet),
    /// and at most the clock's last timestamp.
    @Test func theFloorIsBelowEveryUnpublishedOwnWrite() throws {
        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        configuration.fsync = .interval
        configuration.fsyncIntervalMilliseconds = 60_000
        var node = MachineRunner(configuration)
        node.reportsReservations = false
        let reply = node.request(
            .set, id: 1, ClientProtocol.encodeSet(Self.address, [PropertyWrite(name: "x", value: 1)]))
        let body = try #require(reply?.1)
        let written = try ClientProtocol.decodeVersion(Array(body.dropLast()))
        node.advance(600)
        let beats = node.published.compactMap { frames -> PeerMessage.Heartbeat? in
            guard case .heartbeat(let beat)? = try? PeerMessage.decode(frames) else { return nil }
            return beat
        }
        #expect(!beats.isEmpty && beats.allSatisfy { $0.clock < written.timestamp })
        #expect(node.machine.published == 0, "still waiting for its reservation")
    }

    /// n1 and n2; n2 writes a value, is cut off, n1 deletes a model meanwhile and forgets n2
    /// (FORGET answered OK); n2 is still cut off.
    static func n2WithAStaleValueForgottenWhileCutOff(logs: CapturedLogs? = nil) -> Cluster {
        var cluster = Cluster(["n1", "n2"], logs: logs)
        cluster.exchange(rounds: 12)
        _ = cluster.set(on: 1, 1, [PropertyWrite(name: "stale", value: "deleted since")])
        cluster.exchange(rounds: 2)
        cluster.silent = [1]
        _ = cluster.delete(on: 0, 2)
        var body = WireWriter()
        body.string("n2")
        cluster.exchange(rounds: 5)
        #expect(cluster.nodes[0].request(.forget, id: 9, body.bytes)?.0.kind == .ok)
        return cluster
    }

    /// 7.5 and 8.4: a node forgotten while it was away drops what it holds (its peers may have
    /// collected deletions of it) and asks a peer for its state; it says it is alive again.
    @Test func aNodeForgottenWhileAwayTakesThePeersStateInsteadOfItsOwn() throws {
        let logs = CapturedLogs()
        var cluster = Self.n2WithAStaleValueForgottenWhileCutOff(logs: logs)
        cluster.exchange(rounds: 25)
        #expect(cluster.tombstones(0) == 0, "collected without the forgotten node")
        let requestsBefore = cluster.nodes[1].repairRequests.count
        // n2's repair requests reach n1: its snapshot, and the ANNOUNCE by which alone n1 takes
        // it back (a member held as forgotten is taken back only from itself).
        _ = Self.bringN2Back(&cluster)
        let returning = cluster.nodes[1].machine
        #expect(returning.counters.resyncs == 1)
        #expect(
            cluster.nodes[1].repairRequests[requestsBefore...].contains { _, frames in
                (try? ClientProtocol.decodeRequestHeader(frames[0]).command) == ClientProtocol.Command.snapshot.rawValue
            })
        #expect(returning.store.properties(of: Self.address)["stale"] == nil)
        #expect(returning.membership.members["n2"]?.state == .alive)
        #expect(cluster.nodes[0].machine.membership.members["n2"]?.state == .alive)
        // An operator's forget the node answers by itself: a warning, not an error of the node.
        let told = logs.all.filter { $0.message.contains("forgotten by another member") }
        #expect(!told.isEmpty && told.allSatisfy { $0.level == .warning }, "\(told.map(\.level))")
    }

    /// 7.5: the node says it is alive again, and its members file keeps the forget as answered,
    /// only once the compaction that writes its reset is reported written. Over a failed one (a
    /// full disk) it would come back from a restart with what it dropped, and with no forget
    /// left in the cluster to make it drop it again. The compaction is retried at repair rounds;
    /// once written, the node announces itself and is taken back.
    @Test func aResetIsAnsweredOnlyOnceItsCompactionIsWritten() throws {
        var (cluster, forget, routed) = try Self.forgottenWhileAwayOnAFullDisk()
        #expect(cluster.nodes[1].machine.counters.resyncs == 1)
        #expect(cluster.nodes[1].failedCompactions >= 2, "the reset's compaction is retried")
        #expect(cluster.nodes[1].machine.resetUnwritten)
        #expect(cluster.nodes[0].machine.membership.members["n2"] == forget, "not taken back")
        let saved = try Membership.decodeFile(cluster.nodes[1].savedMembers ?? [])
        #expect(!saved.contains { $0.id == "n2" }, "the forget is not kept as answered")
        #expect((cluster.nodes[1].machine.ownEntry?.version ?? .zero) < forget.version, "no entry over the forget")

        cluster.nodes[1].failsCompactions = false
        for _ in 0..<15 {
            cluster.exchange(rounds: 1)
            routed = Self.routeRepairs(&cluster, from: 1, to: 0, after: routed)
        }
        #expect(!cluster.nodes[1].machine.resetUnwritten)
        #expect(cluster.nodes[1].machine.counters.resyncs == 1, "one reset for the one forget")
        #expect(cluster.nodes[0].machine.membership.members["n2"]?.state == .alive, "taken back from its ANNOUNCE")
        let answered = try Membership.decodeFile(cluster.nodes[1].savedMembers ?? [])
        #expect(answered.first { $0.id == "n2" } == forget, "the forget kept as answered")
        #expect(cluster.nodes[1].machine.store.properties(of: Self.address)["stale"] == nil)
    }

    /// n2, forgotten by n1 while cut off, comes back with compactions failing (a full disk):
    /// the cluster after 15 heartbeat intervals, the forget, and how many of n2's repair
    /// requests were routed to n1.
    static func forgottenWhileAwayOnAFullDisk() throws -> (Cluster, Membership.Member, Int) {
        var cluster = Self.n2WithAStaleValueForgottenWhileCutOff()
        let forget = try #require(cluster.nodes[0].machine.membership.members["n2"])
        cluster.nodes[1].failsCompactions = true
        let routed = Self.bringN2Back(&cluster)
        return (cluster, forget, routed)
    }

    /// Ends n2's cut and, for 15 heartbeat intervals, hands its repair requests made from then
    /// on to n1 and n1's replies back; returns how many of its requests were handled.
    static func bringN2Back(_ cluster: inout Cluster) -> Int {
        cluster.silent = []
        var routed = cluster.nodes[1].repairRequests.count
        for _ in 0..<15 {
            cluster.exchange(rounds: 1)
            routed = Self.routeRepairs(&cluster, from: 1, to: 0, after: routed)
        }
        return routed
    }

    /// 7.5: a node that stops while its reset is not written says nothing about itself (no
    /// leave over the forget, nor the forget kept as answered): back, it hears the forget again.
    @Test func aNodeStoppingBeforeItsResetIsWrittenDoesNotLeave() throws {
        var (cluster, forget, _) = try Self.forgottenWhileAwayOnAFullDisk()
        cluster.nodes[1].handle(.stop)
        cluster.exchange(rounds: 2)
        #expect(cluster.nodes[1].machine.resetUnwritten)
        #expect((cluster.nodes[1].machine.ownEntry?.version ?? .zero) < forget.version, "no leave over the forget")
        #expect(cluster.nodes[0].machine.membership.members["n2"] == forget)
        let saved = try Membership.decodeFile(cluster.nodes[1].savedMembers ?? [])
        #expect(!saved.contains { $0.id == "n2" })
    }

    /// 7.5 and 10.1.1: writes whose OKs still wait when their node learns it was forgotten are
    /// given up with its state, and each client is told so in an ERROR for its request, not an
    /// OK later. With `always` both clients' OKs wait for the log (here a sync is running when
    /// the node learns it, and ends after); with `interval` the OKS client's OK waits for the end
    /// of the round, while the plain client's went as its write was taken. (With `interval` the
    /// OKS client's write may have been published already: the ERROR says it may be lost.)
    @Test(arguments: [NodeConfiguration.FsyncPolicy.always, .interval])
    func writesWaitingWhenTheNodeLearnsItWasForgottenAreAnsweredWithErrors(
        fsync: NodeConfiguration.FsyncPolicy
    ) throws {
        var cluster = Cluster(["n1", "n2"], fsync: fsync)
        let accepted = cluster.forgetCutOffNode(1)
        #expect(accepted, "FORGET accepted")
        // n2, still cut off, takes two writes: one from a client that takes OKS messages, one
        // from a client that does not.
        let batched: [UInt8] = [0x53, 7]
        let plain: [UInt8] = [0x53, 8]
        cluster.nodes[1].holdsSyncs = true
        let before = cluster.nodes[1].sent.count
        for (id, client) in [(UInt64(21), batched), (22, plain)] {
            let frames = ClientProtocol.encodeRequest(
                .set, id: id,
                body: ClientProtocol.encodeSet(Self.address, [PropertyWrite(name: "w\(id)", value: .int(Int64(id)))]),
                flags: client == batched ? ClientProtocol.RequestFlags.batchedReplies : 0)
            cluster.nodes[1].handle(.clientRequest(client: client, frames: frames, identity: nil))
        }
        if fsync == .always {
            // The tick asks for the sync, which the disk has not finished when the news comes.
            cluster.nodes[1].advance(1)
            #expect(!cluster.nodes[1].heldSyncs.isEmpty, "a sync is running")
        }
        let waiting = cluster.nodes[1].sent[before...].filter { $0.client == batched }
        #expect(waiting.isEmpty, "the OKS-taking client's OK waits (\(fsync))")
        // It hears of the forget before its next tick.
        cluster.silent = []
        cluster.deliver(from: 0, to: 1)
        #expect(cluster.nodes[1].machine.counters.resyncs == 1)
        cluster.nodes[1].releaseSyncs()
        cluster.exchange(rounds: 10)

        for (id, client) in [(UInt64(21), batched), (22, plain)] {
            var answers: [ClientProtocol.ReplyKind] = []
            var message = ""
            for (to, frames) in cluster.nodes[1].sent[before...] where to == client {
                let header = try ClientProtocol.decodeReplyHeader(frames[0])
                if header.kind == .oks {
                    let ids = try ClientProtocol.decodeBatchedOKs(frames[1]).map(\.id)
                    answers += ids.filter { $0 == id }.map { _ in .oks }
                } else if header.requestID == id {
                    answers.append(header.kind)
                    if header.kind == .error { message = try ClientProtocol.decodeError(frames[1]).message }
                }
            }
            if fsync == .interval, client == plain {
                // With `interval` a plain client's OK goes as its write is taken, before the reset.
                #expect(answers == [.ok], "request \(id)")
                continue
            }
            #expect(answers == [.error], "request \(id) (\(fsync)): \(answers)")
            #expect(message.contains("forgotten"), "\(message)")
        }
    }

    /// Routes node `from`'s repair requests since `after` to node `to`'s API and the replies
    /// back; returns how many requests there are now.
    static func routeRepairs(_ cluster: inout Cluster, from: Int, to: Int, after: Int) -> Int {
        var handled = after
        while handled < cluster.nodes[from].repairRequests.count {
            answer(&cluster, cluster.nodes[from].repairRequests[handled], from: from, by: to)
            handled += 1
        }
        return handled
    }

    /// Node `to` answers one repair request of node `from`, which gets the reply.
    static func answer(
        _ cluster: inout Cluster, _ request: (peer: String, frames: [[UInt8]]), from: Int, by to: Int
    ) {
        let client: [UInt8] = [0x52, UInt8(from)]
        let before = cluster.nodes[to].sent.count
        cluster.nodes[to].handle(.clientRequest(client: client, frames: request.frames, identity: nil))
        for (recipient, frames) in cluster.nodes[to].sent[before...] where recipient == client {
            cluster.nodes[from].handle(.repairReply(peer: request.peer, frames: frames))
        }
    }

    /// 7.5: a write the forgotten node took and published just before it dropped its state,
    /// which reaches a peer only after that peer served the node its snapshot, ends on the node
    /// too: the node covers its own origin through its latest sequence without the deltas, and
    /// fetches back those a peer's HEARTBEAT reports holding (found by the simulator's forget
    /// fault, 3 nodes, seed 10). A watch on the node that takes resets ends with the write.
    @Test func aWriteOnItsWayWhenTheNodeDropsItsStateComesBackToIt() throws {
        var cluster = Cluster(["n1", "n2"])
        let written = try Self.forgetWhileAWriteIsOnItsWay(&cluster, watch: 5)
        // Then the write reaches n1, and everything is exchanged for a while.
        Self.deliverTheWriteAndExchange(&cluster, written, rounds: 20)
        #expect(cluster.nodes[1].machine.store.properties(of: Self.address)["x"]?.version == written)
        #expect(cluster.nodes[1].machine.repair.ownRecovery == nil, "recovered through the last own sequence")
        #expect(cluster.nodes[1].machine.counters.snapshotsApplied == 1, "fetched back, not a second snapshot")
        // The watch on n2 was reset to the snapshot, then resynced with the write fetched back.
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        var events: [WatchEvent] = []
        for event in cluster.nodes[1].events(watch: 5) { events += try session.handle(event, from: "n2") }
        #expect(events.contains { if case .resyncStarted(.reset) = $0 { true } else { false } })
        #expect(session.replica.properties(of: "m")["x"]?.version == written)
    }

    /// 7.5: the write on its way comes back also when the peer that holds it no longer holds it
    /// as a delta (its history moved on): the node takes that peer's snapshot instead.
    @Test func aWriteOnItsWayComesBackInASnapshotOnceThePeersHistoryDroppedIt() throws {
        var cluster = Cluster(["n1", "n2"], historyDeltas: 2)
        let written = try Self.forgetWhileAWriteIsOnItsWay(&cluster, watch: nil)
        // n2 writes on after its reset; n1 gets the write on its way, then those, which push it
        // out of n1's history of n2's deltas before n2 asks for it.
        for value in 0..<4 {
            _ = cluster.set(on: 1, 40 + UInt64(value), [PropertyWrite(name: "y", value: .int(Int64(value)))])
            cluster.nodes[1].advance(100)
        }
        Self.deliverTheWriteAndExchange(&cluster, written, rounds: 30)
        #expect(cluster.nodes[1].machine.store.properties(of: Self.address)["x"]?.version == written)
        #expect(cluster.nodes[1].machine.repair.ownRecovery == nil)
        #expect(cluster.nodes[1].machine.counters.snapshotsApplied == 2, "the reset's snapshot, then the holder's")
    }

    /// 7.5 and 10.9: while the forgotten node recovers its own deltas, a SNAPSHOT it serves
    /// claims its own origin only through what it holds of them (R) whenever a peer may hold
    /// more: here n1 reports holding the write on its way, which n2 has not fetched back yet. A
    /// requester that lacked the write would have covered it without it, and never asked again
    /// (the simulator's forget fault with a restart, 3 nodes, seed 112). Once n2 fetched it
    /// back, its recovery ended and the claim is whole again.
    @Test func aNodeRecoveringItsOwnDeltasClaimsOnlyThoseItHoldsWhileAPeerHoldsMore() throws {
        var cluster = Cluster(["n1", "n2"])
        let written = try Self.forgetWhileAWriteIsOnItsWay(&cluster, watch: nil)
        let recovery = try #require(cluster.nodes[1].machine.repair.ownRecovery)
        let recovered = try #require(recovery.recovered)
        #expect(recovered < recovery.through)
        // The write reaches n1, whose next HEARTBEAT tells n2 that it holds it.
        cluster.deliver(from: 1, to: 0)
        cluster.nodes[0].advance(100)
        cluster.deliver(from: 0, to: 1)
        #expect(try Self.servedOwnMark(&cluster.nodes[1], id: 50) == recovered)
        Self.deliverTheWriteAndExchange(&cluster, written, rounds: 20)
        #expect(cluster.nodes[1].machine.repair.ownRecovery == nil)
        #expect(try Self.servedOwnMark(&cluster.nodes[1], id: 51) == recovery.through)
    }

    /// 7.5 and 10.9: the other side of the rule above. The write on its way is lost (it never
    /// reaches n1): once every peer heard is connected, has answered n2's FETCH of the rest of
    /// its own deltas, and none reports holding more than n2 holds, they are given up, and its
    /// SNAPSHOT covers them (requesters that would otherwise wait for them for ever). A peer not
    /// heard for a while may hold them, but is waited for no longer than 30 silence limits (a
    /// member down for good would keep the others asking n2 for snapshots that cover nothing).
    @Test func aNodeRecoveringItsOwnDeltasClaimsThemWholeOnceNoPeerCanHoldThem() throws {
        var cluster = Cluster(["n1", "n2"])
        _ = try Self.forgetWhileAWriteIsOnItsWay(&cluster, watch: nil)
        let recovery = try #require(cluster.nodes[1].machine.repair.ownRecovery)
        let recovered = try #require(recovery.recovered)
        #expect(try Self.servedOwnMark(&cluster.nodes[1], id: 49) == recovered, "n1 not heard for 2 s")
        let wait = NodeMachine.ownRecoveryWaitLimits * cluster.nodes[1].machine.peerSilenceLimit
        for _ in 0..<(wait / 100) { cluster.nodes[1].advance(100) }
        #expect(try Self.servedOwnMark(&cluster.nodes[1], id: 50) == recovery.through, "n1 silent too long")
        cluster.delivered[1][0] = cluster.nodes[1].published.count  // the write is lost
        cluster.exchange(rounds: 2)
        #expect(cluster.nodes[0].machine.origins["n2"]?.contiguous == recovered)
        // n1 answered n2's FETCH of the rest while n2 took its snapshot (none of them held).
        #expect((cluster.nodes[1].machine.repair.ownRecoverySwept["inproc://n1"] ?? 0) >= recovery.through)
        #expect(cluster.nodes[1].machine.repair.ownRecovery != nil, "still recovering")
        #expect(try Self.servedOwnMark(&cluster.nodes[1], id: 51) == recovery.through, "n1 heard and answered")
    }

    /// 7.5: an own delta a peer holds above a gap of its own (its HEARTBEAT's mark stops below
    /// it) comes back too, and until the node has asked that peer its SNAPSHOT claims its own
    /// origin through R only (the simulator, 3 nodes × 300 operations, seed 40: a node that
    /// alone heard such a delta kept it, and the others covered it without it). Here n3 holds
    /// n2's second write and missed the first; n1 (the forgetter) missed both, and serves n2 the
    /// snapshot it takes at its reset. The write comes back through whichever path reaches it
    /// first here: the sweep, or n3's mark passing the gap (with n3's snapshots left out, its
    /// mark still reached the second write: it gives the first up once n2 is forgotten, as no
    /// peer holds it — inferred, not traced), so this test passes with the sweep disabled;
    /// ``theSweepFetchesBackAnOwnDeltaHeldOnlyAboveAPeersGap`` isolates the sweep.
    @Test func anOwnDeltaAPeerHoldsAboveAGapComesBack() throws {
        var cluster = Cluster(["n1", "n2", "n3"])
        cluster.exchange(rounds: 12)
        let before = cluster.nodes[1].published.count
        _ = cluster.set(on: 1, 31, [PropertyWrite(name: "y", value: "lost")])
        cluster.nodes[1].advance(100)
        let acknowledged = cluster.set(on: 1, 32, [PropertyWrite(name: "x", value: "kept")])
        let kept = try #require(acknowledged)
        cluster.nodes[1].advance(100)
        for frames in cluster.nodes[1].published[before...] {
            let deltas = (try? PeerMessage.decodeAll(frames)) ?? []
            if deltas.contains(where: { if case .delta(let delta) = $0 { delta.version == kept } else { false } }) {
                cluster.nodes[2].handle(.peerMessage(peer: "inproc://n2", frames: frames))
            }
        }
        cluster.delivered[1][0] = cluster.nodes[1].published.count
        cluster.delivered[1][2] = cluster.nodes[1].published.count
        #expect(cluster.nodes[2].machine.store.properties(of: Self.address)["x"]?.version == kept)
        let mark = try #require(cluster.nodes[2].machine.origins["n2"]?.contiguous)
        // n2 is cut off and forgotten on n1; back, it drops its state and takes n1's snapshot.
        var routed = Self.forgetN2WhileCutOffAndBringItBack(&cluster)
        routed = Self.routeRepairsByPeer(&cluster, from: 1, after: routed, answering: [0])
        for _ in 0..<10 {
            cluster.exchange(rounds: 1)
            routed = Self.routeRepairsByPeer(&cluster, from: 1, after: routed, answering: [0])
        }
        #expect(cluster.nodes[1].machine.counters.resyncs == 1)
        let recovery = try #require(cluster.nodes[1].machine.repair.ownRecovery)
        #expect(recovery.recovered == mark, "R: what n1's snapshot held of n2's")
        #expect(cluster.nodes[1].machine.store.properties(of: Self.address)["x"] == nil)
        #expect(try Self.servedOwnMark(&cluster.nodes[1], id: 60) == mark, "n3 not asked yet")
        for _ in 0..<20 {
            cluster.exchange(rounds: 1)
            routed = Self.routeRepairsByPeer(&cluster, from: 1, after: routed, answering: [0, 2])
        }
        #expect(cluster.nodes[1].machine.store.properties(of: Self.address)["x"]?.version == kept, "fetched back")
        #expect(cluster.nodes[1].machine.store.properties(of: Self.address)["y"] == nil, "given up")
    }

    /// 7.5, the sweep: with no peer's mark above R, each connected peer is asked once for R + 1
    /// through L, which it may hold above a gap of its own. n1 (the forgetter) holds n2's first
    /// write, n3 only its second: n3's mark stays below it (n1 holds the first, so n3 does not
    /// give it up when n2 is forgotten, and n3's own repairs go unanswered here), and n2 takes
    /// n1's snapshot (R = the first). n3 answers n2's FETCH requests only, not its SNAPSHOT
    /// requests: the second write can come back only by the sweep. (Fails with the sweep
    /// disabled.)
    @Test func theSweepFetchesBackAnOwnDeltaHeldOnlyAboveAPeersGap() throws {
        var cluster = Cluster(["n1", "n2", "n3"])
        cluster.exchange(rounds: 12)
        let before = cluster.nodes[1].published.count
        let firstWrite = cluster.set(on: 1, 31, [PropertyWrite(name: "y", value: "held by n1")])
        let first = try #require(firstWrite)
        cluster.nodes[1].advance(100)
        let secondWrite = cluster.set(on: 1, 32, [PropertyWrite(name: "x", value: "held by n3")])
        let second = try #require(secondWrite)
        cluster.nodes[1].advance(100)
        for frames in cluster.nodes[1].published[before...] {
            for case .delta(let delta) in (try? PeerMessage.decodeAll(frames)) ?? [] {
                if delta.version == first { cluster.nodes[0].handle(.peerMessage(peer: "inproc://n2", frames: frames)) }
                if delta.version == second {
                    cluster.nodes[2].handle(.peerMessage(peer: "inproc://n2", frames: frames))
                }
            }
        }
        cluster.delivered[1][0] = cluster.nodes[1].published.count
        cluster.delivered[1][2] = cluster.nodes[1].published.count
        let held = try #require(cluster.nodes[0].machine.origins["n2"]?.contiguous)
        let below = cluster.nodes[2].machine.origins["n2"]?.contiguous ?? 0
        #expect(below < held, "n3 misses the first write")
        var routed = Self.forgetN2WhileCutOffAndBringItBack(&cluster)
        for _ in 0..<30 {
            cluster.exchange(rounds: 1)
            routed = Self.routeRepairsByPeer(&cluster, from: 1, after: routed, answering: [0, 2], fetchesOnly: [2])
        }
        #expect(cluster.nodes[1].machine.counters.resyncs == 1)
        #expect(cluster.nodes[2].machine.origins["n2"]?.contiguous == below, "n3's mark stayed below the gap")
        let state = cluster.nodes[1].machine.store.properties(of: Self.address)
        #expect(state["y"]?.version == first, "from n1's snapshot")
        #expect(state["x"]?.version == second, "fetched back from n3 by the sweep")
    }

    /// n2 is cut off, forgotten on n1, and back: it has heard n1's list (the forget); returns
    /// how many of its repair requests were made by then (none routed yet).
    static func forgetN2WhileCutOffAndBringItBack(_ cluster: inout Cluster) -> Int {
        cluster.silent = [1]
        cluster.exchange(rounds: 5)
        #expect(cluster.nodes[0].forget("n2")?.0.kind == .ok)
        cluster.exchange(rounds: 5)
        cluster.silent = []
        cluster.deliver(from: 0, to: 1)
        return cluster.nodes[1].repairRequests.count
    }

    /// Hands node `from`'s repair requests from position `after` on to the node each is for
    /// (by its peer endpoint), if among `answering` (and, for those in `fetchesOnly`, only its
    /// FETCH requests), and the replies back; returns the position reached.
    static func routeRepairsByPeer(
        _ cluster: inout Cluster, from: Int, after: Int, answering: Set<Int>, fetchesOnly: Set<Int> = []
    ) -> Int {
        var handled = after
        while handled < cluster.nodes[from].repairRequests.count {
            let request = cluster.nodes[from].repairRequests[handled]
            handled += 1
            guard
                let to = cluster.nodes.indices.first(where: {
                    request.peer == "inproc://\(cluster.nodes[$0].machine.configuration.nodeID)"
                }), answering.contains(to)
            else { continue }
            if fetchesOnly.contains(to),
                (try? ClientProtocol.decodeRequestHeader(request.frames[0]).command)
                    != ClientProtocol.Command.fetch.rawValue
            {
                continue
            }
            answer(&cluster, request, from: from, by: to)
        }
        return handled
    }

    /// The mark of the node's own origin in the progress of the first page of a SNAPSHOT it serves
    /// (0 when the progress leaves it out).
    static func servedOwnMark(_ node: inout MachineRunner, id: UInt64) throws -> UInt64 {
        let answer = node.request(
            .snapshot, id: id, SnapshotPage.encodeRequest(after: nil, maximumOctets: 1 << 20), client: [0x4C, 1])
        let reply = try #require(answer)
        #expect(reply.0.kind == .ok)
        return try SnapshotPage.decode(reply.1).progress[node.machine.configuration.nodeID] ?? 0
    }

    /// 7.5 and 10.5.4: a watch on the forgotten node that asked for resets (WATCH flag bit 4)
    /// gets a `reset` snapshot once the peer's snapshot is merged, and its client ends with the
    /// node's state: the writes the node gave up go back to the older values or away. A watch
    /// that did not ask gets `lagged`, which its client merges: it keeps what was given up.
    @Test func aResetReplacesWhatTheWatchHeldAndOnlyForWatchesThatAskForIt() throws {
        var cluster = Cluster(["n1", "n2"])
        Self.keepOnN1ThenForgetN2(&cluster, resetting: 5, merging: 6)
        // n2, cut off, takes writes that never reach n1: they are given up at its reset.
        Self.n2WritesWhatN1NeverGets(
            &cluster, [PropertyWrite(name: "x", value: "given up"), PropertyWrite(name: "z", value: 1)])
        cluster.silent = []
        cluster.deliver(from: 0, to: 1)
        #expect(cluster.nodes[1].machine.counters.resyncs == 1)
        var routed = cluster.nodes[1].repairRequests.count
        for _ in 0..<20 {
            cluster.exchange(rounds: 1)
            routed = Self.routeRepairs(&cluster, from: 1, to: 0, after: routed)
        }
        let node = cluster.nodes[1].machine.store.properties(of: Self.address)
        #expect(node["x"]?.value == "kept" && node["z"] == nil, "the node gave its writes up")
        var resetting = WatchSession(replica: ChannelReplica(channel: "c"))
        var resetEvents: [WatchEvent] = []
        for event in cluster.nodes[1].events(watch: 5) { resetEvents += try resetting.handle(event, from: "n2") }
        #expect(resetEvents.contains { if case .resyncStarted(.reset) = $0 { true } else { false } })
        #expect(resetting.replica.properties(of: "m")["x"]?.value == "kept")
        #expect(resetting.replica.properties(of: "m")["z"] == nil)
        // Its client saw each given-up value go: x back to n1's, z removed (at version zero).
        let changes = resetEvents.compactMap { if case .change(let change, _, _) = $0 { change } else { nil } }
        #expect(changes.contains { $0.property == "z" && $0.old == 1 && $0.new == nil && $0.version == .zero })
        #expect(changes.last(where: { $0.property == "x" })?.new == "kept")
        var merging = WatchSession(replica: ChannelReplica(channel: "c"))
        var lagged = false
        for event in cluster.nodes[1].events(watch: 6) {
            for case .resyncStarted(let reason) in try merging.handle(event, from: "n2") {
                #expect(reason == .lagged)
                lagged = true
            }
        }
        #expect(lagged, "the watch that did not ask for resets was resynced as lagged")
        #expect(merging.replica.properties(of: "m")["x"]?.value == "given up", "merged: it keeps what was given up")
    }

    /// 10.5.4: a reset due while a snapshot is on its way to the watch (here its initial one,
    /// of the state the node dropped) is not lost when the client takes that snapshot: the watch
    /// is sent the reset after it.
    @Test func aResetDueWhileASnapshotIsOnItsWayFollowsIt() throws {
        var cluster = Cluster(["n1", "n2"])
        Self.keepOnN1ThenForgetN2(&cluster, resetting: 4, merging: nil)
        Self.n2WritesWhatN1NeverGets(&cluster, [PropertyWrite(name: "x", value: "given up")])
        // A new watch on n2: its initial snapshot (with the write n2 gives up) is sent, and the
        // client has not yet said it took it.
        cluster.nodes[1].holdsWatchReports = true
        let from = cluster.nodes[1].sent.count
        _ = cluster.nodes[1].request(
            .watch, id: 5, ClientProtocol.encodeWatch(channel: "c", from: nil, takesResets: true))
        cluster.nodes[1].advance(100)
        #expect(!cluster.nodes[1].heldWatchReports.isEmpty, "the initial snapshot is on its way")
        // n2 hears of the forget, drops its state and merges n1's snapshot meanwhile.
        cluster.silent = []
        cluster.deliver(from: 0, to: 1)
        var routed = cluster.nodes[1].repairRequests.count
        for _ in 0..<10 {
            cluster.nodes[1].advance(100)
            routed = Self.routeRepairs(&cluster, from: 1, to: 0, after: routed)
        }
        #expect(cluster.nodes[1].machine.counters.snapshotsApplied == 1)
        cluster.nodes[1].releaseWatchReports()
        cluster.exchange(rounds: 3)
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        var events: [WatchEvent] = []
        for event in cluster.nodes[1].events(watch: 5, from: from) { events += try session.handle(event, from: "n2") }
        #expect(events.contains { if case .resyncStarted(.reset) = $0 { true } else { false } })
        #expect(session.replica.properties(of: "m")["x"]?.value == "kept")
    }

    /// 7.5 and Appendix A: a node that restarts after it dropped its state, before it merged a
    /// peer's snapshot, goes on: its file (`SSNAP4`) says so, it asks for the snapshot again, and a
    /// watch that resumes with a cursor from before the reset (its client holds a write the node
    /// gave up) gets the reset once the snapshot is merged.
    @Test func aRestartBeforeThePeersSnapshotKeepsTheResetGoing() throws {
        var cluster = Cluster(["n1", "n2"])
        Self.keepOnN1ThenForgetN2(&cluster, resetting: 5, merging: nil)
        Self.n2WritesWhatN1NeverGets(&cluster, [PropertyWrite(name: "x", value: "given up")])
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        for event in cluster.nodes[1].events(watch: 5) { _ = try session.handle(event, from: "n2") }
        #expect(session.replica.properties(of: "m")["x"]?.value == "given up", "the client holds the write")
        // n2 hears of the forget and drops its state (its file is written at once), saves its
        // member entry at the next tick, and crashes before it has a peer's snapshot.
        cluster.silent = []
        cluster.deliver(from: 0, to: 1)
        cluster.nodes[1].advance(100)
        #expect(cluster.nodes[1].machine.counters.snapshotsApplied == 0)
        guard case .compact(let compacted, _, _) = try #require(cluster.nodes[1].lastCompaction) else {
            Issue.record("no compaction")
            return
        }
        let file = try StateSnapshot.decode(StateSnapshot.encode(compacted))
        #expect(file.ownRecovery == StateSnapshot.OwnRecovery(through: 1, recovered: nil))
        #expect(file.store.properties(of: Self.address).isEmpty, "the file holds the reset, not the old state")
        var recovery = NodeMachine.Recovery(snapshot: file)
        recovery.members = try Membership.decodeFile(try #require(cluster.nodes[1].savedMembers))
        #expect(recovery.members.first { $0.id == "n2" }?.state == .forgotten, "the members file: the forget, answered")
        cluster.restart(1, on: recovery)
        #expect(cluster.nodes[1].machine.repair.needsSnapshot)
        // The client resumes on the restarted node with its cursor.
        let from = cluster.nodes[1].sent.count
        _ = cluster.nodes[1].request(
            .watch, id: 6, ClientProtocol.encodeWatch(channel: "c", from: session.replica.cursor, takesResets: true))
        var routed = 0
        for _ in 0..<20 {
            cluster.exchange(rounds: 1)
            routed = Self.routeRepairs(&cluster, from: 1, to: 0, after: routed)
        }
        #expect(cluster.nodes[1].machine.counters.resyncs == 0, "the restarted node does not reset again")
        #expect(cluster.nodes[1].machine.counters.snapshotsApplied == 1)
        var events: [WatchEvent] = []
        for event in cluster.nodes[1].events(watch: 6, from: from) { events += try session.handle(event, from: "n2") }
        #expect(events.contains { if case .resyncStarted(.reset) = $0 { true } else { false } })
        #expect(session.replica.properties(of: "m")["x"]?.value == "kept")
        #expect(cluster.nodes[1].machine.store.properties(of: Self.address)["x"]?.value == "kept")
    }

    /// 7.5: a node cut off that stops cleanly writes its leave, which no peer gets; a forget
    /// made meanwhile on a node whose clock is behind is older than that leave. Back, the node
    /// compares the forget with the last forget it answered (none: its members file holds no
    /// entry of its own), not with what it said about itself, and drops its state (the
    /// simulator's reset check, forget fault with a restart: 3 nodes × 5,000 operations, seed
    /// 21, and six more in 2,000 seeds). Once that is written, the file keeps the forget as
    /// answered: a restart does not reset again.
    @Test func aLeaveNoPeerHeardDoesNotHideAForgetMadeMeanwhile() throws {
        var cluster = Cluster(["n1", "n2"])
        _ = cluster.set(on: 1, 1, [PropertyWrite(name: "x", value: "n2's")])
        cluster.exchange(rounds: 12)
        cluster.silent = [1]
        cluster.exchange(rounds: 5)
        // n2's clock runs 2 s ahead of n1's when it stops: its leave is newer than the forget.
        cluster.nodes[1].wall.milliseconds += 2_000
        cluster.nodes[1].handle(.stop)
        let leave = try #require(cluster.nodes[1].machine.ownEntry)
        #expect(leave.state == .left)
        #expect(cluster.nodes[0].forget("n2")?.0.kind == .ok)
        let forget = try #require(cluster.nodes[0].machine.membership.members["n2"])
        #expect(forget.state == .forgotten && forget.version < leave.version)
        // Its files: the state it stops with (as the daemon's last snapshot), its member list.
        let state = cluster.nodes[1].machine.snapshot
        var recovery = NodeMachine.Recovery(snapshot: try StateSnapshot.decode(StateSnapshot.encode(state)))
        recovery.members = try Membership.decodeFile(try #require(cluster.nodes[1].savedMembers))
        #expect(!recovery.members.contains { $0.id == "n2" }, "no forget answered yet")
        cluster.restart(1, on: recovery)
        cluster.silent = []
        var routed = 0
        for _ in 0..<20 {
            cluster.exchange(rounds: 1)
            routed = Self.routeRepairs(&cluster, from: 1, to: 0, after: routed)
        }
        #expect(cluster.nodes[1].machine.counters.resyncs == 1, "back, it dropped its state")
        #expect(cluster.nodes[0].machine.membership.members["n2"]?.state == .alive)
        let answered = try Membership.decodeFile(try #require(cluster.nodes[1].savedMembers))
        #expect(answered.first { $0.id == "n2" } == forget, "the forget, answered")
    }

    /// A watch due a reset gets nothing until the reset: deltas sent meanwhile would move its
    /// cursor past the reset's own mark while its client still holds what the node gave up, and
    /// a resume after a restart would then not be told (seed 287 of the forget sweep). The reset
    /// holds what came meanwhile.
    @Test func aWatchDueAResetGetsNothingUntilIt() throws {
        var cluster = Cluster(["n1", "n2"])
        Self.keepOnN1ThenForgetN2(&cluster, resetting: 5, merging: nil)
        Self.n2WritesWhatN1NeverGets(&cluster, [PropertyWrite(name: "x", value: "given up")])
        cluster.silent = []
        cluster.deliver(from: 0, to: 1)
        #expect(cluster.nodes[1].machine.counters.resyncs == 1)
        let from = cluster.nodes[1].sent.count
        var routed = cluster.nodes[1].repairRequests.count
        // n2 writes after the reset, before any peer's snapshot is merged.
        _ = cluster.set(on: 1, 32, [PropertyWrite(name: "y", value: "after the reset")])
        cluster.nodes[1].advance(100)
        #expect(cluster.nodes[1].events(watch: 5, from: from).isEmpty, "held until the reset")
        for _ in 0..<40 where cluster.nodes[1].machine.counters.snapshotsApplied == 0 {
            cluster.exchange(rounds: 1)
            routed = Self.routeRepairs(&cluster, from: 1, to: 0, after: routed)
        }
        cluster.nodes[1].advance(100)
        let events = cluster.nodes[1].events(watch: 5, from: from)
        #expect(cluster.nodes[1].machine.counters.snapshotsApplied == 1)
        #expect(cluster.nodes[1].machine.watches[WatchKey(client: [0x53, 1], requestID: 5)]?.resetDue == false)
        guard case .snapshotBegin(.reset) = try #require(events.first) else {
            Issue.record("the first event after the hold is not the reset: \(events.prefix(2))")
            return
        }
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        for event in cluster.nodes[1].events(watch: 5) { _ = try session.handle(event, from: "n2") }
        #expect(session.replica.properties(of: "m")["x"]?.value == "kept")
        #expect(session.replica.properties(of: "m")["y"]?.value == "after the reset")
    }

    /// A client away while the node reset and recovered, which resumes with its cursor from
    /// before — after the recovery ended, and again after a restart from the file written then —
    /// gets a reset, not the journal: it holds a write the node gave up (the simulator's forget
    /// fault, 3 nodes, 5,000 operations, seeds 152 and 287: a peer's progress covered the
    /// given-up number, so the recovery ended and the resume was taken as safe).
    @Test func aCursorFromBeforeTheResetGetsAResetAlsoAfterTheRecoveryEnded() throws {
        var cluster = Cluster(["n1", "n2"])
        Self.keepOnN1ThenForgetN2(&cluster, resetting: 5, merging: nil)
        Self.n2WritesWhatN1NeverGets(&cluster, [PropertyWrite(name: "x", value: "given up")])
        // What the client got before it went away (its replica is a class: each resume below
        // starts from a copy of its own, rebuilt from these events).
        let seen = cluster.nodes[1].events(watch: 5)
        func away() throws -> WatchSession {
            var session = WatchSession(replica: ChannelReplica(channel: "c"))
            for event in seen { _ = try session.handle(event, from: "n2") }
            return session
        }
        #expect(try away().replica.properties(of: "m")["x"]?.value == "given up", "the client holds the write")
        // n2 hears of the forget, drops its state and recovers, until the recovery ends.
        cluster.silent = []
        var routed = (cluster.nodes[0].repairRequests.count, cluster.nodes[1].repairRequests.count)
        for _ in 0..<60
        where cluster.nodes[1].machine.counters.resyncs == 0 || cluster.nodes[1].machine.repair.ownRecovery != nil {
            cluster.exchange(rounds: 1)
            routed.0 = Self.routeRepairs(&cluster, from: 0, to: 1, after: routed.0)
            routed.1 = Self.routeRepairs(&cluster, from: 1, to: 0, after: routed.1)
        }
        #expect(cluster.nodes[1].machine.counters.resyncs == 1)
        #expect(cluster.nodes[1].machine.repair.ownRecovery == nil, "the recovery ended")
        #expect(cluster.nodes[1].machine.store.properties(of: Self.address)["x"]?.value == "kept")

        func resume(_ id: UInt64) throws -> WatchSession {
            var session = try away()
            let from = cluster.nodes[1].sent.count
            _ = cluster.nodes[1].request(
                .watch, id: id,
                ClientProtocol.encodeWatch(channel: "c", from: session.replica.cursor, takesResets: true))
            cluster.exchange(rounds: 3)
            var events: [WatchEvent] = []
            for event in cluster.nodes[1].events(watch: id, from: from) {
                events += try session.handle(event, from: "n2")
            }
            #expect(
                events.contains { if case .resyncStarted(.reset) = $0 { true } else { false } },
                "watch \(id)")
            #expect(session.replica.properties(of: "m")["x"]?.value == "kept", "watch \(id)")
            return session
        }
        // A cursor given after the reset (and after a write of n2's since) resumes without one.
        _ = cluster.set(on: 1, 32, [PropertyWrite(name: "y", value: "after")])
        cluster.exchange(rounds: 2)
        let fresh = try resume(6)
        #expect(fresh.replica.cursor["n2"] == 2)
        let from = cluster.nodes[1].sent.count
        _ = cluster.nodes[1].request(
            .watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: fresh.replica.cursor, takesResets: true))
        cluster.exchange(rounds: 3)
        #expect(
            !cluster.nodes[1].events(watch: 7, from: from).contains {
                if case .snapshotBegin = $0 { true } else { false }
            }, "a cursor from after the reset resumes from the journal")

        // The file written at the end keeps the reset; the node restarts on it.
        cluster.nodes[1].handle(.tick(observerBacklog: 0))
        let written = cluster.nodes[1].machine.snapshot
        let file = try StateSnapshot.decode(StateSnapshot.encode(written))
        #expect(file.ownRecovery == StateSnapshot.OwnRecovery(through: 1, recovered: 1))
        var recovery = NodeMachine.Recovery(snapshot: file)
        recovery.members = try Membership.decodeFile(try #require(cluster.nodes[1].savedMembers))
        cluster.restart(1, on: recovery)
        #expect(cluster.nodes[1].machine.repair.ownRecovery == nil && !cluster.nodes[1].machine.repair.needsSnapshot)
        _ = try resume(8)
    }

    /// n1 writes x = "kept", which n2 gets; n2 opens a watch that takes resets (`resetting`)
    /// and, with `merging`, one that does not; then n2 is cut off and forgotten on n1.
    static func keepOnN1ThenForgetN2(_ cluster: inout Cluster, resetting: UInt64, merging: UInt64?) {
        _ = cluster.set(on: 0, 1, [PropertyWrite(name: "x", value: "kept")])
        cluster.exchange(rounds: 2)
        _ = cluster.nodes[1].request(
            .watch, id: resetting, ClientProtocol.encodeWatch(channel: "c", from: nil, takesResets: true))
        if let merging {
            _ = cluster.nodes[1].request(.watch, id: merging, ClientProtocol.encodeWatch(channel: "c", from: nil))
        }
        let accepted = cluster.forgetCutOffNode(1)
        #expect(accepted, "FORGET accepted")
    }

    /// n2 (cut off) takes `writes`, and what it publishes with them never reaches n1.
    static func n2WritesWhatN1NeverGets(_ cluster: inout Cluster, _ writes: [PropertyWrite]) {
        _ = cluster.set(on: 1, 31, writes)
        cluster.nodes[1].advance(100)
        cluster.delivered[1][0] = cluster.nodes[1].published.count
    }

    /// Hands n1 what n2 published (the write on its way, `written`, first), then exchanges
    /// `rounds` rounds, routing n2's repair requests to n1.
    static func deliverTheWriteAndExchange(_ cluster: inout Cluster, _ written: Version, rounds: Int) {
        var routed = cluster.nodes[1].repairRequests.count
        cluster.deliver(from: 1, to: 0)
        #expect(cluster.nodes[0].machine.store.properties(of: address)["x"]?.version == written)
        for _ in 0..<rounds {
            cluster.exchange(rounds: 1)
            routed = routeRepairs(&cluster, from: 1, to: 0, after: routed)
        }
    }

    /// n2 is cut off and forgotten on n1, then takes and publishes a write (returned): it is on
    /// its way to n1. n2 hears of the forget first, drops its state and takes n1's snapshot,
    /// which lacks the write. With `watch`, a watch on n2 that takes resets is open throughout.
    static func forgetWhileAWriteIsOnItsWay(_ cluster: inout Cluster, watch: UInt64?) throws -> Version {
        if let watch {
            _ = cluster.nodes[1].request(
                .watch, id: watch, ClientProtocol.encodeWatch(channel: "c", from: nil, takesResets: true))
        }
        let accepted = cluster.forgetCutOffNode(1)
        #expect(accepted, "FORGET accepted")
        let acknowledged = cluster.set(on: 1, 31, [PropertyWrite(name: "x", value: "on its way")])
        let written = try #require(acknowledged)
        cluster.silent = []
        cluster.deliver(from: 0, to: 1)
        #expect(cluster.nodes[1].machine.counters.resyncs == 1)
        var routed = cluster.nodes[1].repairRequests.count
        for _ in 0..<20 {
            cluster.nodes[1].advance(100)
            routed = routeRepairs(&cluster, from: 1, to: 0, after: routed)
        }
        #expect(cluster.nodes[1].machine.counters.snapshotsApplied == 1)
        #expect(cluster.nodes[1].machine.store.properties(of: address)["x"] == nil, "the snapshot lacks the write")
        return written
    }

    /// 10.5.4 and 10.5.8: a client that held a value whose deletion was collected before it
    /// came back (its cursor older than the history) is told of the deletion by its resync.
    @Test func aResyncAfterCollectionDropsWhatTheClientStillHeld() throws {
        var configuration = MachineRunner.configuration("n1")
        configuration.historyDeltas = 4
        configuration.tombstoneGraceMilliseconds = 0
        var node = MachineRunner(configuration)
        _ = node.request(.set, id: 1, ClientProtocol.encodeSet(Self.address, [PropertyWrite(name: "x", value: 1)]))
        _ = node.request(.watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: nil))
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        for event in node.events(watch: 7) { _ = try session.handle(event, from: "n1") }
        #expect(session.replica.properties(of: "m")["x"]?.value == 1)
        var unwatch = WireWriter()
        unwatch.uint64(7)
        _ = node.request(.unwatch, id: 8, unwatch.bytes)
        _ = node.request(.delete, id: 2, ClientProtocol.encodeDelete(Self.address, properties: ["x"]))
        for value in 0..<10 {
            _ = node.request(
                .set, id: 100 + UInt64(value),
                ClientProtocol.encodeSet(
                    ModelAddress(channel: "c", model: "other"), [PropertyWrite(name: "n", value: .int(Int64(value)))]))
        }
        for _ in 0..<5 { node.advance(100) }
        #expect(node.machine.store.tombstones == 0, "a lone node collects at once")
        let from = node.sent.count
        _ = node.request(.watch, id: 9, ClientProtocol.encodeWatch(channel: "c", from: session.replica.cursor))
        var changes: [PropertyChange] = []
        for event in node.events(watch: 9, from: from) {
            for case .change(let change, _, _) in try session.handle(event, from: "n1") { changes.append(change) }
        }
        let dropped = changes.filter { $0.model == "m" }
        #expect(dropped.count == 1 && dropped.first?.kind == .deleted && dropped.first?.old == 1)
        #expect(session.replica.properties(of: "m").isEmpty)
    }

    /// 10.9 and 8.4: a node that took an older write from a peer's history (a FETCH) after the
    /// deletion that beat it was collected drops it when it merges the snapshot of a peer whose
    /// horizon is above it and that lacks it, and takes that horizon. Without it the node keeps
    /// the write and gives it back to the others in its own snapshots (the simulator's join
    /// fault, 3 nodes × 300 operations, seed 164: an acknowledged deletion lost).
    @Test func aWriteFetchedAfterItsDeletionWasCollectedGoesWithThePeersSnapshot() throws {
        var cluster = Cluster(["n1", "n2"])
        cluster.exchange(rounds: 12)
        _ = cluster.set(on: 1, 1, [PropertyWrite(name: "x", value: "deleted since")])
        cluster.exchange(rounds: 2)
        _ = cluster.delete(on: 0, 2)
        let kept = ModelAddress(channel: "c", model: "kept")
        _ = cluster.nodes[1].request(.set, id: 3, ClientProtocol.encodeSet(kept, [PropertyWrite(name: "y", value: 1)]))
        cluster.exchange(rounds: 30)
        #expect(cluster.tombstones(0) == 0 && cluster.tombstones(1) == 0, "the model's deletion is collected")
        let horizon = cluster.nodes[0].machine.store.collectedThrough
        // n3 joins through n1, which does not know it: it hears n1's HEARTBEAT and asks for what
        // it lacks. Only its FETCH of n2's deltas is answered — from n1's history, which still
        // holds the write the collected deletion beat.
        var joiner = MachineRunner(MachineRunner.configuration("n3", peers: ["n1"]))
        joiner.now = cluster.nodes[0].now
        joiner.wall.milliseconds = cluster.nodes[0].wall.milliseconds
        cluster.nodes.append(joiner)
        let beat = try #require(
            cluster.nodes[0].published.last {
                if case .heartbeat(let beat)? = try? PeerMessage.decode($0) { beat.members != nil } else { false }
            })
        cluster.nodes[2].handle(.peerMessage(peer: "inproc://n1", frames: beat))
        cluster.nodes[2].advance(100)
        for request in cluster.nodes[2].repairRequests {
            guard (try? ClientProtocol.decodeFetch(request.frames[1]))?.origin == "n2" else { continue }
            Self.answer(&cluster, request, from: 2, by: 0)
        }
        #expect(cluster.nodes[2].machine.store.properties(of: Self.address)["x"]?.value == "deleted since")
        // Then it takes n1's snapshot (here, because it is told to).
        cluster.nodes[2].machine.repair.needsSnapshot = true
        var routed = cluster.nodes[2].repairRequests.count
        for _ in 0..<20 where cluster.nodes[2].machine.counters.snapshotsApplied == 0 {
            cluster.nodes[2].handle(.peerMessage(peer: "inproc://n1", frames: beat))
            cluster.nodes[2].advance(100)
            while routed < cluster.nodes[2].repairRequests.count {
                let request = cluster.nodes[2].repairRequests[routed]
                routed += 1
                guard let paged = try? SnapshotPage.decodeRequest(request.frames[1]) else { continue }
                #expect(paged.withHorizon)
                Self.answer(&cluster, request, from: 2, by: 0)
            }
        }
        let n3 = cluster.nodes[2].machine
        #expect(n3.counters.snapshotsApplied == 1)
        #expect(n3.store.properties(of: Self.address).isEmpty, "the write the collected deletion beat is gone")
        #expect(n3.store.properties(of: kept)["y"]?.value == 1)
        #expect(n3.store.digest == cluster.nodes[0].machine.store.digest)
        #expect(n3.store.collectedThrough >= horizon, "it holds what n1 held through n1's horizon")
    }

    /// 10.9: what a peer's snapshot lacks at or below its horizon goes, but for what the peer's
    /// collection did not count: this node's own writes (after a reset it fetches them back from
    /// peers whose snapshot may lack them), a writer the snapshot's progress does not name, a
    /// member this node holds as forgotten of which it received deltas above what the progress
    /// covers; and but for a name the peer holds at any version, and anything above the horizon.
    @Test func aPeersHorizonDropsOnlyWhatItsCollectionCounted() throws {
        var node = MachineRunner(MachineRunner.configuration("n3", peers: ["n1"]))
        for (id, received) in [("n8", 5 as UInt64), ("n9", 2)] {
            node.machine.membership.merge(
                Membership.Member(
                    id: id, publish: "inproc://\(id)", api: "", state: .forgotten,
                    version: Version(milliseconds: 1_700_000_000_000, counter: 0, node: "n1")))
            var progress = OriginProgress()
            for sequence in 1...received { _ = progress.receive(sequence) }
            node.machine.origins[id] = progress
        }
        let horizon = Version(milliseconds: 1_700_000_000_500, counter: 0, node: "").timestamp
        for (name, writer, milliseconds) in [
            ("other", "n2", 100), ("own", "n3", 100), ("unnamed", "n7", 100), ("forgotten", "n8", 100),
            ("forgottenCovered", "n9", 100), ("held", "n2", 100), ("newer", "n2", 501),
        ] as [(String, String, UInt64)] {
            _ = node.machine.store.merge(
                Self.address, property: name,
                register: ReplicaStore.Register(
                    value: .string(name),
                    version: Version(milliseconds: 1_700_000_000_000 + milliseconds, counter: 0, node: writer)))
        }
        let progress: [String: UInt64] = ["n2": 10, "n3": 10, "n8": 3, "n9": 3]
        let changed = node.machine.dropCollected(
            of: [Self.address], through: horizon, progress: progress, peerNames: { _ in ["held"] })
        #expect(changed == ["c"])
        #expect(
            Set(node.machine.store.properties(of: Self.address).keys) == [
                "own", "unnamed", "forgotten", "held", "newer",
            ])
        let again = node.machine.dropCollected(
            of: [Self.address], through: horizon, progress: progress, peerNames: { _ in ["held"] })
        #expect(again.isEmpty, "nothing left to drop")
    }

    /// 10.9: each page passes its range, also one that carries no horizon above 0 (its server
    /// restarted recovering its own deltas, say): what that page listed is not dropped by the
    /// next page that carries one (found in review).
    @Test func aPageWithoutAHorizonStillPassesItsRange() throws {
        var node = MachineRunner(MachineRunner.configuration("n3", peers: ["n1"]))
        let models = ["a", "b", "c"].map { ModelAddress(channel: "c", model: $0) }
        let old = Version(milliseconds: 1_700_000_000_100, counter: 0, node: "n2")
        for address in models {
            _ = node.machine.store.merge(
                address, property: "x", register: ReplicaStore.Register(value: "old", version: old))
        }
        let horizon = Version(milliseconds: 1_700_000_000_500, counter: 0, node: "").timestamp
        let y = [
            "y": ReplicaStore.Register(
                value: 1, version: Version(milliseconds: 1_700_000_000_200, counter: 0, node: "n2"))
        ]
        node.handle(.peerMessage(peer: "inproc://n1", frames: RepairMachineTests.heartbeat("n1", latest: 0)))
        node.advance(50)
        node.machine.repair.needsSnapshot = true
        var answered = node.repairRequests.count
        for _ in 0..<20 where node.machine.counters.snapshotsApplied == 0 {
            node.handle(.peerMessage(peer: "inproc://n1", frames: RepairMachineTests.heartbeat("n1", latest: 0)))
            node.advance(100)
            while answered < node.repairRequests.count {
                let request = node.repairRequests[answered]
                answered += 1
                guard let paged = try SnapshotPage.decodeRequest(request.frames[1]) else { continue }
                // One model a page: a (horizon), b (none), c (horizon), each lacking x.
                let first = paged.after.flatMap { after in models.firstIndex(of: after).map { $0 + 1 } } ?? 0
                let page = SnapshotPage.encode(
                    latestSequence: 0, progress: first == 0 ? ["n2": 5] : [:],
                    collectedThrough: first == 1 ? 0 : horizon, maximumOctets: 1,
                    models: models[first...].map { ($0, y) })
                let id = try ClientProtocol.decodeRequestHeader(request.frames[0]).requestID
                node.handle(
                    .repairReply(peer: request.peer, frames: ClientProtocol.encodeReply(.ok, id: id, body: page.bytes)))
            }
        }
        #expect(node.machine.counters.snapshotsApplied == 1)
        let held = models.map { node.machine.store.properties(of: $0)["x"] != nil }
        #expect(held == [false, true, false], "b's page said nothing of collection")
    }

    /// 10.9 and 7.5: a node recovering its own deltas after a reset serves its snapshot pages with
    /// horizon 0 (a requester would drop the own deltas a peer still holds below it), and its
    /// horizon once the recovery ended; a request without the flag gets `SSPAGE1` pages.
    @Test func aNodeRecoveringItsOwnDeltasServesNoHorizon() throws {
        var cluster = Cluster(["n1", "n2"])
        let written = try Self.forgetWhileAWriteIsOnItsWay(&cluster, watch: nil)
        #expect(cluster.nodes[1].machine.repair.ownRecovery != nil)
        #expect(cluster.nodes[1].machine.store.collectedThrough > 0, "it took n1's horizon with n1's snapshot")
        func served(id: UInt64, withHorizon: Bool = true) throws -> UInt64? {
            let answer = cluster.nodes[1].request(
                .snapshot, id: id,
                SnapshotPage.encodeRequest(after: nil, maximumOctets: 1 << 20, withHorizon: withHorizon),
                client: [0x4C, UInt8(id)])
            let reply = try #require(answer)
            return try SnapshotPage.decode(reply.1).collectedThrough
        }
        #expect(try served(id: 60) == 0)
        Self.deliverTheWriteAndExchange(&cluster, written, rounds: 20)
        #expect(cluster.nodes[1].machine.repair.ownRecovery == nil)
        #expect(try served(id: 61) == cluster.nodes[1].machine.store.collectedThrough)
        #expect(try served(id: 62, withHorizon: false) == nil, "an SSPAGE1 page")
    }
}
