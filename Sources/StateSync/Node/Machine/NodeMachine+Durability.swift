/// Durability (docs/PROTOCOL.md section 11.2): every applied delta is appended to the
/// write-ahead log; the node's own writes are published — and, with `storage.fsync: always`,
/// acknowledged — only once the log is durable through them. Group commit: all writes staged
/// before a sync share it, and a sync is asked for as soon as a round of local writes is taken
/// (and at every tick), so a lone write never waits for a timer. With `storage.fsync: interval`
/// — and with `always` under `storage.publish: written` — a write is published once it is
/// written to the OS, at the end of the driver's turn that took it, within sequence numbers
/// reserved durably ahead (``NodeMachine+Settling`` covers a power loss); with `interval` the
/// log is synced every `storage.fsync_interval_ms`, with `always` at once, while the write
/// travels, and the write is acknowledged once that sync ends.
extension NodeMachine {
    /// Where a staged own write's bytes lie: in the log records it was appended with, which
    /// every write of its round shares — its DELTA body is encoded once, for the log record and
    /// for publishing, and has no array of its own. Offsets only: the records are held once per
    /// round (``StagedRecords``), not by every write of it (a reference each was an atomic
    /// reference count when staged and a release when published, per own write: issue #17).
    struct StagedBytes: Sendable {
        /// The round whose records hold it (see ``StagedRecords``).
        let round: Int
        /// Where its model id (with its length) starts, where its DELTA body starts and ends.
        let model: Int
        let body: Int
        let end: Int

        /// The size of the model id and the DELTA body: a channel batch's frame, a packed batch's
        /// entry.
        var entryOctets: Int { end - model }
    }

    /// The log records of the rounds of own writes staged, one array per round, in order: the
    /// first is round ``base``.
    struct StagedRecords: Sendable {
        var rounds: [[UInt8]] = []
        var base = 0

        /// The number the next round staged gets.
        var nextRound: Int { base + rounds.count }

        /// The DELTA body (section 7.1) of `staged`.
        func bodyBytes(of staged: StagedBytes) -> [UInt8] {
            Array(rounds[staged.round - base][staged.body..<staged.end])
        }

        /// Calls `body` with the model id and the DELTA body of `staged`, in place (a slice of the
        /// records is a retain and a release of them).
        func withEntryBytes(of staged: StagedBytes, _ body: (UnsafeBufferPointer<UInt8>) -> Void) {
            rounds[staged.round - base].withUnsafeBufferPointer {
                body(UnsafeBufferPointer(rebasing: $0[staged.model..<staged.end]))
            }
        }

        /// Forgets the rounds before `round` (their writes are published).
        mutating func drop(before round: Int) {
            let dropped = min(max(round - base, 0), rounds.count)
            rounds.removeFirst(dropped)
            base += dropped
        }
    }

    struct Durability: Sendable {
        /// Local writes logged but not yet durable, in order, where their bytes lie and the log
        /// position after each (parallel arrays: no tuple copies on the hot path).
        var staged: [Delta] = []
        var stagedBodies: [StagedBytes] = []
        var stagedPositions: [UInt64] = []
        /// The records ``stagedBodies`` lie in.
        var stagedRecords = StagedRecords()
        /// SET replies waiting for the log position of their write.
        var replies: [WaitingReply] = []
        /// With `interval`: the OKs, for clients that take OKS messages, of the writes taken
        /// since the last tick, sent together at the next (the end of the driver's round).
        var heldOKs: [(client: [UInt8], ok: BatchedOK)] = []
        /// Bytes appended since the node started (a position, never reset).
        var appended: UInt64 = 0
        /// The position through which the log is durable.
        var durable: UInt64 = 0
        /// The position of the sync asked for and not yet reported: one at a time, so writes
        /// that arrive while it runs share the next one (group commit).
        var syncRequested: UInt64?
        /// The size of the log file, and of the records the last compaction kept in it: the log is
        /// compacted when what was appended since passes `storage.compact_bytes` (kept records
        /// alone never make it compact again).
        var logSize = 0
        var keptBytes = 0

        /// The log bytes appended since the last compaction.
        var grownBytes: Int { logSize - keptBytes }
        /// When the log was last synced (for `storage.fsync: interval`).
        var lastSync: UInt64 = 0
        /// A compaction failed: it is retried at a later repair round.
        var compactionPending = false
        /// Compactions asked for, and those whose outcome the driver reported (in order:
        /// ``NodeInput/compactionWritten`` or ``NodeInput/compactionFailed(_:)``).
        var compactionsAsked: UInt64 = 0
        var compactionsAnswered: UInt64 = 0
        /// A compaction was asked for while one was not yet answered: it is asked once that one is.
        var compactionDeferred = false
        /// The compaction that writes a reset (``resetUnwritten``), by its number in
        /// ``compactionsAsked``: once it is reported written, the node says it is alive again.
        var resetCompaction: UInt64?
        /// A reset's compaction waits for the sync that ran when the node dropped its state (a
        /// host that syncs in the background): it is asked for once that sync ends. (A failed
        /// one is retried at repair rounds, not at every sync.)
        var resetWaitsForSync = false
        /// The log position after the last own write appended.
        var lastOwnPosition: UInt64 = 0
        /// The own sequence numbers reserved durably, which may be published before the log is
        /// durable through them (section 11.2; ``NodeConfiguration/publishesBeforeSync``).
        var reserved: UInt64 = 0
        /// The reservation asked for and not yet reported.
        var reservationRequested: UInt64?
        /// Published before their sync: per round of own writes not yet durable, its last
        /// sequence number and the log position after it; and the highest own sequence number
        /// durable.
        var unsyncedRounds: [(sequence: UInt64, position: UInt64)] = []
        var durableOwnSequence: UInt64 = 0

        /// Some own write is not durable yet.
        var ownWritesUnsynced: Bool { lastOwnPosition > durable }
    }

    /// How many sequence numbers one reservation covers beyond the write that asks for it. A
    /// reservation costs one durable file write; a larger block costs longer settling after a
    /// power loss (its numbers are asked of every peer).
    static let reservationBlock: UInt64 = 32_768

    /// Appends `applied` as log records: deltas that arrived in `received` as the bodies they
    /// came in, the others encoded.
    mutating func appendToLog(_ applied: AppliedDeltas, mustSucceed: Bool, received: ReceivedFrames? = nil) {
        guard !applied.isEmpty else { return }
        var records = DeltaLog.Batch(
            capacity: received.map { DeltaLog.Batch.capacity(received: applied.count, payloadBytes: $0.payloadBytes) }
                ?? DeltaLog.Batch.capacity(localWrites: applied.count))
        if let received {
            received.addRecords(of: applied, to: &records)
        } else {
            // By index, not `for entry in applied`: the loop would copy every entry (retains and
            // releases per delta on the hot path).
            for index in applied.indices { records.add(applied[delta: index]) }
        }
        handOver(records, mustSucceed: mustSucceed)
    }

    /// Hands log records to the host to append; returns their bytes.
    @discardableResult
    private mutating func handOver(_ records: DeltaLog.Batch, mustSucceed: Bool) -> [UInt8] {
        let bytes = records.bytes
        guard !bytes.isEmpty else { return bytes }
        durability.appended += UInt64(bytes.count)
        durability.logSize += bytes.count
        actions.append(.appendLog(bytes: bytes, mustSucceed: mustSucceed))
        return bytes
    }

    /// Logs this node's own writes and stages them to be published once durable. Each delta's
    /// body is encoded once, into its log record: the published frames are copied from those
    /// bytes (no array per write). A local write too large for a record stays local: it is
    /// neither logged nor published (SETs are refused before this; a model's write is
    /// reported).
    mutating func stage(_ applied: AppliedDeltas) {
        var records = DeltaLog.Batch(capacity: DeltaLog.Batch.capacity(localWrites: applied.count))
        var placed: [DeltaLog.Batch.Placement?] = []
        placed.reserveCapacity(applied.count)
        for index in applied.indices { placed.append(records.addPlaced(applied[delta: index])) }
        let bytes = handOver(records, mustSucceed: true)
        let round = durability.stagedRecords.nextRound
        var stagedAny = false
        // Room for the round at once, growing geometrically: reserveCapacity(count + new) alone
        // reallocates to exactly that, so with `storage.fsync: interval` (thousands of one-write
        // rounds between syncs) every round copied everything staged so far.
        let needed = durability.staged.count + applied.count
        if durability.staged.capacity < needed {
            let capacity = max(needed, 2 * durability.staged.capacity)
            durability.staged.reserveCapacity(capacity)
            durability.stagedBodies.reserveCapacity(capacity)
            durability.stagedPositions.reserveCapacity(capacity)
        }
        for index in applied.indices {  // by index: see appendToLog
            guard let place = placed[index] else {
                counters.encodingFailures += 1
                logger.error(
                    "a local write is too large to log and replicate; it stays local",
                    metadata: [
                        "model": "\(applied[delta: index].channel)/\(applied[delta: index].model)",
                        "delta.version": "\(applied[delta: index].version)",
                    ])
                continue
            }
            durability.staged.append(applied[delta: index])
            durability.stagedBodies.append(
                StagedBytes(round: round, model: place.model, body: place.body, end: place.end))
            durability.stagedPositions.append(durability.appended)
            stagedAny = true
        }
        if stagedAny { durability.stagedRecords.rounds.append(bytes) }
        durability.lastOwnPosition = durability.appended
        if configuration.publishesBeforeSync, let last = durability.staged.last?.sequence {
            durability.unsyncedRounds.append((last, durability.appended))
            reserveAhead()
        }
    }

    /// Own deltas through `sequence` are held by a peer (fetched back, covered by its snapshot,
    /// or reported in its progress): published long ago, and a power loss of this node cannot
    /// take them from the cluster.
    mutating func ownHeldByPeers(through sequence: UInt64) {
        published = max(published, sequence)
        visibleToWatches = max(visibleToWatches, sequence)
    }

    /// Lets watches go on to own deltas that are published and durable.
    private mutating func updateVisibleToWatches() {
        let durable =
            configuration.publishesBeforeSync ? min(published, durability.durableOwnSequence) : published
        visibleToWatches = max(visibleToWatches, durable)
    }

    /// When writes are published before their sync (`storage.fsync: interval`, or `always` with
    /// `storage.publish: written`): publishes the staged writes whose sequence numbers are
    /// reserved (they are written to the OS: a process crash keeps them), and asks for the next
    /// reservation before the block runs out. A write beyond the reservation waits for it, and
    /// every write after it too (deltas are published in sequence order). Called when the
    /// driver's turn ends (``tick(observerBacklog:)``), not per write: the writes a busy turn
    /// took go out as one batch, and a lone write waits for no timer.
    mutating func publishReserved() {
        guard configuration.publishesBeforeSync, !durability.staged.isEmpty else { return }
        reserveAhead()
        publishStaged(publishablePrefix(orReserved: true))
    }

    /// How many staged writes, from the first, may go out now (deltas go out in sequence order):
    /// those the log is durable through `position` (0: none), and with `orReserved` those within
    /// the reservation (section 11.2).
    private func publishablePrefix(durableThrough position: UInt64 = 0, orReserved: Bool) -> Int {
        var ready = 0
        while ready < durability.staged.count,
            durability.stagedPositions[ready] <= position
                || (orReserved && durability.staged[ready].sequence <= durability.reserved)
        {
            ready += 1
        }
        return ready
    }

    /// Asks for the next reservation ahead of need while writes come (half a block before it
    /// runs out); at stop only for what waits (its release must not be followed by a new one).
    private mutating func reserveAhead() {
        let last = durability.staged.last?.sequence ?? (nextSequence - 1)
        if stopping {
            if last > durability.reserved, (durability.reservationRequested ?? 0) < last {
                durability.reservationRequested = last
                actions.append(.reserveSequences(through: last, void: voidOwn))
            }
        } else if last &+ Self.reservationBlock / 2 > durability.reserved {
            reserveSequences(beyond: last)
        }
    }

    /// Asks for a reservation through a block beyond `sequence`, unless one that covers
    /// `sequence` is asked for already.
    mutating func reserveSequences(beyond sequence: UInt64) {
        if let requested = durability.reservationRequested, requested > sequence { return }
        let through = sequence &+ Self.reservationBlock
        guard through > sequence else { return }
        durability.reservationRequested = through
        actions.append(.reserveSequences(through: through, void: voidOwn))
    }

    /// The host made the reservation durable: what it covers is published.
    mutating func sequencesReserved(through: UInt64) {
        durability.reserved = max(durability.reserved, through)
        // Settled once the reservation of this boot, with the numbers found void, is durable.
        if settling?.confirming == true { completeSettling() }
        if let requested = durability.reservationRequested, requested <= through {
            durability.reservationRequested = nil
        }
        guard configuration.publishesBeforeSync else { return }
        publishReserved()
        pumpWatches()
        if stopping { leaveIfDrained() }
    }

    /// Stopping, with every own write published and durable: no number beyond the last is in
    /// use, so the reservation comes down to it, and a restart after a later power loss has
    /// nothing to settle (section 11.2).
    mutating func releaseReservationIfDrained() {
        guard stopping, refusal == nil, settling == nil, durability.reserved > nextSequence - 1,
            durability.staged.isEmpty, !durability.ownWritesUnsynced
        else { return }
        durability.reserved = nextSequence - 1
        durability.reservationRequested = nil
        actions.append(.reserveSequences(through: nextSequence - 1, void: voidOwn))
    }

    /// Publishes the first `count` staged writes and forgets them.
    private mutating func publishStaged(_ count: Int) {
        guard count > 0 else { return }
        let deltas: [Delta]
        let bodies: [StagedBytes]
        let records = durability.stagedRecords
        if count == durability.staged.count {
            // The usual case: everything staged goes; hand the arrays over, no copy.
            deltas = durability.staged
            bodies = durability.stagedBodies
            durability.staged = []
            durability.stagedBodies = []
            durability.stagedPositions.removeAll(keepingCapacity: true)
            durability.stagedRecords = StagedRecords(rounds: [], base: records.nextRound)
        } else {
            deltas = Array(durability.staged[..<count])
            bodies = Array(durability.stagedBodies[..<count])
            durability.staged.removeFirst(count)
            durability.stagedBodies.removeFirst(count)
            durability.stagedPositions.removeFirst(count)
            durability.stagedRecords.drop(before: durability.stagedBodies[0].round)
        }
        publish(deltas, bodies: bodies, records: records)
        for delta in deltas { published = max(published, delta.sequence) }
        updateVisibleToWatches()
    }

    /// Queues a SET's reply for when its write is durable (at once if it is, or with
    /// `storage.fsync: interval`, where a write is acknowledged once the OS has it). The OK of a
    /// client that takes OKS messages (section 10.1.1) goes in one with its other OKs that
    /// become durable together — with `interval`, with those of the writes taken in the same
    /// round, at its tick.
    mutating func replyWhenDurable(client: [UInt8], _ answer: WaitingAnswer) {
        if case .batchedOK(let ok) = answer, configuration.fsync == .interval {
            durability.heldOKs.append((client, ok))
        } else if configuration.fsync == .interval || durability.durable >= durability.appended {
            actions.append(.reply(client: client, frames: answer.frames))
        } else {
            durability.replies.append(WaitingReply(client: client, answer: answer, position: durability.appended))
        }
    }

    /// Queues a reply that carries this node's own state — a served snapshot, whose progress
    /// list covers the own writes it holds — for when every own write logged so far is durable,
    /// whatever `storage.fsync` says. Sent earlier, it could leave a peer holding a write that a
    /// power loss then takes from this node, which would number its next write the same: the
    /// peer would drop that one as a duplicate (section 10.9).
    mutating func replyOnceOwnWritesAreDurable(client: [UInt8], frames: [[UInt8]]) {
        let position = durability.lastOwnPosition
        guard position > durability.durable else {
            actions.append(.reply(client: client, frames: frames))
            return
        }
        durability.replies.append(WaitingReply(client: client, answer: .frames(frames), position: position))
        // Not the interval's timer: a peer's repair waits on it (snapshots are rare; a page of a
        // streamed one comes at a time).
        requestSync(force: true)
    }

    /// Asks for a sync of what is staged: at once with `storage.fsync: always` (or when
    /// `force`d), every `storage.fsync_interval_ms` with `interval`. While a sync runs (a host
    /// that syncs in the background: the simulator's slow disk), the next waits for it to end,
    /// then covers everything written meanwhile — except at stop, which syncs at once.
    mutating func requestSync(force: Bool) {
        guard durability.appended > durability.durable, durability.ownWritesUnsynced || !durability.replies.isEmpty
        else { return }
        if !force, configuration.fsync == .interval,
            now &- durability.lastSync < UInt64(configuration.fsyncIntervalMilliseconds)
        {
            return
        }
        let position = durability.appended
        // At stop, also with one running: the stop's round must end with everything durable.
        if durability.syncRequested != nil, !stopping { return }
        durability.syncRequested = position
        actions.append(.syncLog(through: position, atOnce: stopping))
    }

    /// The log is durable through `position`: what was staged up to there is published, in
    /// DELTA batches, and its replies sent.
    mutating func logDurable(through position: UInt64) {
        durability.durable = max(durability.durable, position)
        durability.lastSync = now
        if let requested = durability.syncRequested, requested <= position { durability.syncRequested = nil }
        // A reset waits for no other condition (section 7.5): the node is forgotten until it is
        // written.
        if durability.resetWaitsForSync, durability.syncRequested == nil {
            durability.resetWaitsForSync = false
            compact()
        }
        // Published before its sync, what is staged waits for its reservation, not for the sync.
        if !configuration.publishesBeforeSync {
            publishStaged(publishablePrefix(durableThrough: position, orReserved: false))
        } else {
            var synced = 0
            while synced < durability.unsyncedRounds.count, durability.unsyncedRounds[synced].position <= position {
                durability.durableOwnSequence = max(
                    durability.durableOwnSequence, durability.unsyncedRounds[synced].sequence)
                synced += 1
            }
            durability.unsyncedRounds.removeFirst(synced)
            // With `always`, a write's OK goes after its DELTA (section 10.3): a sync that ran
            // before the tick that publishes (one forced by a snapshot reply) publishes what it
            // made durable — a durable write needs no reservation — and what is reserved.
            if configuration.fsync == .always {
                publishStaged(publishablePrefix(durableThrough: position, orReserved: true))
            }
            updateVisibleToWatches()
        }
        var answered = 0
        var oks: [(client: [UInt8], ok: BatchedOK)] = []
        while answered < durability.replies.count, durability.replies[answered].position <= position {
            let reply = durability.replies[answered]
            answered += 1
            switch reply.answer {
            case .batchedOK(let ok): oks.append((reply.client, ok))
            case .frames(let frames): actions.append(.reply(client: reply.client, frames: frames))
            }
        }
        sendOKs(oks)
        durability.replies.removeFirst(answered)
        // What was written while the sync ran is synced next; at once, whatever the policy, when
        // a reply waits (with `interval` only held snapshots do: a peer's repair waits on them).
        requestSync(force: !durability.replies.isEmpty)
        pumpWatches()
        // Not while a sync runs (a host that syncs later): the compaction would empty the log
        // under it.
        if durability.grownBytes > configuration.compactBytes, durability.staged.isEmpty,
            durability.syncRequested == nil
        {
            compact()
        }
        if stopping { leaveIfDrained() }
    }

    /// Writes the whole state as the snapshot and empties the log (`storage.compact_bytes`, a
    /// merged peer snapshot, and at stop).
    mutating func compact() {
        // One at a time: a host that writes it in the background (DataDirectory) puts what is
        // appended meanwhile after it. The next one is asked when this one is answered; but a
        // reset's at once, and written at once (after the one under way): writes the node
        // takes after its reset must not land in a log a crash could bring back without it,
        // where the forget, heard again, would drop them with the old state.
        guard durability.compactionsAnswered == durability.compactionsAsked || resetUnwritten else {
            durability.compactionDeferred = true
            return
        }
        // Everything appended so far is in the snapshot: once written, it is durable.
        let kept = recordsAboveGaps
        actions.append(.compact(snapshot, keeping: kept, atOnce: resetUnwritten))
        durability.logSize = DeltaLog.magic.count + kept.count
        durability.keptBytes = kept.count
        durability.compactionPending = false
        durability.compactionsAsked += 1
        // A reset is written once this compaction is (section 7.5).
        if resetUnwritten { durability.resetCompaction = durability.compactionsAsked }
    }

    /// The driver reports the outcome of the oldest compaction not yet answered: `failure` says
    /// why it could not be written (the log still holds everything; it is retried at a repair
    /// round). The compaction that writes a reset makes the node say it is alive again, and its
    /// members file keeps the forget as answered, only once written: a node that said so over a
    /// failed one would come back from a restart with what it dropped, and no forget left in
    /// the cluster to make it drop it again.
    mutating func compactionAnswered(failure: String?) {
        durability.compactionsAnswered += 1
        if failure == nil { counters.compactions += 1 } else { counters.compactionsFailed += 1 }
        if let failure {
            durability.compactionPending = true
            logger.error("log compaction failed; will retry", metadata: ["error": "\(failure)"])
        }
        // One asked for while this one ran, after this one's own bookkeeping: at once if a
        // repair round could ask for it now, else at the next that can (and after a failure,
        // as a failed one is retried).
        defer {
            if durability.compactionDeferred {
                durability.compactionDeferred = false
                if failure == nil, durability.staged.isEmpty, durability.replies.isEmpty,
                    durability.syncRequested == nil
                {
                    compact()
                } else {
                    durability.compactionPending = true
                }
            }
        }
        guard resetUnwritten, durability.resetCompaction == durability.compactionsAnswered else { return }
        durability.resetCompaction = nil
        guard failure == nil else { return }
        resetUnwritten = false
        resetWritten()
        // A leave the stop held back for the reset.
        if stopping { leaveIfDrained() }
    }

    /// The log records a compaction keeps: the peers' deltas this node holds above a gap (from
    /// their history), in origin and sequence order. A snapshot's progress is a contiguous mark
    /// per origin, so without them a restart would forget it holds these; kept in the log, the
    /// restart replays them (changing nothing in the state) and knows them again. A peer's
    /// settling after a power loss asks for exactly such deltas (section 11.2): forgotten, the
    /// settling node could reuse a number whose old values this node keeps, or declare it void.
    /// Records are taken until they pass a quarter of `storage.compact_bytes` (at least 64 KiB;
    /// the last one may go past it): a gap that long is repaired, or filled by a snapshot, in
    /// time. Kept records do not count towards the next compaction. A forgotten member's are
    /// not kept: nothing will fill the gap below them.
    var recordsAboveGaps: [UInt8] {
        if faults.forgetHeldAboveGaps { return [] }
        var batch = DeltaLog.Batch()
        let budget = max(configuration.compactBytes / 4, 64 << 10)
        for origin in origins.keys.sorted() where origin != configuration.nodeID {
            if membership.members[origin]?.state == .forgotten { continue }
            guard let progress = origins[origin], !progress.above.isEmpty, let held = history[origin] else { continue }
            // Number by number from the history's lowest (below it nothing is held), so the walk
            // ends at the budget, not at the end of a long run.
            for run in progress.above.runs where run.upperBound > held.droppedThrough {
                for sequence in max(run.lowerBound, held.droppedThrough + 1)...run.upperBound {
                    guard batch.bytes.count < budget else { return batch.bytes }
                    if let delta = held[sequence] { batch.add(delta) }
                }
            }
        }
        return batch.bytes
    }

    /// Publishes durable local writes, in order: when every linked peer takes packed batches
    /// (section 7.7), consecutive deltas of one channel as one packed batch; else, when every one
    /// takes channel batches (section 7.6), as one channel batch unless they are all of one
    /// model; else consecutive deltas of one model as one DELTA batch. `bodies` say where each
    /// delta's encoded bytes lie (one each) in `records`, copied into the messages as they are.
    mutating func publish(_ deltas: [Delta], bodies: [StagedBytes], records: StagedRecords) {
        let linked = !peerEndpoints.isEmpty
        let packed =
            configuration.packedBatches && linked && peerEndpoints.allSatisfy { peers[$0]?.takesPackedBatches == true }
        let acrossModels =
            packed
            || (configuration.channelBatches && linked
                && peerEndpoints.allSatisfy { peers[$0]?.takesChannelBatches == true })
        let ranges = Self.batchRanges(
            of: deltas, limit: configuration.batchMaximumDeltas, acrossModels: acrossModels,
            octets: packed ? (bodies.map(\.entryOctets), PeerMessage.packedBatchTargetOctets) : nil)
        for range in ranges {
            let run = deltas[range]
            counters.deltaMessagesPublished += 1
            // A delta too large for a pack's frame goes alone, as a DELTA batch (which every node
            // takes), whose frame is its body only (a pack ends before a delta past its target, so
            // a large delta is alone in its run).
            let oversized =
                run.count == 1 && bodies[range.lowerBound].entryOctets > PeerMessage.packedEntryMaximumOctets
            if packed, !oversized {
                var octets = 0
                for body in range { octets += bodies[body].entryOctets }
                actions.append(
                    .publish(
                        PeerMessage.encodePackedBatch(
                            channel: run[run.startIndex].channel, count: range.count, octets: octets
                        ) { index, write in records.withEntryBytes(of: bodies[range.lowerBound + index], write) }))
                counters.packedBatchesPublished += 1
                continue
            }
            // The older forms: a frame per delta, copied out of the log records.
            let model = run[run.startIndex].model
            let oneModel = run.allSatisfy { $0.model == model }
            actions.append(
                .publish(
                    oneModel
                        ? PeerMessage.encodeBatch(run, bodies: bodies[range].map { records.bodyBytes(of: $0) }[...])
                        : PeerMessage.encodeChannelBatch(
                            run, bodies: bodies[range].map { records.bodyBytes(of: $0) }[...])))
            if !oneModel { counters.channelBatchesPublished += 1 }
        }
    }

    /// How `deltas` go out as batches: runs of consecutive deltas of one model (of one channel,
    /// `acrossModels`), of at most `limit` each, in order; with `octets`, a run also ends before a
    /// delta that would take its bodies past the given size (a packed batch's one frame), so a
    /// run is larger than that only when it is one delta (which a frame of its own would carry
    /// whole anyway).
    static func batchRanges(
        of deltas: [Delta], limit: Int, acrossModels: Bool = false, octets: (sizes: [Int], target: Int)? = nil
    ) -> [Range<Int>] {
        var ranges: [Range<Int>] = []
        var start = 0
        var size = octets.map { $0.sizes.first ?? 0 } ?? 0
        for index in deltas.indices.dropFirst() {
            if deltas[index].channel != deltas[start].channel
                || (!acrossModels && deltas[index].model != deltas[start].model) || index - start >= limit
                || (octets.map { size + $0.sizes[index] > $0.target } ?? false)
            {
                ranges.append(start..<index)
                start = index
                size = 0
            }
            if let octets { size += octets.sizes[index] }
        }
        if !deltas.isEmpty { ranges.append(start..<deltas.count) }
        return ranges
    }
}

extension NodeMachine {
    /// Sends `oks` in one OKS message per client, each client's in the order given.
    mutating func sendOKs(_ oks: [(client: [UInt8], ok: BatchedOK)]) {
        guard !oks.isEmpty else { return }
        var batches: [(client: [UInt8], oks: [BatchedOK])] = []
        // Each client's batch, by routing id: many clients each with one write a sync stay linear.
        var batchOf: [[UInt8]: Int] = [:]
        for (client, ok) in oks {
            if let last = batches.indices.last, batches[last].client == client {
                batches[last].oks.append(ok)
            } else if let index = batchOf[client] {
                batches[index].oks.append(ok)
            } else {
                batchOf[client] = batches.count
                batches.append((client, [ok]))
            }
        }
        for batch in batches {
            actions.append(.reply(client: batch.client, frames: ClientProtocol.encodeBatchedOKs(batch.oks)))
        }
    }

    /// With `interval`: sends the OKs held since the last tick (the writes were taken, and
    /// written to the OS, in this round).
    mutating func sendHeldOKs() {
        guard !durability.heldOKs.isEmpty else { return }
        let held = durability.heldOKs
        durability.heldOKs.removeAll(keepingCapacity: true)
        sendOKs(held)
    }

    /// A write's OK for a client that takes OKS messages: its request id and OK body.
    typealias BatchedOK = (id: UInt64, body: [UInt8])

    /// What a reply waiting for the log says.
    enum WaitingAnswer {
        /// The reply's frames, as they go.
        case frames([[UInt8]])
        /// The OK of a client that takes OKS messages: sent in one with that client's other OKs.
        case batchedOK(BatchedOK)

        /// The reply as one message (an OKS of this one OK).
        var frames: [[UInt8]] {
            switch self {
            case .frames(let frames): frames
            case .batchedOK(let ok): ClientProtocol.encodeBatchedOKs([ok])
            }
        }

        /// The id of the request it answers (0 when its header cannot be read).
        var requestID: UInt64 {
            switch self {
            case .frames(let frames):
                frames.first.flatMap { try? ClientProtocol.decodeReplyHeader($0).requestID } ?? 0
            case .batchedOK(let ok): ok.id
            }
        }
    }

    /// A reply waiting for the log to be durable through `position`.
    struct WaitingReply {
        let client: [UInt8]
        let answer: WaitingAnswer
        let position: UInt64
    }
}
