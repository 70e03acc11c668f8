/// Replication (docs/PROTOCOL.md sections 7 and 8): peer messages in, local writes out, the
/// bookkeeping of every origin's sequence numbers, and what live models are sent.
extension NodeMachine {
    /// A delta new to this node, applied to the store: where it is among the deltas given to
    /// ``NodeMachine/apply(_:emitters:account:)``, and which of its writes won. It names its
    /// delta by position, not by holding a copy: a copy is an atomic reference count when the
    /// entry is made and a release when the array of entries goes, for every delta on both the
    /// writer and the reader (issue #17).
    struct Applied: Sendable {
        /// Its position in the deltas given to ``NodeMachine/apply(_:emitters:account:)``
        /// (``AppliedDeltas/given``).
        var offset = 0
        /// The writes that won when not all of the delta's did; `nil`: all of them (none, for a
        /// delta without writes): read it through ``AppliedDeltas/won(_:)``, ``wonAny`` and
        /// ``wonCount``. (Not a copy of the delta's writes when they all won: each copy is an
        /// atomic reference count on their array and a release; ``AppliedDeltas/won(_:)`` makes
        /// the one a live model's write set keeps.)
        let wonSubset: PropertyWrites?
        /// How many writes the delta has.
        let writeCount: Int
        /// The instance id of the model that made it (local writes), else 0.
        var emitter: UInt64 = 0

        /// How many writes won.
        var wonCount: Int { wonSubset?.count ?? writeCount }
        /// Whether any write won.
        var wonAny: Bool { wonCount > 0 }
    }

    /// What one call of ``NodeMachine/apply(_:emitters:account:)`` applied: the new deltas among
    /// those it was given, in order, each with the writes that won.
    struct AppliedDeltas: Sendable {
        /// The deltas given (new or not): ``Applied/offset`` is a position in it. (All of them
        /// stay alive while this is held: it is meant to live for one input's handling.)
        let given: [Delta]
        /// One per new delta, in order.
        var entries: [Applied] = []

        var count: Int { entries.count }
        var isEmpty: Bool { entries.isEmpty }
        var indices: Range<Int> { entries.indices }

        /// The `index`th new delta, borrowed where it lies (a copy only for a caller that keeps
        /// it: one returned by a function was a retain and a release per use).
        subscript(delta index: Int) -> Delta {
            _read { yield given[entries[index].offset] }
        }

        /// The writes of the `index`th new delta that won (possibly none).
        func won(_ index: Int) -> PropertyWrites { entries[index].wonSubset ?? given[entries[index].offset].writes }

        /// The new deltas, copied out (tests and rare paths; the hot ones read them in place).
        var deltas: [Delta] { entries.map { given[$0.offset] } }
    }

    /// The frames of a DELTA message as received (topic, then one body per delta; or a packed
    /// batch's one frame of entries), and which of its deltas were accepted: a received delta is
    /// logged as its body, not re-encoded.
    struct ReceivedFrames {
        let frames: [[UInt8]]
        /// For a packed batch (section 7.7), where each delta's entry lies in `frames[1]`.
        let packedEntries: [Range<Int>]?
        /// The positions of the accepted deltas among the message's; `nil`: all of them.
        let accepted: [Int]?
        /// Whether each body starts with its model id (a channel batch, section 7.6).
        var modelFirst: Bool { frames[0].first == PeerMessage.channelBatchTopicPrefix }
        /// The bytes of the frames after the topic: what the deltas' records copy, at most.
        var payloadBytes: Int {
            var total = 0
            for index in frames.indices.dropFirst() { total += frames[index].count }
            return total
        }

        /// Adds the log records of the deltas `applied` took from this message: each one's frame
        /// (or packed entry) as it came, after its channel (and model). The frames are read in
        /// place: a slice of one, or a copy of the optional list of entries, per delta was an
        /// atomic reference count and its release per delta received (issue #17).
        func addRecords(of applied: AppliedDeltas, to records: inout DeltaLog.Batch) {
            if let packedEntries {
                frames[1].withUnsafeBufferPointer { entries in
                    for index in applied.indices {
                        let offset = applied.entries[index].offset
                        let entry = packedEntries[accepted?[offset] ?? offset]
                        records.add(
                            channel: applied.given[offset].channel,
                            modelAndBody: UnsafeBufferPointer(rebasing: entries[entry]))
                    }
                }
                return
            }
            let modelFirst = modelFirst
            for index in applied.indices {
                let offset = applied.entries[index].offset
                let position = accepted?[offset] ?? offset
                frames[1 + position].withUnsafeBufferPointer { frame in
                    if modelFirst {
                        records.add(channel: applied.given[offset].channel, modelAndBody: frame)
                    } else {
                        records.add(
                            channel: applied.given[offset].channel, model: applied.given[offset].model, body: frame)
                    }
                }
            }
        }
    }

    // MARK: - Peer messages

    /// One message (or DELTA batch) from the peer at `endpoint`.
    mutating func receivePeerMessage(_ frames: [[UInt8]], from endpoint: String) {
        do {
            if let decoded = try PeerMessage.decodeDeltaMessage(
                frames, channelBatches: configuration.channelBatches, packedBatches: configuration.packedBatches)
            {
                counters.deltaMessagesReceived += 1
                counters.peerMessagesReceived += 1
                applyRemote(decoded.deltas, from: endpoint, frames: frames, packedEntries: decoded.packedEntries)
                return
            }
            switch try PeerMessage.decode(frames) {
            case .heartbeat(let beat):
                counters.peerMessagesReceived += 1
                if let bound = boundNode(of: endpoint), beat.node != bound {
                    refuseForged(origin: beat.node, count: 1, from: endpoint, bound: bound, what: "a HEARTBEAT")
                    return
                }
                receiveHeartbeat(beat, from: endpoint)
            case .delta(let delta): applyRemote([delta], from: endpoint)
            }
        } catch {
            countMalformed(
                kind: "malformed-peer", "dropped a malformed message from a peer", endpoint: endpoint, error: error)
        }
    }

    /// Notes when a HEARTBEAT of the peer at `endpoint` came: its pace (``PeerProgress/pace``),
    /// and, once, that it beats much slower than this node (liveness follows each peer's pace,
    /// but `network.heartbeat_ms` should be one value in a cluster).
    mutating func notePace(of endpoint: String, incarnation: UInt64) {
        var peer = peers[endpoint] ?? PeerProgress()
        let own = UInt64(configuration.heartbeatIntervalMilliseconds)
        // Not across a restart (the gap holds its downtime); the pace heard before it stays until
        // new gaps come (else a slow peer's link would be replaced before its second HEARTBEAT).
        // Nor a gap under half this node's interval: HEARTBEATs read together after a pause.
        if let last = peer.lastHeartbeatAt, peer.incarnation == incarnation, now &- last >= own / 2 {
            peer.heartbeatGaps.append(now &- last)
            if peer.heartbeatGaps.count > 4 { peer.heartbeatGaps.removeFirst() }
        }
        peer.lastHeartbeatAt = now
        if !peer.paceLogged, peer.heartbeatGaps.count == 4, let pace = peer.pace, pace > 2 * own {
            peer.paceLogged = true
            logger.warning(
                "a peer sends HEARTBEATs every \(pace) ms or so, this node every \(own) ms (network.heartbeat_ms): liveness follows the peer's pace, but give every node the same heartbeat_ms",
                metadata: ["peer.endpoint": "\(endpoint)", "peer.id": "\(peer.node ?? "?")"])
        }
        peers[endpoint] = peer
    }

    /// With security, the node id the peer at `endpoint` authenticated as (its CURVE key is that
    /// node's): its live stream may carry only that origin (section 14); a stream from an
    /// endpoint that is neither configured nor a learned member may carry none (empty id).
    /// `nil` without security.
    func boundNode(of endpoint: String) -> String? {
        guard configuration.security != nil else { return nil }
        return configuration.peerNodeIDs[endpoint] ?? learnedPeerIDs[endpoint] ?? ""
    }

    /// Drops what a peer sent in another node's name on its live stream: counted and logged.
    mutating func refuseForged(origin: String, count: Int, from endpoint: String, bound: String, what: String) {
        counters.forgedOrigins += count
        // A HEARTBEAT speaks for its sender: one in another id's name is most often a node whose
        // configuration was copied from that node's, node.id unchanged (section 7.5).
        let hint =
            what == "a HEARTBEAT" && !bound.isEmpty
            ? " (a node configured with node.id \(origin) by mistake? its key is \(bound)'s: give it node.id \(bound))"
            : ""
        warnLimited(
            "forged-origin", "a peer sent \(what) in another node's name on its live stream; dropped\(hint)",
            metadata: [
                "peer.endpoint": "\(endpoint)", "peer.id": "\(bound)", "origin": "\(origin)",
            ])
    }

    /// A HEARTBEAT (section 7.3): liveness, the peer's repair endpoint, and what exists.
    mutating func receiveHeartbeat(_ beat: PeerMessage.Heartbeat, from endpoint: String) {
        var restarted = false
        notePace(of: endpoint, incarnation: beat.incarnation)
        peers[endpoint, default: PeerProgress()].lastMessageAt = now
        peers[endpoint, default: PeerProgress()].node = beat.node
        // What it takes (section 7.6) is said with its member list; a restart may be an older
        // version, so a new incarnation takes nothing more until it says so.
        if peers[endpoint]?.incarnation != beat.incarnation {
            // Heard before in another incarnation: it restarted (section 11.3, step 1); its
            // repair link is replaced below, once the endpoint this HEARTBEAT advertises is known.
            restarted = peers[endpoint]?.incarnation != nil
            peers[endpoint]?.incarnation = beat.incarnation
            peers[endpoint]?.takesChannelBatches = false
            peers[endpoint]?.takesPackedBatches = false
            peers[endpoint]?.listsThisNode = false
            peers[endpoint]?.listHeard = false
            peers[endpoint]?.heartbeatsWithoutList = 0
            peers[endpoint]?.unknownSince = nil
            // A peer that started (or restarted) ANNOUNCEs itself only once it has heard this
            // node's member list (``PeerProgress/listHeard``): the list rides on the HEARTBEATs
            // that follow, as after a change of it, not on the next tenth (up to ten intervals,
            // 5 s at the default 500 ms, before a joiner could be told or take anything).
            if beat.node != configuration.nodeID { sendListOnNextHeartbeats() }
        }
        if beat.members == nil, peers[endpoint]?.listHeard == false { peers[endpoint]?.heartbeatsWithoutList += 1 }
        if beat.members != nil {
            let capabilities = beat.capabilities ?? 0
            peers[endpoint]?.takesChannelBatches = capabilities & PeerMessage.channelBatchesCapability != 0
            peers[endpoint]?.takesPackedBatches = capabilities & PeerMessage.packedBatchesCapability != 0
        }
        var repairEndpoint = beat.api.isEmpty ? nil : Self.reachable(beat.api, via: endpoint)
        // Only an API on the host this node reaches the peer at is dialled: a HEARTBEAT must not
        // make the node connect anywhere else (section 14).
        if let advertised = repairEndpoint, !Self.sameHost(advertised, endpoint) {
            counters.foreignRepairEndpoints += 1
            warnLimited(
                "foreign-api",
                "a peer advertises its API on another host than the one its stream comes from; not dialled (bind its API on the same host as its publish endpoint)",
                metadata: ["peer.endpoint": "\(endpoint)", "api": "\(advertised)"])
            repairEndpoint = nil
        }
        peers[endpoint, default: PeerProgress()].repairEndpoint = repairEndpoint
        if restarted { replaceRepairLink(ofRestarted: endpoint) }
        // The first repair link to a peer is made at once, not at the next round: the ANNOUNCE
        // this HEARTBEAT's list may call for goes over it (else a joiner waits for the list on
        // the seed's next HEARTBEAT, one interval later).
        if repairEndpoint != nil, repair.links[endpoint] == nil, peerEndpoints.contains(endpoint) {
            updateRepairLinks()
        }
        var covered = beat.progress
        covered[beat.node] = max(covered[beat.node] ?? 0, beat.latestSequence)
        peers[endpoint, default: PeerProgress()].progress = covered
        if beat.node == configuration.nodeID, beat.incarnation != incarnation {
            if refuseIfAnotherStartSpeaks(beat.incarnation, at: endpoint) { return }
            otherStartStillHeard()
        }
        guard beat.node != configuration.nodeID else { return }
        noteIncarnation(beat.incarnation, of: beat.node, at: endpoint)
        // Its floor (section 8.4): for collection, and followed like a version, so that what this
        // node writes from now on is above every deletion anyone may have collected.
        noteReport(
            of: beat.node, floor: beat.clock, latest: beat.latestSequence, progress: covered,
            withMembers: beat.members != nil)
        clock.observe(Version(timestamp: beat.clock, node: beat.node))
        origins[beat.node, default: OriginProgress()].incarnation = beat.incarnation
        // A claim this peer could not back is not followed again while it repeats it unchanged
        // (section 11.3); a new claim (an honest origin's latest grows as it writes) is.
        let withdrawn = repair.withdrawn[endpoint] ?? [:]
        if beat.latestSequence != withdrawn[beat.node] { announce(origin: beat.node, through: beat.latestSequence) }
        // What the peer holds of every origin: a delta it has exists, so it is owed to us too.
        // For our own origin this means we lost deltas we had published (a damaged or removed
        // log): fetch them back and never reuse their sequence numbers.
        for (origin, through) in beat.progress.sorted(by: { $0.key < $1.key }) where through != withdrawn[origin] {
            announce(origin: origin, through: through)
        }
        // The member list first: a node that was forgotten learns it before anything else.
        if let members = beat.members {
            receiveMembers(members, from: endpoint, sender: beat.node)
            if refusal != nil { return }
            peers[endpoint]?.listHeard = true
        }
        compareDigest(of: beat, from: endpoint)
        tellIfUnknown(endpoint)
        if let own = beat.progress[configuration.nodeID], own < UInt64.max {
            // A peer holds more of this id's deltas than this run numbered: deltas of an earlier
            // life of the id. With nothing on disk, the node would number new writes over them.
            // Not once it holds writes its peers take, and a peer's progress has covered this
            // start's numbering without going past it: then the numbers past it are another
            // start's under its id (section 7.5, "Two nodes under one id"), whose signs decide
            // which stops; as a node with data, it numbers past them and takes them back. (A node
            // wiped and cut off for a minute hears its earlier life's numbers first: it stops.)
            if startedWithoutOwnDeltas, !(holdsWritesPeersTake && ownNumberingTaken), own >= nextSequence {
                refuseToRun(
                    "node id \(configuration.nodeID) already published deltas 1…\(own) in this cluster (peer \(beat.node) holds them), and this node started with none of its own in its data directory (a new or emptied one): it would reuse their sequence numbers. Restore the node's data directory, or give it a new node.id\(membership.members[configuration.nodeID]?.state == .forgotten ? "" : " (and statesync forget \(configuration.nodeID) on a member, if the node that wrote them is gone; if it runs, this is a second node under its id: give this one its own)")"
                )
                return
            }
            if own >= 1, own < nextSequence { ownNumberingTaken = true }
            nextSequence = max(nextSequence, own + 1)
        }
    }

    /// An advertised endpoint bound to a wildcard host is reached at the host we reach the peer at.
    /// Whether the advertised endpoint `a` is on the host of the peer endpoint `b`: the same TCP
    /// host, or any two non-TCP endpoints (`ipc://`, `inproc://`, the simulator's: local by
    /// nature). A peer configured by host name cannot be compared without a DNS lookup (which a
    /// machine does not make): then any host is accepted.
    static func sameHost(_ a: String, _ b: String) -> Bool {
        switch (tcpHost(of: a), tcpHost(of: b)) {
        case (nil, nil): return true
        case (let x?, let y?):
            let isAddress = y.allSatisfy { $0.isHexDigit || $0 == "." || $0 == ":" || $0 == "[" || $0 == "]" }
            return x == y || !isAddress
        default: return false
        }
    }

    static func reachable(_ advertised: String, via peerEndpoint: String) -> String {
        for wildcard in ["tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:"] where advertised.hasPrefix(wildcard) {
            guard let host = tcpHost(of: peerEndpoint) else { return advertised }
            return "tcp://\(host):\(advertised.dropFirst(wildcard.count))"
        }
        return advertised
    }

    mutating func countMalformed(kind: String, _ message: String, endpoint: String, error: any Error) {
        counters.malformedMessages += 1
        warnLimited(
            kind, "\(message)",
            metadata: ["peer.endpoint": "\(endpoint)", "error": "\(error)"])
    }

    /// Applies deltas from one peer message (or one repair answer). Returns the new ones, in
    /// order; they are logged, followed by the clock and sent to live models.
    /// `frames`, when given, are the DELTA message the deltas were decoded from (one body per
    /// delta, or with `packedEntries` a packed batch's entries): the new ones are logged as
    /// those bodies.
    @discardableResult
    mutating func applyRemote(
        _ deltas: [Delta], from endpoint: String, repaired: Bool = false, frames: [[UInt8]]? = nil,
        packedEntries: [Range<Int>]? = nil
    ) -> AppliedDeltas {
        if !repaired, !knowsThisNode(endpoint) {
            refuseBeforeKnown(deltas.count, from: endpoint, live: true)
            return AppliedDeltas(given: [])
        }
        // The deltas to apply: all of them (the same array, no copy) unless one is refused.
        var accepted = deltas
        var acceptedPositions: [Int]?  // set once one is refused
        var refusedAny = false
        // A DELTA batch is of one model: its names are checked once (see refuses).
        var validated: ModelAddress?
        let bound = repaired ? nil : boundNode(of: endpoint)
        for index in deltas.indices {
            // Read in place (a copy of the delta, and of its writes to check them, were an atomic
            // reference count and a release each per delta received: issue #17).
            let refused = refuses(
                deltas[index], from: endpoint, repaired: repaired, bound: bound, validated: &validated)
            if refused, !refusedAny {
                refusedAny = true
                accepted = Array(deltas[..<index])
                acceptedPositions = Array(0..<index)
            } else if !refused, refusedAny {
                accepted.append(deltas[index])
                acceptedPositions!.append(index)
            }
        }
        guard let newest = accepted.indices.max(by: { accepted[$0].version < accepted[$1].version }) else {
            return AppliedDeltas(given: [])
        }
        // Every version at or below one the clock follows is within the drift bound too.
        let drifted =
            clock.observe(accepted[newest].version)
            ? [] : accepted.indices.filter { $0 == newest || !clock.observe(accepted[$0].version) }.map { accepted[$0] }
        if !repaired {
            peers[endpoint, default: PeerProgress()].lastMessageAt = now
            peers[endpoint, default: PeerProgress()].node = accepted[accepted.count - 1].origin
            peers[endpoint, default: PeerProgress()].deltasReceived += accepted.count
            counters.deltasReceived += accepted.count
        }
        counters.clockDriftRejections += drifted.count
        let applied = apply(accepted) { machine, applied in
            machine.counters.propertiesStale += applied.writeCount - applied.wonCount
            if applied.wonAny { machine.counters.deltasApplied += 1 }
        }
        if latencySamples.enabled, !repaired, !applied.isEmpty {
            latencySamples.remoteApplied(version: accepted[newest].version, wallNow: clock.wallMilliseconds())
        }
        if let drifted = drifted.first {
            warnLimited(
                "clock-drift", "a peer's clock is further ahead than clock.max_drift_ms; not following it",
                metadata: [
                    "peer.id": "\(drifted.origin)", "delta.version": "\(drifted.version)",
                ])
        }
        // Live models first (a `write` to the log is not on the path of a remote change to its
        // observers), then logged, without fsync: the log does not make them durable on a power
        // loss anyway, and a peer can always send them again.
        deliver(applied)
        if let frames,
            packedEntries?.count == deltas.count || (packedEntries == nil && frames.count == deltas.count + 1)
        {
            appendToLog(
                applied, mustSucceed: false,
                received: ReceivedFrames(frames: frames, packedEntries: packedEntries, accepted: acceptedPositions))
        } else {
            appendToLog(applied, mustSucceed: false)
        }
        return applied
    }

    /// After this many HEARTBEATs without a member list (and none with one) in an incarnation,
    /// the peer predates membership. A node sends its list on every tenth at least; five times
    /// that leaves room for lost HEARTBEATs.
    static let heartbeatsWithoutListOfAnOldNode = 5 * membersEveryHeartbeats

    /// Whether the peer at `endpoint` knows this node (section 7.5, "Known before taken"): its
    /// member list in this incarnation named it, or it took its ANNOUNCE, and it saved its list
    /// before saying so; then, should it settle after a power loss (section 11.2), it asks this
    /// node for the deltas it lost. Before that, its own deltas are not taken from it: a node it
    /// does not know could hold numbers it would reuse. A peer that cannot be told (it advertises
    /// no API this node may dial, or predates membership) is taken as it comes.
    func knowsThisNode(_ endpoint: String) -> Bool {
        guard let peer = peers[endpoint] else { return false }
        return peer.listsThisNode || (peer.incarnation != nil && peer.repairEndpoint == nil)
            || peer.heartbeatsWithoutList > Self.heartbeatsWithoutListOfAnOldNode
    }

    /// Deltas from a peer that does not know this node yet: not taken (not received either, so
    /// they are repaired once it does); it is told this node's entry. Those of its live stream
    /// (`live`) still say the link is alive.
    mutating func refuseBeforeKnown(_ count: Int, from endpoint: String, live: Bool) {
        if live { peers[endpoint, default: PeerProgress()].lastMessageAt = now }
        counters.deltasBeforeKnown += count
        tellIfUnknown(endpoint)
        infoLimited(
            "before-known",
            "a peer's deltas are taken once it knows this node (its member list names it, or it took this node's ANNOUNCE); until then they are left to repair",
            metadata: ["peer.endpoint": "\(endpoint)", "deltas": "\(count)"])
    }

    /// A peer that does not know this node yet, whose member list was heard in this incarnation,
    /// is told this node's entry at once (not at its next list, every tenth HEARTBEAT): its
    /// deltas wait until it knows (section 7.5). Not before its list: see
    /// ``PeerProgress/listHeard``.
    mutating func tellIfUnknown(_ endpoint: String) {
        guard refusal == nil, !knowsThisNode(endpoint) else {
            peers[endpoint]?.unknownSince = nil
            return
        }
        let since = peers[endpoint]?.unknownSince ?? now
        peers[endpoint]?.unknownSince = since
        let unknownFor = now &- since
        if unknownFor > 30 * interval(of: peers[endpoint]) {
            warnLimited(
                "unknown-to-peer",
                "a peer still does not know this node, so its deltas are not taken: it has not named this node in its member list nor answered its ANNOUNCE (is its API reachable from here?)",
                metadata: ["peer.endpoint": "\(endpoint)", "seconds": "\(unknownFor / 1000)"])
        }
        // Not while a reset is not yet written: the entry told would be the one from before the
        // forget, which the peer holds a newer one of.
        guard peers[endpoint]?.listHeard == true, !resetUnwritten, let own = ownEntry else { return }
        announce(own, to: endpoint)
    }

    /// Whether a received delta is refused: this node's own write echoed back, an origin other
    /// than the one the sending peer's key is bound to (`bound`), an invalid name (counted as
    /// malformed), or a planted drop. `validated` is the address whose names were checked last:
    /// a DELTA batch is of one model, its names are checked once.
    private mutating func refuses(
        _ delta: borrowing Delta, from endpoint: String, repaired: Bool, bound: String?,
        validated: inout ModelAddress?
    ) -> Bool {
        if delta.origin == configuration.nodeID && !repaired { return true }  // our own write, echoed back
        if let bound, delta.origin != bound {
            refuseForged(origin: delta.origin, count: 1, from: endpoint, bound: bound, what: "a DELTA")
            return true
        }
        do {
            // Compared as bytes, not as Strings: a channel batch names each delta's model, and
            // `==` would take the NFD twin of a checked name for it (and let it past the NFC and
            // length checks).
            let checkedAlready =
                validated.map { $0.channel.hasSameUTF8(as: delta.channel) && $0.model.hasSameUTF8(as: delta.model) }
                ?? false
            if !checkedAlready {
                try Names.validateChannel(delta.channel)
                try Names.validateModel(delta.model)
                validated = delta.address
            }
            for position in 0..<delta.writes.count { try Names.validateWrite(delta.writes[position]) }
            return plantedDrop(delta)
        } catch {
            countMalformed(
                kind: "invalid-delta", "dropped a delta with an invalid name", endpoint: endpoint, error: error)
            return true
        }
    }

    /// Records and merges deltas in runs of one origin and one model (a DELTA batch, usually):
    /// their bookkeeping looks each up once per run. `account` sees each new delta, with the
    /// writes that won, as it is applied.
    mutating func apply(
        _ deltas: [Delta], emitters: [UInt64]? = nil, recording: Bool = true,
        account: (inout NodeMachine, borrowing Applied) -> Void
    ) -> AppliedDeltas {
        var applied = AppliedDeltas(given: deltas)
        applied.entries.reserveCapacity(deltas.count)
        var start = 0
        while start < deltas.count {
            var end = start + 1
            while end < deltas.count, deltas[end].origin == deltas[start].origin,
                deltas[end].channel == deltas[start].channel, deltas[end].model == deltas[start].model
            {
                end += 1
            }
            var isNew = isNewScratch
            isNewScratch = []
            if recording {
                record(run: deltas[start..<end], into: &isNew)
            } else {
                isNew.removeAll(keepingCapacity: true)
                isNew.append(contentsOf: repeatElement(true, count: end - start))
            }
            // Usually every delta of the run is new: merge the run as it is, without a copy.
            let fresh: [Delta]
            let offsets: [Int]?  // of the fresh deltas in `deltas`; nil: start, start + 1, ...
            if isNew.allSatisfy({ $0 }) {
                fresh = start == 0 && end == deltas.count ? deltas : Array(deltas[start..<end])
                offsets = nil
            } else {
                offsets = (start..<end).filter { isNew[$0 - start] }
                fresh = offsets!.map { deltas[$0] }
            }
            isNewScratch = isNew
            var won = winnersScratch
            winnersScratch = []
            store.applyWinning(run: fresh, into: &won)
            for index in won.indices {
                let offset = offsets?[index] ?? start + index
                let new = Applied(
                    offset: offset, wonSubset: won[index], writeCount: fresh[index].writes.count,
                    emitter: emitters?[offset] ?? 0)
                account(&self, new)
                applied.entries.append(new)
            }
            won.removeAll(keepingCapacity: true)
            winnersScratch = won
            start = end
        }
        return applied
    }

    /// Merges own deltas fetched back after this node dropped its state (section 7.5). Their
    /// numbers are covered already (the reset covered them without the deltas): they are merged,
    /// delivered to live models and logged, not recorded (neither the history nor the journal
    /// gets them; the caller resyncs the watches of their channels). Returns those channels.
    mutating func mergeRecoveredOwn(_ deltas: [Delta]) -> Set<String> {
        let applied = apply(deltas, recording: false) { machine, applied in
            if applied.wonAny { machine.counters.deltasApplied += 1 }
        }
        deliver(applied)
        appendToLog(applied, mustSucceed: false)
        var changed = Set<String>()
        for index in applied.indices where applied.entries[index].wonAny {
            changed.insert(applied[delta: index].channel)
        }
        return changed
    }

    /// Test-only fault (``NodeFaults/dropRemoteDeltasShare``): silently discards a share of
    /// remote deltas and marks them received, so they are never repaired.
    mutating func plantedDrop(_ delta: Delta) -> Bool {
        let share = faults.dropRemoteDeltasShare
        guard share > 0, delta.origin != configuration.nodeID,
            Double(delta.sequence &* 2_654_435_761 % 1000) / 1000 < share
        else { return false }
        _ = record(delta)
        return true
    }

    /// Sends the writes that won to the live models at their addresses, in runs of one address.
    mutating func deliver(_ applied: AppliedDeltas) {
        guard !attachedModels.isEmpty else { return }
        var deliveries: [ModelDelivery] = []
        var start = 0
        while start < applied.count {
            // A run of deltas of one model (a batch, usually): its live model is looked up once,
            // and its list of writes takes its room at once (grown one doubling at a time, a
            // batch of 256 single sets took nine allocations and copies).
            let address = applied[delta: start].address
            var end = start + 1
            while end < applied.count, applied[delta: end].model == address.model,
                applied[delta: end].channel == address.channel
            {
                end += 1
            }
            defer { start = end }
            guard let instance = attachedModels[address] else { continue }
            var sets: [ModelRegistrar.RemoteWriteSet] = []
            for index in start..<end where applied.entries[index].wonAny && instance != applied.entries[index].emitter {
                if sets.isEmpty { sets.reserveCapacity(end - index) }
                sets.append(
                    ModelRegistrar.RemoteWriteSet(
                        writes: applied.won(index), version: applied[delta: index].version,
                        isRemote: applied[delta: index].version.node != configuration.nodeID,
                        emitter: applied.entries[index].emitter))
            }
            guard !sets.isEmpty else { continue }
            // The same model again after a run of a model not attached here: one delivery.
            if deliveries.last?.address == address {
                deliveries[deliveries.count - 1].sets.append(contentsOf: sets)
            } else {
                deliveries.append(ModelDelivery(address: address, sets: sets))
            }
        }
        if !deliveries.isEmpty { actions.append(.deliver(deliveries)) }
    }

    // MARK: - Local writes

    /// Numbers the writes live models made, applies them, logs them and stages them to be
    /// published (and acknowledged) once durable.
    mutating func takeLocalWrites(_ writes: LocalWriteRound) {
        guard !writes.isEmpty else { return }
        _ = applyLocal(writes)
        // Group commit: a full round means a long queue (the host feeds it in rounds of this
        // size): its sync is asked for now (where it may go before its sync, it is published
        // now, first), so it is published before the host feeds the next.
        // A smaller round waits for the tick that ends the driver's turn, sharing its sync with
        // whatever else the turn took (one per turn, not one per peer message).
        if writes.count >= Self.localWritesPerRound {
            // Published first where it may go before its sync: it travels while the sync runs.
            publishReserved()
            requestSync(force: false)
        }
    }

    /// The most local writes the host feeds the machine in one input (``NodeInput/localRound(_:)``).
    package static let localWritesPerRound = 4096

    /// Numbers `writes` in order and applies them as this node's deltas. Returns them as applied.
    mutating func applyLocal(_ round: LocalWriteRound) -> AppliedDeltas {
        // The round's deltas in one allocation (a `ManagedBuffer` per delta cost the turn 8 % more),
        // sharing the round's array of properties, cut to its size first: the deltas keep it.
        var writes = round
        writes.fitProperties()
        let first = nextSequence
        let deltas = Delta.batch(count: writes.count) { index in
            let entry = writes.entries[index]
            return Delta.Fields(
                channel: entry.address.channel, model: entry.address.model, version: entry.version,
                sequence: first + UInt64(index), writes: writes.writes(at: index))
        }
        nextSequence += UInt64(writes.count)
        let applied = apply(deltas, emitters: writes.entries.map(\.emitter)) { machine, _ in
            machine.counters.deltasPublished += 1
        }
        stage(applied)
        // The instance that wrote it already holds it (``deliver(_:)`` skips it); another
        // instance at the address (a newer one may have adopted the store before this write
        // landed) gets it.
        deliver(applied)
        return applied
    }

    // MARK: - Sequence bookkeeping (section 8.1)

    /// Records a delta's sequence number and keeps it for repairs. Returns `false` for a delta
    /// already received (applying it again would be harmless, but it is not logged twice).
    mutating func record(_ delta: Delta) -> Bool {
        var isNew: [Bool] = []
        record(run: CollectionOfOne(delta), into: &isNew)
        return isNew[0]
    }

    /// Records a run of deltas of one origin like ``record(_:)``, with one look-up of the
    /// origin's progress and history for the whole run. Sets `isNew` to whether each was new
    /// (the caller's buffer, reused: no array per run).
    mutating func record<Run: Collection<Delta>>(run deltas: Run, into isNew: inout [Bool]) {
        isNew.removeAll(keepingCapacity: true)
        guard let origin = deltas.first?.origin else { return }
        assert(deltas.allSatisfy { $0.origin == origin }, "a run is of one origin")
        // In place (no copy of the origin's set of received-above sequence numbers).
        let gapsBefore = counters.sequenceGaps
        Self.record(
            deltas, into: &isNew, progress: &origins[origin, default: OriginProgress()],
            history: &history[origin, default: OriginHistory()], historyLimit: configuration.historyDeltas,
            counters: &counters)
        if counters.sequenceGaps != gapsBefore {
            logger.debug(
                "a gap opened in an origin's sequence numbers",
                metadata: [
                    "peer.id": "\(origin)", "delta.sequence": "\(deltas.first!.sequence)",
                    "contiguous": "\(origins[origin]?.contiguous ?? 0)",
                ])
        }
        // The journal serves watches, which only a client API takes (a node without one answers
        // its peers' repairs and nothing else): an embedded node without an API keeps none (a
        // copy of every delta, its release and the journal's bookkeeping when it is dropped;
        // issue #17). The API endpoint is fixed for the node's life.
        guard configuration.apiEndpoint != nil else { return }
        let (limit, overflow) = configuration.historyDeltas.multipliedReportingOverflow(by: max(origins.count, 1))
        for (index, new) in zip(deltas.indices, isNew) where new {
            journal.append(deltas[index], limit: overflow ? Int.max / 2 : limit)
        }
    }

    private static func record<Run: Collection<Delta>>(
        _ deltas: Run, into isNew: inout [Bool], progress: inout OriginProgress, history: inout OriginHistory,
        historyLimit: Int, counters: inout NodeCounters
    ) {
        isNew.reserveCapacity(deltas.count)
        // By index, not `for delta in deltas`: each element's copy is an atomic reference count
        // and its release, for every delta recorded (issue #17).
        for index in deltas.indices {
            let (new, openedGap) = progress.receiveNotingGap(deltas[index].sequence)
            isNew.append(new)
            guard new else {
                counters.duplicateDeltas += 1
                continue
            }
            if openedGap { counters.sequenceGaps += 1 }
            history.insert(deltas[index], limit: historyLimit)
        }
    }

    /// The state now covers `origin` through `sequence` without the deltas themselves (a
    /// snapshot): neither repairs nor watch resumes can be served from history below it.
    mutating func coverWithoutHistory(origin: String, through sequence: UInt64) {
        let progress = origins[origin] ?? OriginProgress()
        resetWatchesHolding(origin: origin) { $0 <= sequence && !progress.holds($0) }
        resyncResumedWatches(lacking: origin, through: sequence, held: progress)
        origins[origin, default: OriginProgress()].cover(through: sequence)
        history[origin, default: OriginHistory()].drop(through: sequence)
        journal.markAbsent(origin: origin, through: sequence)
    }

    /// Records that `origin`'s deltas exist through `sequence` (a heartbeat or a peer's progress
    /// said so): a gap at the tail, with no later delta to reveal it, is counted like any other.
    mutating func announce(origin: String, through sequence: UInt64) {
        var progress = origins[origin, default: OriginProgress()]
        guard sequence > progress.announced else { return }
        let gapBefore = progress.hasGap
        progress.announced = sequence
        if !gapBefore, progress.hasGap { counters.sequenceGaps += 1 }
        origins[origin] = progress
    }

    /// Sequence numbers known to exist but not received, over all origins (saturating: a peer's
    /// absurd announcement cannot overflow it).
    package var missingDeltas: Int {
        var total: UInt64 = 0
        for progress in origins.values {
            let missing = progress.missing
            total = total.addingReportingOverflow(missing).overflow ? .max : total + missing
        }
        return Int(clamping: total)
    }

    /// Per origin with a gap, its first run of missing sequence numbers.
    package var firstGaps: [String: ClosedRange<UInt64>] {
        origins.compactMapValues(\.firstGap)
    }

    /// What this node takes beyond version 1 (HEARTBEAT `capabilities`, section 7.3); `nil`: none.
    var ownCapabilities: UInt64? {
        let bits =
            (configuration.channelBatches ? PeerMessage.channelBatchesCapability : 0)
            | (configuration.packedBatches ? PeerMessage.packedBatchesCapability : 0)
        return bits == 0 ? nil : bits
    }

    /// This node's heartbeat (section 7.3), with its member list or without, and with the state
    /// digest when given (section 11.4): its progress is ``heartbeatProgress`` unless given.
    func heartbeat(
        withMembers: Bool = true, floor: UInt64? = nil, progress: [String: UInt64]? = nil, stateDigest: UInt64? = nil
    ) -> PeerMessage {
        .heartbeat(
            PeerMessage.Heartbeat(
                node: configuration.nodeID, latestSequence: published, clock: floor ?? ownFloor,
                incarnation: incarnation, api: boundRepair, progress: progress ?? heartbeatProgress,
                members: withMembers ? membership.sorted : nil,
                capabilities: ownCapabilities, stateDigest: stateDigest))
    }
}
