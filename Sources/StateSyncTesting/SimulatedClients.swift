import StateSync
import Synchronization

/// A client that writes: one SET at a time to a node of its choosing, recording what it wrote and
/// whether (and with which version) the node acknowledged it.
final class SimulatedWriter {
    let client: SimulatedCluster.Client
    var name: String { client.name }
    private var nextRequestID: UInt64 = 1
    /// The write in flight (request id 0: its node was down, it fails on the next turn).
    private var pending: (id: UInt64, write: ConvergenceChecker.Write, deadline: UInt64)?
    /// Every write issued, in order.
    private(set) var writes: [ConvergenceChecker.Write] = []
    /// Replies in a form this writer did not ask for (PROTOCOL.md 10.1.1), or malformed.
    private(set) var violations: [String] = []
    /// Called when the write in flight is settled (acknowledged or not).
    var onSettled: ((SimulatedCluster) -> Void)?
    static let timeout: UInt64 = 3000

    var isBusy: Bool { pending != nil }
    /// Whether its writes ask for their OKs in OKS messages (PROTOCOL.md 10.1.1), as
    /// `StateSyncClient` does; the others take the one OK a request of version 1.
    let batchedReplies: Bool

    init(name: String, batchedReplies: Bool = false) {
        self.batchedReplies = batchedReplies
        client = SimulatedCluster.Client(name: name)
        client.onReceive = { [unowned self] frames, cluster in self.received(frames, in: cluster) }
        client.onConnectionLost = { [unowned self] cluster in self.connectionLost(in: cluster) }
    }

    /// Sends `properties` of `model` to node `node` (connecting to it). `false` when the node is
    /// down: the write is recorded as not acknowledged.
    @discardableResult
    func write(
        channel: String, model: String, properties: [String: Value], to node: Int, in cluster: SimulatedCluster
    ) -> Bool {
        write(
            channel: channel,
            ConvergenceChecker.Write(model: model, properties: properties, node: "", acknowledged: nil), to: node,
            in: cluster)
    }

    /// Sends `write` — values (a SET, with their time to live), deletions of properties or of the
    /// model (a DELETE) — to node `node`. `false` when the node is down: the write is recorded as
    /// not acknowledged.
    @discardableResult
    func write(channel: String, _ write: ConvergenceChecker.Write, to node: Int, in cluster: SimulatedCluster) -> Bool {
        var write = write
        write.node = cluster.nodes[node].id
        write.acknowledged = nil
        guard pending == nil else { preconditionFailure("one write at a time") }
        guard client.connection?.node == node || cluster.connect(client, to: node) else {
            // The node is down: the write fails at once (settled on the next turn, not re-entrantly).
            pending = (0, write, cluster.now)
            cluster.schedule(at: cluster.now) { [weak self] cluster in self?.settle(acknowledged: nil, in: cluster) }
            return false
        }
        let id = nextRequestID
        nextRequestID += 1
        pending = (id, write, cluster.now + Self.timeout)
        let address = ModelAddress(channel: channel, model: write.model)
        let flags = batchedReplies ? ClientProtocol.RequestFlags.batchedReplies : 0
        let request =
            write.properties.isEmpty
            ? ClientProtocol.encodeRequest(
                .delete, id: id,
                body: ClientProtocol.encodeDelete(
                    address, properties: write.deletesModel ? [] : write.deleted.sorted()),
                flags: flags)
            : ClientProtocol.encodeRequest(
                .set, id: id, body: ClientProtocol.encodeSet(address, write.propertyWrites), flags: flags)
        cluster.send(request, from: client)
        cluster.schedule(at: cluster.now + Self.timeout) { [weak self] cluster in
            guard let self, let pending = self.pending, pending.id == id else { return }
            self.settle(acknowledged: nil, in: cluster)
        }
        return true
    }

    private func settle(acknowledged: Version?, unchanged: Bool = false, in cluster: SimulatedCluster) {
        guard var write = pending?.write else { return }
        pending = nil
        write.acknowledged = acknowledged
        write.acknowledgedAt = acknowledged == nil ? nil : cluster.now
        if unchanged {
            // The node said the write changed nothing (a deletion of what had no value): it removed
            // nothing, anywhere.
            write.deleted = []
            write.deletesModel = false
        }
        writes.append(write)
        cluster.record("write", name, [Array("\(write.model) \(acknowledged?.description ?? "-")".utf8)])
        onSettled?(cluster)
    }

    private func received(_ frames: [[UInt8]], in cluster: SimulatedCluster) {
        guard frames.count == 2, let header = try? ClientProtocol.decodeReplyHeader(frames[0]),
            let pending, pending.id != 0
        else { return }
        let node = client.connection.map { cluster.nodes[$0.node].id } ?? "?"
        let ok: [UInt8]?
        switch header.kind {
        case .oks:
            // Only a writer that asked for them gets OKS messages; its OK is the entry of its id.
            guard let replies = try? ClientProtocol.decodeBatchedOKs(frames[1]) else {
                violations.append("\(name): a malformed OKS message from \(node)")
                return
            }
            if !batchedReplies { violations.append("\(name): an OKS message from \(node), which it did not ask for") }
            let entries = replies.filter { $0.id == pending.id }
            guard let entry = entries.first else { return }
            if entries.count > 1 {
                violations.append("\(name): request \(pending.id) twice in one OKS message from \(node)")
            }
            ok = entry.body
        case .ok:
            guard header.requestID == pending.id else { return }
            if batchedReplies {
                violations.append(
                    "\(name): request \(pending.id) answered with a plain OK from \(node), where it asked for an OKS")
            }
            ok = frames[1]
        case .error:
            guard header.requestID == pending.id else { return }
            ok = nil
        case .event:
            return
        }
        var version: Version?
        // Acknowledged: an OK whose outcome is "changed" (1), with the write's version.
        if let ok, ok.last == 1, let decoded = try? ClientProtocol.decodeVersion(Array(ok.dropLast())) {
            version = decoded
        }
        settle(acknowledged: version, unchanged: ok?.last == 0, in: cluster)
    }

    private func connectionLost(in cluster: SimulatedCluster) {
        // The node crashed before answering: the write may or may not have been made durable.
        if pending != nil { settle(acknowledged: nil, in: cluster) }
    }
}

/// A client that watches a channel on one node and records every change it is told of, exactly as
/// `StateSyncClient` would compute them (its ``WatchSession`` and replica). When its node
/// crashes it resumes with its replica once the node is back, so one chain runs through the run.
/// It also checks what a client cannot see through its replica: within one connection a node
/// sends each delta at most once.
///
/// With a state file, it is `statesync watch --state FILE`: every change it is told of is
/// "printed" through a ``WatchState``, which keeps the file (here in memory), and
/// ``restartFromStateFile(in:)`` stops it as a crash would (nothing saved) and starts it again
/// from the file; half the times a `reset` snapshot is being printed, it is saved and crashes
/// there. At every caught-up marker with every line printed, the file's copy must hold what the
/// watch's replica holds (``printUnprinted(in:)``), and the file must end as the nodes' state.
final class SimulatedWatcher {
    /// The state file's bytes and the clock its saves are timed by: the simulated one.
    final class StateFile: Sendable {
        let saved = Mutex<[UInt8]?>(nil)
        let now = Atomic<UInt64>(0)

        func open(channel: String) -> WatchState {
            // The bytes are always the state's own: decoding them cannot fail but for a bug.
            do {
                return try WatchState(
                    path: "(simulated)", channel: channel, saved: saved.withLock { $0 },
                    milliseconds: { [self] in now.load(ordering: .relaxed) },
                    write: { [self] bytes in saved.withLock { $0 = bytes } })
            } catch {
                fatalError("the simulated watch state file does not read back: \(error)")
            }
        }
    }
    private let stateFile: StateFile?
    private var watchState: WatchState?
    /// Where each run from the state file began in ``changes``.
    private(set) var runStarts: [Int] = [0]
    /// What the events of the messages handled meant, not yet printed.
    private var unprinted: [WatchEvent] = []
    /// How many messages are handled before what they meant is printed (1 to 4, drawn).
    private var printLag: SeededRandom
    private var printEvery = 1
    private var messagesUnprinted = 0

    private(set) var client: SimulatedCluster.Client
    let name: String
    let nodeIndex: Int
    let channel: String
    private(set) var session: WatchSession
    private var watchID: UInt64 = 0
    private var nextRequestID: UInt64 = 1
    /// The (origin, sequence) of every DELTA event of the current connection.
    private var seen: Set<DeltaID> = []

    private struct DeltaID: Hashable {
        let origin: String
        let sequence: UInt64
    }
    /// Every change told, in order.
    private(set) var changes: [PropertyChange] = []
    /// Where in ``changes`` a reset snapshot began.
    private(set) var resetStarts: Set<Int> = []
    /// Deltas a node sent twice on one connection, and protocol errors.
    private(set) var violations: [String] = []
    /// Whether the node registered the watch (OK) and it is running.
    private(set) var isWatching = false
    /// The last caught-up marker: when it came, the node's newest version and what the node
    /// was missing when it was sent.
    private(set) var lastCaughtUp: (at: UInt64, latest: Version?, nodeMissing: Int)?

    /// What the watch asks for (`nil`: the whole channel).
    let filter: ClientProtocol.WatchFilter?
    /// Whether the watch takes several events in one message (WATCH flag bit 3).
    let batchedEvents: Bool
    /// The most events one message brought.
    private(set) var largestMessage = 0

    init(
        node: Int, channel: String, name: String, capacity: Int, filter: ClientProtocol.WatchFilter? = nil,
        batchedEvents: Bool = false, stateFile: Bool = false, random: SeededRandom = SeededRandom(seed: 0)
    ) {
        self.printLag = random
        self.nodeIndex = node
        self.channel = channel
        self.filter = filter
        self.batchedEvents = batchedEvents
        let file = stateFile ? StateFile() : nil
        let state = file?.open(channel: channel)
        self.stateFile = file
        self.watchState = state
        self.session = WatchSession(replica: state?.liveReplica ?? ChannelReplica(channel: channel), filter: filter)
        self.name = name
        // A placeholder until every stored property is set: the client the watch uses takes
        // callbacks on self.
        client = SimulatedCluster.Client(name: name, capacity: capacity)
        client = makeClient(name: name, capacity: capacity)
    }

    private func makeClient(name: String, capacity: Int) -> SimulatedCluster.Client {
        let client = SimulatedCluster.Client(name: name, capacity: capacity)
        client.onReceive = { [unowned self] frames, cluster in self.received(frames, in: cluster) }
        client.onConnectionLost = { [unowned self] cluster in self.connectionLost(in: cluster) }
        return client
    }

    var replica: ChannelReplica { session.replica }

    /// Opens (or resumes, with its replica) the watch; retries while the node is down.
    func start(in cluster: SimulatedCluster) {
        guard cluster.connect(client, to: nodeIndex) else {
            cluster.schedule(at: cluster.now + 100) { [weak self] cluster in self?.retry(in: cluster) }
            return
        }
        seen = []
        isWatching = false
        watchID = nextRequestID
        nextRequestID += 1
        let resume = replica.isEmpty ? nil : replica.cursor
        cluster.send(
            ClientProtocol.encodeRequest(
                .watch, id: watchID,
                body: ClientProtocol.encodeWatch(
                    channel: channel, from: resume, filter: filter, batchedEvents: batchedEvents, takesResets: true,
                    heldAbove: replica.heldAbove)),
            from: client)
    }

    private func received(_ frames: [[UInt8]], in cluster: SimulatedCluster) {
        guard frames.count >= 2, let header = try? ClientProtocol.decodeReplyHeader(frames[0]),
            header.requestID == watchID
        else { return }
        // Only an EVENT of a watch that asked for batched events carries more than one body.
        if frames.count > 2, !(header.kind == .event && batchedEvents) {
            violations.append(
                "\(cluster.nodes[nodeIndex].id)'s watcher: a message of \(frames.count) frames (batched events: \(batchedEvents))"
            )
            return
        }
        switch header.kind {
        case .ok:
            isWatching = true
        case .error:
            let message = (try? ClientProtocol.decodeError(frames[1]))?.message ?? "malformed error"
            violations.append("\(cluster.nodes[nodeIndex].id)'s watcher: the watch ended: \(message)")
            cluster.disconnect(client)
            start(in: cluster)
        case .event:
            largestMessage = max(largestMessage, frames.count - 1)
            for body in frames[1...] { receivedEvent(body, in: cluster) }
            // `statesync watch` prints behind its client's I/O thread, by up to many messages.
            messagesUnprinted += 1
            if messagesUnprinted >= printEvery {
                printUnprinted(in: cluster)
                messagesUnprinted = 0
                printEvery = 1 + printLag.below(4)
            }
        case .oks:
            // A watcher's requests never ask for them (PROTOCOL.md 10.1.1).
            violations.append("\(cluster.nodes[nodeIndex].id)'s watcher: an OKS message it did not ask for")
        }
    }

    private func receivedEvent(_ body: [UInt8], in cluster: SimulatedCluster) {
        guard let event = try? ClientProtocol.decodeWatchEvent(body) else {
            violations.append("\(cluster.nodes[nodeIndex].id)'s watcher: a malformed watch event")
            return
        }
        // A reset snapshot starts the count again: the node dropped its state and what it had
        // sent with it (PROTOCOL.md 7.5, 10.5.4).
        if case .snapshotBegin(.reset) = event {
            seen = []
            resetStarts.insert(changes.count)
        }
        if case .delta(let delta, _) = event,
            !seen.insert(DeltaID(origin: delta.origin, sequence: delta.sequence)).inserted
        {
            violations.append(
                "\(cluster.nodes[nodeIndex].id)'s watcher: delta \(delta.origin):\(delta.sequence) sent twice on one watch"
            )
        }
        do {
            for meaning in try session.handle(event, from: cluster.nodes[nodeIndex].id) {
                if stateFile != nil { unprinted.append(meaning) }
                switch meaning {
                case .change(let change, _, _):
                    changes.append(change)
                case .caughtUp(_, let latest, let missing): lastCaughtUp = (cluster.now, latest, missing)
                default: break
                }
            }
        } catch {
            violations.append("\(cluster.nodes[nodeIndex].id)'s watcher: \(error)")
        }
    }

    /// With a state file: prints what the messages' events meant, once all of them were applied
    /// to the watch's replica, as `statesync watch` prints behind its client's I/O thread. When
    /// the last message ended with a caught-up marker at the replica's cursor, every line is printed
    /// and recorded: the file's copy must then hold every record the replica holds, deletions
    /// that printed no line included, or a watch resumed from it would not go on as this one.
    private func printUnprinted(in cluster: SimulatedCluster) {
        guard let watchState, let stateFile, !unprinted.isEmpty else { return }
        stateFile.now.store(cluster.now, ordering: .relaxed)
        for meaning in unprinted { watchState.printing(meaning) {} }
        defer { unprinted = [] }
        // Half the time a reset is being printed, the file is saved (as every 200 ms) and the
        // watch crashes there: resumed from part of a reset, it must still end as the nodes.
        if resetBeingPrinted(), printLag.chance(0.5) {
            watchState.saveNow()
            cluster.schedule(at: cluster.now) { [weak self] cluster in self?.restartFromStateFile(in: cluster) }
            return
        }
        guard case .caughtUp(let cursor, _, _) = unprinted.last, watchState.liveReplica.cursor == cursor else { return }
        let live = watchState.liveReplica
        let printed = watchState.printedReplica
        // The file names only numbers the watch took (not all: one that changed nothing is not
        // worth naming, the node sends it again). Each keeps at most the first 1,024 of an origin
        // it takes, each in its order: past that, they can differ.
        let (takenAbove, namedAbove) = (live.heldAbove, printed.heldAbove)
        if namedAbove.contains(where: { origin, numbers in
            let taken = takenAbove[origin] ?? []
            return taken.count < ChannelReplica.heldAboveLimit && !Set(numbers).isSubset(of: taken)
        }) {
            violations.append(
                "\(cluster.nodes[nodeIndex].id)'s state-file watcher at \(cursor): the file names \(namedAbove) as held above its cursor, the watch took \(takenAbove)"
            )
        }
        for model in Set(live.modelsHoldingRecords + printed.modelsHoldingRecords).sorted() {
            let (held, copied) = (live.records(of: model), printed.records(of: model))
            // The same values, and the same deletions deciding what a later write does: for each
            // property, the newer of its own deletion and the model's (the copy records a model's
            // deletion per property too while its lines print).
            func floor(_ records: [String: ReplicaStore.Register], _ name: String) -> Version {
                max(records[name].map { $0.isDeleted ? $0.version : .zero } ?? .zero, records[""]?.version ?? .zero)
            }
            let deciding = Set(held.keys).union(copied.keys).contains { floor(held, $0) != floor(copied, $0) }
            guard held.filter({ !$0.value.isDeleted }) != copied.filter({ !$0.value.isDeleted }) || deciding
            else { continue }
            violations.append(
                "\(cluster.nodes[nodeIndex].id)'s state-file watcher at \(cursor): the file's copy of \(model) is \(copied), the watch's \(held)"
            )
        }
    }

    /// Whether the events about to be printed start a `reset` snapshot and do not end it.
    private func resetBeingPrinted() -> Bool {
        var resetting = false
        for meaning in unprinted {
            switch meaning {
            case .resyncStarted(let reason): resetting = reason == .reset
            case .resyncComplete: resetting = false
            default: continue
            }
        }
        return resetting
    }

    /// Stops the watch as a crash of `statesync watch --state` would (what was not saved is
    /// lost) and starts it again from the file.
    func restartFromStateFile(in cluster: SimulatedCluster) {
        guard let stateFile else { return }
        // A new process: a new connection (routing id); the node finds the old one gone.
        cluster.disconnect(client)
        client = makeClient(name: "\(name)#\(runStarts.count)", capacity: client.capacity)
        isWatching = false
        lastCaughtUp = nil
        unprinted = []
        messagesUnprinted = 0
        let state = stateFile.open(channel: channel)
        watchState = state
        session = WatchSession(replica: state.liveReplica, filter: filter)
        runStarts.append(changes.count)
        start(in: cluster)
    }

    /// The changes per run from the state file (one run without one), and where in each a reset
    /// snapshot began.
    var sessions: (changes: [[PropertyChange]], resetStarts: [Set<Int>]) {
        let bounds = runStarts + [changes.count]
        return (
            (0..<runStarts.count).map { Array(changes[bounds[$0]..<bounds[$0 + 1]]) },
            (0..<runStarts.count).map { run in
                Set(resetStarts.filter { $0 >= bounds[run] && $0 < bounds[run + 1] }.map { $0 - bounds[run] })
            }
        )
    }

    private func connectionLost(in cluster: SimulatedCluster) {
        isWatching = false
        cluster.schedule(at: cluster.now + 100) { [weak self] cluster in self?.retry(in: cluster) }
    }

    private func retry(in cluster: SimulatedCluster) { start(in: cluster) }

    /// The watcher's copy of the channel: model → property → register. With a state file, what
    /// the file holds once what is left is printed and saved (the end of the watch), read back.
    func finalState() -> [String: [String: ReplicaStore.Register]] {
        var copy = replica
        if let watchState, let stateFile {
            for meaning in unprinted { watchState.printing(meaning) {} }
            unprinted = []
            watchState.saveNow()
            copy = stateFile.open(channel: channel).liveReplica
        }
        return Dictionary(uniqueKeysWithValues: copy.models.map { ($0, copy.properties(of: $0)) })
    }
}

/// Lists a channel of one node page by page (LIST, at most 3 models a page) over the simulated
/// network, for the verdict: the pages together must be the node's models, each once, in name
/// order, with their property counts and newest versions.
final class SimulatedLister {
    let client: SimulatedCluster.Client
    let nodeIndex: Int
    let channel: String
    private(set) var entries: [ClientProtocol.ListEntry] = []
    private(set) var problems: [String] = []
    private(set) var done = false
    private var after = ""
    private var requestID: UInt64 = 0

    init(node: Int, channel: String, name: String) {
        nodeIndex = node
        self.channel = channel
        client = SimulatedCluster.Client(name: name, capacity: 100)
        client.onReceive = { [unowned self] frames, cluster in self.received(frames, in: cluster) }
        client.onConnectionLost = { [unowned self] _ in self.finish("the connection was lost") }
    }

    func start(in cluster: SimulatedCluster) {
        guard cluster.connect(client, to: nodeIndex) else { return finish("cannot connect") }
        ask(in: cluster)
    }

    private func ask(in cluster: SimulatedCluster) {
        requestID += 1
        cluster.send(
            ClientProtocol.encodeRequest(
                .list, id: requestID,
                body: ClientProtocol.encodeList(.init(channel: channel, after: after, limit: 3))),
            from: client)
    }

    private func received(_ frames: [[UInt8]], in cluster: SimulatedCluster) {
        guard frames.count == 2, let header = try? ClientProtocol.decodeReplyHeader(frames[0]),
            header.requestID == requestID
        else { return }
        guard header.kind == .ok, let page = try? ClientProtocol.decodeListReply(frames[1]) else {
            return finish("LIST after '\(after)' was answered \(header.kind) or malformed")
        }
        entries += page.entries
        guard page.more else { return finish(nil) }
        guard let last = page.entries.last, page.entries.count == 3 else {
            return finish("a page with more after it holds \(page.entries.count) of 3 entries")
        }
        after = last.name
        ask(in: cluster)
    }

    private func finish(_ problem: String?) {
        if let problem { problems.append(problem) }
        done = true
    }

    /// What is wrong with the listing, against the node's `models` of the channel.
    func violations(node: String, models: [String: [String: ReplicaStore.Register]]) -> [String] {
        var found = problems.map { "\(node): \($0)" }
        let expected = models.keys.sorted()
        if entries.map(\.name) != expected {
            found.append("\(node): LIST gave \(entries.map(\.name)), the node holds \(expected)")
        }
        for entry in entries {
            guard let registers = models[entry.name] else { continue }
            let latest = registers.values.map(\.version).max()
            if entry.count != registers.count || entry.latest != latest {
                found.append(
                    "\(node): LIST says \(entry.name) has \(entry.count) properties, newest \(entry.latest); it has \(registers.count), newest \(latest?.description ?? "-")"
                )
            }
        }
        return found
    }
}

/// An operator who forgets a member (FORGET, PROTOCOL.md 10.12) through one node's client API:
/// asked while the node still hears from the member, the node refuses, so the operator asks again
/// every 100 ms until it is accepted or ``stop()`` is called.
final class SimulatedForgetter {
    let client: SimulatedCluster.Client
    let nodeIndex: Int
    let member: String
    /// When the forget was accepted, if it was.
    private(set) var acceptedAt: UInt64?
    private var stopped = false
    private var requestID: UInt64 = 0

    init(node: Int, forgetting member: String, name: String) {
        nodeIndex = node
        self.member = member
        client = SimulatedCluster.Client(name: name, capacity: 100)
        client.onReceive = { [unowned self] frames, cluster in self.received(frames, in: cluster) }
    }

    func start(in cluster: SimulatedCluster) {
        guard !stopped, acceptedAt == nil else { return }
        guard cluster.connect(client, to: nodeIndex) else { return retry(in: cluster) }
        ask(in: cluster)
    }

    /// Asks no more (the member is heard again: a forget now would be refused, rightly).
    func stop() { stopped = true }

    private func ask(in cluster: SimulatedCluster) {
        requestID += 1
        var body = WireWriter()
        body.string(member)
        cluster.send(ClientProtocol.encodeRequest(.forget, id: requestID, body: body.bytes), from: client)
    }

    private func retry(in cluster: SimulatedCluster) {
        cluster.schedule(at: cluster.now + 100) { [weak self] cluster in self?.start(in: cluster) }
    }

    private func received(_ frames: [[UInt8]], in cluster: SimulatedCluster) {
        guard frames.count == 2, let header = try? ClientProtocol.decodeReplyHeader(frames[0]),
            header.requestID == requestID, acceptedAt == nil
        else { return }
        if header.kind == .ok {
            acceptedAt = cluster.now
            cluster.record("forget", client.name, [Array(member.utf8)])
        } else {
            retry(in: cluster)
        }
    }
}
