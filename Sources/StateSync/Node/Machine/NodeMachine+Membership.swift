/// Membership (docs/PROTOCOL.md section 7.5): the member list every node keeps, spread in
/// HEARTBEATs and by ANNOUNCE, and the links it makes to the members it learns.
///
/// A node configured with one reachable member (a seed) subscribes to it, learns every member
/// from its HEARTBEATs and subscribes to them; it ANNOUNCEs its own entry to each peer whose
/// list lacks it, so they subscribe to it in turn, and their HEARTBEATs carry it to the rest.
extension NodeMachine {
    /// The member list rides on the HEARTBEATs that follow a change of it, and on every tenth:
    /// it is O(members) octets on every HEARTBEAT of every node otherwise (1.3 MB/s into each
    /// node of a simulated 64-node cluster at 100 ms heartbeats).
    static let membersAfterChange = 3
    static let membersEveryHeartbeats = 10
    /// A list of at most this many entries rides on every HEARTBEAT (section 7.5, "Spreading"):
    /// a node joining through a member that does not subscribe to it may ANNOUNCE only once it
    /// has heard that member's list, which came up to ten heartbeat intervals later (5 s at the
    /// default). Eight entries of about 90 octets each: 0.7 KB a HEARTBEAT; into each node of a
    /// full mesh of eight, 10 KB/s at the default interval, 50 KB/s at 100 ms.
    static let membersOnEveryHeartbeatUpTo = 8

    /// The member list rides on the next ``membersAfterChange`` HEARTBEATs (section 7.5,
    /// "Spreading"): after a change of it, a peer's new start, a new subscriber.
    mutating func sendListOnNextHeartbeats() {
        listDueFrom = heartbeatsSent
    }

    /// Writes this node's own entry with a fresh version: alive when it starts (its endpoints),
    /// left when it stops cleanly.
    mutating func writeOwnEntry(_ state: Membership.State) {
        sendListOnNextHeartbeats()
        membership.merge(
            Membership.Member(
                id: configuration.nodeID, publish: boundPublish,
                api: configuration.apiEndpoint != nil || configuration.repairEndpoint != nil ? boundRepair : "",
                state: state, version: clock.next(), incarnation: incarnation))
    }

    /// This node's entry as it stands.
    var ownEntry: Membership.Member? { membership.members[configuration.nodeID] }

    /// Whether `member` is this node's entry as this start wrote it: the same entry, naming this
    /// start's incarnation. (Two starts can write entries equal but for it: a version repeats
    /// across starts. One relayed only by nodes of an earlier version names no start, and does
    /// not count.)
    func isThisStartsEntry(_ member: Membership.Member) -> Bool {
        member == ownEntry && member.incarnation == incarnation
    }

    /// Merges the member list of a HEARTBEAT from `sender` at `endpoint`, links to new members,
    /// and ANNOUNCEs this node's entry if the sender's list lacks it.
    mutating func receiveMembers(_ list: [Membership.Member], from endpoint: String, sender: String) {
        var theirs: Membership.Member?
        for member in list {
            if member.id == configuration.nodeID {
                theirs = member
                if isThisStartsEntry(member), member.state == .alive { ownEntryAcknowledged = true }
            }
            // Entries are kept as their node wrote them (a rewritten one would differ from its
            // writer's at the same version); the sender's own publish endpoint bound to a
            // wildcard host is dialled where its stream comes from.
            takeMember(member, dialAt: member.id == sender ? Self.reachable(member.publish, via: endpoint) : nil)
        }
        // It knows this node (it saved its list before sending it): its own deltas are taken;
        // not once its list says this node was forgotten.
        let knew = peers[endpoint]?.listsThisNode ?? false
        peers[endpoint]?.listsThisNode = theirs.map { $0.state != .forgotten } ?? false
        // What was left to repair until it knew this node is asked for at once.
        if !knew, peers[endpoint]?.listsThisNode == true { repairsDue = true }
        // Not while a reset is unwritten: the entry would undo the forget on the peer, and a
        // restart before the reset is written would come back with what it dropped.
        guard refusal == nil, !resetUnwritten, let own = ownEntry, theirs.map({ $0.version < own.version }) ?? true
        else { return }
        announce(own, to: endpoint)
    }

    /// Takes one entry learned from a peer or an ANNOUNCE (`fromItself`: the member's own
    /// ANNOUNCE, which it sends only once it has heard this node's list); a new alive member is
    /// dialled at `dialAt` when given (its publish endpoint resolved), else at its publish
    /// endpoint.
    mutating func takeMember(_ member: Membership.Member, dialAt: String? = nil, fromItself: Bool = false) {
        if member.id == configuration.nodeID {
            // Forgotten before this start (no peer has held this start's entry yet, and the
            // forget does not name this start's incarnation), with none of its own deltas on
            // disk: not the node that was forgotten coming back. A forget made while it runs is
            // answered below.
            let unanswered = member.state == .forgotten && member.version > (resyncedAfterForget?.version ?? .zero)
            let ofThisStart = member.incarnation == incarnation
            if unanswered, startedWithoutOwnDeltas, !ownEntryAcknowledged, !ofThisStart {
                refuseToRun(
                    "node id \(configuration.nodeID) was forgotten (statesync forget, by \(member.version.node)), and this node started with none of its own deltas in its data directory: a forgotten id does not come back that way (it cannot tell a node that never wrote from one whose writes are lost). Give it a new node.id (the data directory can stay: it keeps what the node took from its peers), or restore a data directory holding its own writes"
                )
                return
            }
            // Forgotten while it ran, or while it was away: a forget newer than the last one it
            // answered. Whatever it said about itself since may have been written without
            // knowing of it (a restart, a clock ahead of the forgetter's), and the others may have
            // collected deletions without it. It takes their state, once per forget, and says it
            // is alive again once that is written. Heard while it stops, it is not answered with
            // the leave (the forget would be gone from the cluster, and the node, back, would
            // never drop its state): back, the node hears it again.
            if unanswered, !faults.skipReset {
                guard !stopping else { return }
                resyncedAfterForget = member
                // An operator's act this node answers by itself, not a fault of this node.
                logger.warning(
                    "this node was forgotten by another member (statesync forget); it stays in the cluster because it runs, and says so",
                    metadata: ["member.version": "\(member.version)"])
                resyncAfterForget(by: member.version.node)
                clock.advance(past: member.version)
                return
            }
            // A newer entry about this node than the one it wrote at this start: written by
            // another (an operator's forget, a forged leave), or by itself in an earlier run (the
            // leave it wrote when it stopped, from a clock that was ahead of its clock now). It
            // says again what it is, with a later version. Also at an equal version with another
            // content: its member entries are not logged, so a restarted node's clock can give
            // the version of the leave it wrote when it stopped once more.
            // And at an equal version naming another start (an earlier start's entry, which peers
            // would keep over this one's if its incarnation is the higher).
            let otherStart = member.incarnation.map { $0 != incarnation } ?? false
            guard let own = ownEntry,
                own.version < member.version || (own.version == member.version && (own != member || otherStart))
            else { return }
            // Written again by a start it superseded: that start runs (section 7.5, "Two nodes
            // under one id"). A node that refused says nothing more about itself.
            if refuseIfAnotherStartRuns(member) || refusal != nil { return }
            clock.advance(past: member.version)
            // Not before a reset is written: once peers hear it is alive the forget is gone from
            // the cluster, and a restart would come back with what it dropped.
            if !resetUnwritten { writeOwnEntry(stopping ? .left : .alive) }
            return
        }
        // A member this node holds as forgotten is taken back only from itself, by ANNOUNCE: an
        // entry of it that a HEARTBEAT's list carries (a third node's, or its own, sent before it
        // heard of the forget) may have been written before it learned of the forget (at a
        // restart, or by a clock ahead of the forgetter's), and would undo the forget here before
        // the member hears of it, and it would never drop its state (section 7.5). Back, it
        // hears this node's list, drops its state and answers with its own entry.
        if member.state != .forgotten, !fromItself, membership.members[member.id]?.state == .forgotten { return }
        let wasAway = membership.members[member.id].map { $0.state != .alive } ?? false
        guard membership.merge(member) else { return }
        counters.membershipUpdates += 1
        sendListOnNextHeartbeats()
        if member.state == .alive, wasAway { aliveAgainAt[member.id] = now }
        if member.state == .alive {
            link(member, at: dialAt ?? member.publish)
        } else {
            unlink(member.id, publishingAt: member.publish, because: member.state)
        }
    }

    /// The state this node dropped after a forget is in its snapshot file: it says it is alive
    /// again, with an entry newer than the forget and than all it said before, and its members
    /// file keeps the forget as answered (a restart does not reset again for it).
    mutating func resetWritten() {
        answeredForget = resyncedAfterForget
        writeOwnEntry(stopping ? .left : .alive)
    }

    /// This node was forgotten (section 7.5): while it was away the others collected deletions
    /// without waiting for it (section 8.4), so what it holds may be data deleted since. It
    /// drops its state — its replica, what it received of every origin, its history and journal
    /// — and takes a peer's snapshot instead; its own deltas no peer holds are given up (its
    /// sequence numbers go on after them, and its snapshot covers them). The reset is made
    /// durable by a compaction (retried at repair rounds while it fails).
    mutating func resyncAfterForget(by forgetter: String) {
        let own = configuration.nodeID
        let latest = nextSequence - 1
        var fresh = ReplicaStore()
        fresh.plantedWrongTieBreak = faults.wrongTieBreak
        fresh.plantedIgnoreDeletions = faults.ignoreDeletions
        store = fresh
        origins = [:]
        history = [:]
        journal.dropAll()
        antiEntropy = AntiEntropy()  // what was compared was the state dropped
        coverWithoutHistory(origin: own, through: latest)
        ownHeldByPeers(through: latest)
        durability.staged = []
        durability.stagedBodies = []
        durability.stagedPositions = []
        durability.stagedRecords = NodeMachine.StagedRecords()
        // Writes waiting to be acknowledged are given up with the rest: their clients are told
        // (also those whose OK, with `interval`, waited for the end of the round). Such a write
        // may have been published already (before its sync, at its reservation) and be kept by a
        // peer after all: the ERROR says it may be lost, not that it is.
        let givenUp =
            durability.heldOKs.map { ($0.client, $0.ok.id) }
            + durability.replies.map { ($0.client, $0.answer.requestID) }
        durability.heldOKs = []
        for (client, id) in givenUp {
            actions.append(
                .reply(
                    client: client,
                    frames: ClientProtocol.encodeReply(
                        .error, id: id,
                        body: ClientProtocol.encodeError(
                            .internal,
                            "node \(own) was forgotten while this write waited to be acknowledged: it may be lost; send it again"
                        ))))
        }
        durability.replies = []
        collection = CollectionState()
        repair.needsSnapshot = true
        repair.fetches = [:]
        // A snapshot being taken or served stands for the state dropped: taken again, and a
        // requester's next page refused (it starts over).
        repair.stream = nil
        repair.snapshot = nil
        repair.servingBeforeReset.formUnion(repair.serving.keys)
        repair.serving = [:]
        // Its own deltas a peer gets after serving the snapshot taken are fetched back from it.
        repair.ownRecovery = latest > 0 ? StateSnapshot.OwnRecovery(through: latest, recovered: nil) : nil
        lastResetThrough = latest
        repair.ownRecoveryFetch = nil
        repair.ownRecoverySweep = false
        repair.ownRecoverySwept = [:]
        // Written at once (unless a sync runs, which only a host that syncs in the background
        // has: then once it ends), and the node says it is alive again only once the driver
        // reports it written: then the cluster no longer says it was forgotten, and a restart
        // before would keep what it held.
        durability.compactionPending = true
        resetUnwritten = true
        // A compaction of an earlier reset still being written does not write this one: only
        // the compaction asked for from here on does (it sets this when it is asked).
        durability.resetCompaction = nil
        if durability.syncRequested == nil { compact() } else { durability.resetWaitsForSync = true }
        counters.resyncs += 1
        // A watch that takes resets gets one once the peer's snapshot is merged (its client may
        // hold writes given up here); the others are resynced as before, merging.
        for key in watches.order where watches[key]?.takesResets == true { watches[key]?.resetDue = true }
        resyncWatches(of: Set(watches.order.compactMap { watches[$0]?.channel }), merged: false)
        logger.warning(
            "this node was forgotten while away: dropping its state and taking a peer's snapshot (deletions it missed may have been collected; its writes no peer holds are given up)",
            metadata: ["forgotten.by": "\(forgetter)", "sequence": "\(latest)"])
    }

    /// Stops the node for good with `reason` (once): it takes no more input that matters, and
    /// its host stops it.
    mutating func refuseToRun(_ reason: String) {
        guard refusal == nil else { return }
        refusal = reason
        logger.critical("refusing to run", metadata: ["reason": "\(reason)"])
        actions.append(.refuseToRun(reason: reason))
    }

    /// Stopping: once every own delta is published, writes this node's entry as left and
    /// publishes a HEARTBEAT with it — after the deltas, so that peers, which drop their links
    /// to a member that left, have received all of them.
    mutating func leaveIfDrained() {
        // A node that refused to run says nothing more about itself (it would undo a forget).
        releaseReservationIfDrained()
        guard stopping, !leftAnnounced, refusal == nil, !resetUnwritten, durability.staged.isEmpty else { return }
        leftAnnounced = true
        writeOwnEntry(.left)
        saveMembersIfChanged()
        actions.append(.publish(heartbeat(floor: ownFloor).encode()))
    }

    /// The node id linked at a peer endpoint, if known.
    func linkedID(of endpoint: String) -> String? {
        configuration.peerNodeIDs[endpoint] ?? learnedPeerIDs[endpoint] ?? peers[endpoint]?.node
    }

    /// Drops every link to a member that left or was forgotten, and stops awaiting its deltas
    /// that no remaining peer reports holding (its deltas already received stay).
    mutating func unlink(_ id: String, publishingAt publish: String, because state: Membership.State) {
        guard id != configuration.nodeID else { return }
        forgetDigests(of: id, publishingAt: publish)
        // Its endpoint, and any other where it was heard or configured by id.
        let endpoints = peerEndpoints.filter { $0 == publish || linkedID(of: $0) == id }
        // A configured peer that left may come back (a forgotten one is gone for good).
        if state == .forgotten { droppedConfiguredPeers = droppedConfiguredPeers.filter { $0.value != id } }
        for endpoint in endpoints {
            if state == .left, configuration.peers.contains(endpoint) { droppedConfiguredPeers[endpoint] = id }
            if let heard = peers[endpoint]?.lastMessageAt {
                departedLastHeard[id] = max(departedLastHeard[id] ?? 0, heard)
            }
            peerEndpoints.removeAll { $0 == endpoint }
            peers[endpoint] = nil
            learnedPeerIDs[endpoint] = nil
            unheardLinkSince[endpoint] = nil
            unheardLinkResets[endpoint] = nil
            repair.links[endpoint] = nil
            repair.withdrawn[endpoint] = nil
            lastAnnounce[endpoint] = nil
            actions.append(.disconnectPeer(endpoint: endpoint))
        }
        if var progress = origins[id] {
            let held = peerEndpoints.compactMap { peers[$0]?.progress[id] }.max() ?? 0
            progress.announced = max(progress.highestReceived, held)
            origins[id] = progress
        }
        if !endpoints.isEmpty {
            logger.notice(
                "a member \(state == .left ? "left the cluster" : "was forgotten"); dropped its links",
                metadata: ["member": "\(id)", "links": "\(endpoints.joined(separator: ","))"])
        }
    }

    /// FORGET (section 10.12): an operator removes a member for good. This node writes the
    /// member's entry as forgotten; the entry spreads, and every node drops its links.
    mutating func forget(_ id: String) throws {
        guard id != configuration.nodeID else {
            throw StateSyncError(
                .protocolError, "node \(id) cannot forget itself; stop it (it leaves), then forget it on another member"
            )
        }
        guard let held = membership.members[id] else {
            throw StateSyncError(.protocolError, "no member '\(id)' (statesync members lists them)")
        }
        // A running member answers a forget by saying it is alive again: forget only the gone.
        if held.state == .alive, let heard = memberStatus().first(where: { $0.id == id }), heard.connected {
            throw StateSyncError(
                .protocolError,
                "member '\(id)' is alive (heard \(heard.lastSeenMillisecondsAgo ?? 0) ms ago): stop it first (a clean stop leaves by itself); forget is for a node that is gone for good"
            )
        }
        // Newer than the entry it replaces, whatever this node's clock says: that entry may come
        // from a clock ahead of it (its writer's, within the drift bound), and an older forget
        // would be dropped by every node, this one first, while the operator was told OK.
        clock.advance(past: held.version)
        // It names the start of the entry it replaces (a forget's, the start that one removed):
        // that start learns the forget was made while it ran, even if no list it heard held it.
        let entry = Membership.Member(
            id: id, publish: held.publish, api: held.api, state: .forgotten, version: clock.next(),
            incarnation: held.incarnation)
        takeMember(entry)
        logger.notice("forgot a member (statesync forget)", metadata: ["member": "\(id)"])
    }

    /// Subscribes to `member` unless it is linked already (configured, or learned before), has
    /// no usable publish endpoint, or (with security) has no trusted key here.
    mutating func link(_ member: Membership.Member, at publish: String) {
        guard !publish.isEmpty, !Self.isWildcard(publish) else { return }
        if peerEndpoints.contains(publish) { return }
        if peerEndpoints.contains(where: { linkedID(of: $0) == member.id }) { return }
        if configuration.security != nil, !admittedPeers.contains(member.id) {
            warnLimited(
                "member-without-key",
                "learned a member whose key this node does not trust; not linking to it (add it to security.peer_keys)",
                metadata: ["member": "\(member.id)", "publish": "\(publish)"])
            return
        }
        peerEndpoints.append(publish)
        learnedPeerIDs[publish] = member.id
        peers[publish] = peers[publish] ?? PeerProgress()
        actions.append(.connectPeer(endpoint: publish, node: member.id))
        logger.info(
            "linked to a member learned from the member list",
            metadata: ["member": "\(member.id)", "publish": "\(publish)"])
    }

    /// The node links to no peer: every one it had left or was forgotten (section 7.5). It hears
    /// no member list, and no one may link to it (a node forgotten while it was cut off never
    /// learns it). It dials again its configured peers whose members left (not those forgotten):
    /// when one is back, its HEARTBEATs bring the list (one that never comes back stays a silent
    /// link).
    mutating func relinkConfiguredPeers() {
        for (endpoint, id) in droppedConfiguredPeers.sorted(by: { $0.key < $1.key }) {
            if configuration.security != nil, !admittedPeers.contains(id) { continue }
            peerEndpoints.append(endpoint)
            learnedPeerIDs[endpoint] = id
            peers[endpoint] = PeerProgress()
            actions.append(.connectPeer(endpoint: endpoint, node: id))
        }
        logger.warning(
            "this node linked to no peer (each left or was forgotten): dialling again its configured peers that left",
            metadata: ["peers": "\(droppedConfiguredPeers.keys.sorted().joined(separator: ","))"])
        droppedConfiguredPeers = [:]
    }

    /// Links every alive member not linked yet: after a reload that may trust new keys.
    mutating func linkKnownMembers() {
        for member in membership.sorted where member.state == .alive && member.id != configuration.nodeID {
            link(member, at: member.publish)
        }
    }

    /// Sends `own` to the peer at `endpoint` over its repair link, at most once per heartbeat
    /// interval.
    mutating func announce(_ own: Membership.Member, to endpoint: String) {
        guard repair.links[endpoint] != nil else { return }
        let interval = UInt64(configuration.heartbeatIntervalMilliseconds)
        if let last = lastAnnounce[endpoint], now &- last < interval { return }
        lastAnnounce[endpoint] = now
        let id = nextRepairID()
        if announcesInFlight.count >= 64 { announcesInFlight.removeAll() }
        announcesInFlight[id] = own
        counters.announcesSent += 1
        actions.append(
            .sendRepairRequest(
                peer: endpoint, requestID: id,
                frames: ClientProtocol.encodeRequest(.announce, id: id, body: Membership.encodeAnnounce(own))))
    }

    /// An ANNOUNCE request: a node's own entry. With security only that node's key may send it.
    /// Returns whether the member list holds that entry now (the answer tells the sender: section
    /// 10.11).
    mutating func receiveAnnounce(_ body: [UInt8], identity: String?) throws -> Bool {
        let member = try Membership.decodeAnnounce(body)
        guard NodeConfiguration.isValidNodeID(member.id) else {
            throw StateSyncError(.protocolError, "'\(member.id.prefix(64))' is not a node id")
        }
        if configuration.security != nil, identity != "node:\(member.id)" {
            throw Forbidden(message: "a node may announce only its own member entry")
        }
        guard member.version.node == member.id else {
            throw StateSyncError(.protocolError, "an ANNOUNCE carries the sender's own entry, written by itself")
        }
        guard member.state != .alive || (!Self.isWildcard(member.publish) && !member.publish.isEmpty) else {
            throw StateSyncError(
                .protocolError,
                "member \(member.id) publishes at \(member.publish), which no other host can dial; bind network.publish to a concrete address to join through a seed"
            )
        }
        guard clock.observe(member.version) else {
            throw StateSyncError(.protocolError, "the entry's version is further ahead than clock.max_drift_ms")
        }
        takeMember(member, fromItself: true)
        // That very entry, of the start that announced it (when it names one).
        guard let held = membership.members[member.id], held == member else { return false }
        return member.incarnation == nil || held.incarnation == member.incarnation
    }

    /// Whether `endpoint` is bound to every interface (`tcp://*:P`, `tcp://0.0.0.0:P`).
    static func isWildcard(_ endpoint: String) -> Bool {
        endpoint.hasPrefix("tcp://*:") || endpoint.hasPrefix("tcp://0.0.0.0:") || endpoint.hasPrefix("tcp://[::]:")
    }

    /// Every member as this node sees it (status, `statesync members`).
    func memberStatus() -> [NodeStatus.Member] {
        var lastHeard: [String: UInt64] = [:]
        var heardAt: [String: PeerProgress] = [:]
        for (_, progress) in peers {
            guard let node = progress.node, let at = progress.lastMessageAt else { continue }
            if at >= lastHeard[node] ?? 0 { heardAt[node] = progress }
            lastHeard[node] = max(lastHeard[node] ?? 0, at)
        }
        return membership.sorted.map { member in
            let heard = lastHeard[member.id] ?? departedLastHeard[member.id]
            // Back after it left: silent since it said so, not since its last HEARTBEAT before.
            let silentSince = [heard, aliveAgainAt[member.id]].compactMap { $0 }.max()
            let isSelf = member.id == configuration.nodeID
            let interval = interval(of: heardAt[member.id])
            let state: String
            switch member.state {
            case .alive where isSelf: state = "alive"
            case .alive:
                if let silentSince, now &- silentSince <= 3 * interval {
                    state = "alive"
                } else if let silentSince, now &- silentSince < silenceLimit(of: heardAt[member.id]) {
                    state = "suspect"
                } else {
                    state = "down"
                }
            case .left, .forgotten: state = "\(member.state)"
            }
            return NodeStatus.Member(
                id: member.id, publishEndpoint: member.publish, apiEndpoint: member.api, state: state,
                lastSeenMillisecondsAgo: isSelf ? nil : heard.map { Int(now &- $0) },
                missingDeltas: Int(clamping: origins[member.id]?.missing ?? 0),
                connected: isSelf || heard.map { now &- $0 <= 3 * interval } ?? false,
                version: member.version.description)
        }
    }
}
