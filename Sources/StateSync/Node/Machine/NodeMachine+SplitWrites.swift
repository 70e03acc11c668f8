import Logging

/// Split writes after two nodes ran under one id (docs/PROTOCOL.md section 7.5, "Mending split
/// writes"). While both ran, each numbered its writes from the same sequence numbers, and each
/// peer kept the first delta it received under a number: a peer may hold the other start's
/// write where this node holds its own, and another peer this node's. Once the signs of the
/// other start stop (it refused to run), the node that goes on asks each peer for its own
/// numbers of that time (FETCH) and compares: under a number where a peer holds another write,
/// it takes that write and publishes it again under a new number, and its own too, both with
/// their versions. Every replica then holds both, and the last-writer-wins merge gives each the
/// same state.
extension NodeMachine {
    /// The check of own numbers the other start may have taken too.
    struct SplitWritesCheck: Sendable {
        /// The first own number checked: the first this node numbered within
        /// ``NodeMachine/splitWritesLookBack`` before the first sign.
        var from: UInt64
        /// Peers are asked once no sign came for ``NodeMachine/splitWritesQuiet``.
        var lastSign: UInt64
        /// Set when peers are first asked: the last own number checked.
        var through: UInt64?
        /// Per peer still to answer, the next own number to ask it for.
        var cursors: [String: UInt64] = [:]
        /// Peers that answered for the whole range.
        var done: Set<String> = []
        /// Unanswered or refused FETCHes, per peer; one that reaches ``NodeMachine/splitWritesAttempts`` is left out.
        var failures: [String: Int] = [:]
        var fetch: Outstanding?
        /// When peers were first asked: peers not reachable within ``NodeMachine/splitWritesPatience`` are left out.
        var startedAt: UInt64 = 0
        /// The writes published again, so that one held by several peers goes out once.
        var reissued: Set<ReissuedWrite> = []
        /// Numbers under which a peer held another write.
        var splitNumbers: Set<UInt64> = []
        /// Peers left out (unreachable, or refusing).
        var leftOut: [String] = []
    }

    /// One write published again: its model, version and properties.
    struct ReissuedWrite: Hashable, Sendable {
        let channel: String
        let model: String
        let version: Version
        let writes: [PropertyWrite]

        init(_ delta: Delta) {
            channel = delta.channel
            model = delta.model
            version = delta.version
            writes = Array(delta.writes)
        }
    }

    /// How far back before the first sign of another start own numbers are checked: the other
    /// may have run that long before it was seen (signs come within a few heartbeats when it is
    /// linked, within the spreading of member entries when it joined through a seed).
    static let splitWritesLookBack: UInt64 = 60_000
    /// Peers are asked once no sign came for this long (the other start has stopped): five
    /// heartbeat intervals, at least this.
    static let splitWritesQuiet: UInt64 = 2_000
    /// ``splitWritesQuiet``, or five of this node's heartbeat intervals when that is longer.
    var splitWritesQuietTime: UInt64 {
        max(Self.splitWritesQuiet, 5 * UInt64(configuration.heartbeatIntervalMilliseconds))
    }
    static let splitWritesAttempts = 3
    static let splitWritesPatience: UInt64 = 60_000

    /// A sign of another start under this node's id, which it did not refuse at: own numbers
    /// from a minute before the first sign on are checked against its peers once the signs stop.
    /// A sign during a check under way starts the wait again, over the numbers from the first
    /// sign's on (the other start may have taken more meanwhile); what was published again is
    /// not published twice.
    mutating func scheduleSplitWritesCheck() {
        let from = firstOwnNumber(writtenAtOrAfter: lookBackCutoff)
        guard var check = splitWritesCheck else {
            splitWritesCheck = SplitWritesCheck(from: from, lastSign: now)
            return
        }
        check.lastSign = now
        check.from = min(check.from, from)
        if check.through != nil {
            check.through = nil
            check.cursors = [:]
            check.done = []
            check.failures = [:]
            check.fetch = nil
        }
        splitWritesCheck = check
    }

    /// A HEARTBEAT in this node's id from another start, after the first (which is a sign): the
    /// other still runs, so the check waits on.
    mutating func otherStartStillHeard() {
        guard let check = splitWritesCheck else { return }
        // Waiting: only the wait starts again (no scan of the history at every HEARTBEAT).
        if check.through == nil {
            splitWritesCheck?.lastSign = now
        } else {
            scheduleSplitWritesCheck()
        }
    }

    /// A minute before now, by the earlier of the wall clock and the node's clock (which follows
    /// peers that run ahead: the window would shrink).
    private var lookBackCutoff: UInt64 {
        min(clock.wallMilliseconds(), clock.lastTimestamp >> 16) &- Self.splitWritesLookBack
    }

    /// The first own number whose delta this node holds that was written at or after `cutoff`
    /// (milliseconds since 1970), or the next it will number. A scan of the retained own deltas:
    /// their versions need not rise with their numbers (writes published again keep theirs,
    /// numbers fetched back carry the other start's clock).
    private func firstOwnNumber(writtenAtOrAfter cutoff: UInt64) -> UInt64 {
        let own = configuration.nodeID
        // (Its history may be dropped through its last number: a snapshot covered them.)
        guard let history = history[own], nextSequence > 1, history.droppedThrough < nextSequence - 1 else {
            return nextSequence
        }
        let held = history.deltas(in: (history.droppedThrough + 1)...(nextSequence - 1))
        return held.first { $0.version.milliseconds >= cutoff }?.sequence ?? nextSequence
    }

    /// At a repair round: once the signs stopped, asks the next peer for the next own numbers,
    /// one FETCH at a time.
    mutating func requestSplitWritesCheck(usable: [String]) {
        guard var check = splitWritesCheck, refusal == nil else { return }
        if check.through == nil {
            // Not while settling (section 11.2): it numbers no write until then.
            guard now &- check.lastSign >= splitWritesQuietTime, settling == nil else { return }
            let through = nextSequence - 1
            guard check.from <= through else {
                splitWritesCheck = nil
                return
            }
            check.through = through
            check.startedAt = now
            logger.notice(
                "another node ran under this node's id: checking which of its own writes of that time each peer holds",
                metadata: ["delta.range": "\(check.from)...\(through)"])
        }
        // Every peer with a link is asked, also one linked after the check began.
        for peer in usable
        where check.cursors[peer] == nil && !check.done.contains(peer) && !check.leftOut.contains(peer)
            && peers[peer]?.node != configuration.nodeID
        {
            check.cursors[peer] = check.from
        }
        if let fetch = check.fetch {
            guard fetch.deadline <= now else {
                splitWritesCheck = check
                return
            }
            check.fetch = nil
            check.failures[fetch.peer, default: 0] += 1
            remakeRepairLink(ofUnanswering: fetch.peer)  // as for any FETCH unanswered in time
        }
        for (peer, failures) in check.failures where failures >= Self.splitWritesAttempts {
            if check.cursors.removeValue(forKey: peer) != nil { check.leftOut.append(peer) }
        }
        // The peers known to this node that have not answered: asked while the check lasts,
        // left out after ``splitWritesPatience`` (down, or without a repair endpoint). Not the
        // other start's endpoint (its HEARTBEATs named this node's id): it stopped.
        let others = Set(peers.filter { $0.value.node != configuration.nodeID }.keys)
        let unanswered = others.union(check.cursors.keys).subtracting(check.done).subtracting(check.leftOut)
        let patient = now &- check.startedAt < Self.splitWritesPatience
        guard let peer = usable.first(where: { check.cursors[$0] != nil }), let through = check.through else {
            if !patient || unanswered.isEmpty {
                check.leftOut += unanswered.sorted()
                check.cursors = [:]
                splitWritesCheck = check
                finishSplitWritesCheck()
            } else {
                splitWritesCheck = check
            }
            return
        }
        let range = Self.limited(check.cursors[peer]!...through)
        check.fetch = sendFetch(origin: configuration.nodeID, range: range, to: peer)
        splitWritesCheck = check
    }

    /// The answer to a check's FETCH (`true` if it was one): each own number under which the
    /// peer holds another write is mended.
    mutating func splitWritesReply(
        _ requestID: UInt64, kind: ClientProtocol.ReplyKind, body: [UInt8], from peer: String
    ) -> Bool {
        guard var check = splitWritesCheck, let fetch = check.fetch, fetch.requestID == requestID else { return false }
        check.fetch = nil
        // A node that refused to run writes nothing more.
        guard refusal == nil else { return true }
        guard kind == .ok, let (deltas, _, _) = try? ClientProtocol.decodeFetched(body) else {
            check.failures[peer, default: 0] += 1
            splitWritesCheck = check
            return true
        }
        counters.deltasFetched += deltas.count
        let own = configuration.nodeID
        var round = LocalWriteRound(capacity: 0)
        for delta in deltas where delta.origin == own && fetch.range.contains(delta.sequence) {
            // A number this node no longer holds a delta of cannot be compared. (Under one number,
            // `==` compares the writes: version, model and properties.)
            guard let held = history[own]?[delta.sequence], held != delta else { continue }
            check.splitNumbers.insert(delta.sequence)
            // The peer's write, then this node's: both again, under new numbers, with their
            // versions; merged here as any write is.
            for write in [delta, held] where check.reissued.insert(ReissuedWrite(write)).inserted {
                round.append(
                    LocalWrite(
                        address: write.address, version: write.version, writes: Array(write.writes), emitter: 0))
            }
        }
        if fetch.range.upperBound >= check.through ?? 0 {
            check.cursors[peer] = nil
            check.done.insert(peer)
        } else {
            check.cursors[peer] = fetch.range.upperBound + 1
        }
        splitWritesCheck = check
        if !round.isEmpty {
            counters.splitWritesReissued += round.count
            logger.warning(
                "a peer holds other writes under this node's own sequence numbers (another node ran under its id): publishing both again under new numbers",
                metadata: [
                    "peer.endpoint": "\(peer)", "delta.range": "\(fetch.range)", "writes": "\(round.count)",
                ])
            takeLocalWrites(round)
        }
        repairsDue = true
        return true
    }

    private mutating func finishSplitWritesCheck() {
        guard let check = splitWritesCheck else { return }
        splitWritesCheck = nil
        let metadata: Logger.Metadata = [
            "delta.range": "\(check.from)...\(check.through ?? 0)", "numbers.split": "\(check.splitNumbers.count)",
            "writes.republished": "\(check.reissued.count)",
            "peers.left.out": "\(check.leftOut.sorted().joined(separator: ", "))",
        ]
        if !check.leftOut.isEmpty {
            logger.warning(
                "checked own writes against the peers that answered; the others could not be asked, and may hold another node's writes under this node's numbers",
                metadata: metadata)
        } else {
            logger.notice("checked own writes against every peer", metadata: metadata)
        }
    }

    /// A check's FETCH the driver could not queue: asked again at the next round, counted as
    /// a failure of that peer (one that can never be asked is left out, not asked forever).
    mutating func splitWritesRequestUnsent(_ requestID: UInt64) -> Bool {
        guard let fetch = splitWritesCheck?.fetch, fetch.requestID == requestID else { return false }
        splitWritesCheck?.fetch = nil
        splitWritesCheck?.failures[fetch.peer, default: 0] += 1
        return true
    }

    /// A peer restarted, and its repair link was made again: a check's FETCH to it is asked
    /// again, not counted as unanswered.
    mutating func splitWritesPeerRestarted(_ peer: String) {
        if splitWritesCheck?.fetch?.peer == peer { splitWritesCheck?.fetch = nil }
    }
}
