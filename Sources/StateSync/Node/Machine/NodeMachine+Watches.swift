/// Watches on the client API (docs/PROTOCOL.md section 10.5): a snapshot of the channel and an
/// "initial state complete" marker, then every delta of the channel in this node's apply order,
/// and "caught up" markers. Nothing is buffered per watch: a watch is a cursor into the node's
/// journal, advanced only as far as the client's queue took its events (the driver reports how
/// many it sent). A client too slow for the history is resynchronised with a snapshot, or its
/// watch ends, as it asked.
extension NodeMachine {
    /// Where a watch is: its position in this node's journal, and what it has been delivered, as
    /// a cursor (every sequence number through it) plus the numbers delivered above it.
    struct WatchPosition: Sendable {
        var journalIndex: Int
        var cursor: WatchCursor
        var above: [String: SequenceRuns] = [:]

        /// Whether the delta of `origin`/`sequence` was already delivered.
        func covers(_ origin: String, _ sequence: UInt64) -> Bool {
            sequence <= cursor[origin] || (!above.isEmpty && above[origin]?.contains(sequence) == true)
        }

        mutating func deliver(_ origin: String, _ sequence: UInt64) {
            if sequence == cursor[origin] + 1 {
                var position = sequence
                if !above.isEmpty, let end = above[origin]?.removeRun(startingAt: position + 1) { position = end }
                cursor[origin] = position
                if above[origin]?.isEmpty == true { above[origin] = nil }
            } else if sequence > cursor[origin] {
                above[origin, default: []].insert(sequence)
            }
        }
    }

    /// Numbers of `origin` taken as void (section 10.8) hold no delta: every watch goes past
    /// them as if delivered, so its cursor does not stop below them (and the numbers it is
    /// delivered above them do not pile up). In-flight positions too, which replace the watch's
    /// once the driver reports.
    mutating func passVoidInWatches(origin: String, _ sequences: [UInt64]) {
        let void = Set(sequences)
        resetWatchesHolding(origin: origin) { void.contains($0) }
        func pass(_ position: inout WatchPosition) {
            for sequence in sequences where !position.covers(origin, sequence) { position.deliver(origin, sequence) }
        }
        for key in watches.order {
            guard var watch = watches[key] else { continue }
            pass(&watch.position)
            switch watch.inFlight {
            case .snapshot(var position, let events):
                pass(&position)
                watch.inFlight = .snapshot(position, events: events)
            case .deltas(var before, var after, var end):
                pass(&before)
                for index in after.indices { pass(&after[index]) }
                pass(&end)
                watch.inFlight = .deltas(before: before, after: after, end: end)
            case .ending, .marker, nil: break
            }
            watches[key] = watch
        }
    }

    /// A batch of events sent to a watch's client, waiting for the driver to say how many it took.
    enum InFlight: Sendable {
        /// The final ERROR of a watch that lagged with the "end" policy.
        case ending
        /// A whole snapshot of `events` events; the position it stands for.
        case snapshot(WatchPosition, events: Int)
        /// Deltas: the position after each message (one event each, or a run of events for a
        /// watch that takes batched events), and where the batch left the watch.
        case deltas(before: WatchPosition, after: [WatchPosition], end: WatchPosition)
        /// A caught-up marker.
        case marker
    }

    struct Watch: Sendable {
        let channel: String
        /// What of the channel this watch is sent (`nil`: everything).
        var filter: ClientProtocol.WatchFilter?
        /// With security, who opened it (the user id of its key): checked again at a reload.
        var identity: String?
        var onLag: ClientProtocol.LagPolicy = .resync
        /// The client takes several DELTA events in one message (WATCH flag bit 3).
        var batchedEvents = false
        /// The client replaces what it holds with a snapshot of reason `reset` (WATCH flag bit 4).
        var takesResets = false
        /// This node dropped its state since the watch began (it was forgotten, section 7.5):
        /// the watch is sent a `reset` snapshot once a peer's snapshot is merged.
        var resetDue = false
        /// Deltas its client holds that this node did not when the watch resumed (covered by its
        /// cursor, or named as held above it), per origin, at most
        /// ``NodeMachine/clientOnlyLimit`` each: should the node cover one without receiving
        /// it (a snapshot's progress, a void number), the client would keep what it wrote, so
        /// the watch gets a `reset` snapshot (section 10.5.4, "Resumed watch").
        var clientOnly: [String: Set<UInt64>] = [:]
        /// Resumed from a cursor, and sent no snapshot since: its client's state may lack writes
        /// this node's state holds that no journal entry brings — a peer's snapshot page carries
        /// registers newer than its progress (section 10.9), and one merged before the watch
        /// resumed reached no watch. Should the node cover numbers this watch was not delivered
        /// without their deltas, it gets a resync snapshot (``resyncResumedWatches(lacking:through:held:)``).
        var mayLackMergedState = false
        /// The watch lagged with the "end" policy: its ERROR is still to be sent.
        var ending = false
        var position: WatchPosition
        /// A snapshot (and why) still to send before any delta.
        var pendingSnapshot: ClientProtocol.SnapshotReason?
        /// A snapshot was asked for while one was on its way, which stands for a state gone since
        /// (a peer's snapshot merged, a reset): it is sent again once that one is taken.
        var snapshotAgain = false
        var caughtUpSent = false
        var lastMarker: UInt64 = 0
        var lagging = false
        var inFlight: InFlight?
        /// How many deltas the next batch holds: cut to what the client's queue took when it
        /// refused some (for a batched watch, up to ``eventsPerMessage`` per message it took),
        /// doubled back (to ``pumpLimit``) when it took all — so a slow client does not make the
        /// node encode events it throws away.
        var batchLimit = NodeMachine.pumpLimit
    }

    /// The watches, in the order they were opened (so every run treats them in one order).
    struct WatchTable: Sendable {
        private(set) var byKey: [WatchKey: Watch] = [:]
        private(set) var order: [WatchKey] = []
        /// Watches whose client is not taking events as fast as they come.
        var lagging = 0

        var count: Int { byKey.count }

        subscript(key: WatchKey) -> Watch? {
            get { byKey[key] }
            set {
                if newValue == nil, byKey[key] != nil {
                    byKey[key] = nil
                    order.removeAll { $0 == key }
                } else if let newValue {
                    if byKey.updateValue(newValue, forKey: key) == nil { order.append(key) }
                }
            }
        }

        mutating func removeAll(of client: [UInt8]) {
            for key in order where key.client == client { byKey[key] = nil }
            order.removeAll { $0.client == client }
        }
    }

    static let markerInterval: UInt64 = 1000
    static let snapshotChunk = 256
    static let pumpLimit = 256
    /// At most this many DELTA events share a message of a watch that takes batched events:
    /// enough to send a round's events in a few messages, few enough that a client's queue of
    /// `network.client_hwm` messages holds about as many bytes as one full of snapshot RECORDS
    /// (256 records each).
    static let eventsPerMessage = 32

    // MARK: - Opening and closing

    mutating func addWatch(
        _ key: WatchKey, channel: String, from cursor: WatchCursor?, onLag: ClientProtocol.LagPolicy,
        identity: String? = nil, filter: ClientProtocol.WatchFilter? = nil, batchedEvents: Bool = false,
        takesResets: Bool = false, heldAbove: [String: [UInt64]] = [:]
    ) {
        var watch = Watch(
            channel: channel, filter: filter, identity: identity, onLag: onLag, batchedEvents: batchedEvents,
            takesResets: takesResets, position: WatchPosition(journalIndex: 0, cursor: cursor ?? WatchCursor()))
        if let cursor {
            if let position = resumePosition(after: cursor) {
                watch.position = position
                watch.mayLackMergedState = true
            } else {
                watch.pendingSnapshot = .historyGone
            }
            // Taken before this node last dropped its state (section 7.5): its client may hold
            // writes the node gave up, and data deleted since. A client that takes resets gets
            // one, once the peer's snapshot is merged — also after the recovery ended, and after
            // restarts (a peer's progress may cover given-up numbers it never held).
            if takesResets, lastResetThrough > 0, cursor[configuration.nodeID] <= lastResetThrough {
                if let recovery = repair.ownRecovery, recovery.recovered == nil {
                    watch.resetDue = true
                } else {
                    watch.pendingSnapshot = .reset
                }
            }
            if takesResets { watch.clientOnly = heldByClientOnly(cursor: cursor, heldAbove: heldAbove) }
        } else {
            watch.pendingSnapshot = .initial
        }
        watches[key] = watch
    }

    mutating func removeWatch(_ key: WatchKey) {
        if watches[key]?.lagging == true { watches.lagging -= 1 }
        watches[key] = nil
    }

    /// Values of `channels` expired: their watches are due a CAUGHT-UP at the end of their next
    /// walk, which carries the node's clock of expiry (the client deletes them then, after every
    /// delta before it).
    mutating func noteExpiries(in channels: Set<String>) {
        for key in watches.order where channels.contains(watches[key]?.channel ?? "") {
            watches[key]?.caughtUpSent = false
        }
    }

    /// Watches of `channels` get a resync snapshot: their state changed without deltas (a peer's
    /// snapshot was merged, `merged`, or this node dropped its state), which the journal cannot
    /// show them. A watch due a reset (``Watch/resetDue``) waits for the merge, then gets a
    /// `reset` snapshot whatever its channel: what its client holds may be gone from the node.
    mutating func resyncWatches(of channels: Set<String>, merged: Bool = true) {
        for key in watches.order {
            guard var watch = watches[key] else { continue }
            let snapshotOnItsWay = if case .snapshot = watch.inFlight { true } else { false }
            if watch.resetDue {
                guard merged else { continue }
                watch.resetDue = false
                // A new watch's initial snapshot not yet built holds the merged state already.
                if watch.pendingSnapshot != .initial || snapshotOnItsWay { watch.pendingSnapshot = .reset }
                if snapshotOnItsWay { watch.snapshotAgain = true }
                watches[key] = watch
                continue
            }
            guard channels.contains(watch.channel) else { continue }
            if snapshotOnItsWay {
                watch.snapshotAgain = true
                if watch.pendingSnapshot == .initial { watch.pendingSnapshot = .lagged }
                watches[key] = watch
                continue
            }
            guard watch.pendingSnapshot == nil else { continue }
            watches[key]?.pendingSnapshot = .lagged
        }
    }

    // MARK: - Sending

    /// The node stops: each watch is sent what it is owed that its client's queue takes, then an
    /// ERROR (code 5) that ends it and says why (section 10.5.9), so that its client resumes it
    /// elsewhere at once instead of when a PING goes unanswered (5 s).
    mutating func endWatchesAtStop() {
        pumpWatches()
        for key in watches.order {
            guard watches[key] != nil else { continue }
            let body = ClientProtocol.encodeError(
                .internal,
                "node \(configuration.nodeID) is stopping: this watch ends here"
            )
            actions.append(
                .reply(client: key.client, frames: ClientProtocol.encodeReply(.error, id: key.requestID, body: body)))
            removeWatch(key)
        }
    }

    /// Sends every watch what it is owed (as far as its client's queue takes it: see
    /// ``watchEventsSent(_:accepted:clientGone:)``).
    mutating func pumpWatches() {
        // A write's OK goes before its watch events, also when it waited for the round's end
        // (a pump in the middle of a round, after a sync or a reservation, sends what it holds
        // so far).
        if watches.count > 0 { sendHeldOKs() }
        for key in watches.order where watches[key]?.inFlight == nil { pump(key) }
    }

    /// Emits the next batch of events `key` is owed, if any.
    private mutating func pump(_ key: WatchKey) {
        guard var watch = watches[key], watch.inFlight == nil else { return }
        defer { watches[key] = watch }
        func event(_ body: ClientProtocol.WatchEventBody) -> [[UInt8]] {
            ClientProtocol.encodeReply(.event, id: key.requestID, body: ClientProtocol.encodeWatchEvent(body))
        }
        while true {
            if watch.ending {
                let body = ClientProtocol.encodeError(
                    .lagged,
                    "this watch fell behind the node's history and ended (its policy is to end on lag); watch again")
                watch.inFlight = .ending
                actions.append(
                    .sendWatchEvents(key, [ClientProtocol.encodeReply(.error, id: key.requestID, body: body)]))
                return
            }
            // Due a reset (section 7.5): nothing until it, which holds the state the events
            // would build on. (Deltas sent meanwhile would move the client's cursor past the
            // reset's own mark, on top of state it still holds from before: a resume after a
            // restart would then not be told.)
            if watch.resetDue { return }
            if let reason = watch.pendingSnapshot {
                let events = snapshotEvents(of: watch.channel, reason: reason, filter: watch.filter, event)
                watch.mayLackMergedState = false
                watch.inFlight = .snapshot(events.position, events: events.frames.count)
                actions.append(.sendWatchEvents(key, events.frames))
                return
            }
            let before = watch.position
            let (deltas, end, historyGone) = nextDeltas(
                channel: watch.channel, from: watch.position, limit: watch.batchLimit)
            if historyGone {
                // The end policy's ERROR is told once the client's queue takes it (it may be full
                // now: that is the lag); the resync policy sends the state again.
                if watch.onLag == .end { watch.ending = true } else { watch.pendingSnapshot = .lagged }
                continue
            }
            if deltas.isEmpty {
                watch.position = end
                if end.journalIndex == before.journalIndex { break }
                continue
            }
            var events: [[[UInt8]]] = []
            var after: [WatchPosition] = []
            var firstSent: Version?
            // A watch that takes batched events gets runs of them as one message: the header once,
            // then one body each (section 10.5.7).
            var inMessage = 0
            func add(_ body: [UInt8], after position: WatchPosition) {
                if watch.batchedEvents, inMessage > 0, inMessage < Self.eventsPerMessage {
                    events[events.count - 1].append(body)
                    after[after.count - 1] = position
                    inMessage += 1
                } else {
                    events.append(ClientProtocol.encodeReply(.event, id: key.requestID, body: body))
                    after.append(position)
                    inMessage = 1
                }
            }
            for (whole, position) in deltas {
                // A filtered watch is sent what passes; its position moves over the rest too.
                guard let delta = watch.filter.map({ $0.apply(to: whole) }) ?? whole else { continue }
                if firstSent == nil { firstSent = delta.version }
                let body = ClientProtocol.encodeWatchEvent(.delta(delta, cursor: position.cursor))
                add(body, after: position)
                if faults.duplicateWatchEvents { add(body, after: position) }
            }
            guard let firstSent else {
                // Nothing of this batch passed the filter.
                watch.position = end
                continue
            }
            // Live events only: a watch still replaying history (resumed from an old cursor) is
            // not lagging by the age of what it replays.
            if latencySamples.enabled, watch.caughtUpSent {
                latencySamples.watchSent(version: firstSent, wallNow: clock.wallMilliseconds())
            }
            watch.inFlight = .deltas(before: before, after: after, end: end)
            actions.append(.sendWatchEvents(key, events))
            return
        }
        // The first time the watch has everything (after its snapshot), then at most once per
        // interval: "nothing changed" is told apart from "not yet synced" without a marker per
        // delta.
        if !watch.caughtUpSent || now &- watch.lastMarker >= Self.markerInterval {
            watch.inFlight = .marker
            let marker = ClientProtocol.WatchEventBody.caughtUp(
                cursor: watch.position.cursor, latest: store.latestVersion == .zero ? nil : store.latestVersion,
                missing: missingDeltas, expiredThrough: store.expiredThrough)
            actions.append(.sendWatchEvents(key, [event(marker)]))
        } else {
            setLagging(&watch, false)
        }
    }

    /// A whole snapshot of `channel` as EVENTs: its start, the records in chunks, and its end
    /// with the record count and digest the client verifies.
    private func snapshotEvents(
        of channel: String, reason: ClientProtocol.SnapshotReason, filter: ClientProtocol.WatchFilter?,
        _ event: (ClientProtocol.WatchEventBody) -> [[UInt8]]
    ) -> (frames: [[[UInt8]]], position: WatchPosition) {
        var (models, position) = channelSnapshot(channel)
        // Whether the records are the whole (filtered) state: then a client drops what it holds
        // at or below the horizon of collection that they lack (PROTOCOL.md 10.5.4).
        var complete = true
        if let filter {
            // A new watch that asked for no initial state gets an empty one (a resync still sends
            // the state: it replaces deltas the watch missed).
            if reason == .initial && !filter.initialState {
                models = []
                complete = false
            } else {
                models = models.compactMap { model, properties in
                    let kept = properties.filter { filter.passes(model: model, property: $0.0) }
                    return kept.isEmpty ? nil : (model, kept)
                }
            }
        }
        var frames = [event(.snapshotBegin(reason))]
        var digest = RegisterDigest()
        var chunk: [(model: String, properties: [(String, ReplicaStore.Register)])] = []
        var inChunk = 0
        for (model, properties) in models {
            for (name, register) in properties {
                digest.add(channel: channel, model: model, property: name, register: register)
            }
            chunk.append((model, properties))
            inChunk += properties.count
            if inChunk >= Self.snapshotChunk {
                frames.append(event(.records(chunk)))
                chunk = []
                inChunk = 0
            }
        }
        if !chunk.isEmpty { frames.append(event(.records(chunk))) }
        frames.append(
            event(
                .snapshotEnd(
                    records: digest.count, digest: digest.value, cursor: position.cursor,
                    collectedThrough: complete ? servedHorizon : 0)))
        return (frames, position)
    }

    /// The driver sent the first `accepted` messages of `key`'s batch (one event each, or a run
    /// of DELTA events for a watch that takes batched events).
    mutating func watchEventsSent(_ key: WatchKey, accepted: Int, clientGone: Bool) {
        if clientGone {
            for other in watches.order where other.client == key.client && watches[other]?.lagging == true {
                watches.lagging -= 1
            }
            watches.removeAll(of: key.client)
            return
        }
        guard var watch = watches[key], let inFlight = watch.inFlight else { return }
        watch.inFlight = nil
        var complete = false
        switch inFlight {
        case .ending:
            if accepted > 0 {
                removeWatch(key)
                return
            }
        case .snapshot(let position, let events):
            // A snapshot cut short is sent again whole (the client restarts it at its begin), of
            // the state then; so is one whose state changed while it was on its way.
            let again = watch.snapshotAgain
            watch.snapshotAgain = false
            if accepted == events {
                watch.position = position
                if !again { watch.pendingSnapshot = nil }
                watch.caughtUpSent = false
                complete = true
            }
        case .deltas(let before, let after, let end):
            if accepted >= after.count {
                watch.position = end
                watch.batchLimit = min(watch.batchLimit * 2, Self.pumpLimit)
                complete = true
            } else {
                // Advance message by message, so a refusal resumes exactly where it stopped.
                watch.position = accepted > 0 ? after[accepted - 1] : before
                watch.batchLimit = max(1, watch.batchedEvents ? accepted * Self.eventsPerMessage : accepted)
            }
        case .marker:
            if accepted > 0 {
                watch.caughtUpSent = true
                watch.lastMarker = now
                complete = true
            }
        }
        if complete {
            watches[key] = watch
            pump(key)  // the next batch, or nothing more owed
            if let current = watches[key], current.inFlight == nil { setLagging(key, false) }
        } else {
            if !watch.lagging {
                warnLimited(
                    "slow-watcher",
                    "a watching client is not keeping up; its watch waits (and resyncs if it falls behind history)",
                    metadata: ["watch.channel": "\(watch.channel)"])
            }
            setLagging(&watch, true)
            watches[key] = watch
        }
    }

    private mutating func setLagging(_ key: WatchKey, _ lagging: Bool) {
        guard var watch = watches[key] else { return }
        setLagging(&watch, lagging)
        watches[key] = watch
    }

    private mutating func setLagging(_ watch: inout Watch, _ lagging: Bool) {
        guard watch.lagging != lagging else { return }
        watch.lagging = lagging
        watches.lagging += lagging ? 1 : -1
    }

    // MARK: - The journal seen from a watch

    /// The next deltas of `channel` a watch at `position` must get, in this node's apply order, up
    /// to `limit`, with the position after each. Stops before this node's own deltas that are not
    /// yet published and durable (``visibleToWatches``). `historyGone` says the watch needs
    /// deltas the node no longer holds.
    func nextDeltas(channel: String, from position: WatchPosition, limit: Int) -> (
        deltas: [(Delta, WatchPosition)], end: WatchPosition, historyGone: Bool
    ) {
        var position = position
        if position.journalIndex < journal.base {
            // Entries this watch has not passed were dropped: only those it still needs matter.
            let needed = journal.droppedThrough.contains { origin, through in
                through > position.cursor[origin]
                    && !(position.cursor[origin] + 1...through).allSatisfy { position.covers(origin, $0) }
            }
            if needed { return ([], position, true) }
            position.journalIndex = journal.base
        }
        var deltas: [(Delta, WatchPosition)] = []
        // What the cursor covers, by the journal's origin numbers: a long way to go (a watch
        // resumed near the end of a full journal) is passed over by the entries' keys alone
        // where the cursor covers them. A live watch, a few entries behind, walks as before.
        let keyed = journal.end - position.journalIndex > Self.keyedWalkFrom
        var through = keyed ? journal.originNames.map { position.cursor[$0] } : []
        let own = keyed ? journal.number(ifKnown: configuration.nodeID) : nil
        while deltas.count < limit {
            if keyed {
                position.journalIndex = journal.firstNotCovered(
                    from: position.journalIndex, through: through, own: own, above: visibleToWatches)
            }
            guard let entry = journal.entry(at: position.journalIndex) else { break }
            if entry.origin == configuration.nodeID && entry.sequence > visibleToWatches { break }
            position.journalIndex += 1
            if position.covers(entry.origin, entry.sequence) { continue }
            position.deliver(entry.origin, entry.sequence)
            // (`through` has a slot for every origin the journal numbered.)
            if keyed, let key = journal.key(at: position.journalIndex - 1) {
                through[Int(key.origin)] = position.cursor[entry.origin]
            }
            if entry.delta.channel == channel { deltas.append((entry.delta, position)) }
        }
        return (deltas, position, false)
    }

    /// From how many entries ahead of a watch ``nextDeltas(channel:from:limit:)`` passes over
    /// covered ones by their keys.
    static let keyedWalkFrom = 64

    /// The registers of `channel` and the watch position they stand for.
    func channelSnapshot(_ channel: String) -> (
        records: [(String, [(String, ReplicaStore.Register)])], position: WatchPosition
    ) {
        var position = WatchPosition(journalIndex: journal.end, cursor: WatchCursor())
        for (origin, progress) in origins {
            if origin == configuration.nodeID {
                position.cursor[origin] = min(progress.contiguous, visibleToWatches)
            } else {
                position.cursor[origin] = progress.contiguous
                if !progress.above.isEmpty { position.above[origin] = progress.above }
            }
        }
        // Own deltas not yet visible to watches are in the state but not in the cursor: the watch
        // goes through them again (harmless: a client ignores a delta it already holds).
        // (Found by the journal's keys: everything counts as covered but those.)
        if let own = journal.number(ifKnown: configuration.nodeID) {
            position.journalIndex = journal.firstNotCovered(
                from: journal.base, through: Array(repeating: .max, count: journal.originNames.count), own: own,
                above: visibleToWatches)
        }
        // Deletions too: a client's replica learns of a deletion it missed from its record.
        let models = store.models(in: channel).sorted().map { model in
            (model, store.records(of: ModelAddress(channel: channel, model: model)).sorted { $0.key < $1.key })
        }
        return (models, position)
    }

    static let clientOnlyLimit = 1024

    /// The deltas a resumed watch's client holds — covered by its cursor, or named as held above
    /// it — that this node does not hold (nor knows void), per origin, at most
    /// ``clientOnlyLimit`` each (the lowest).
    func heldByClientOnly(cursor: WatchCursor, heldAbove: [String: [UInt64]]) -> [String: Set<UInt64>] {
        var clientOnly: [String: Set<UInt64>] = [:]
        // (A cursor's entries come from the client: one far ahead stops at the limit.)
        func note(_ origin: String, _ sequences: some Sequence<UInt64>) {
            let progress = origins[origin] ?? OriginProgress()
            var missing = clientOnly[origin] ?? []
            for sequence in sequences {
                guard missing.count < Self.clientOnlyLimit else { break }
                if !progress.holds(sequence) { missing.insert(sequence) }
            }
            if !missing.isEmpty { clientOnly[origin] = missing }
        }
        for (origin, through) in cursor.positions {
            let contiguous = origins[origin]?.contiguous ?? 0
            if through > contiguous { note(origin, (contiguous + 1)...through) }
        }
        for (origin, sequences) in heldAbove { note(origin, sequences) }
        return clientOnly
    }

    /// This node holds `origin`'s numbers that `lost` says without their deltas (a snapshot's
    /// progress covers them, or they are void): a watch whose client holds one of them gets a
    /// `reset` snapshot, since a merged one would leave the client with what that delta wrote.
    /// Numbers the node received since the watch resumed are forgotten.
    mutating func resetWatchesHolding(origin: String, lost: (UInt64) -> Bool) {
        let progress = origins[origin] ?? OriginProgress()
        for key in watches.order {
            guard var watch = watches[key], let held = watch.clientOnly[origin] else { continue }
            let gone = held.filter(lost)
            let remaining = held.filter { !gone.contains($0) && !progress.holds($0) }
            watch.clientOnly[origin] = remaining.isEmpty ? nil : remaining
            if let first = gone.min() {
                if case .snapshot = watch.inFlight { watch.snapshotAgain = true }
                if watch.pendingSnapshot != .initial { watch.pendingSnapshot = .reset }
                logger.info(
                    "a watch's client holds a delta this node covers without it (lost here, given up everywhere?); the watch gets a reset snapshot",
                    metadata: ["peer.id": "\(origin)", "delta.sequence": "\(first)"])
            }
            watches[key] = watch
        }
    }

    /// This node covers `origin`'s numbers through `sequence` without their deltas (a peer's
    /// snapshot's progress, a forgotten member's numbers given up), and `held` (its progress
    /// before) says which it received: a watch resumed from a cursor
    /// (``Watch/mayLackMergedState``) not delivered one of the others gets a resync snapshot.
    /// What that one wrote may have reached this node's state in an earlier snapshot's pages,
    /// merged before the watch resumed, and will never come as a delta now: the client would
    /// miss it (the simulator, 3 nodes × 300 operations, seed 1154, with a snapshot asked for at
    /// the end of a round). A watch that began with a snapshot, or got one since, holds all the
    /// state had: it is left alone; so is one that will be delivered the numbers from the journal.
    mutating func resyncResumedWatches(lacking origin: String, through sequence: UInt64, held: OriginProgress) {
        guard sequence > held.contiguous else { return }
        for key in watches.order {
            guard var watch = watches[key], watch.mayLackMergedState, !watch.resetDue else { continue }
            // The first number neither received nor delivered: above both marks, a number is
            // either in a run held above the gap, or in a run delivered above the cursor, or it
            // is that number. The walk jumps run by run.
            let from = max(watch.position.cursor[origin], held.contiguous)
            guard sequence > from else { continue }
            var first = from + 1  // (below `sequence`: no overflow, whatever cursor a client sent)
            while first <= sequence {
                let pastHeld = held.above.firstAbsent(from: first)
                let past = watch.position.above[origin]?.firstAbsent(from: pastHeld) ?? pastHeld
                if past == first { break }
                first = past
            }
            guard first <= sequence else { continue }
            // (One with a snapshot on its way is not marked: that snapshot holds the state.)
            if watch.pendingSnapshot == nil { watch.pendingSnapshot = .lagged }
            watch.mayLackMergedState = false
            watches[key] = watch
        }
    }

    /// Where a watch resuming at `cursor` starts: the oldest retained journal entry (entries it
    /// already has are skipped), or `nil` when the node no longer holds deltas it needs.
    func resumePosition(after cursor: WatchCursor) -> WatchPosition? {
        // Every delta the cursor lacks must still be in the journal (not dropped, and not known
        // only through a snapshot) — also above a gap of the origin.
        for (origin, through) in journal.droppedThrough where through > cursor[origin] { return nil }
        var position = WatchPosition(journalIndex: journal.base, cursor: cursor)
        // Void numbers are never in the journal: the watch goes past those above its cursor.
        for (origin, ranges) in voidKnown {
            for range in ranges where range.upperBound > cursor[origin] {
                for sequence in max(range.lowerBound, cursor[origin] + 1)...range.upperBound {
                    position.deliver(origin, sequence)
                }
            }
        }
        return position
    }
}
