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
/// **Failover.** When the daemon does not answer (a request or the watch's liveness ping times
/// out), the model moves to the next endpoint of the client, resumes its watch there with its
/// replica — every change it had not seen, once — and sends again the writes that were not
/// answered: a write the dead daemon had applied is applied once more with the same value, which
/// changes nothing that was not changed since.
///
/// **Refused writes.** A write the daemon refuses (``StateSyncError/Code/remote``: a key without
/// write permission, a full disk) is undone in the model: its properties take back what the
/// daemon holds, and observers are told. ``StateSyncClient/synchronize(_:)`` throws the refusal.
final class ClientModels: Sendable {
    private let links = Mutex<[ModelAddress: any ClientModelLinkProtocol]>([:])

    func link(for address: ModelAddress) -> (any ClientModelLinkProtocol)? {
        links.withLock { table in
            if let link = table[address], link.isAlive { return link }
            table[address] = nil
            return nil
        }
    }

    func insert(_ link: any ClientModelLinkProtocol, for address: ModelAddress) {
        links.withLock { $0[address] = link }
    }

    /// The link of the live model `model`, if it is one of this client's.
    func linkHolding(_ model: AnyObject) -> (any ClientModelLinkProtocol)? {
        links.withLock { table in table.values.first { $0.holds(model) } }
    }

    func closeAll() {
        let all = links.withLock { table in
            defer { table.removeAll() }
            return Array(table.values)
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
        /// The properties it writes or deletes ("" for the whole model's deletion).
        var names: [String] { writes.map(\.name) }
        var isDeletion: Bool { writes.allSatisfy(\.isDeletion) }
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
        var refusal: StateSyncError?
        var waiters: [(upTo: Int, continuation: CheckedContinuation<Version?, any Error>)] = []
        var closed = false
        var task: Task<Void, Never>?
        var wake: AsyncStream<Void>.Continuation?
    }

    let address: ModelAddress
    let replica: ChannelReplica
    private let model = Mutex<WeakModel>(WeakModel())
    private let state = Mutex(State())
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
                let (events, _) = try await client.watch(
                    channel: address.channel, replica: replica, filter: filter)
                // The initial state: the replica holds it once its end is verified. (The stream
                // is iterated on by the link later, by one task at a time.)
                for try await event in events {
                    if case .initialStateComplete = event { break }
                }
                let registers = replica.properties(of: address.model)
                for register in registers.values { clock.advance(past: register.version) }
                model.withLock { $0.value = fresh }
                fresh._$registrar.attach(fresh, adopting: registers, binding: binding())
                let (wakeStream, wake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
                let task = Task { [self] in
                    await run(startingAt: index, events: events, wake: wakeStream)
                }
                state.withLock {
                    $0.task = task
                    $0.wake = wake
                }
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
            emit: { [weak self] _, version, writes in self?.enqueue(Outgoing(provisional: version, writes: writes)) },
            discard: { _ in },
            reportEncodingFailure: { _, _ in })
    }

    /// Called by the model, under its lock, for every local write: only queues it.
    private func enqueue(_ write: Outgoing) {
        let wake = state.withLock { state -> AsyncStream<Void>.Continuation? in
            guard !state.closed else { return nil }
            state.queue.append(write)
            state.written += 1
            for name in write.names { state.inFlight[name, default: 0] += 1 }
            return state.wake
        }
        wake?.yield()
    }

    // MARK: - Running

    private func run(
        startingAt first: Int, events: AsyncThrowingStream<WatchEvent, any Error>, wake: AsyncStream<Void>
    ) async {
        var index = first
        var stream: AsyncThrowingStream<WatchEvent, any Error>? = events
        var failures = 0
        while !Task.isCancelled && isAlive {
            do {
                let client = try connections.client(at: index)
                let events: AsyncThrowingStream<WatchEvent, any Error>
                if let stream {
                    events = stream
                } else {
                    (events, _) = try await client.watch(channel: address.channel, replica: replica, filter: filter)
                }
                failures = 0
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask { [self] in try await consume(events) }
                    group.addTask { [self] in try await send(through: client, wake: wake) }
                    // The first to end (an error: the daemon is gone) ends the other.
                    try await group.next()
                    group.cancelAll()
                }
            } catch {
                if Task.isCancelled || !isAlive { break }
                failures += 1
                // The next daemon; after a whole round without an answer, wait a little.
                index = (index + 1) % endpoints.count
                if failures % endpoints.count == 0 { try? await Task.sleep(for: .milliseconds(200)) }
            }
            stream = nil
        }
        failWaiters(StateSyncError(.stopped, "the model \(address) is no longer linked"))
    }

    /// Applies the watch's changes of this model, holding back those of properties with writes
    /// in flight.
    private func consume(_ events: AsyncThrowingStream<WatchEvent, any Error>) async throws {
        for try await event in events {
            // The model is gone (or the link closed): markers come periodically, so this ends soon.
            guard isAlive else { return }
            guard case .change(let change, _, _) = event, change.model == address.model else { continue }
            clock.advance(past: change.version)
            let apply = state.withLock { state -> Bool in
                let held =
                    state.inFlight[change.property, default: 0] > 0
                    || (state.inFlight["", default: 0] > 0) || (change.byModelDeletion && !state.inFlight.isEmpty)
                if held { state.heldBack.append(change) }
                return !held
            }
            if apply { self.apply([change]) }
        }
        throw StateSyncError(.connectionLost, "the watch of \(address.channel) ended")
    }

    /// Sends the queued writes in order, one at a time, until cancelled or the daemon fails.
    private func send(through client: StateSyncClient, wake: AsyncStream<Void>) async throws {
        var wakes = wake.makeAsyncIterator()
        while !Task.isCancelled && isAlive {
            guard let next = state.withLock({ $0.queue.first }) else {
                _ = await wakes.next()
                continue
            }
            do {
                let result: StateSyncClient.SetResult
                if next.writes.contains(where: \.isModelDeletion) {
                    result = try await client.delete(address)
                } else if next.isDeletion {
                    result = try await client.delete(address, properties: next.names)
                } else {
                    result = try await client.set(address, next.writes)
                }
                answered(next, version: result.version, refusal: nil)
            } catch let error as StateSyncError where error.code == .remote {
                answered(next, version: nil, refusal: error)
            }
        }
    }

    /// The daemon answered `write`: it takes the daemon's version (or, refused, is undone), and
    /// the changes held back for its properties are merged now.
    private func answered(_ write: Outgoing, version: Version?, refusal: StateSyncError?) {
        guard let model = model.withLock({ $0.value }) else { return }
        if let version {
            clock.advance(past: version)
            model._$registrar.acknowledge(provisional: write.provisional, as: version)
        } else {
            model._$registrar.revert(
                model, provisional: write.provisional, to: replica.properties(of: address.model))
        }
        let (released, ready) = state.withLock {
            state -> ([PropertyChange], [CheckedContinuation<Version?, any Error>]) in
            state.queue.removeFirst()
            state.answered += 1
            if let version { state.lastVersion = version }
            if let refusal { state.refusal = refusal }
            for name in write.names {
                let count = state.inFlight[name, default: 0] - 1
                state.inFlight[name] = count > 0 ? count : nil
            }
            var released: [PropertyChange] = []
            var kept: [PropertyChange] = []
            for change in state.heldBack {
                let held =
                    state.inFlight[change.property, default: 0] > 0 || state.inFlight["", default: 0] > 0
                    || (change.byModelDeletion && !state.inFlight.isEmpty)
                if held { kept.append(change) } else { released.append(change) }
            }
            state.heldBack = kept
            var ready: [CheckedContinuation<Version?, any Error>] = []
            state.waiters.removeAll { waiter in
                guard waiter.upTo <= state.answered else { return false }
                ready.append(waiter.continuation)
                return true
            }
            return (released, ready)
        }
        apply(released)
        // A refusal is told to the waiters it finds, or else to the next synchronize.
        let outcome = state.withLock { state in
            defer { if !ready.isEmpty { state.refusal = nil } }
            return (state.lastVersion, state.refusal)
        }
        for continuation in ready {
            if let refusal = outcome.1 {
                continuation.resume(throwing: refusal)
            } else {
                continuation.resume(returning: outcome.0)
            }
        }
    }

    /// Applies changes the watch computed against the replica, in order, to the model.
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
        _ = model._$registrar.applyRemote(model, sets)
    }

    // MARK: - Waiting and closing

    /// Returns once every write made before the call has been answered: the last version the
    /// daemon gave (nil before the first write); throws the refusal of any of them.
    func synchronize() async throws -> Version? {
        try await withCheckedThrowingContinuation { continuation in
            let immediate = state.withLock { state -> Result<Version?, any Error>? in
                if state.closed {
                    return .failure(StateSyncError(.stopped, "the model \(address) is no longer linked"))
                }
                if state.answered >= state.written {
                    defer { state.refusal = nil }
                    return state.refusal.map { .failure($0) } ?? .success(state.lastVersion)
                }
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
    private let failovers = Mutex<[Int: StateSyncClient]>([:])

    /// Set once, at the end of the owner's initialisation (weak: the owner holds this).
    func setOwner(_ client: StateSyncClient) {
        owner.withLock { $0.client = client }
    }

    func client(at index: Int) throws -> StateSyncClient {
        guard let owner = owner.withLock({ $0.client }) else {
            throw StateSyncError(.stopped, "the client is closed")
        }
        if index == 0 { return owner }
        return try failovers.withLock { table in
            if let existing = table[index] { return existing }
            let client = try StateSyncClient(
                endpoint: owner.failoverEndpoints[index - 1], requestTimeout: owner.requestTimeout,
                security: owner.security)
            table[index] = client
            return client
        }
    }

    func closeAll() {
        let all = failovers.withLock { table in
            defer { table.removeAll() }
            return Array(table.values)
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
        if let existing = models.link(for: address) {
            guard let link = existing as? ClientModelLink<M>, let model = link.currentModel else {
                throw StateSyncError(.modelTypeMismatch, "\(address) is already held by a live model of another type")
            }
            return model
        }
        let link = ClientModelLink<M>(
            address: address, endpoints: [endpoint] + failoverEndpoints, connections: connections)
        let fresh = M()
        try await link.start(fresh)
        models.insert(link, for: address)
        return fresh
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
