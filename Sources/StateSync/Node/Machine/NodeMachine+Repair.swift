/// Gap repair between nodes (docs/PROTOCOL.md section 11.3): per-origin sequence numbers reveal
/// missing deltas; the node FETCHes exactly those from a peer over a link to the peer's API (or
/// repair endpoint), preferring the origin itself, and falls back to a SNAPSHOT when no peer
/// still holds them.
extension NodeMachine {
    struct Outstanding: Sendable {
        let peer: String
        let requestID: UInt64
        let deadline: UInt64
        let range: ClosedRange<UInt64>
    }

    struct RepairState: Sendable {
        /// Per peer (its configured publish endpoint), the endpoint its link is connected to.
        var links: [String: String] = [:]
        /// Per origin, the FETCH in flight.
        var fetches: [String: Outstanding] = [:]
        var snapshot: Outstanding?
        var nextID: UInt64 = 1
        /// Per origin, the peers that answered a FETCH saying they no longer hold what is missing.
        var exhausted: [String: Set<String>] = [:]
        /// Per origin, the peers among those that never held it either (they dropped nothing at
        /// or above the range asked): if the origin itself is one, the numbers do not exist.
        var neverHeld: [String: Set<String>] = [:]
        /// Per peer (publish endpoint), per origin: a claim withdrawn (section 11.3): while the
        /// peer repeats exactly this announcement for the origin, it is not followed again.
        var withdrawn: [String: [String: UInt64]] = [:]
        var needsSnapshot = false
        /// Turns among the peers asked: one for FETCHes, one for SNAPSHOTs (shared, a snapshot
        /// could keep landing on the same peer whatever the number of fetches in between).
        var rotation = 0
        var snapshotRotation = 0
        /// A snapshot was merged and must be made durable (compaction).
        var mergedSnapshot = false
        /// The streamed SNAPSHOT being received, if any.
        var stream: SnapshotStream?
        /// The streamed SNAPSHOTs being served, by requester (routing id): the model order
        /// fixed at the first page (section 10.9). At most ``NodeMachine/servedSnapshotLimit``.
        var serving: [[UInt8]: ServedSnapshot] = [:]
        /// Requesters of streamed SNAPSHOTs begun before this node dropped its state (section
        /// 7.5): their next page is refused, so that they start over (the pages before stand for
        /// a state that is gone).
        var servingBeforeReset: Set<[UInt8]> = []
        /// This node's own deltas published before it dropped its state (it was forgotten,
        /// section 7.5), which may reach a peer after the peer served the snapshot it took: those
        /// through `recovered` are in its state again (what the first snapshot merged since held,
        /// and what was fetched back since). Kept in its snapshot file while it lasts.
        var ownRecovery: StateSnapshot.OwnRecovery?
        /// The FETCH of own deltas in flight; whether it asks a peer that reports no mark above
        /// R (a sweep: it may hold some above a gap of its own).
        var ownRecoveryFetch: Outstanding?
        var ownRecoverySweep = false
        /// Per peer, through which own number it answered a sweep since the reset (or the
        /// restart): a FETCH asks for at most 2000 numbers.
        var ownRecoverySwept: [String: UInt64] = [:]
    }

    /// A streamed SNAPSHOT being received: its peer, the cursor of the next page, the progress
    /// its first page carried (covered once the last page is merged), the channels it changed.
    struct SnapshotStream: Sendable {
        var peer: String
        var after: ModelAddress?
        var progress: [String: UInt64]?
        var changed: Set<String> = []
        var pages = 0
        /// Requests of the current page that went unanswered: past ``NodeMachine/pageAttempts``
        /// the transfer starts over with another peer.
        var attempts = 0
        /// The models this node held when the first page came, in page order, that no page has
        /// covered yet: each page's range is compared with them when the page carries a horizon
        /// above 0 (``dropCollected(of:through:progress:peerNames:)``). `nil` when the first page
        /// carried none.
        var held: ArraySlice<ModelAddress>?
        /// The least horizon of collection the pages carried (`nil`: one carried none).
        var horizon: UInt64?
        /// The page being read and merged, a slice at a time (``mergePageSlice()``), with the
        /// names its models merged so far hold when its horizon is to be applied (else `nil`).
        /// The next page is asked for once it is merged.
        var merging: (page: SnapshotPage.Reader, names: [ModelAddress: Set<String>]?)?
    }

    /// A streamed SNAPSHOT being served: every model held when its first page was asked for, in
    /// page order, and that moment's progress.
    struct ServedSnapshot: Sendable {
        var addresses: [ModelAddress]
        var progress: [String: UInt64]
        var latestSequence: UInt64
        var usedAt: UInt64
        /// Whether its pages carry the horizon of collection (`SSPAGE2`: the requester asked).
        var withHorizon: Bool
        /// The page after the one just served, to encode at the next tick: after the reply is
        /// sent, while the requester merges it (two processes, two cores: the transfer is a
        /// pipeline instead of encode, merge, encode, ...).
        var ahead: (after: ModelAddress, octets: Int)?
        /// That page, encoded: served as is when asked for with the same cursor and size.
        var prefetched: (after: ModelAddress, octets: Int, bytes: [UInt8], next: ModelAddress?)?
    }

    /// At most this many streamed SNAPSHOTs are served at once (each holds a list of the model
    /// addresses); a requester beyond it, or one silent for ``servedSnapshotIdle`` ms, gets a
    /// fresh list (correct, only slower).
    static let servedSnapshotLimit = 4
    static let servedSnapshotIdle: UInt64 = 60_000
    /// How long a page may take, and how often one is asked for before the transfer starts over.
    static let snapshotPageTimeout: UInt64 = 5 * repairTimeout
    static let pageAttempts = 3

    static let repairTimeout: UInt64 = 1000
    static let maximumFetch: UInt64 = 2000

    /// Connects a link to each peer whose heartbeat advertised a repair endpoint (again when it
    /// changed).
    mutating func updateRepairLinks() {
        for peer in peerEndpoints {
            guard let endpoint = peers[peer]?.repairEndpoint, repair.links[peer] != endpoint else { continue }
            repair.links[peer] = endpoint
            actions.append(.connectRepairLink(peer: peer, endpoint: endpoint))
        }
    }

    /// A link that let a request go unanswered is made again: libzmq drops a connection for
    /// good after some input (a reply over 64 MiB), and would keep queueing requests on it.
    mutating func remakeRepairLink(ofUnanswering peer: String) {
        guard let endpoint = repair.links[peer] else { return }
        counters.repairLinkResets += 1
        actions.append(.connectRepairLink(peer: peer, endpoint: endpoint))
    }

    /// A peer heard in a new incarnation (it restarted): its repair link is replaced, and the
    /// requests in flight on the old one are forgotten — the peer is not marked exhausted — and
    /// go again on the new one at once (section 11.3, step 1). The old connection may be
    /// half-open: a host that lost power sent no FIN, so the first request on it would be lost
    /// (its new kernel answers it with a reset), time out a second later and mark the peer
    /// exhausted, and a gap only the restarted peer could fill (its last writes) would be
    /// filled by a snapshot, seconds later, with every watch of the channel resynchronised.
    ///
    /// A streamed snapshot from it is given up: its new run serves later pages from a fresh
    /// list, with the progress of now, not of the first page (after a power loss under
    /// `interval` it may hold less than that page said), so the snapshot starts over.
    mutating func replaceRepairLink(ofRestarted peer: String) {
        guard let old = repair.links[peer] else { return }
        // Where its new run serves (a restart may move its API; a link to the old address would
        // lose what is asked on it).
        let endpoint = peers[peer]?.repairEndpoint ?? old
        repair.links[peer] = endpoint
        counters.repairLinkResets += 1
        actions.append(.connectRepairLink(peer: peer, endpoint: endpoint))
        for (origin, fetch) in repair.fetches where fetch.peer == peer { repair.fetches[origin] = nil }
        if repair.snapshot?.peer == peer { repair.snapshot = nil }
        if repair.stream?.peer == peer {
            abandonStream()
            repair.needsSnapshot = true
        }
        if repair.ownRecoveryFetch?.peer == peer { repair.ownRecoveryFetch = nil }
        settling?.fetches[peer] = nil
        splitWritesPeerRestarted(peer)
        repairsDue = true
    }

    /// Sends a FETCH for every origin with a gap and no request in flight; a SNAPSHOT when needed.
    /// `prompted`: run at once after an answer (``NodeMachine/repairsDue``), not at a round: it
    /// gives nothing up (claims withdrawn, a forgotten member's numbers), which waits for the next
    /// round, as it did when every step did. Every peer exhausted within a few round trips, a
    /// forgotten member coming back could have its first writes given up before its entry saying
    /// so arrived (simulator, 3 nodes × 300 operations, seed 10, with each step at once).
    mutating func requestRepairs(prompted: Bool = false) {
        guard !faults.skipRepair else { return }
        var connected: [String: String?] = [:]  // peer → its node id
        for (peer, progress) in peers where isConnected(progress) { connected[peer] = progress.node }
        let usable = repair.links.keys.filter { connected[$0] != nil }.sorted()
        guard !usable.isEmpty else { return }
        var timedOut: Set<String> = []
        for origin in repair.fetches.keys.sorted() {
            guard let fetch = repair.fetches[origin], fetch.deadline <= now else { continue }
            // No answer in time: try another peer next.
            repair.fetches[origin] = nil
            repair.exhausted[origin, default: []].insert(fetch.peer)
            timedOut.insert(fetch.peer)
        }
        if let snapshot = repair.snapshot, snapshot.deadline <= now {
            repair.snapshot = nil
            timedOut.insert(snapshot.peer)
        }
        for peer in timedOut.sorted() { remakeRepairLink(ofUnanswering: peer) }

        // A page being merged asks nothing meanwhile (as a page request in flight would not).
        if repair.stream?.merging != nil { return }
        // A stream whose page request timed out or could not be sent asks its peer again for
        // the same page (a broken link resumes where it stopped); a peer no longer usable means
        // starting over with another.
        if var stream = repair.stream, repair.snapshot == nil {
            stream.attempts += 1
            if usable.contains(stream.peer), stream.attempts < Self.pageAttempts {
                repair.stream = stream
                requestPage(of: stream)
                return
            }
            abandonStream()
            repair.needsSnapshot = true
        }
        if requestSnapshotIfNeeded(usable: usable) { return }
        guard repair.snapshot == nil else { return }
        requestOwnRecovery(usable: usable)
        requestSplitWritesCheck(usable: usable)
        for origin in origins.keys.sorted() where repair.fetches[origin] == nil {
            guard let gap = origins[origin]?.firstGap else { continue }
            // Prefer the origin itself; otherwise rotate through the connected peers that may
            // still hold the deltas. When none does, only a snapshot can fill the gap.
            let candidates = usable.filter { !(repair.exhausted[origin]?.contains($0) ?? false) }
            guard !candidates.isEmpty else {
                let neverHeld = repair.neverHeld[origin] ?? []
                let phantom =
                    usable.allSatisfy(neverHeld.contains) && usable.contains(where: { connected[$0] == .some(origin) })
                let goneForgotten =
                    membership.members[origin]?.state == .forgotten
                    && !usable.contains(where: { (peers[$0]?.progress[origin] ?? 0) >= gap.lowerBound })
                if prompted, phantom || goneForgotten { continue }
                repair.exhausted[origin] = nil
                repair.neverHeld[origin] = nil
                if phantom {
                    withdrawUnbackedClaims(origin: origin)
                } else if goneForgotten {
                    giveUpForgotten(origin: origin, gap)
                } else {
                    repair.needsSnapshot = true
                }
                continue
            }
            // The origin's own deltas are taken from it once it knows this node (section 7.5):
            // until then another peer is asked, or none (the origin is being told).
            let askable = candidates.filter { connected[$0] != .some(origin) || knowsThisNode($0) }
            guard !askable.isEmpty else { continue }
            let peer: String
            if let own = askable.first(where: { connected[$0] == .some(origin) }) {
                peer = own
            } else {
                repair.rotation += 1
                peer = askable[repair.rotation % askable.count]
            }
            let range = Self.limited(gap)
            repair.fetches[origin] = sendFetch(origin: origin, range: range, to: peer)
            logger.debug(
                "fetching missing deltas",
                metadata: ["peer.id": "\(origin)", "delta.range": "\(range)", "peer.endpoint": "\(peer)"])
        }
        // A gap no peer holds any more: the snapshot is asked for at the next tick, not the next
        // round. Not in this one: a round that asks for a snapshot asks for nothing else. (Asked
        // here, after this round's FETCHes, the timing showed a watch bug, since fixed: 3 nodes ×
        // 300 operations, seed 1154; see ``resyncResumedWatches(lacking:through:held:)``.)
        if repair.needsSnapshot, repair.snapshot == nil { repairsDue = true }
    }

    /// Starts a streamed SNAPSHOT when one is needed and none is in flight; whether it did.
    private mutating func requestSnapshotIfNeeded(usable: [String]) -> Bool {
        guard repair.needsSnapshot, repair.snapshot == nil else { return false }
        // Prefer peers whose last heartbeat shows they hold what this node lacks: a snapshot
        // from a peer that lacks it too would cover nothing.
        let gaps = origins.compactMapValues(\.firstGap)
        let ownRecovered = repair.ownRecovery?.recovered
        let holders = usable.filter { peer in
            let progress = peers[peer]?.progress ?? [:]
            return gaps.allSatisfy { origin, gap in (progress[origin] ?? 0) >= gap.upperBound }
                && ownRecovered.map { (progress[configuration.nodeID] ?? 0) > $0 } ?? true
        }
        let choices = holders.isEmpty ? usable : holders
        repair.snapshotRotation += 1
        let peer = choices[repair.snapshotRotation % choices.count]
        repair.needsSnapshot = false
        let stream = SnapshotStream(peer: peer)
        repair.stream = stream
        requestPage(of: stream)
        logger.info("history is gone on the peers; asking for a snapshot", metadata: ["peer.endpoint": "\(peer)"])
        return true
    }

    /// After this node dropped its state (section 7.5): FETCHes back its own deltas a peer's
    /// HEARTBEAT reports holding beyond those recovered, through the last it had numbered. The
    /// reset covered them without the deltas, so they are not a gap that repair would see; one
    /// published just before the reset may reach a peer after the snapshot the node took.
    private mutating func requestOwnRecovery(usable: [String]) {
        guard let recovery = repair.ownRecovery, let recovered = recovery.recovered else { return }
        // One at a time; one unanswered in time is asked again, of a holder in turn.
        if let fetch = repair.ownRecoveryFetch, fetch.deadline > now { return }
        repair.ownRecoveryFetch = nil
        let own = configuration.nodeID
        let holders = usable.filter { (peers[$0]?.progress[own] ?? 0) > recovered }
        guard !holders.isEmpty else {
            // No peer reports holding the next one: each connected peer is asked once for the
            // rest, which it may hold above a gap of its own (its mark does not show them), in
            // turn (one that does not answer does not hold up the others).
            let unswept = usable.filter { (repair.ownRecoverySwept[$0] ?? 0) < recovery.through }
            guard !unswept.isEmpty else { return }
            repair.rotation += 1
            let peer = unswept[repair.rotation % unswept.count]
            let from = max(recovered, repair.ownRecoverySwept[peer] ?? 0) + 1
            repair.ownRecoveryFetch = sendFetch(origin: own, range: Self.limited(from...recovery.through), to: peer)
            repair.ownRecoverySweep = true
            return
        }
        repair.rotation += 1
        let peer = holders[repair.rotation % holders.count]
        let range = Self.limited(recovered + 1...min(peers[peer]?.progress[own] ?? 0, recovery.through))
        repair.ownRecoveryFetch = sendFetch(origin: own, range: range, to: peer)
        repair.ownRecoverySweep = false
        logger.info(
            "fetching back own deltas a peer holds that this node dropped with its state",
            metadata: ["delta.range": "\(range)", "peer.endpoint": "\(peer)"])
    }

    /// The answer to ``requestOwnRecovery(usable:)``'s FETCH: the own deltas it returns are
    /// merged again (their numbers stay covered: they are not recorded, and watches of their
    /// channels are resynced, as after a snapshot). A peer that no longer holds them as deltas
    /// holds them in its state: a snapshot is asked for, from a peer that holds them.
    private mutating func takeRecoveredOwn(
        kind: ClientProtocol.ReplyKind, body: [UInt8], asked fetch: Outstanding, from peer: String
    ) {
        repair.ownRecoveryFetch = nil
        let sweep = repair.ownRecoverySweep
        repair.ownRecoverySweep = false
        guard let recovered = repair.ownRecovery?.recovered else { return }
        // A peer swept answers for the range asked (an ERROR too: it gives none of them).
        if sweep { repair.ownRecoverySwept[peer] = max(repair.ownRecoverySwept[peer] ?? 0, fetch.range.upperBound) }
        guard kind == .ok, let (deltas, _, _) = try? ClientProtocol.decodeFetched(body) else { return }
        let own = configuration.nodeID
        let wanted = deltas.filter { $0.origin == own && fetch.range.contains($0.sequence) }
            .sorted { $0.sequence < $1.sequence }
        var through = recovered
        for delta in wanted where delta.sequence == through + 1 { through = delta.sequence }
        // A peer that reported a mark above R and sent no R + 1 holds it in its state only; one
        // swept holds only what it sent (maybe nothing).
        if through == recovered, !sweep {
            repair.needsSnapshot = true
            logger.info(
                "a peer holds own deltas this node dropped with its state, no longer as deltas; asking for a snapshot",
                metadata: ["delta.range": "\(fetch.range)", "peer.endpoint": "\(peer)"])
        }
        guard !wanted.isEmpty else { return }
        counters.deltasFetched += wanted.count
        // Every one it sent is merged, also those above a gap (its state holds them now).
        let changed = mergeRecoveredOwn(wanted)
        if through > recovered { ownRecovered(through: through) }
        // Made durable like a merged snapshot (its numbers are covered: a log replay skips them).
        repair.mergedSnapshot = true
        logger.notice(
            "fetched back own deltas a peer received after this node dropped its state",
            metadata: [
                "delta.range": "\(wanted[0].sequence)...\(wanted[wanted.count - 1].sequence)",
                "deltas": "\(wanted.count)", "peer.endpoint": "\(peer)", "channels.changed": "\(changed.count)",
            ])
        resyncWatches(of: changed)
    }

    /// This node holds its own deltas again through `sequence` (section 7.5); the recovery ends
    /// once that reaches the last it had numbered.
    private mutating func ownRecovered(through sequence: UInt64) {
        guard var recovery = repair.ownRecovery else { return }
        recovery.recovered = sequence
        repair.ownRecovery = sequence >= recovery.through ? nil : recovery
    }

    /// Sends `peer` a FETCH of `origin`'s deltas in `range`; returns it as in flight.
    mutating func sendFetch(origin: String, range: ClosedRange<UInt64>, to peer: String) -> Outstanding {
        let id = nextRepairID()
        counters.repairRequests += 1
        actions.append(
            .sendRepairRequest(
                peer: peer, requestID: id,
                frames: ClientProtocol.encodeRequest(
                    .fetch, id: id, body: ClientProtocol.encodeFetch(origin: origin, range: range))))
        return Outstanding(peer: peer, requestID: id, deadline: now + Self.repairTimeout, range: range)
    }

    /// Asks the stream's peer for its next page.
    private mutating func requestPage(of stream: SnapshotStream) {
        let id = nextRepairID()
        repair.snapshot = Outstanding(
            peer: stream.peer, requestID: id, deadline: now + Self.snapshotPageTimeout, range: 0...0)
        actions.append(
            .sendRepairRequest(
                peer: stream.peer, requestID: id,
                frames: ClientProtocol.encodeRequest(
                    .snapshot, id: id,
                    body: SnapshotPage.encodeRequest(
                        after: stream.after, maximumOctets: configuration.snapshotPageOctets))))
    }

    mutating func nextRepairID() -> UInt64 {
        defer { repair.nextID += 1 }
        return repair.nextID
    }

    /// A FETCH range limited to 2000 sequence numbers, without overflow (section 10.8).
    static func limited(_ range: ClosedRange<UInt64>) -> ClosedRange<UInt64> {
        let (end, overflow) = range.lowerBound.addingReportingOverflow(maximumFetch - 1)
        return range.lowerBound...(overflow ? range.upperBound : min(range.upperBound, end))
    }

    /// The driver could not queue a request: it is not in flight, and the next round retries.
    mutating func repairRequestUnsent(peer: String, requestID: UInt64) {
        if repair.snapshot?.requestID == requestID {
            repair.snapshot = nil
            // A stream asks again for the same page at the next round.
            if repair.stream == nil { repair.needsSnapshot = true }
            return
        }
        if let origin = repair.fetches.first(where: { $0.value.requestID == requestID })?.key {
            repair.fetches[origin] = nil
            counters.repairRequests -= 1
        } else if repair.ownRecoveryFetch?.requestID == requestID {
            repair.ownRecoveryFetch = nil
            counters.repairRequests -= 1
        } else if splitWritesRequestUnsent(requestID) {
            counters.repairRequests -= 1
        }
    }

    /// Applies a FETCH or SNAPSHOT reply from the link to `peer`.
    mutating func handleRepairReply(_ frames: [[UInt8]], from peer: String) {
        guard frames.count == 2, let header = try? ClientProtocol.decodeReplyHeader(frames[0]) else {
            counters.malformedMessages += 1
            return
        }
        if let member = announcesInFlight.removeValue(forKey: header.requestID) {
            // Taken: the peer saved its member list before it answered; it knows this node.
            // Refused: it never will, so its deltas are taken all the same (and the warning says
            // what that costs).
            peers[peer]?.listsThisNode = true
            // What was left to repair until it knew this node is asked for at once.
            repairsDue = true
            // "Taken": the peer's list holds this start's entry, as a HEARTBEAT's list holding it
            // would say (section 7.5, "Ids do not come back empty"). An empty body (an older
            // node) says nothing.
            if header.kind == .ok, frames[1].first == 1, member.state == .alive { ownEntryAcknowledged = true }
            if header.kind != .ok {
                let reason = (try? ClientProtocol.decodeError(frames[1]))?.message ?? "?"
                warnLimited(
                    "announce-refused",
                    "a peer refused this node's member entry (ANNOUNCE); its deltas are taken all the same, but should it lose power it will not ask this node for deltas it lost",
                    metadata: ["peer.endpoint": "\(peer)", "member": "\(member.id)", "error": "\(reason)"])
            }
            return
        }
        if let snapshot = repair.snapshot, snapshot.requestID == header.requestID {
            repair.snapshot = nil
            if header.kind == .ok, SnapshotPage.isPage(frames[1]) {
                takePage(frames[1], from: peer)
                return
            }
            // A whole snapshot in one reply (a peer that does not page), or an error (then the
            // snapshot starts over, from the next peer in turn).
            if header.kind != .ok, repair.stream != nil { repair.needsSnapshot = true }
            abandonStream()
            guard header.kind == .ok, let decoded = try? StateSnapshot.decode(frames[1]) else {
                logger.warning("a peer's snapshot reply was unusable", metadata: ["peer.endpoint": "\(peer)"])
                return
            }
            let channels = merge(decoded)
            noteSnapshotMerged(from: peer)
            repair.mergedSnapshot = true
            logger.info(
                "merged a peer's snapshot",
                metadata: ["peer.endpoint": "\(peer)", "channels.changed": "\(channels.count)"])
            // Their state changed without deltas, which the journal cannot show them.
            resyncWatches(of: channels)
            return
        }
        if settlingReply(header.requestID, kind: header.kind, body: frames[1], from: peer) { return }
        if let fetch = repair.ownRecoveryFetch, fetch.requestID == header.requestID {
            takeRecoveredOwn(kind: header.kind, body: frames[1], asked: fetch, from: peer)
            return
        }
        if splitWritesReply(header.requestID, kind: header.kind, body: frames[1], from: peer) { return }
        guard let (origin, outstanding) = repair.fetches.first(where: { $0.value.requestID == header.requestID }) else {
            return  // a late answer to a request already retried
        }
        repair.fetches[origin] = nil
        guard header.kind == .ok, let (deltas, droppedThrough, void) = try? ClientProtocol.decodeFetched(frames[1])
        else {
            return
        }
        // The origin's own deltas from the origin are taken once it knows this node, like its
        // live stream; until then the reply is left unanswered (asked again).
        if origin == peers[peer]?.node, !knowsThisNode(peer) {
            refuseBeforeKnown(deltas.count, from: peer, live: false)
            return
        }
        let wanted = deltas.filter { $0.origin == origin && outstanding.range.contains($0.sequence) }
        let fresh = applyRemote(wanted, from: peer, repaired: true)
        counters.deltasFetched += deltas.count
        // Own deltas fetched back (this node had lost them) were published long ago.
        for index in fresh.indices where fresh[delta: index].origin == configuration.nodeID {
            ownHeldByPeers(through: fresh[delta: index].sequence)
        }
        // Only the origin may say which of its numbers will never exist (the node id of the
        // peer's heartbeats: with security, bound to its key, section 14).
        let voided =
            void.isEmpty || peers[peer]?.node != origin || origin == configuration.nodeID
            ? 0 : takeVoid(origin: origin, void, within: outstanding.range)
        if deltas.isEmpty && voided == 0 {
            // This peer does not hold them (dropped, or never had them); another may, else a
            // snapshot will do: asked at once.
            if repair.exhausted[origin, default: []].insert(peer).inserted { repairsDue = true }
            if droppedThrough < outstanding.range.lowerBound { repair.neverHeld[origin, default: []].insert(peer) }
        } else {
            // The rest of a gap longer than a FETCH waits for the round, as before: 2,000 numbers
            // per origin a round bound what repair adds to a node that dropped deltas because it
            // was behind, and a late joiner's gaps are filled by a snapshot, not by FETCHes.
            repair.exhausted[origin] = nil
            repair.neverHeld[origin] = nil
        }
    }

    /// Takes the numbers of `origin` its origin declared void (section 10.8) within `range` as
    /// received without a delta: the gap they made closes, and watches go past them. Returns
    /// how many were new.
    mutating func takeVoid(origin: String, _ void: [ClosedRange<UInt64>], within range: ClosedRange<UInt64>) -> Int {
        guard var progress = origins[origin] else { return 0 }
        var taken: [UInt64] = []
        for declared in void where declared.overlaps(range) {
            for sequence in max(declared.lowerBound, range.lowerBound)...min(declared.upperBound, range.upperBound)
            where progress.receive(sequence) {
                taken.append(sequence)
            }
        }
        origins[origin] = progress
        guard !taken.isEmpty else { return 0 }
        counters.voidSequences += taken.count
        rememberVoid(origin: origin, taken)
        passVoidInWatches(origin: origin, taken)
        logger.info(
            "the origin declared sequence numbers void (lost everywhere in a power loss): no longer missing",
            metadata: [
                "peer.id": "\(origin)", "delta.range": "\(taken.first!)...\(taken.last!)",
                "void.count": "\(taken.count)",
            ])
        return taken.count
    }

    /// Keeps `sequences` among the numbers known void of `origin` (its own included), as
    /// merged ranges, at most ``SequenceReservation/maximumVoidRanges`` per origin, like the
    /// file that keeps a node's own (the oldest go first: by then long covered by snapshots).
    mutating func rememberVoid(origin: String, _ sequences: [UInt64]) {
        voidKnown[origin] = (voidKnown[origin] ?? []).merged(
            adding: sequences, keepingAtMost: SequenceReservation.maximumVoidRanges)
    }

    /// Every connected peer, the origin among them, answered that it never held the missing
    /// sequence numbers of `origin`: they do not exist (a peer announced numbers it does not have).
    /// The node stops waiting for them: what it expects of the origin falls back to what it
    /// received, and each peer's claim above that is not followed again while the peer repeats
    /// it unchanged (section 11.3).
    mutating func withdrawUnbackedClaims(origin: String) {
        guard var progress = origins[origin] else { return }
        let backed = progress.highestReceived
        guard progress.announced > backed else { return }
        let phantom = progress.announced - backed
        progress.announced = backed
        origins[origin] = progress
        for (peer, state) in peers {
            if let claim = state.progress[origin], claim > backed {
                repair.withdrawn[peer, default: [:]][origin] = claim
            }
        }
        counters.phantomSequences =
            counters.phantomSequences.addingReportingOverflow(Int(clamping: phantom)).overflow
            ? .max : counters.phantomSequences + Int(clamping: phantom)
        warnLimited(
            "phantom-sequences",
            "peers announced sequence numbers of an origin that no peer, the origin included, ever held; no longer waiting for them",
            metadata: [
                "peer.id": "\(origin)", "delta.range": "\(backed + 1)...\(backed + phantom)",
            ])
    }

    /// A forgotten member's deltas in `gap` that no connected peer holds, as deltas or in its
    /// state (section 7.5: it is gone for good, and the deltas with it): no longer awaited. This
    /// node may hold later ones (received before the forget, above the gap); without this it
    /// would ask for the gap for ever. At most ``maximumFetch`` numbers a round; watches go
    /// past them as past void ones.
    mutating func giveUpForgotten(origin: String, _ gap: ClosedRange<UInt64>) {
        guard var progress = origins[origin] else { return }
        let held = progress
        let range = Self.limited(gap)
        var taken: [UInt64] = []
        for sequence in range where progress.receive(sequence) { taken.append(sequence) }
        origins[origin] = progress
        guard !taken.isEmpty else { return }
        rememberVoid(origin: origin, taken)
        // What they wrote may be in this node's state from a peer's snapshot page (a peer held
        // them there): a resumed watch that missed that merge is resynced, as when a snapshot
        // covers numbers (section 10.5.4).
        resyncResumedWatches(lacking: origin, through: range.upperBound, held: held)
        passVoidInWatches(origin: origin, taken)
        warnLimited(
            "forgotten-gap",
            "a forgotten member's deltas that no connected peer holds are given up (it is gone for good)",
            metadata: ["peer.id": "\(origin)", "delta.range": "\(range)"])
    }

    /// One page of the streamed SNAPSHOT: merged a slice at a time (the first at once, the others
    /// at the next ticks, ``mergePageSlice()``); then the next one asked for, or, after the last,
    /// the progress the first one carried covered.
    private mutating func takePage(_ bytes: [UInt8], from peer: String) {
        guard var stream = repair.stream, stream.peer == peer, let page = try? SnapshotPage.Reader(bytes) else {
            pageUnusable(from: peer)
            return
        }
        if stream.progress == nil {
            stream.progress = page.progress
            stream.horizon = page.collectedThrough
            if let horizon = page.collectedThrough, horizon > 0 { stream.held = ArraySlice(addressesInPageOrder) }
        } else {
            stream.horizon = page.collectedThrough.flatMap { horizon in stream.horizon.map { min($0, horizon) } }
        }
        // The names the page holds are needed only if it may cover models held at the start.
        let appliesHorizon = !(stream.held?.isEmpty ?? true) && (page.collectedThrough ?? 0) > 0
        stream.merging = (page, appliesHorizon ? [:] : nil)
        repair.stream = stream
        mergePageSlice()
    }

    /// A page that does not decode: the snapshot starts over.
    private mutating func pageUnusable(from peer: String) {
        counters.malformedMessages += 1
        abandonStream()
        repair.needsSnapshot = true
        warnLimited(
            "snapshot-page", "a peer's snapshot page was unusable; the snapshot starts over",
            metadata: ["peer.endpoint": "\(peer)"])
    }

    /// Gives up the snapshot being received, unfinished: the watches of the channels its pages
    /// changed are resynced (the state merged stays, and reached no journal; merged again, it
    /// would change nothing, and the next stream would not name those channels).
    mutating func abandonStream() {
        if let changed = repair.stream?.changed, !changed.isEmpty { resyncWatches(of: changed) }
        // The pages merged stay: what they brought beyond the marks too (section 11.4).
        if let stream = repair.stream, stream.pages > 0 || stream.merging != nil {
            noteSnapshotMerged(from: stream.peer)
        }
        repair.stream = nil
    }

    /// Reads and merges the next slice of the page being merged, about
    /// ``NodeConfiguration/snapshotMergeSliceRegisters`` registers (whole models): the node
    /// answers its sockets between slices. Inputs taken between slices are merged as they would
    /// be had they come before the page (registers merge by last-writer-wins whatever the
    /// order); what the stream's pages cover is settled once the last one is merged. After the
    /// page's last slice, ``pageMerged(next:horizon:names:into:)``. A page found damaged on the
    /// way (its checksum held: a faulty server) leaves what was merged of it, and the snapshot
    /// starts over.
    mutating func mergePageSlice() {
        // Moved out while the slice is merged (the only copy: the names and the channels changed
        // grow in place, not copied at each slice).
        guard repair.stream?.merging != nil, var stream = repair.stream.take(),
            var (page, names) = stream.merging.take()
        else { return }
        let next: ModelAddress?
        var refused = 0
        do {
            var registers = 0
            var models = 0
            // Counted once a slice, and also when the page turns out damaged.
            defer { if refused > 0 { refusedSnapshotNames(refused) } }
            while !page.isAtModelsEnd, registers < configuration.snapshotMergeSliceRegisters || models == 0 {
                registers += try mergeNextModel(
                    of: &page, names: &names, changed: &stream.changed, refused: &refused)
                models += 1
            }
            next = page.isAtModelsEnd ? try page.next() : nil
        } catch {
            repair.stream = stream
            pageUnusable(from: stream.peer)
            return
        }
        guard page.isAtModelsEnd else {
            stream.merging = (page, names)
            repair.stream = stream
            return
        }
        pageMerged(next: next, horizon: page.collectedThrough, names: names ?? [:], into: stream)
    }

    /// Merges the next model of `page`; returns how many registers it held. Decoded straight
    /// into the store, each register moved in as it is read (a joiner's usual case: no live
    /// model attached to it, and the names the page holds not needed); else read whole, in name
    /// order, and merged by ``mergeRegisters(_:refused:)``, which delivers what won to the live
    /// model in that order. The channels it changes go into `changed` as they change, also when
    /// the page turns out damaged part of the way through the model (what was merged of it
    /// stays); the registers left out for their names are added to `refused`.
    private mutating func mergeNextModel(
        of page: inout SnapshotPage.Reader, names: inout [ModelAddress: Set<String>]?, changed: inout Set<String>,
        refused: inout Int
    ) throws(WireError) -> Int {
        let (address, count) = try page.nextModel()
        guard names == nil, Self.isMergeable(address), attachedModels[address] == nil else {
            let registers = try page.registersInNameOrder()
            changed.formUnion(mergeRegisters([(address, registers)][...], refused: &refused))
            names?[address] = Set(registers.map(\.name))
            return count
        }
        var failure: WireError?
        let newest = store.merge(address, expected: count) {
            while page.registersLeft > 0 {
                do throws(WireError) {
                    let (name, register) = try page.nextRegister()
                    guard Self.isMergeable(name, register) else {
                        refused += 1
                        continue
                    }
                    return ReplicaStore.NamedRegister(name, register)
                } catch {
                    failure = error
                    return nil
                }
            }
            return nil
        }
        if let newest {
            clock.observe(newest)
            changed.insert(address.channel)
        }
        if let failure { throw failure }
        return count
    }

    /// Whether a snapshot's model may be merged: names a DELTA could not carry are not (section
    /// 5).
    private static func isMergeable(_ address: ModelAddress) -> Bool {
        (try? Names.validateChannel(address.channel)) != nil && (try? Names.validateModel(address.model)) != nil
    }

    /// Whether a snapshot's register may be merged: names a DELTA could not carry are not
    /// (section 5), and the empty name, the model's deletion, only with a deletion.
    private static func isMergeable(_ name: String, _ register: ReplicaStore.Register) -> Bool {
        name.isEmpty ? register.isDeleted : (try? Names.validateProperty(name)) != nil
    }

    /// Counts registers of a peer's snapshot that were not merged for their names, and says so.
    private mutating func refusedSnapshotNames(_ count: Int) {
        counters.malformedMessages += 1
        warnLimited(
            "snapshot-names", "a peer's snapshot held registers with invalid names; they were not merged",
            metadata: ["registers": "\(count)"])
    }

    /// What follows a page's merge: records the page's range collected, then the next page asked
    /// for, or the stream's end.
    private mutating func pageMerged(
        next: ModelAddress?, horizon: UInt64?, names: [ModelAddress: Set<String>], into stream: SnapshotStream
    ) {
        var stream = stream
        let peer = stream.peer
        // The models this node holds in the page's range (the pages cover every address, in
        // order; a page without a horizon above 0 passes its range all the same): what they hold
        // at or below the page's horizon that the page lacks was collected.
        if let held = stream.held {
            let covered = held.prefix { address in next.map { !SnapshotPage.precedes($0, address) } ?? true }
            stream.held = held.dropFirst(covered.count)
            if let horizon, horizon > 0, !covered.isEmpty {
                stream.changed.formUnion(
                    dropCollected(
                        of: Array(covered), through: horizon, progress: stream.progress ?? [:],
                        peerNames: { names[$0] ?? [] }))
            }
        }
        stream.pages += 1
        if let next {
            stream.after = next
            stream.attempts = 0
            repair.stream = stream
            requestPage(of: stream)
            return
        }
        repair.stream = nil
        coverSnapshotProgress(stream.progress ?? [:])
        noteSnapshotMerged(from: stream.peer)
        // What the peer lacked at or below its horizon, this node lacks too now (it may hold
        // more: its own writes, a writer the peer did not count, what came after each page).
        if let horizon = stream.horizon { store.markCollected(through: horizon) }
        repair.mergedSnapshot = true
        logger.info(
            "merged a peer's snapshot",
            metadata: [
                "peer.endpoint": "\(peer)", "pages": "\(stream.pages)", "channels.changed": "\(stream.changed.count)",
            ])
        resyncWatches(of: stream.changed)
    }

    /// Serves one page of a streamed SNAPSHOT to `client` (section 10.9).
    mutating func snapshotPage(
        for client: [UInt8], after cursor: ModelAddress?, maximumOctets: Int, withHorizon: Bool
    ) -> [UInt8] {
        let octets = min(max(maximumOctets, 1024), 32 << 20)
        var served: ServedSnapshot
        if cursor != nil, let held = repair.serving[client], now &- held.usedAt < Self.servedSnapshotIdle {
            served = held
        } else {
            if repair.serving[client] == nil, repair.serving.count >= Self.servedSnapshotLimit,
                let oldest = repair.serving.min(by: { $0.value.usedAt < $1.value.usedAt })?.key
            {
                repair.serving[oldest] = nil
            }
            served = ServedSnapshot(
                addresses: addressesInPageOrder,
                progress: servedProgress, latestSequence: nextSequence - 1, usedAt: now, withHorizon: withHorizon)
        }
        served.usedAt = now
        let page: (bytes: [UInt8], next: ModelAddress?)
        if let cursor, let ready = served.prefetched, ready.after == cursor, ready.octets == octets {
            // Read at the tick after the previous page: later than that page's progress, as a
            // page must be (section 10.9); writes since then reach the requester as deltas.
            page = (ready.bytes, ready.next)
        } else {
            page = Self.encodePage(of: served, after: cursor, octets: octets, horizon: servedHorizon, from: store)
        }
        served.prefetched = nil
        served.ahead = page.next.map { ($0, octets) }
        repair.serving[client] = page.next == nil ? nil : served
        counters.snapshotPagesServed += 1
        return page.bytes
    }

    /// How many silence limits a reset node waits for a peer it heard that may hold its own
    /// deltas (``servedProgress``).
    static let ownRecoveryWaitLimits: UInt64 = 30

    /// The progress a SNAPSHOT this node serves claims: every origin's contiguous mark, but for
    /// its own origin while it recovers its own deltas after a reset (section 7.5, "Own deltas on
    /// their way"). Its state then holds them only through R (none before it merged a snapshot);
    /// the rest may still be on a peer, and a requester that lacks them would cover them without
    /// them and never ask again. So the own mark is R, unless every peer heard is connected, each
    /// one it can ask has answered its sweep (``requestOwnRecovery(usable:)``: what it held above a
    /// gap is merged), and none reports holding more: then no peer that could hold them remains,
    /// the rest are given up, and the snapshot covers them as after the recovery.
    var servedProgress: [String: UInt64] {
        var progress = origins.mapValues(\.contiguous).filter { $0.value > 0 }
        guard let recovery = repair.ownRecovery else { return progress }
        let own = configuration.nodeID
        let recovered = recovery.recovered ?? 0
        let mayStillBeHeld =
            recovery.recovered == nil
            || peers.contains { endpoint, peer in
                if (peer.progress[own] ?? 0) > recovered { return true }
                // One not heard for a while (a restart, a partition) is waited for, but no longer
                // than 30 silence limits (section 7.4): a member down for good would keep the
                // others asking this node for snapshots that cover nothing, and the recovery from
                // ending.
                if let last = peer.lastMessageAt, !isConnected(peer) {
                    return now &- last < Self.ownRecoveryWaitLimits * silenceLimit(of: peer)
                }
                return isConnected(peer) && repair.links[endpoint] != nil
                    && (repair.ownRecoverySwept[endpoint] ?? 0) < recovery.through
            }
        if mayStillBeHeld { progress[own] = recovered > 0 ? min(recovered, progress[own] ?? 0) : nil }
        return progress
    }

    /// Encodes, at a tick, the next page of every streamed SNAPSHOT served a page since (the
    /// reply went out with the round before), and lets go of prefetched pages nobody asked for
    /// within a page timeout.
    mutating func prefetchSnapshotPages() {
        guard !repair.serving.isEmpty else { return }
        for client in Array(repair.serving.keys) {
            guard var served = repair.serving[client] else { continue }
            if let ahead = served.ahead {
                let page = Self.encodePage(
                    of: served, after: ahead.after, octets: ahead.octets, horizon: servedHorizon, from: store)
                served.prefetched = (ahead.after, ahead.octets, page.bytes, page.next)
                served.ahead = nil
            } else if served.prefetched != nil, now &- served.usedAt > Self.snapshotPageTimeout {
                served.prefetched = nil
            } else {
                continue
            }
            repair.serving[client] = served
        }
    }

    /// The horizon of collection this node's snapshots carry (section 10.9): its own, but 0
    /// while it recovers its own deltas after a reset — a peer may hold some of them at or below
    /// it, and a requester would drop them as collected.
    var servedHorizon: UInt64 { repair.ownRecovery == nil ? store.collectedThrough : 0 }

    /// One page of `served`: the models after `cursor` (all from the start without one), with
    /// `horizon` when the requester asked for it.
    static func encodePage(
        of served: ServedSnapshot, after cursor: ModelAddress?, octets: Int, horizon: UInt64, from store: ReplicaStore
    ) -> (bytes: [UInt8], next: ModelAddress?) {
        // The first address after the cursor (binary search: the list is in page order).
        var start = 0
        if let cursor {
            var high = served.addresses.count
            while start < high {
                let middle = (start + high) / 2
                if SnapshotPage.precedes(cursor, served.addresses[middle]) { high = middle } else { start = middle + 1 }
            }
        }
        return SnapshotPage.encode(
            latestSequence: cursor == nil ? served.latestSequence : 0, progress: cursor == nil ? served.progress : [:],
            collectedThrough: served.withHorizon ? horizon : nil, maximumOctets: octets,
            models: served.addresses[start...].lazy.compactMap { address in
                let records = store.records(of: address)
                return records.isEmpty ? nil : (address, records)
            })
    }

    /// Every model this node holds, in page order (section 10.9).
    var addressesInPageOrder: [ModelAddress] { store.allModels.map(\.0).sorted(by: SnapshotPage.precedes) }

    /// Merges a peer's snapshot: every register through last-writer-wins, then the progress it
    /// covers. Returns the channels it changed.
    mutating func merge(_ snapshot: StateSnapshot) -> Set<String> {
        let horizon = snapshot.store.collectedThrough
        let held = horizon > 0 ? addressesInPageOrder : []
        var refused = 0
        var changed = mergeRegisters(
            snapshot.store.allModels.sorted { SnapshotPage.precedes($0.0, $1.0) }.map { address, registers in
                (address, registers.sorted { $0.key < $1.key }.map { (name: $0.key, register: $0.value) })
            }[...], refused: &refused)
        if refused > 0 { refusedSnapshotNames(refused) }
        if !held.isEmpty {
            changed.formUnion(
                dropCollected(
                    of: held, through: horizon, progress: snapshot.progress,
                    peerNames: { Set(snapshot.store.records(of: $0).keys) }))
        }
        coverSnapshotProgress(snapshot.progress)
        store.markCollected(through: horizon)
        return changed
    }

    /// Drops what this node holds of `models` at or below a peer's horizon of collection that
    /// the peer's snapshot lacks (`peerNames`: the names it holds of a model, its deletion under
    /// the empty name) — section 10.9. The peer held it, or what beat it, and collected the
    /// deletion that did: this node took it since from some history (a FETCH of an older
    /// delta), and would give it back to the others in its own snapshots. Only what the peer's
    /// collection counted goes: kept are this node's own writes (after a reset it fetches them
    /// back from peers whose snapshot may lack them), the writes of a writer the snapshot's
    /// `progress` does not name (the peer may never have had them: a writer it did not know),
    /// of a member this node holds as forgotten unless it received none of that member's deltas
    /// above what the progress covers (the peer collected without it), and a name the peer
    /// holds at any version. Live models see the values go as deletions just above the horizon.
    /// Returns the channels it changed.
    mutating func dropCollected(
        of models: [ModelAddress], through horizon: UInt64, progress: [String: UInt64],
        peerNames: (ModelAddress) -> Set<String>
    ) -> Set<String> {
        let own = configuration.nodeID
        let forgotten = Set(membership.members.values.filter { $0.state == .forgotten }.map(\.id))
        var counted: [String: Bool] = [:]
        func countedByPeer(_ writer: String) -> Bool {
            if let known = counted[writer] { return known }
            var answer = false
            if writer != own, let covered = progress[writer] {
                answer = !forgotten.contains(writer) || (origins[writer]?.highestReceived ?? 0) <= covered
            }
            counted[writer] = answer
            return answer
        }
        let deletedAt = Version(timestamp: horizon &+ 1, node: "")
        var changed = Set<String>()
        var deliveries: [ModelDelivery] = []
        var dropped = 0
        for address in models {
            let names = peerNames(address)
            let (changes, gone) = store.drop(address, through: horizon) { name, version in
                names.contains(name) || !countedByPeer(version.node)
            }
            guard gone > 0 else { continue }
            dropped += gone
            changed.insert(address.channel)
            guard attachedModels[address] != nil, !changes.isEmpty else { continue }
            let writes = changes.map { PropertyWrite.deletion(of: $0.property) }
            deliveries.append(
                ModelDelivery(
                    address: address, sets: [ModelRegistrar.RemoteWriteSet(writes: writes, version: deletedAt)]))
        }
        if !deliveries.isEmpty { actions.append(.deliver(deliveries)) }
        if dropped > 0 {
            logger.info(
                "dropped records a peer's snapshot shows collected (older writes this node took from a history after their deletion was collected)",
                metadata: ["records": "\(dropped)", "collected.through": "\(horizon >> 16).\(horizon & 0xFFFF)"])
        }
        return changed
    }

    /// Merges registers of a peer's snapshot (or page) through last-writer-wins, delivering
    /// what won to live models. Each model's registers come in ascending name order, each name
    /// once (``SnapshotPage/models``). Returns the channels it changed; adds to `refused` the
    /// registers it left out for their names.
    mutating func mergeRegisters(
        _ models: ArraySlice<(ModelAddress, [(name: String, register: ReplicaStore.Register)])>, refused: inout Int
    ) -> Set<String> {
        var changed = Set<String>()
        var deliveries: [ModelDelivery] = []
        for (address, registers) in models {
            guard Self.isMergeable(address) else {
                refused += registers.count
                continue
            }
            var sets: [ModelRegistrar.RemoteWriteSet] = []
            var newest: Version?
            func invalid(_ entry: (name: String, register: ReplicaStore.Register)) -> Bool {
                !Self.isMergeable(entry.name, entry.register)
            }
            var valid = registers  // the usual case: no copy
            if let first = registers.firstIndex(where: invalid) {
                valid = Array(registers[..<first]) + registers[first...].filter { !invalid($0) }
                refused += registers.count - valid.count
            }
            // One look-up of the model for all its registers; what a live model is sent is built
            // only when one is attached.
            let won = store.merge(address, registers: valid)
            let attached = attachedModels[address] != nil
            // By index, reading each register in place (a pair bound from the array is a copy).
            for index in valid.indices where won[index] {
                // A register that won but changed nothing visible (a deletion of what had no value)
                // still moves the version a live model holds.
                let version = valid[index].register.version
                newest = max(newest ?? version, version)
                guard attached else { continue }
                let (name, register) = valid[index]
                let write: PropertyWrite
                if name.isEmpty {
                    write = .modelDeletion
                } else if register.isDeleted {
                    write = .deletion(of: name)
                } else {
                    write = PropertyWrite(name: name, value: register.value, timeToLive: register.timeToLive)
                }
                sets.append(ModelRegistrar.RemoteWriteSet(writes: [write], version: register.version))
            }
            guard let newest else { continue }
            clock.observe(newest)
            changed.insert(address.channel)
            if attached { deliveries.append(ModelDelivery(address: address, sets: sets)) }
        }
        if !deliveries.isEmpty { actions.append(.deliver(deliveries)) }
        return changed
    }

    /// Covers what a merged snapshot includes of each origin (section 10.9).
    mutating func coverSnapshotProgress(_ progress: [String: UInt64]) {
        for (origin, through) in progress.sorted(by: { $0.key < $1.key }) {
            coverWithoutHistory(origin: origin, through: through)
        }
        counters.snapshotsApplied += 1
        // What the snapshot holds of this node's own deltas is in its state again.
        if let recovery = repair.ownRecovery {
            ownRecovered(through: max(recovery.recovered ?? 0, progress[configuration.nodeID] ?? 0))
        }
        if let own = progress[configuration.nodeID], own < UInt64.max {
            nextSequence = max(nextSequence, own + 1)
            // Own deltas a peer held were published long ago (by an earlier run of this node).
            ownHeldByPeers(through: own)
        }
    }

    // MARK: - Serving peers

    /// Serves a FETCH: the retained deltas of `origin` in `range`, its dropped-through mark and,
    /// for this node's own origin, the numbers in `range` it declared void.
    mutating func fetch(origin: String, range: ClosedRange<UInt64>) -> (
        deltas: [Delta], droppedThrough: UInt64, void: [ClosedRange<UInt64>]
    ) {
        var void: [ClosedRange<UInt64>] = []
        if origin == configuration.nodeID {
            for declared in voidOwn where declared.overlaps(range) {
                void.append(max(declared.lowerBound, range.lowerBound)...min(declared.upperBound, range.upperBound))
                if void.count == ClientProtocol.maximumVoidRanges { break }
            }
        }
        guard let history = history[origin] else { return ([], 0, void) }
        let deltas = history.deltas(in: range)
        counters.deltasServed += deltas.count
        return (deltas, history.droppedThrough, void)
    }
}
