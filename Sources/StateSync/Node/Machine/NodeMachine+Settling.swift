/// Settling after a power loss (docs/PROTOCOL.md section 11.2). With `storage.fsync: interval`,
/// or `always` with `storage.publish: written`, a node publishes its writes before they are
/// durable, within sequence numbers it reserved durably. When the OS went down while it ran (a
/// power loss, a kernel crash), its log may lack deltas it had published: peers may hold them,
/// and a new write under one of their numbers would be dropped by those peers as a duplicate.
/// So the node numbers no local write until every peer it links to, and every member that left
/// (it may come back holding them), has answered a FETCH of its own origin over the numbers the
/// log may have lost; it takes back what they hold, and numbers on after the highest any of
/// them held.
extension NodeMachine {
    struct Settling: Sendable {
        /// Why the log may have lost own deltas.
        enum Cause: String, Sendable {
            /// The OS went down while the node published before syncing.
            case powerLoss = "a power loss"
            /// Recovery cut records where the log had been durable.
            case damagedLog = "a damaged log"
        }

        /// The own sequence numbers the log may have lost: after the greatest recovered, through
        /// the reservation (after a damaged log, the next 2,000).
        let range: ClosedRange<UInt64>
        let cause: Cause
        /// Per peer (its publish endpoint), the next number to ask it for.
        var askFrom: [String: UInt64] = [:]
        /// Per peer, the FETCH in flight.
        var fetches: [String: Outstanding] = [:]
        /// The peers that answered for the whole range.
        var done: Set<String> = []
        /// Local writes and write requests that arrived meanwhile, in order: taken once settled.
        var held: [Held] = []
        /// How many of them are client requests.
        var heldRequests = 0
        /// The oldest timestamp among the held local writes (they are below the node's floor).
        var heldFloor: UInt64 = .max
        /// Own deltas taken back from peers.
        var recovered = 0
        /// The greatest own number a reply held as a delta, and the greatest a reply's
        /// dropped-through mark covered within the range (a peer held those, inside its state).
        var highestReturned: UInt64 = 0
        var highestDropped: UInt64 = 0
        /// When the node last said what it waits for.
        var lastReport: UInt64?
        /// Every peer answered: the node waits for its reservation of this boot, with the
        /// numbers it found void, to be durable before it numbers the held writes (a crash
        /// before then settles again, and finds the same numbers void).
        var confirming = false

        init(range: ClosedRange<UInt64>, after cause: Cause) {
            self.range = range
            self.cause = cause
        }
    }

    enum Held: Sendable {
        case localWrites(LocalWriteRound)
        case request(client: [UInt8], frames: [[UInt8]], identity: String?)
    }

    /// The most client write requests held while settling; beyond it a SET or DELETE is refused
    /// (ERROR 5) and may be sent again.
    static let heldRequestLimit = 65_536

    /// Holds live models' writes until the node has settled.
    mutating func hold(_ round: LocalWriteRound) {
        guard !round.isEmpty, let floor = settling?.heldFloor else { return }
        // In place (optional chaining): the held list is not copied.
        settling?.heldFloor = min(floor, round.entries.lazy.map(\.version.timestamp).min() ?? .max)
        settling?.held.append(.localWrites(round))
    }

    /// Holds a client's SET or DELETE until the node has settled; `false` when too many wait.
    mutating func hold(request frames: [[UInt8]], from client: [UInt8], identity: String?) -> Bool {
        guard let requests = settling?.heldRequests, requests < Self.heldRequestLimit else { return false }
        settling?.heldRequests += 1
        settling?.held.append(.request(client: client, frames: frames, identity: identity))
        return true
    }

    /// The peers a settling node must hear from, by publish endpoint: those it links to, and the
    /// members that left (not those forgotten): a member that stopped cleanly may hold the lost
    /// deltas and come back with them.
    var settlingPeers: [String] {
        var endpoints = Set(peerEndpoints)
        for member in membership.sorted where member.state == .left && member.id != configuration.nodeID {
            if !peerEndpoints.contains(where: { linkedID(of: $0) == member.id }) { endpoints.insert(member.publish) }
        }
        return endpoints.sorted()
    }

    /// The ``settlingPeers`` that have not answered for the whole range yet, by publish endpoint,
    /// and whether each can be asked now: connected, with a repair link.
    func settlingWaits(_ settling: Settling) -> [(peer: String, reachable: Bool)] {
        settlingPeers.filter { !settling.done.contains($0) }.map { peer in
            (peer, repair.links[peer] != nil && (peers[peer].map { isConnected($0) } ?? false))
        }
    }

    /// The peers a settling node still waits for, as STATUS names them: by the id it links
    /// the endpoint to, else by the member entry at that endpoint (not heard since the start:
    /// one alive, suspect or down, or one that left, as ``settlingPeers`` added it; a forgotten
    /// member does not lend its name, as in ``NodeStatus/notReadyReasons``). Once every peer
    /// answered it waits for no one (a peer linked since is not asked).
    func settlingStatus(_ settling: Settling) -> [NodeStatus.SettlingPeer] {
        guard !settling.confirming else { return [] }
        let waits = settlingWaits(settling)
        guard !waits.isEmpty else { return [] }
        let members = Dictionary(
            membership.sorted.filter { $0.state != .forgotten && $0.id != configuration.nodeID }.map {
                ($0.publish, $0.id)
            },
            uniquingKeysWith: { first, _ in first })
        return waits.map { peer, reachable in
            NodeStatus.SettlingPeer(endpoint: peer, node: linkedID(of: peer) ?? members[peer], reachable: reachable)
        }
    }

    /// At every repair round: asks each peer that has not answered for the next part of the
    /// range; once every one of ``settlingPeers`` has answered all of it, numbers the held
    /// writes. A FETCH unanswered for 1000 ms is sent again on a new link (libzmq drops a
    /// connection for good after a frame over its maximum size).
    mutating func advanceSettling() {
        guard var settling, !settling.confirming else { return }
        for (peer, fetch) in settling.fetches.sorted(by: { $0.key < $1.key }) where fetch.deadline <= now {
            settling.fetches[peer] = nil
            remakeRepairLink(ofUnanswering: peer)
        }
        let waits = settlingWaits(settling)
        for (peer, reachable) in waits where reachable {
            let from = settling.askFrom[peer] ?? settling.range.lowerBound
            guard settling.fetches[peer] == nil else { continue }
            let range = Self.limited(from...settling.range.upperBound)
            let id = nextRepairID()
            settling.fetches[peer] = Outstanding(
                peer: peer, requestID: id, deadline: now + Self.repairTimeout, range: range)
            actions.append(
                .sendRepairRequest(
                    peer: peer, requestID: id,
                    frames: ClientProtocol.encodeRequest(
                        .fetch, id: id,
                        body: ClientProtocol.encodeFetch(origin: configuration.nodeID, range: range))))
        }
        guard !waits.isEmpty else {
            self.settling = settling
            finishSettling()
            return
        }
        if settling.lastReport.map({ now &- $0 >= 10_000 }) ?? true {
            settling.lastReport = now
            logger.warning(
                "holding writes until these peers say which of this node's possibly lost deltas they hold; those unreachable are down, left, or advertise no API this node may dial (a peer that is gone for good: statesync forget it)",
                metadata: [
                    "peers": "\(waits.map(\.peer).joined(separator: ", "))",
                    "peers.unreachable": "\(waits.filter { !$0.reachable }.map(\.peer).joined(separator: ", "))",
                    "delta.range": "\(settling.range)", "writes.held": "\(settling.held.count)",
                ])
        }
        self.settling = settling
    }

    /// A FETCH reply to a settling request: takes back the own deltas it holds, moves the next
    /// sequence number past them (and past what the peer dropped from its history), and asks
    /// the next part of the range at once. Returns `false` for another request.
    mutating func settlingReply(_ requestID: UInt64, kind: ClientProtocol.ReplyKind, body: [UInt8], from peer: String)
        -> Bool
    {
        guard var settling, let fetch = settling.fetches[peer], fetch.requestID == requestID else { return false }
        settling.fetches[peer] = nil
        self.settling = settling
        // An error or an undecodable answer is asked again at the next round.
        guard kind == .ok, let (deltas, droppedThrough, _) = try? ClientProtocol.decodeFetched(body) else {
            let reason =
                kind == .error ? (try? ClientProtocol.decodeError(body))?.message ?? "?" : "an undecodable reply"
            warnLimited(
                "settling-refused", "a peer did not answer a settling FETCH; asking again",
                metadata: ["peer.endpoint": "\(peer)", "error": "\(reason)"])
            return true
        }
        let own = configuration.nodeID
        let wanted = deltas.filter { $0.origin == own && fetch.range.contains($0.sequence) }
        let fresh = applyRemote(wanted, from: peer, repaired: true)
        counters.deltasFetched += wanted.count
        var highest = wanted.lazy.map(\.sequence).max() ?? 0
        if let returned = self.settling?.highestReturned, highest > returned {
            self.settling?.highestReturned = highest
        }
        // Numbers it held and dropped from its history exist too (a mark above the range asked
        // counts as its last number: the next part is asked next).
        if droppedThrough >= fetch.range.lowerBound {
            let dropped = min(droppedThrough, fetch.range.upperBound)
            highest = max(highest, dropped)
            if let before = self.settling?.highestDropped, dropped > before { self.settling?.highestDropped = dropped }
        }
        if highest > 0 {
            nextSequence = max(nextSequence, highest + 1)
            ownHeldByPeers(through: highest)
        }
        self.settling?.recovered += fresh.count
        if fetch.range.upperBound >= (self.settling?.range.upperBound ?? .max) {
            self.settling?.done.insert(peer)
        } else {
            self.settling?.askFrom[peer] = fetch.range.upperBound + 1
        }
        // The next part at once, not at the next round.
        advanceSettling()
        return true
    }

    /// Every peer answered: the numbers lost everywhere are declared void, and the reservation
    /// is written again, made in this boot, with them (a later process crash has nothing to
    /// settle, and still knows them); once it is durable, ``completeSettling()``.
    private mutating func finishSettling() {
        guard let settled = settling, !settled.confirming else { return }
        settling?.confirming = true
        declareVoid(settled)
        actions.append(.reserveSequences(through: durability.reserved, void: voidOwn))
    }

    /// The reservation of this boot is durable: the held writes are numbered after everything
    /// any peer holds, in the order they came. (No other reservation is asked for while the node
    /// settles — it numbers nothing, and releases nothing — and the host reports reservations
    /// in order, so the first report while confirming is this one.)
    mutating func completeSettling() {
        guard let settled = settling, settled.confirming else { return }
        settling = nil
        counters.ownDeltasTakenBack += settled.recovered
        if settled.cause == .damagedLog { actions.append(.logDamageSettled) }
        logger.notice(
            "settled after \(settled.cause.rawValue): every peer said which of this node's deltas it holds",
            metadata: [
                "delta.range": "\(settled.range)", "deltas.taken_back": "\(settled.recovered)",
                "next_sequence": "\(nextSequence)", "writes.held": "\(settled.held.count)",
            ])
        for held in settled.held {
            switch held {
            case .localWrites(let round): takeLocalWrites(round)
            case .request(let client, let frames, let identity):
                counters.clientRequests -= 1  // counted when it came
                handleClientRequest(frames, from: client, identity: identity)
            }
        }
    }
}

extension NodeMachine {
    /// Settled: an own number below one a peer returned that no peer held (none returned it,
    /// no peer's dropped-through mark covers it) was published and then lost everywhere — every
    /// peer missed it on the live stream and the power loss took it from the log. It will never
    /// exist: the node takes it as received and declares it void in FETCH replies (section 10.8),
    /// so the peers that hold the later numbers close their gap instead of asking for it for
    /// good. The numbers are kept with the reservation, which a restart reads back.
    private mutating func declareVoid(_ settled: Settling) {
        guard !faults.skipVoid, settled.highestReturned > 0 else { return }
        let own = configuration.nodeID
        let first = max(settled.range.lowerBound, settled.highestDropped + 1)
        guard first < settled.highestReturned, var progress = origins[own] else { return }
        var sequences: [UInt64] = []
        for sequence in first..<settled.highestReturned where progress.receive(sequence) { sequences.append(sequence) }
        origins[own] = progress
        guard !sequences.isEmpty else { return }
        counters.voidSequences += sequences.count
        rememberVoid(origin: own, sequences)
        passVoidInWatches(origin: own, sequences)
        logger.warning(
            "own deltas that were published before \(settled.cause.rawValue) are held by no peer below ones a peer holds: lost everywhere, declared void",
            metadata: [
                "delta.ranges":
                    "\([].merged(adding: sequences).map { "\($0.lowerBound)...\($0.upperBound)" }.joined(separator: ","))",
                "void.count": "\(sequences.count)",
            ])
    }

    /// At start: the own numbers an earlier settling declared void are received (they hold no
    /// delta) and still declared in FETCH replies.
    mutating func takeRecoveredVoid(_ void: [ClosedRange<UInt64>]) {
        guard !void.isEmpty else { return }
        let own = configuration.nodeID
        var progress = origins[own] ?? OriginProgress()
        for range in void {
            for sequence in range { _ = progress.receive(sequence) }
        }
        origins[own] = progress
        voidKnown[own] = void
        // Below a number a peer held, so below what the log holds; never numbered again anyway.
        if let last = void.last, last.upperBound < .max { nextSequence = max(nextSequence, last.upperBound + 1) }
    }

    /// Stopping while settling: the held client writes were never numbered or logged; their
    /// clients are told (ERROR 5), the live models' writes are dropped with a warning.
    mutating func refuseHeldWritesAtStop() {
        guard let held = settling?.held, !held.isEmpty else { return }
        logger.warning(
            "stopping before settling: the writes held meanwhile were never numbered, logged or acknowledged, and are dropped",
            metadata: ["writes.held": "\(held.count)"])
        for case .request(let client, let frames, _) in held {
            guard let header = try? ClientProtocol.decodeRequestHeader(frames[0]) else { continue }
            counters.clientErrors += 1
            actions.append(
                .reply(
                    client: client,
                    frames: ClientProtocol.encodeReply(
                        .error, id: header.requestID,
                        body: ClientProtocol.encodeError(
                            .internal,
                            "node \(configuration.nodeID) stopped before it settled after \(settling?.cause.rawValue ?? "a power loss"); the write was not made"
                        ))))
        }
        settling?.held = []
        settling?.heldRequests = 0
    }
}
