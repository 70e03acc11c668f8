import Foundation
import Synchronization

/// Typed models mirrored from a daemon: ``StateSyncClient/model(_:channel:id:)``.
///
/// A client model is a `@Replicated` instance like one attached to an embedded node. Its local
/// writes apply at once (observers fire on the writing thread, with a provisional version) and go
/// to the daemon as SETs and DELETEs, in order, one at a time; the daemon's answer gives each its
/// version. Remote changes come through a watch of the model's channel (filtered to the model)
/// and are applied by last-writer-wins against that version, with exact old and new values.
///
/// **Writes in flight.** While a write of a property waits for its answer, the watch's changes of
/// that property are held back, then merged once the answer gives the write its version: any
/// change the daemon applied before the write is older than it (the daemon's clock is past every
/// version it applied) and loses, a later one wins. So the model ends where the daemon does.
///
/// **Failover.** When the daemon does not answer (the watch's liveness ping times out, or the
/// watch ends), the model moves to the next endpoint of the client, resumes its watch there with
/// its replica — every change it had not seen, once — and sends again the writes that were not
/// answered. A write the dead daemon had applied is then written once more, with a new version:
/// if another client wrote the property in between, the resent value wins over it (as if the
/// app had written it again).
///
/// **Refused writes.** A write the daemon refuses (``StateSyncError/Code/remote``: a key without
/// write permission, a full disk), or does not apply (its values were current, or it holds newer
/// ones), is undone in the model: its properties take back what the watch's replica holds, and
/// observers are told. ``StateSyncClient/synchronize(_:)`` throws a refusal once.
///
/// **Threads.** Observers of remote changes run on a serial queue of the model's own, in apply
/// order; those of local writes on the writing thread, as with an embedded node. The client
/// stays alive while one of its models does.
final class ClientModels: Sendable {
    private let links = Mutex<(table: [ModelAddress: any ClientModelLinkProtocol], closed: Bool)>(([:], false))

    func link(for address: ModelAddress) -> (any ClientModelLinkProtocol)? {
        links.withLock { links in
            if let link = links.table[address], link.isAlive { return link }
            links.table[address] = nil
            return nil
        }
    }

    /// Registers `link` for `address` and returns it — or, when a live link got there first (a
    /// concurrent `model(...)` call), that one; or nil when the client is closed. A link not
    /// registered is closed.
    func insert(_ link: any ClientModelLinkProtocol, for address: ModelAddress) -> (any ClientModelLinkProtocol)? {
        let kept = links.withLock { links -> (any ClientModelLinkProtocol)? in
            if links.closed { return nil }
            if let existing = links.table[address], existing.isAlive { return existing }
            links.table[address] = link
            return link
        }
        if kept !== link { link.close() }
        return kept
    }

    /// The link of the live model `model`, if it is one of this client's.
    func linkHolding(_ model: AnyObject) -> (any ClientModelLinkProtocol)? {
        links.withLock { links in links.table.values.first { $0.holds(model) } }
    }

    func closeAll() {
        let all = links.withLock { links in
            defer {
                links.table.removeAll()
                links.closed = true
            }
            return Array(links.table.values)
        }
        for link in all { link.close() }
    }
}

protocol ClientModelLinkProtocol: AnyObject, Sendable {
    var isAlive: Bool { get }
    func holds(_ model: AnyObject) -> Bool
    func synchronize() async throws -> Version?
    func close()
}

/// A typed model's link to its daemons: the watch that brings remote changes, the queue of its
/// local writes, and the failover between endpoints.
final class ClientModelLink<Model: ReplicatedModel>: ClientModelLinkProtocol {
    /// One local write waiting for the daemon's answer.
    struct Outgoing: Sendable {
        let provisional: Version
        let writes: [PropertyWrite]
        /// Its place among the model's writes (1, 2, ...).
        let index: Int
        /// The properties it writes or deletes ("" for the whole model's deletion).
        var names: [String] { writes.map(\.name) }
    }

    struct State: Sendable {
        var queue: [Outgoing] = []
        /// Per property (and "" for the model's deletion), its writes waiting for an answer.
        var inFlight: [String: Int] = [:]
        /// Changes of properties with writes in flight, in the order the watch gave them.
        var heldBack: [PropertyChange] = []
        var written = 0
        var answered = 0
        var lastVersion: Version?
        /// Refusals not yet told to a ``synchronize()``, by the index of the write refused.
        var refusals: [(index: Int, error: StateSyncError)] = []
        var waiters: [(upTo: Int, continuation: CheckedContinuation<Version?, any Error>)] = []
        var closed = false
        var task: Task<Void, Never>?
        /// Wakes the sender of the current session (each session has its own: a stream whose
        /// waiting task is cancelled ends for good).
        var wake: AsyncStream<Void>.Continuation?
    }

    let address: ModelAddress
    let replica: ChannelReplica
    private let model = Mutex<WeakModel>(WeakModel())
    private let state = Mutex(State())
    /// Orders what reaches the model from the watch and from the answers: a change released
    /// after an answer never overtakes, or is overtaken by, one the watch gives meanwhile.
    /// Held only while values are applied; observers run on ``observers``, not under it.
    private let applying = Mutex(())
    /// Runs the model's observers for remote changes, in apply order (one serial queue per
    /// model, like a node's observer queue).
    private let observers = DispatchObserverExecutor(label: "statesync.client-model.observers")
    /// Gives local writes their provisional versions: past every version the model has seen.
    let clock: HybridLogicalClock
    private let endpoints: [String]
    private let connections: ClientConnections

    struct WeakModel: @unchecked Sendable {
        // Safe: only read and written under the `model` mutex; the model itself is Sendable.
        weak var value: Model?
    }

    init(address: ModelAddress, endpoints: [String], connections: ClientConnections) {
        self.address = address
        self.replica = ChannelReplica(channel: address.channel)
        self.endpoints = endpoints
        self.connections = connections
        self.clock = HybridLogicalClock(node: "client")
    }

    var isAlive: Bool {
        model.withLock { $0.value != nil } && !state.withLock { $0.closed }
    }

    var currentModel: Model? { model.withLock { $0.value } }

    func holds(_ object: AnyObject) -> Bool {
        model.withLock { $0.value.map { $0 === object } ?? false }
    }

    private var filter: ClientProtocol.WatchFilter {
        ClientProtocol.WatchFilter(prefix: address.model)
    }

    // MARK: - Start

    /// Opens the watch on the first endpoint that answers, waits for the initial state, and
    /// attaches `fresh` adopting it; then runs the link in the background.
    func start(_ fresh: Model) async throws {
        var lastError: (any Error)?
        for index in endpoints.indices {
            do {
                let client = try connections.client(at: index)
                let (events, _) = try await client.watch(channel: address.channel, replica: replica, filter: filter)
                // The initial state: the replica holds it once its end is verified — or, when an
                // earlier endpoint died mid-snapshot and this watch resumed, once it caught up.
                // (The stream is iterated on by the link later, by one task at a time.)
                for try await event in events {
                    switch event {
                    case .initialStateComplete, .resyncComplete, .caughtUp: break
                    default: continue
                    }
                    break
                }
                let records = replica.records(of: address.model)
                for register in records.values { clock.advance(past: register.version) }
                model.withLock { $0.value = fresh }
                fresh._$registrar.attach(fresh, adopting: records, binding: binding())
                let task = Task { [self] in await run(startingAt: index, events: events) }
                state.withLock { $0.task = task }
                return
            } catch {
                lastError = error
            }
        }
        throw lastError ?? StateSyncError(.connectionLost, "no daemon answered")
    }

    private func binding() -> ModelBinding {
        ModelBinding(
            address: address,
            stamp: { [clock] in clock.next() },
            emit: { [weak self] _, version, writes in self?.enqueue(version, writes) },
            discard: { _ in },
            reportEncodingFailure: { _, _ in })
    }

    /// Called by the model, under its lock, for every local write: only queues it.
    private func enqueue(_ version: Version, _ writes: [PropertyWrite]) {
        let wake = state.withLock { state -> AsyncStream<Void>.Continuation? in
            guard !state.closed else { return nil }
            state.written += 1
            let write = Outgoing(provisional: version, writes: writes, index: state.written)
            state.queue.append(write)
            for name in write.names { state.inFlight[name, default: 0] += 1 }
            return state.wake
        }
        wake?.yield()
    }

    // MARK: - Running

    /// Sessions, one per daemon in turn: the watch (resumed with the replica after the first)
    /// and the sender. A session ends when its watch does — the daemon died, restarted, or
    /// stopped answering its liveness pings — and the next endpoint is tried.
    private func run(startingAt first: Int, events: AsyncThrowingStream<WatchEvent, any Error>) async {
        var index = first
        var stream: AsyncThrowingStream<WatchEvent, any Error>? = events
        while !Task.isCancelled && isAlive {
            let opened = ContinuousClock.now
            do {
                let client = try connections.client(at: index)
                let events: AsyncThrowingStream<WatchEvent, any Error>
                if let stream {
                    events = stream
                } else {
                    (events, _) = try await client.watch(channel: address.channel, replica: replica, filter: filter)
                }
                stream = nil
                let (wakes, wake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
                state.withLock { $0.wake = wake }
                wake.yield()  // what is queued goes out at once
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask { [self] in try await consume(events) }
                    group.addTask { [self] in await send(through: client, wakes: wakes) }
                    // The watch ends the session (the sender never does: it retries on this
                    // connection until the watch says the daemon is gone).
                    try await group.next()
                    group.cancelAll()
                }
            } catch {
                if Task.isCancelled || !isAlive { break }
                index = (index + 1) % endpoints.count
            }
            stream = nil
            // A session that failed at once (no daemon answering): wait a little before the next.
            if ContinuousClock.now - opened < .seconds(1) { try? await Task.sleep(for: .milliseconds(200)) }
        }
        failWaiters(StateSyncError(.stopped, "the model \(address) is no longer linked"))
    }

    /// Applies the watch's changes of this model, holding back those of properties with writes
    /// in flight. Every event the watch yielded before it ended is taken: the replica has
    /// counted them, and the next daemon resumes after them.
    private func consume(_ events: AsyncThrowingStream<WatchEvent, any Error>) async throws {
        for try await event in events {
            // The model is gone (or the link closed): markers come periodically, so this ends soon.
            guard isAlive else { return }
            guard case .change(let change, _, _) = event, change.model == address.model else { continue }
            clock.advance(past: change.version)
            applying.withLock { _ in
                let held = state.withLock { state -> Bool in
                    let held = Self.isHeld(change, state)
                    if held { state.heldBack.append(change) }
                    return held
                }
                if !held { apply([change]) }
            }
        }
        throw StateSyncError(.connectionLost, "the watch of \(address.channel) ended")
    }

    private static func isHeld(_ change: PropertyChange, _ state: State) -> Bool {
        state.inFlight[change.property, default: 0] > 0 || state.inFlight["", default: 0] > 0
            || (change.byModelDeletion && !state.inFlight.isEmpty)
    }

    /// Sends the queued writes in order, one at a time, until cancelled. A request that gets no
    /// answer is sent again on this connection after a pause: if the daemon is gone, the watch
    /// ends the session first; if it is slow, the write may apply twice with the same value.
    private func send(through client: StateSyncClient, wakes: AsyncStream<Void>) async {
        var wakes = wakes.makeAsyncIterator()
        while !Task.isCancelled && isAlive {
            guard let next = state.withLock({ $0.queue.first }) else {
                if await wakes.next() == nil { return }
                continue
            }
            do {
                answered(next, result: try await client.write(address, next.writes), refusal: nil)
            } catch let error as StateSyncError where error.code == .remote {
                answered(next, result: nil, refusal: error)
            } catch {
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
    }

    /// The daemon answered `write`. Applied (`.changed`), it takes the daemon's version; refused,
    /// or not applied (`.unchanged`, `.superseded`: the daemon holds those values, or newer
    /// ones), the model takes back what the replica holds for it. Then the changes held back
    /// for its properties are merged.
    private func answered(_ write: Outgoing, result: StateSyncClient.SetResult?, refusal: StateSyncError?) {
        guard let model = model.withLock({ $0.value }) else { return }
        let ready = applying.withLock {
            _ -> [(CheckedContinuation<Version?, any Error>, Result<Version?, any Error>)] in
            if let result, result.outcome == .changed {
                clock.advance(past: result.version)
                model._$registrar.acknowledge(provisional: write.provisional, as: result.version)
            } else {
                if let result { clock.advance(past: result.version) }
                model._$registrar.revert(
                    model, provisional: write.provisional, to: replica.records(of: address.model),
                    notifyingOn: observers)
            }
            let (released, ready) = state.withLock { state in
                state.queue.removeFirst()
                state.answered += 1
                if let result, result.outcome == .changed { state.lastVersion = result.version }
                if let refusal { state.refusals.append((write.index, refusal)) }
                for name in write.names {
                    let count = state.inFlight[name, default: 0] - 1
                    state.inFlight[name] = count > 0 ? count : nil
                }
                var released: [PropertyChange] = []
                var kept: [PropertyChange] = []
                for change in state.heldBack {
                    if Self.isHeld(change, state) { kept.append(change) } else { released.append(change) }
                }
                state.heldBack = kept
                return (released, Self.takeReady(&state))
            }
            apply(released)
            return ready
        }
        for (continuation, result) in ready { continuation.resume(with: result) }
    }

    /// The waiters whose writes are all answered, with what each gets: the first refusal among
    /// its writes (told once), or the last version.
    private static func takeReady(
        _ state: inout State
    ) -> [(CheckedContinuation<Version?, any Error>, Result<Version?, any Error>)] {
        var ready: [(CheckedContinuation<Version?, any Error>, Result<Version?, any Error>)] = []
        state.waiters.sort { $0.upTo < $1.upTo }
        while let waiter = state.waiters.first, waiter.upTo <= state.answered {
            state.waiters.removeFirst()
            ready.append((waiter.continuation, outcome(upTo: waiter.upTo, &state)))
        }
        return ready
    }

    private static func outcome(upTo index: Int, _ state: inout State) -> Result<Version?, any Error> {
        guard let refused = state.refusals.firstIndex(where: { $0.index <= index }) else {
            return .success(state.lastVersion)
        }
        let error = state.refusals[refused].error
        state.refusals.removeAll { $0.index <= index }
        return .failure(error)
    }

    /// Applies changes the watch computed against the replica, in order, to the model; their
    /// observers run on ``observers``. (Caller holds ``applying``.)
    private func apply(_ changes: [PropertyChange]) {
        guard !changes.isEmpty, let model = model.withLock({ $0.value }) else { return }
        let sets = changes.map { change -> ModelRegistrar.RemoteWriteSet in
            switch change.kind {
            case .set:
                return .init(writes: [PropertyWrite(name: change.property, value: change.new)], version: change.version)
            case .deleted:
                return .init(
                    writes: [change.byModelDeletion ? .modelDeletion : .deletion(of: change.property)],
                    version: change.version)
            case .expired:
                return .init(
                    writes: [.deletion(of: change.property)], version: change.writtenVersion ?? change.version,
                    expiredAt: change.version)
            }
        }
        _ = model._$registrar.applyRemote(model, sets, notifyingOn: observers)
    }

    // MARK: - Waiting and closing

    /// Returns once every write made before the call has been answered: the last version the
    /// daemon gave (nil before the first write); throws the refusal of any of them.
    func synchronize() async throws -> Version? {
        // What the answers released, or undid, has reached the observers when this returns or
        // throws.
        let outcome: Result<Version?, any Error>
        do {
            outcome = .success(try await answers())
        } catch {
            outcome = .failure(error)
        }
        await observers.flush()
        return try outcome.get()
    }

    private func answers() async throws -> Version? {
        try await withCheckedThrowingContinuation { continuation in
            let immediate = state.withLock { state -> Result<Version?, any Error>? in
                if state.closed {
                    return .failure(StateSyncError(.stopped, "the model \(address) is no longer linked"))
                }
                if state.answered >= state.written { return Self.outcome(upTo: state.written, &state) }
                state.waiters.append((state.written, continuation))
                return nil
            }
            if let immediate { continuation.resume(with: immediate) }
        }
    }

    private func failWaiters(_ error: StateSyncError) {
        let waiters = state.withLock { state in
            defer { state.waiters.removeAll() }
            return state.waiters.map(\.continuation)
        }
        for waiter in waiters { waiter.resume(throwing: error) }
    }

    func close() {
        let (task, wake) = state.withLock { state in
            state.closed = true
            return (state.task, state.wake)
        }
        task?.cancel()
        wake?.finish()
        model.withLock { $0.value }?._$registrar.detach()
        failWaiters(StateSyncError(.stopped, "the model \(address) is no longer linked"))
    }
}

/// The connections typed models share: the client itself for its own endpoint, one more client
/// per failover endpoint, made when first needed.
final class ClientConnections: Sendable {
    private struct Owner: @unchecked Sendable {
        // Safe: only read and written under the `owner` mutex; the client is Sendable.
        weak var client: StateSyncClient?
    }
    private let owner = Mutex(Owner())
    private let failovers = Mutex<(clients: [Int: StateSyncClient], closed: Bool)>(([:], false))

    /// Set once, at the end of the owner's initialisation (weak: the owner holds this).
    func setOwner(_ client: StateSyncClient) {
        owner.withLock { $0.client = client }
    }

    func client(at index: Int) throws -> StateSyncClient {
        guard let owner = owner.withLock({ $0.client }) else {
            throw StateSyncError(.stopped, "the client is closed")
        }
        if index == 0 { return owner }
        return try failovers.withLock { failovers in
            if failovers.closed { throw StateSyncError(.stopped, "the client is closed") }
            if let existing = failovers.clients[index] { return existing }
            let client = try StateSyncClient(
                endpoint: owner.failoverEndpoints[index - 1], requestTimeout: owner.requestTimeout,
                security: owner.security)
            failovers.clients[index] = client
            return client
        }
    }

    func closeAll() {
        let all = failovers.withLock { failovers in
            defer {
                failovers.clients.removeAll()
                failovers.closed = true
            }
            return Array(failovers.clients.values)
        }
        for client in all { client.close() }
    }
}

extension StateSyncClient {
    /// The model of type `M` at `channel`/`id`, mirrored from the daemon: it starts with the
    /// daemon's state, its local writes go to the daemon (``synchronize(_:)`` waits for their
    /// answers), and remote changes reach its observers, `changes(of:)` streams and Observation
    /// tracking with exact old and new values, in the daemon's order — as with a model attached
    /// to an embedded node. With several endpoints (``init(endpoints:requestTimeout:security:)``)
    /// it fails over when its daemon dies: no change missed, none delivered twice.
    ///
    /// While an instance for the address is alive, the same instance is returned. A local
    /// write's change carries a provisional version (the daemon gives the real one when it takes
    /// the write); remote changes carry the daemon's.
    ///
    /// - Throws: ``StateSyncError`` for an invalid name, a live instance of another type at the
    ///   address, or when no daemon answers.
    public func model<M: ReplicatedModel>(_ type: M.Type, channel: String, id: String) async throws -> M {
        try Names.validateChannel(channel)
        try Names.validateModel(id)
        let address = ModelAddress(channel: channel, model: id)
        /// The live model of `link`, which must be of type `M`.
        func model(of link: any ClientModelLinkProtocol) throws -> M {
            guard let typed = link as? ClientModelLink<M>, let model = typed.currentModel else {
                throw StateSyncError(.modelTypeMismatch, "\(address) is already held by a live model of another type")
            }
            return model
        }
        if let existing = models.link(for: address) { return try model(of: existing) }
        let link = ClientModelLink<M>(
            address: address, endpoints: [endpoint] + failoverEndpoints, connections: connections)
        let fresh = M()  // (the link holds its model weakly: this is the reference that keeps it)
        try await link.start(fresh)
        guard let kept = models.insert(link, for: address) else {
            throw StateSyncError(.stopped, "the client for \(endpoint) is closed")
        }
        // A concurrent call for the same address may have linked its model first: that one it is.
        return kept === link ? fresh : try model(of: kept)
    }

    /// Waits until the daemon has answered every write `model` made before this call, and
    /// returns the version of the last one (nil if it has made none).
    ///
    /// - Throws: the daemon's refusal (``StateSyncError/Code/remote``) of one of those writes,
    ///   which the model has undone; ``StateSyncError/Code/stopped`` if the model is no longer
    ///   linked (the client was closed).
    @discardableResult
    public func synchronize<M: ReplicatedModel>(_ model: M) async throws -> Version? {
        guard let link = models.linkHolding(model) else {
            throw StateSyncError(.stopped, "the model is not linked to this client")
        }
        return try await link.synchronize()
    }
}
