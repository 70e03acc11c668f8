package import Logging

/// Every protocol decision of one node, with no I/O: ``NodeInput``s go in, ``NodeAction``s come
/// out (docs/PROTOCOL.md is what it implements).
///
/// The machine owns the node's replicated state (the store, what it has received of each
/// origin, the retained history, the journal watches follow), its links to peers, its repairs,
/// its watches and what waits to become durable. It has no sockets, threads, files, wall clock,
/// randomness or environment: time comes with every input, the incarnation is given, the hybrid
/// logical clock it stamps with reads the wall time its owner injected, and test faults are
/// configuration (``NodeFaults``). So the same machine runs in `statesyncd` (driven by the
/// ZeroMQ I/O thread) and in the cluster simulator (driven by a seed), and a test can drive it
/// input by input.
///
/// Files by concern: replication (peer messages, local writes, SET), durability, repair,
/// watches, the client API.
///
/// Thread safety: a value type; its owner serialises access (``StateSyncNode`` keeps it behind
/// its lock).
package struct NodeMachine: Sendable {
    package let configuration: NodeConfiguration
    package let incarnation: UInt64
    /// The node's clock: models stamp their writes from it on their own threads; the machine
    /// stamps SETs and follows peers' versions.
    package let clock: HybridLogicalClock
    package var logger: Logger
    let faults: NodeFaults
    var limiter = LogLimiter()

    // MARK: Replicated state

    /// The node's replica of every model.
    package internal(set) var store = ReplicaStore()
    /// What has been received of each origin's sequence numbers.
    var origins: [String: OriginProgress] = [:]
    /// Per origin, the deltas retained to serve repairs.
    var history: [String: OriginHistory] = [:]
    /// Every recorded delta in apply order: what watches follow.
    var journal = Journal()
    /// Empty between inputs: the buffer ``apply(_:emitters:account:)`` collects a run's winning
    /// writes in (`nil`: all of a delta's writes won), kept with its capacity.
    var winnersScratch: [PropertyWrites?] = []
    /// The buffer ``apply(_:emitters:account:)`` marks a run's new deltas in, kept with its
    /// capacity between inputs (what it holds then means nothing).
    var isNewScratch: [Bool] = []
    /// Per configured peer endpoint, what this node has heard from it.
    var peers: [String: PeerProgress] = [:]
    /// When the link of each peer never heard from was made (or last replaced), and how many
    /// times it was replaced so.
    var unheardLinkSince: [String: UInt64] = [:]
    var unheardLinkResets: [String: Int] = [:]
    /// Every peer publish endpoint the node links to: the configured ones, then the members it
    /// learned (section 7.5).
    package internal(set) var peerEndpoints: [String] = []
    /// The node id of each learned peer endpoint.
    var learnedPeerIDs: [String: String] = [:]
    /// When each member whose links were dropped (it left, or was forgotten) was last heard.
    var departedLastHeard: [String: UInt64] = [:]
    /// When each member that had left (or was forgotten) was learned to be alive again: it counts
    /// as alive from then until its silence says otherwise, not `down` from its last HEARTBEAT
    /// before it left until its first one after it is back.
    var aliveAgainAt: [String: UInt64] = [:]
    /// Configured peer endpoints whose links were dropped because their member left (not
    /// forgotten), with that member's id: dialled again if the node is left linked to no peer.
    var droppedConfiguredPeers: [String: String] = [:]
    /// A peer's member list held this node's entry of this start (a HEARTBEAT's list, or an
    /// ANNOUNCE answered "taken"): it is in the cluster, and a forget it hears of from now on was
    /// made while it ran.
    var ownEntryAcknowledged = false

    /// The cluster's member list (section 7.5).
    package internal(set) var membership = Membership()
    /// The list's revision when it was last saved (``NodeAction/saveMembers(_:)``).
    var savedMembershipRevision = 0
    /// The last forget of this node that it dropped its state for (it does so once per forget),
    /// and the last one whose reset is written: the members file keeps that one as the node's
    /// own entry, so that a forget newer than it, heard after a restart, was made while the
    /// node was away (section 7.5, "Forgotten while away").
    var resyncedAfterForget: Membership.Member?
    var answeredForget: Membership.Member?
    /// ``answeredForget``'s version when the members file was last saved.
    var savedAnsweredForget: Version?
    /// The state this node dropped after a forget (section 7.5) is not in its snapshot file yet:
    /// its compaction waits for a running sync (which only a host that syncs in the background
    /// has), or its outcome is not reported yet, or it failed and waits for its retry. Its entry
    /// saying it is alive again, and the members file's answered forget, wait for it
    /// (``compactionAnswered(failure:)``).
    var resetUnwritten = false
    /// This node's latest own sequence number when it last dropped its state (section 7.5), 0
    /// if it never did: kept for good (in its snapshot file), since a watch cursor whose own mark
    /// is at or below it was taken before that reset, and its client may hold given-up writes
    /// (a cursor the node gave since covers its own origin through at least this number).
    var lastResetThrough: UInt64 = 0
    /// Per peer endpoint, when this node last sent it an ANNOUNCE; the ANNOUNCEs in flight (by
    /// request id, the entry each carried).
    var lastAnnounce: [String: UInt64] = [:]
    var announcesInFlight: [UInt64: Membership.Member] = [:]
    /// The HEARTBEAT saying this node left was published (it stops).
    var leftAnnounced = false
    /// HEARTBEATs published, and how many had been when the member list was last due on the
    /// next ones (``sendListOnNextHeartbeats()``): it rides on those and on every tenth (section
    /// 7.5).
    var heartbeatsSent = 0
    var listDueFrom = 0
    /// The node started knowing none of its own sequence numbers: an empty data directory (or
    /// one that never held a delta of its own — a node that refused to run leaves a snapshot
    /// without any, and must refuse again).
    var startedWithoutOwnDeltas = false
    /// Why it refuses to run, once it does.
    package internal(set) var refusal: String?
    /// A peer's HEARTBEAT said it holds some of this start's own numbers and none past them
    /// (``holdsWritesPeersTake``, section 7.5).
    var ownNumberingTaken = false
    /// Signs that other incarnations of this node's id run, by incarnation: their live entries
    /// this start superseded, their HEARTBEATs (``refuseIfAnotherStartRuns(_:)``).
    var signsOfOtherStarts: [UInt64: Int] = [:]
    /// When this start bound its endpoints (its age, for ``signsBeforeRefusing(against:)``).
    var boundAt: UInt64?
    /// Other incarnations of this node's id whose HEARTBEATs it heard (each is one sign).
    var startsHeardSpeaking: Set<UInt64> = []
    /// The incarnations heard under each peer's node id (``noteIncarnation(_:of:at:)``).
    var incarnationTrails: [String: IncarnationTrail] = [:]
    /// Own numbers to check against peers after signs of another start under this id
    /// (``scheduleSplitWritesCheck()``).
    var splitWritesCheck: SplitWritesCheck?
    package var counters = NodeCounters()
    /// Latencies measured while handling inputs, for the host's metrics (drained by it).
    package var latencySamples = LatencySamples()
    /// The sequence number the next local write gets.
    package internal(set) var nextSequence: UInt64 = 1
    /// The highest own sequence number published (sent; with `storage.fsync: always` and
    /// `storage.publish: synced`, durable).
    package internal(set) var published: UInt64 = 0
    /// The highest own sequence number a watch on this node may be sent: published and durable
    /// (with `storage.fsync: interval` or `storage.publish: written` a write is published before
    /// its sync, but this node's watches see it only once a power loss of this node can no longer
    /// take it), or held by a peer.
    var visibleToWatches: UInt64 = 0
    /// Addresses that have a live model on this node, with that instance's id: only their
    /// changes are delivered, and not to the instance that wrote them (it holds them already).
    package var attachedModels: [ModelAddress: UInt64] = [:]
    /// With security: what each admitted client may do, by identity (the user id of its key),
    /// from its driver at start and at every reload (``NodeInput/clientAccessChanged(_:peers:)``).
    var clientAccess: [String: SecurityConfiguration.ClientAccess] = [:]
    /// With security: the node ids whose keys are admitted (a removed peer's open connections
    /// may do nothing).
    var admittedPeers: Set<String> = []
    /// The data directory's free space, when known, and whether it is under the reserve.
    var diskFree: UInt64?
    /// Octets of client writes taken since the free space was last measured (every 200 ms):
    /// counted against it, so that a burst between two measurements cannot fill the disk.
    var writtenSinceSpaceCheck: UInt64 = 0
    var diskFull = false
    /// Refused connections by key fingerprint, for the 32 most recent distinct keys (status).
    var refusedKeys: [String: Int] = [:]
    var refusedKeyOrder: [String] = []

    // MARK: Endpoints, timers, flow

    package internal(set) var boundPublish: String
    package internal(set) var boundRepair: String
    var lastHeartbeat: UInt64?
    var lastRepairRound: UInt64?
    /// An answer let the next repair request go (an ANNOUNCE taken or a list naming this node, a
    /// FETCH that found a peer without the deltas), or a round found a snapshot needed (it goes
    /// alone, at the next tick): the next tick asks at once instead of at the next round, up to
    /// ``repairInterval`` later (PROTOCOL.md 11.3). Not after an answer that changed nothing (a
    /// peer that keeps answering so would be asked again at network speed), nor after a
    /// snapshot's end (a gap no snapshot fills would make FETCHes and SNAPSHOTs follow each
    /// other so).
    var repairsDue = false
    /// When the store's digest last took in the models changed since (``foldDigestsWhenDue()``).
    var lastDigestFold: UInt64?
    /// Digests compared with peers' (section 11.4).
    var antiEntropy = AntiEntropy()
    var intakePaused = false
    var pausedSince: UInt64 = 0
    package internal(set) var stopping = false

    var durability = Durability()
    /// Set while the node settles its sequence numbers after a power loss (section 11.2): it
    /// takes no local write until every peer has said which of its lost deltas it holds.
    var settling: Settling?
    /// Every origin's numbers this node knows to be void (its own, which settling found lost
    /// everywhere, section 11.2, and those the origins declared to it, section 10.8): a watch
    /// resumed below them goes past them. Ascending and merged per origin.
    var voidKnown: [String: [ClosedRange<UInt64>]] = [:]
    /// Own numbers that will never exist: FETCH replies declare them, the reservation keeps them.
    var voidOwn: [ClosedRange<UInt64>] { voidKnown[configuration.nodeID] ?? [] }
    var repair = RepairState()
    var watches = WatchTable()
    var collection = CollectionState()
    /// Set by the host before each input: below every version a live model stamped and the
    /// machine has not taken yet (``ownFloor``); `.max` when there is none.
    package var hostWriteFloor: UInt64 = .max

    /// The actions of the input being handled.
    var actions: [NodeAction] = []
    /// The `now` of the input being handled (monotonic milliseconds).
    var now: UInt64 = 0

    /// What a node recovered from its data directory before it starts.
    package struct Recovery: Sendable {
        package var snapshot: StateSnapshot?
        /// The deltas of the log, in order (own and remote).
        package var deltas: [Delta] = []
        /// Torn or corrupt bytes cut from the log's tail.
        package var cutBytes = 0
        package var cutReason: String?
        /// Whether the log was damaged where it had been durable (an intact record was cut after
        /// the bad one), now or at an earlier start that did not settle since: it may have lost
        /// acknowledged own deltas (section 11.2, "Settling after a damaged log").
        package var logDamaged = false
        /// The log's size after recovery (its magic and its intact records).
        package var logSize = 0
        /// The member list the node saved (section 7.5), if any.
        package var members: [Membership.Member] = []
        /// The sequence numbers the node had reserved for publishing before they were durable
        /// (`storage.fsync: interval`, or `storage.publish: written`, section 11.2): 0 when it
        /// reserved none.
        package var reservedSequence: UInt64 = 0
        /// Own numbers an earlier settling declared void (kept with the reservation).
        package var voidSequences: [ClosedRange<UInt64>] = []
        /// Whether the reservation was made in the running boot of the operating system: then
        /// whatever the node wrote to its log survived it (a process crash loses nothing written),
        /// and nothing it published can be missing from the log.
        package var reservedInThisBoot = true

        package init(
            snapshot: StateSnapshot? = nil, deltas: [Delta] = [], cutBytes: Int = 0, cutReason: String? = nil,
            logSize: Int = 0
        ) {
            self.snapshot = snapshot
            self.deltas = deltas
            self.cutBytes = cutBytes
            self.cutReason = cutReason
            self.logSize = logSize
        }
    }

    /// A machine that continues from `recovery`: the snapshot, then the log replayed over it.
    package init(
        configuration: NodeConfiguration, clock: HybridLogicalClock, incarnation: UInt64, recovery: Recovery,
        faults: NodeFaults = NodeFaults(), logger: Logger
    ) {
        self.configuration = configuration
        self.clock = clock
        self.incarnation = incarnation
        self.faults = faults
        self.logger = logger
        boundPublish = configuration.publishEndpoint
        boundRepair = configuration.repairServiceEndpoint
        for peer in configuration.peers { peers[peer] = PeerProgress() }
        peerEndpoints = configuration.peers
        // The peers the configuration gives keys for, as the driver says again once it read
        // them: the members saved by an earlier run are linked before that (a trial's restart
        // warned that a peer whose key was configured was not trusted, then linked it).
        admittedPeers = Set((configuration.security?.peerKeys ?? [:]).keys)
        var latestSequence: UInt64 = 0
        if let snapshot = recovery.snapshot {
            store = snapshot.store
            latestSequence = snapshot.latestSequence
            for (origin, through) in snapshot.progress.sorted(by: { $0.key < $1.key }) {
                coverWithoutHistory(origin: origin, through: through)
            }
            // It had dropped its state (section 7.5): what it still recovers goes on, and a
            // peer's snapshot it had not merged yet is asked for again.
            if let own = snapshot.ownRecovery {
                lastResetThrough = own.through
                // A recovery that reached its end is kept only as the last reset.
                if (own.recovered ?? 0) < own.through { repair.ownRecovery = own }
                if own.recovered == nil { repair.needsSnapshot = true }
            }
        }
        // The member list saved by an earlier run: a restarted node knows every member it knew,
        // which its collection of deletions relies on (section 8.4). Its own entry is written
        // again at bind, above the one saved.
        for member in recovery.members {
            if member.id == configuration.nodeID {
                clock.advance(past: member.version)
                // The last forget it answered (a file of an earlier version holds the last entry
                // the node wrote instead: no forget answered).
                if member.state == .forgotten {
                    resyncedAfterForget = member
                    answeredForget = member
                    savedAnsweredForget = member.version
                }
            } else {
                membership.merge(member)
            }
        }
        savedMembershipRevision = membership.revision
        store.plantedWrongTieBreak = faults.wrongTieBreak
        store.plantedIgnoreDeletions = faults.ignoreDeletions
        // Replay the write-ahead log: every delta applied since the snapshot, own and remote.
        var ownLatest = store.allModels.flatMap { $0.1.values.map(\.version) }.filter {
            $0.node == configuration.nodeID
        }.max()
        for delta in recovery.deltas where record(delta) {
            _ = store.apply(delta)
            if delta.origin == configuration.nodeID {
                latestSequence = max(latestSequence, delta.sequence)
                ownLatest = max(ownLatest ?? delta.version, delta.version)
            }
        }
        counters = NodeCounters()
        counters.logBytesCut = recovery.cutBytes
        // Never reuse a sequence number or issue a version below what this node already wrote.
        nextSequence = latestSequence + 1
        // A reservation says the node published deltas: its data directory is not a new one;
        // nor is one whose log is damaged (its own deltas may have been cut with the damage).
        startedWithoutOwnDeltas = latestSequence == 0 && recovery.reservedSequence == 0 && !recovery.logDamaged
        published = latestSequence
        visibleToWatches = latestSequence
        durability.durableOwnSequence = latestSequence
        durability.reserved = max(recovery.reservedSequence, latestSequence)
        takeRecoveredVoid(recovery.voidSequences)
        if recovery.reservedSequence > latestSequence, !recovery.reservedInThisBoot, !faults.skipSettling {
            // The OS went down since (a power loss, a kernel crash): deltas published before
            // their sync may be missing from the log. Their numbers are not reused until every
            // peer said which of them it holds (section 11.2). From the first own number it lacks:
            // a settling cut short (a crash, a stop) may have logged numbers taken back from
            // peers above ones still missing, which a new settling must look at again.
            let first = min(latestSequence, origins[configuration.nodeID]?.contiguous ?? 0) + 1
            settling = Settling(range: first...recovery.reservedSequence, after: .powerLoss)
            logger.warning(
                "the node stopped without a clean shutdown in an earlier boot of the OS (a power loss or a kernel crash) while it published before syncing (storage.fsync: interval, or storage.publish: written): its log may have lost deltas it had published; it takes no writes until its peers have said which of them they hold",
                metadata: ["delta.range": "\(first)...\(recovery.reservedSequence)"])
        }
        if recovery.logDamaged, settling == nil, !faults.skipSettling {
            // Records after the damage were cut too: own deltas among them may have been
            // acknowledged and published. Their numbers are not reused until every peer said
            // which of this node's deltas above the log's last it holds (section 11.2): a FETCH
            // of 2,000 numbers each; past them, the peers' progress lists move the next number.
            let first = min(latestSequence, origins[configuration.nodeID]?.contiguous ?? 0) + 1
            settling = Settling(range: first...(first &+ Self.maximumFetch - 1), after: .damagedLog)
            logger.error(
                "the log is damaged where it was durable (a bad disk, or a power loss that kept a later part of a write and not an earlier one): the records from the damage on were cut (kept in deltas.log.damaged), this node's acknowledged writes possibly among them; it takes no writes until every peer has said which of its deltas it holds (a peer that is down holds them back until it is up or forgotten), and takes those back",
                metadata: [
                    "log.bytes_cut": "\(recovery.cutBytes)", "reason": "\(recovery.cutReason ?? "-")",
                    "delta.range": "\(first)...\(first &+ Self.maximumFetch - 1)",
                ])
        }
        if let ownLatest { clock.advance(past: ownLatest) }
        // Peers' versions it holds are followed as if just received (within the drift bound), so a
        // restart with a lagging wall clock does not stamp writes that lose at once.
        clock.observe(store.latestVersion)
        durability.logSize = recovery.logSize
        // The records a compaction would keep now (the last one's, replayed, among them) do not
        // count towards the next: a restart must not make a node compact again for them.
        durability.keptBytes = min(recordsAboveGaps.count, max(recovery.logSize - DeltaLog.magic.count, 0))
        if recovery.cutBytes > 0, !recovery.logDamaged {
            logger.warning(
                "cut a torn or corrupt tail from the log (a crash interrupted a write); it was never acknowledged",
                metadata: ["log.bytes_cut": "\(recovery.cutBytes)", "reason": "\(recovery.cutReason ?? "-")"])
        }
        if faults.dropRemoteDeltasShare > 0 {
            logger.critical(
                "TEST FAULT INJECTION: silently dropping a share of remote deltas without repair",
                metadata: ["share": "\(faults.dropRemoteDeltasShare)"])
        }
    }

    // MARK: - Inputs

    /// Handles one input at time `now` (monotonic milliseconds) and returns what to do, in order.
    package mutating func handle(_ input: NodeInput, now: UInt64) -> [NodeAction] {
        self.now = now
        switch input {
        case .endpointsBound(let publish, let repair):
            boundPublish = publish
            boundRepair = repair
            boundAt = now
            writeOwnEntry(.alive)
            // The members an earlier run saved are dialled now, not only the configured peers:
            // a node that joined through a seed which is away (leaving, restarting) when it
            // comes back would otherwise hear no one, and no one would hear it.
            linkKnownMembers()
            if Self.isWildcard(publish) {
                logger.warning(
                    "network.publish is bound to every interface: nodes that learn this node from the member list cannot dial that address, so it can join a cluster only through nodes whose network.peers list its real address (bind network.publish to that address to join through a seed)",
                    metadata: ["publish": "\(publish)"])
            }
            let exposed = configuration.security != nil ? [] : [publish, repair].filter { !Self.isLoopbackOnly($0) }
            if !exposed.isEmpty {
                logger.warning(
                    "binding a non-loopback address without security: anyone who can reach it can read every write, and through the API write every model (docs/PROTOCOL.md section 14)",
                    metadata: ["endpoints": "\(exposed.joined(separator: ", "))"])
            }
        case .peerMessage(let peer, let frames):
            receivePeerMessage(frames, from: peer)
        case .clientRequest(let client, let frames, let identity):
            handleClientRequest(frames, from: client, identity: identity)
        case .repairReply(let peer, let frames):
            handleRepairReply(frames, from: peer)
        case .repairRequestUnsent(let peer, let requestID):
            repairRequestUnsent(peer: peer, requestID: requestID)
        case .localRound(let round):
            if settling != nil {
                hold(round)
            } else {
                takeLocalWrites(round)
            }
        case .logDurable(let position):
            logDurable(through: position)
        case .sequencesReserved(let through):
            sequencesReserved(through: through)
        case .compactionWritten:
            compactionAnswered(failure: nil)
        case .compactionFailed(let reason):
            compactionAnswered(failure: reason)
        case .watchEventsSent(let key, let accepted, let gone):
            watchEventsSent(key, accepted: accepted, clientGone: gone)
        case .diskSpace(let available):
            diskSpace(available)
        case .clientAccessChanged(let access, let peers):
            admittedPeers = peers
            clientAccessChanged(access)
            // Members learned before their key was trusted are linked now.
            linkKnownMembers()
        case .subscriberConnected:
            // Perhaps a node joining through this one, which this node does not subscribe to,
            // and which may ANNOUNCE itself only once it has heard the list: a list of more than
            // ``membersOnEveryHeartbeatUpTo`` entries otherwise came on every tenth HEARTBEAT
            // only (up to 5 s at the default interval before the joiner was known).
            counters.subscribersConnected += 1
            sendListOnNextHeartbeats()
        case .authenticationRefused(let fingerprint, let address):
            counters.authenticationRefusals += 1
            if refusedKeys[fingerprint] == nil, refusedKeys.count >= 32, let oldest = refusedKeyOrder.first {
                refusedKeys[oldest] = nil
                refusedKeyOrder.removeFirst()
            }
            if refusedKeys[fingerprint] == nil { refusedKeyOrder.append(fingerprint) }
            refusedKeys[fingerprint, default: 0] += 1
            warnLimited(
                "authentication-refused",
                fingerprint == Self.handshakeFailedKey
                    // Before ZAP: the party's key is unknown, and it may be a trusted one.
                    ? "refused a connection whose CURVE handshake failed: it has no CURVE, or it dialled this node expecting another server key (a peer still dialling this node's old key while it rotates, until its link is replaced)"
                    : "refused a connection whose key is not admitted (security.peer_keys, security.client_keys)",
                metadata: ["key": "\(fingerprint)", "address": "\(address)"])
        case .replyDropped:
            counters.repliesDropped += 1
        case .tick(let backlog):
            tick(observerBacklog: backlog)
        case .stop:
            sendHeldOKs()
            refuseHeldWritesAtStop()
            stopping = true
            publishReserved()
            requestSync(force: true)
            leaveIfDrained()
            endWatchesAtStop()
        }
        saveMembersIfChanged()
        let result = actions
        actions = []
        return result
    }

    /// Saves the member list when it changed: before any HEARTBEAT that carries it (a member this
    /// node acknowledges in its list is one it will still know after a crash, section 8.4).
    mutating func saveMembersIfChanged() {
        guard membership.revision != savedMembershipRevision || answeredForget?.version != savedAnsweredForget
        else { return }
        savedMembershipRevision = membership.revision
        savedAnsweredForget = answeredForget?.version
        // Its own id's entry is the last forget it answered (none before one).
        let own = configuration.nodeID
        let list = membership.sorted.compactMap { $0.id == own ? answeredForget : $0 }
        actions.append(.saveMembers(Membership.encodeFile(list)))
    }

    /// Something waits for the driver's next tick: own writes to sync or publish, replies
    /// waiting for a sync or (with `interval`, OKS messages) for the end of the round, or watches
    /// to feed (their events are sent at ticks). A driver ends a long turn early for these, and
    /// only for these: a tick costs a poll and a log write, which a node busy with peers' deltas
    /// alone need not pay more often.
    var awaitsTick: Bool {
        !durability.staged.isEmpty || !durability.replies.isEmpty || !durability.heldOKs.isEmpty || watches.count > 0
    }

    /// Runs what is due: the next slice of a snapshot page, durability of staged writes,
    /// heartbeat, the repair round (with compaction), backpressure, and the watches.
    mutating func tick(observerBacklog: Int) {
        // A snapshot page being merged: its next slice (the driver ticks at once while it lasts).
        mergePageSlice()
        // With `interval`: the OKs of the writes taken in the round that ends here.
        sendHeldOKs()
        publishReserved()
        requestSync(force: false)
        prefetchSnapshotPages()
        let interval = UInt64(configuration.heartbeatIntervalMilliseconds)
        if lastHeartbeat.map({ now &- $0 >= interval }) ?? true {
            let withMembers =
                heartbeatsSent &- listDueFrom < Self.membersAfterChange
                || heartbeatsSent % Self.membersEveryHeartbeats == 0
                || membership.members.count <= Self.membersOnEveryHeartbeatUpTo
            let floor = ownFloor
            saveMembersIfChanged()
            let progress = heartbeatProgress
            let digest = digestForHeartbeat(progress: progress, withMembers: withMembers)
            actions.append(
                .publish(
                    heartbeat(withMembers: withMembers, floor: floor, progress: progress, stateDigest: digest).encode())
            )
            heartbeatsSent += 1
            lastHeartbeat = now
            collectDeletions(ownFloor: floor)
        }
        if lastRepairRound.map({ now &- $0 >= Self.repairInterval }) ?? true {
            lastRepairRound = now
            repairsDue = false
            foldDigestsWhenDue()
            updateRepairLinks()
            advanceSettling()
            if !intakePaused { requestRepairs() }
            // Received deltas alone also grow the log; a merged snapshot is only durable once it
            // is in the snapshot file.
            if durability.staged.isEmpty, durability.replies.isEmpty, durability.syncRequested == nil,
                durability.grownBytes > configuration.compactBytes || repair.mergedSnapshot
                    || durability.compactionPending
            {
                compact()
                repair.mergedSnapshot = false
            }
        } else if repairsDue {
            repairsDue = false
            if !intakePaused { requestRepairs(prompted: true) }
        }
        applyBackpressure(observerBacklog: observerBacklog)
        expireValues()
        checkPeerLinks()
        for (kind, suppressed, level) in limiter.closedWindows(now: now) {
            // At the level of the lines suppressed.
            logger.log(
                level: level,
                "\(suppressed) more log lines of this kind were suppressed in the last second",
                metadata: ["kind": "\(kind)", "suppressed": "\(suppressed)"])
        }
        pumpWatches()
    }

    /// The free space changed: below `storage.reserve_bytes` the node stops taking client writes
    /// (ERROR 9) until it is back above it; logged once per episode.
    mutating func diskSpace(_ available: UInt64) {
        diskFree = available
        writtenSinceSpaceCheck = 0
        let full = available < UInt64(max(configuration.reserveBytes, 0))
        guard full != diskFull else { return }
        diskFull = full
        if full {
            counters.diskFullEpisodes += 1
            logger.error(
                "the data directory's disk is nearly full: refusing writes until space returns; reads, watches and repairs go on",
                metadata: ["disk.free_bytes": "\(available)", "storage.reserve_bytes": "\(configuration.reserveBytes)"])
        } else {
            logger.notice(
                "the data directory's disk has space again: taking writes",
                metadata: ["disk.free_bytes": "\(available)"])
        }
    }

    /// Whether only this host can reach `endpoint`: `ipc://`, `inproc://`, or TCP on a loopback
    /// address (`127.0.0.0/8`, `::1`, `localhost`). A wildcard or any other address is exposed.
    static func isLoopbackOnly(_ endpoint: String) -> Bool {
        guard let tcp = tcpHost(of: endpoint) else { return true }
        var host = tcp.filter { $0 != "[" && $0 != "]" }
        if let semicolon = host.lastIndex(of: ";") { host = String(host[host.index(after: semicolon)...]) }
        return host == "localhost" || host == "::1" || host.hasPrefix("127.")
    }

    /// How long a peer never heard from may stay silent before its link is replaced: 10 of this
    /// node's heartbeat intervals, at least a second.
    var peerSilenceLimit: UInt64 { silenceLimit(of: nil) }
    /// How long a peer may stay silent before its link is replaced: 10 heartbeat intervals (this
    /// node's, or the peer's when it beats slower), at least a second.
    func silenceLimit(of peer: PeerProgress?) -> UInt64 { max(10 * interval(of: peer), 1000) }

    /// Replaces the link of every peer that has been silent for ``peerSilenceLimit`` (and again
    /// every such period while it stays silent): libzmq drops a connection for good after some
    /// input, and a new socket is the only way back. A peer never heard from gets a new link
    /// too, quietly: with security, a peer that rotated its key pair is reached only by dialling
    /// its other trusted key, which the transport does for a link that never delivered anything.
    mutating func checkPeerLinks() {
        if peerEndpoints.isEmpty, !droppedConfiguredPeers.isEmpty, !stopping, refusal == nil {
            relinkConfiguredPeers()
        }
        for endpoint in peerEndpoints {
            guard let progress = peers[endpoint], let last = progress.lastMessageAt else {
                guard let since = unheardLinkSince[endpoint] else {
                    unheardLinkSince[endpoint] = now
                    continue
                }
                if now &- since >= peerSilenceLimit {
                    unheardLinkSince[endpoint] = now
                    counters.peerLinkResets += 1
                    actions.append(.resetPeerLink(endpoint: endpoint))
                    // Said once, after three periods: a peer that is down says nothing either,
                    // but an endpoint that is not a node's publish socket (its API, say) is
                    // connected to and never speaks, which nothing else tells.
                    unheardLinkResets[endpoint, default: 0] += 1
                    if unheardLinkResets[endpoint] == 3 {
                        logger.warning(
                            "no message ever came from a peer this node links to: check that it runs and, if it is in network.peers, that this is its network.publish endpoint (not its api or http.listen)",
                            metadata: ["peer.endpoint": "\(endpoint)", "silent.ms": "\(3 * peerSilenceLimit)"])
                    }
                }
                continue
            }
            let since = max(last, progress.linkResetAt ?? 0)
            guard now &- since >= silenceLimit(of: progress) else { continue }
            peers[endpoint]?.linkResetAt = now
            counters.peerLinkResets += 1
            actions.append(.resetPeerLink(endpoint: endpoint))
            if since == last {
                let silent = now &- last  // (the message is built only if logged)
                warnLimited(
                    "peer-link-reset",
                    "no message from a peer for \(silent) ms; replacing its link (the peer may be down, or libzmq dropped the connection for good after some input, such as a frame over 64 MiB)",
                    metadata: [
                        "peer.endpoint": "\(endpoint)", "peer.id": "\(progress.node ?? "?")",
                    ])
            }
        }
    }

    /// How often gaps are looked for and repairs (re)requested, in milliseconds.
    static let repairInterval: UInt64 = 50

    /// How often the store's digest takes in the models changed since it last did
    /// (``ReplicaStore/foldDigests()``), in milliseconds, unless ``digestFoldModels`` or more
    /// wait. A fold ends an epoch of the store's lazy digest: a model that
    /// changes in an epoch is hashed about three times in it at most (its first change's
    /// registers, its whole share when it changes again, and at the fold), however often it
    /// changes. Folded at every repair round (50 ms, until 2026-11-28), a daemon whose clients
    /// rewrote 1,000 keys a few times an epoch hashed a register or two per write; `statesync
    /// bench --path client` put the difference at a tenth to a fifth of the peer's CPU per change
    /// (issue #17).
    static let digestFoldInterval: UInt64 = 1_000

    /// The most models waiting for a fold before the next repair round folds them, whatever the
    /// time: a fold hashes each once, on the I/O thread, and a long list would hold the thread
    /// up (a microsecond or so a model). A status folds them first in any case.
    static let digestFoldModels = 4096

    /// Sums the shares of the models changed since into the store's digest once a second, or
    /// sooner when many wait: the list of them stays short however rarely the status is read.
    mutating func foldDigestsWhenDue() {
        let due = lastDigestFold.map { now &- $0 >= Self.digestFoldInterval } ?? true
        guard due || store.staleDigestCount >= Self.digestFoldModels else { return }
        lastDigestFold = now
        store.foldDigests()
    }

    /// The latest time the driver should call ``NodeInput/tick(observerBacklog:)`` again (it may
    /// call it earlier, and does after every round of inputs).
    package func nextDeadline() -> UInt64 {
        let interval = UInt64(configuration.heartbeatIntervalMilliseconds)
        var deadline = (lastHeartbeat ?? now) &+ interval
        deadline = min(deadline, (lastRepairRound ?? now) &+ Self.repairInterval)
        if durability.ownWritesUnsynced || !durability.replies.isEmpty {
            deadline = min(deadline, durability.lastSync &+ UInt64(configuration.fsyncIntervalMilliseconds))
        }
        if watches.lagging > 0 || intakePaused { deadline = min(deadline, now &+ 5) }
        if !durability.heldOKs.isEmpty || repair.stream?.merging != nil || repairsDue { deadline = now }
        // The next expiry, in this monotonic time (the wall clock tells how far off it is).
        if let expiry = store.nextExpiry {
            let wall = clock.wallMilliseconds()
            deadline = min(deadline, expiry > wall ? now &+ (expiry - wall) : now)
        }
        return max(deadline, now)
    }

    /// Stops or resumes reading peers' deltas with the observers' backlog.
    mutating func applyBackpressure(observerBacklog backlog: Int) {
        let limit = configuration.observerBacklogLimit
        if !intakePaused, backlog > limit {
            intakePaused = true
            pausedSince = now
            counters.observerBackpressurePauses += 1
            actions.append(.pauseIntake(true))
            warnLimited(
                "observer-backpressure",
                "observers are more than \(limit) changes behind; not taking peer deltas until they catch up")
        } else if intakePaused, backlog <= limit / 2 {
            intakePaused = false
            counters.observerBackpressureMilliseconds += Int(now &- pausedSince)
            actions.append(.pauseIntake(false))
        }
    }

    /// Whether the node has stopped reading peers' deltas (backpressure).
    package var isIntakePaused: Bool { intakePaused }

    // MARK: - Status

    /// Whether the peer at `endpoint` sent a message within 3 heartbeat intervals.
    func isConnected(_ peer: PeerProgress) -> Bool {
        guard let last = peer.lastMessageAt else { return false }
        return now &- last <= 3 * interval(of: peer)
    }

    /// The heartbeat interval liveness expects of `peer`: this node's, or the peer's pace as
    /// heard when it beats slower (a node with a longer `network.heartbeat_ms` would otherwise be
    /// suspect, down and its link replaced between two of its HEARTBEATs). At most a minute.
    func interval(of peer: PeerProgress?) -> UInt64 {
        max(UInt64(configuration.heartbeatIntervalMilliseconds), min(peer?.pace ?? 0, 60_000))
    }

    /// The fingerprint under which refused connections whose handshake failed before ZAP are
    /// counted (no key reached the node).
    package static let handshakeFailedKey = "no-curve"

    /// The node's status at `now`.
    package mutating func status(now: UInt64) -> NodeStatus {
        // The caller read its clock before taking the lock: an input handled meanwhile may carry a
        // later time. Time never goes back (ages below are `now - then`, which must not wrap).
        self.now = max(self.now, now)
        let now = self.now
        store.foldDigests()
        var status = NodeStatus(
            node: configuration.nodeID, incarnation: incarnation, publishEndpoint: boundPublish,
            apiEndpoint: configuration.apiEndpoint == nil ? nil : boundRepair,
            peers: peerEndpoints.map { endpoint in
                let progress = peers[endpoint] ?? PeerProgress()
                return NodeStatus.Peer(
                    endpoint: endpoint, node: progress.node, connected: isConnected(progress),
                    lastSeenMillisecondsAgo: progress.lastMessageAt.map { Int(now &- $0) },
                    deltasReceived: progress.deltasReceived, knowsThisNode: knowsThisNode(endpoint))
            },
            channels: store.channelModelCounts,
            latestVersion: store.latestVersion == .zero ? nil : store.latestVersion,
            latestSequence: nextSequence - 1, stateDigest: store.digest,
            counters: Dictionary(uniqueKeysWithValues: counters.all), watchers: watches.count,
            missingDeltas: missingDeltas, laggingWatches: watches.lagging)
        status.publishedSequence = published
        status.refusedKeys = refusedKeys
        status.diskFull = diskFull
        status.diskFreeBytes = diskFree
        status.settling = settling != nil
        status.settlingWaitsFor = settling.map(settlingStatus) ?? []
        status.storage = NodeStatus.Storage(
            fsync: configuration.fsync.rawValue, publish: configuration.publishesBeforeSync ? "written" : "synced",
            intervalMilliseconds: configuration.fsync == .interval ? configuration.fsyncIntervalMilliseconds : nil)
        status.writesHeld =
            settling?.held.reduce(0) { held, entry in
                if case .localWrites(let round) = entry { held + round.count } else { held + 1 }
            } ?? 0
        status.members = memberStatus()
        status.tombstones = store.tombstones
        status.collectedThrough = store.collectedThrough
        status.collectionHeldBy = collection.heldBy
        status.duplicateNodeIDs = duplicateNodeIDs
        status.divergedPeers = divergedPeers
        return status
    }

    /// The whole state and, per origin, how far it includes its deltas: a snapshot to write or
    /// to serve.
    package var snapshot: StateSnapshot {
        StateSnapshot(
            store: store, latestSequence: nextSequence - 1, progress: origins.mapValues(\.contiguous),
            ownRecovery: repair.ownRecovery
                ?? (lastResetThrough > 0
                    ? StateSnapshot.OwnRecovery(through: lastResetThrough, recovered: lastResetThrough) : nil))
    }

    /// The whole state as a SNAPSHOT reply carries it (section 10.9): what this node still
    /// recovers of its own deltas is kept in its own file only (Appendix A), and limits what the
    /// progress claims of them (``servedProgress``).
    var servedSnapshot: StateSnapshot {
        var whole = snapshot
        whole.ownRecovery = nil
        whole.progress = servedProgress
        return whole
    }
}

/// What a node has heard from one configured peer endpoint.
struct PeerProgress: Sendable {
    var node: String?
    var lastMessageAt: UInt64?
    /// When its link was last replaced (``NodeMachine/checkPeerLinks()``).
    var linkResetAt: UInt64?
    var deltasReceived = 0
    /// The peer's advertised repair endpoint (its API, or its repair endpoint), from its
    /// heartbeats: where repairs are fetched.
    var repairEndpoint: String?
    /// Per origin, the contiguous mark the peer's last heartbeat reported (its own included): a
    /// snapshot from it covers at least that much.
    var progress: [String: UInt64] = [:]
    /// The incarnation of the peer's last heartbeat: a new one forgets what it said it takes.
    var incarnation: UInt64?
    /// Whether the peer said, in this incarnation, that it takes channel batches (section 7.6).
    var takesChannelBatches = false
    /// Whether the peer said, in this incarnation, that it takes packed batches (section 7.7).
    var takesPackedBatches = false
    /// Whether the peer, in this incarnation, named this node in its member list or took its
    /// ANNOUNCE (section 7.5, "Known before taken"): it then knows this node durably, and asks
    /// it for its lost deltas should it settle after a power loss (section 11.2). Until then the
    /// peer's own deltas from it are not taken: they are repaired once it has.
    var listsThisNode = false
    /// Whether a member list came from the peer in this incarnation: only then is it told this
    /// node's entry unasked (what its list said about this node, a forget included, is taken
    /// first: told before, it would take this node's newer entry over the forget, and this node
    /// would never learn it was forgotten while away).
    var listHeard = false
    /// HEARTBEATs without a member list in this incarnation, before the first with one: a node
    /// sends its list at least every tenth, so many more is a node that predates membership,
    /// which cannot be told about this node (its deltas are taken as they come).
    var heartbeatsWithoutList = 0
    /// Since when, in this incarnation, the peer was heard without knowing this node.
    var unknownSince: UInt64?
    /// When its last HEARTBEAT came, and the times between its last four of one incarnation:
    /// the least is its pace (a stall or a partition only lengthens some).
    var lastHeartbeatAt: UInt64?
    var heartbeatGaps: [UInt64] = []
    /// Whether a pace unlike this node's was logged.
    var paceLogged = false

    /// The interval the peer's HEARTBEATs come at, as heard (`nil` before two of them).
    var pace: UInt64? { heartbeatGaps.min() }
}

/// Faults a test can plant in a node on purpose, to prove its checkers catch them. Never set in
/// production (docs/PROTOCOL.md, Appendix C).
package struct NodeFaults: Sendable, Equatable {
    /// The share (0–1) of remote deltas silently discarded and marked received, never repaired.
    package var dropRemoteDeltasShare: Double = 0
    /// Breaks last-writer-wins on this node: equal timestamps are decided by node id backwards.
    package var wrongTieBreak = false
    /// This node never sends repair requests: a gap stays open for good.
    package var skipRepair = false
    /// This node sends every watch each live delta twice.
    package var duplicateWatchEvents = false
    /// This node never lets a deletion win (of a property or a model).
    package var ignoreDeletions = false
    /// This node never deletes an expired value.
    package var neverExpire = false
    /// This node collects deletions at its own floor, as if every member had everything.
    package var collectEarly = false
    /// After a power loss this node numbers writes at once, without settling (section 11.2).
    package var skipSettling = false
    /// After settling this node declares no own number void (section 10.8): numbers lost
    /// everywhere below ones a peer held stay gaps on the peers for good.
    package var skipVoid = false
    /// This node's compactions keep none of the peers' deltas it holds above a gap (section
    /// 11.5 item 6): a restart forgets it holds them.
    package var forgetHeldAboveGaps = false
    /// This node ignores request flags (section 10.1.1): a write that asked for an OKS gets a
    /// plain OK, as from a node that predates them, which this node claims not to be.
    package var ignoreRequestFlags = false
    /// This node never drops its state when it learns it was forgotten (section 7.5): it says
    /// it is alive again with what it held, deleted data included.
    package var skipReset = false

    package init(
        dropRemoteDeltasShare: Double = 0, wrongTieBreak: Bool = false, skipRepair: Bool = false,
        duplicateWatchEvents: Bool = false, ignoreDeletions: Bool = false, neverExpire: Bool = false,
        collectEarly: Bool = false, skipSettling: Bool = false, skipVoid: Bool = false,
        forgetHeldAboveGaps: Bool = false, ignoreRequestFlags: Bool = false, skipReset: Bool = false
    ) {
        self.dropRemoteDeltasShare = min(max(dropRemoteDeltasShare, 0), 1)
        self.wrongTieBreak = wrongTieBreak
        self.skipRepair = skipRepair
        self.duplicateWatchEvents = duplicateWatchEvents
        self.ignoreDeletions = ignoreDeletions
        self.neverExpire = neverExpire
        self.collectEarly = collectEarly
        self.skipSettling = skipSettling
        self.skipVoid = skipVoid
        self.forgetHeldAboveGaps = forgetHeldAboveGaps
        self.ignoreRequestFlags = ignoreRequestFlags
        self.skipReset = skipReset
    }

    package var isEmpty: Bool { self == NodeFaults() }
}

extension NodeMachine {
    /// Logs a warning of `kind` at most once a second (``LogLimiter``), with the number of lines
    /// of that kind suppressed since the last one.
    mutating func warnLimited(
        _ kind: String, _ message: @autoclosure () -> Logger.Message,
        metadata: @autoclosure () -> Logger.Metadata = [:]
    ) {
        logLimited(.warning, kind, message(), metadata: metadata())
    }

    /// Like ``warnLimited(_:_:metadata:)``, at info level: for what is expected for a moment
    /// (a joining node's first deltas), not a fault.
    mutating func infoLimited(
        _ kind: String, _ message: @autoclosure () -> Logger.Message,
        metadata: @autoclosure () -> Logger.Metadata = [:]
    ) {
        logLimited(.info, kind, message(), metadata: metadata())
    }

    private mutating func logLimited(
        _ level: Logger.Level, _ kind: String, _ message: @autoclosure () -> Logger.Message,
        metadata: @autoclosure () -> Logger.Metadata
    ) {
        guard let suppressed = limiter.allow(kind, now: now, level: level) else { return }
        var fields = metadata()
        fields["suppressed"] = "\(suppressed)"
        logger.log(level: level, message(), metadata: fields)
    }
}

/// Rate-limits logs of bad input: at most one line per kind per second, with the count of the
/// ones it suppressed; a burst's tail is reported by ``closedWindows(now:)`` once its second is
/// over, so every suppressed line is accounted for without waiting for the next one.
struct LogLimiter: Sendable {
    private var entries: [String: (last: UInt64, suppressed: Int, level: Logger.Level)] = [:]
    static let window: UInt64 = 1000

    /// Returns the number of suppressed messages to report when `kind` may be logged at `now`
    /// (at `level`, which the report of a burst's tail uses too).
    mutating func allow(_ kind: String, now: UInt64, level: Logger.Level = .warning) -> Int? {
        var entry = entries[kind] ?? (0, 0, level)
        if entry.last != 0 && now &- entry.last < Self.window {
            entry.suppressed += 1
            entries[kind] = entry
            return nil
        }
        let suppressed = entry.suppressed
        entries[kind] = (max(now, 1), 0, level)
        return suppressed
    }

    /// The kinds whose window closed with lines suppressed, how many, and at which level they
    /// are logged: reported now (which opens a new window), in the order of their names.
    mutating func closedWindows(now: UInt64) -> [(kind: String, suppressed: Int, level: Logger.Level)] {
        var closed: [(kind: String, suppressed: Int, level: Logger.Level)] = []
        for (kind, entry) in entries where entry.suppressed > 0 && now &- entry.last >= Self.window {
            closed.append((kind, entry.suppressed, entry.level))
        }
        closed.sort { $0.kind < $1.kind }
        for (kind, _, level) in closed { entries[kind] = (max(now, 1), 0, level) }
        return closed
    }
}
