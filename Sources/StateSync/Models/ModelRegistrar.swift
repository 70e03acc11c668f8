public import Observation
import Synchronization

/// Where a model attached to a node sends its local writes.
struct ModelBinding: Sendable {
    let address: ModelAddress
    let clock: HybridLogicalClock
    /// Hands a local write to the node. Called with the model's lock held, in version order; it
    /// must only enqueue.
    let emit: @Sendable (_ address: ModelAddress, _ version: Version, _ writes: [PropertyWrite]) -> Void
    /// Reports a property that could not be encoded for the wire.
    let reportEncodingFailure: @Sendable (_ property: String, _ error: any Error) -> Void
}

/// The engine behind every ``Replicated()`` model: one lock per model instance, exact old and new
/// values, one notification order, transactions, and the hook that turns writes into deltas.
///
/// The macro-generated accessors call into this type; all the semantics live here.
///
/// ## Where callbacks run
/// Observers never run while the model's lock is held. Changes are queued under the lock in apply
/// order; the thread that made a change and found no delivery in progress then delivers the queue
/// (its own change and any that other threads queue meanwhile) until it is empty. So a callback
/// runs on the writing thread, or on another writer's thread that was already delivering. For
/// remote changes the delivering thread is the node's observer queue (``ObserverExecutor``): the
/// node's I/O thread applies the values and moves on. A write made inside a callback is queued
/// and delivered after the current notification, by the same delivering thread.
///
/// Thread safety: every method may be called from any thread.
public final class ModelRegistrar: Sendable {
    struct Pending: Sendable {
        let change: ErasedChange
        let observers: [ObserverEntry]
    }

    struct State: Sendable {
        var versions: [String: Version] = [:]
        var pending: [Pending] = []
        var delivering = false
        var binding: ModelBinding?
    }

    struct Touched: Sendable {
        let index: Int
        let old: any Sendable
    }

    private let state = Mutex(State())
    private let observers = Mutex<(nextID: UInt64, byProperty: [String: [ObserverEntry]])>((1, [:]))
    /// The thread running a transaction on this model, or 0.
    private let transactionOwner = Atomic<UInt>(0)
    // Read and written only by the thread in `transactionOwner` while it holds `state`'s lock.
    nonisolated(unsafe) private var transactionLog: [Touched] = []
    // The property versions at the start of the running transaction; same guard as above.
    nonisolated(unsafe) private var transactionVersions: [String: Version] = [:]
    private let supersededWrites = Atomic<Int>(0)

    /// Local writes that did not apply because the property holds a version from a clock ahead
    /// of this one (beyond the drift bound): last-writer-wins kept the held value.
    public var supersededWriteCount: Int { supersededWrites.load(ordering: .relaxed) }
    /// Observation interop: `withObservationTracking` and SwiftUI see reads and writes.
    public let observationRegistrar = ObservationRegistrar()
    /// Unique in this process, never reused (unlike an `ObjectIdentifier`): tells a node which
    /// instance made a local write.
    let instanceID = ModelRegistrar.nextInstanceID.add(1, ordering: .relaxed).newValue
    private static let nextInstanceID = Atomic<UInt64>(0)

    /// The clock of models that are not attached to a node.
    static let standaloneClock = HybridLogicalClock(node: "local")

    public init() {}

    private var inTransactionOnThisThread: Bool {
        transactionOwner.load(ordering: .relaxed) == currentThreadID()
    }

    // MARK: - Accessors (called by macro-generated code)

    /// Reads a tracked property.
    public func read<Model: ReplicatedModel, T>(_ model: Model, _ property: ReplicatedProperty<Model, T>) -> T {
        observationRegistrar.access(model, keyPath: property.keyPath)
        if inTransactionOnThisThread { return property.get(model) }
        return state.withLock { _ in property.get(model) }
    }

    /// Reads a `@Local` property: under the lock, untracked.
    public func readLocal<Model: AnyObject, T>(_ model: Model, _ get: (Model) -> T) -> T {
        if inTransactionOnThisThread { return get(model) }
        var value: T?
        state.withLock { _ in value = get(model) }
        return value!
    }

    /// Writes a `@Local` property: under the lock, untracked, not replicated.
    public func writeLocal<Model: AnyObject>(_ model: Model, _ set: (Model) -> Void) {
        if inTransactionOnThisThread { return set(model) }
        state.withLock { _ in set(model) }
    }

    /// Writes a tracked property: applies it, stamps a version, queues its notification and (when
    /// attached to a node) its delta, then delivers notifications outside the lock.
    public func write<Model: ReplicatedModel, T>(
        _ model: Model, _ property: ReplicatedProperty<Model, T>, _ newValue: T
    ) {
        if inTransactionOnThisThread {
            let old = property.get(model)
            if let index = Model._$schema.index(of: property.name),
                !transactionLog.contains(where: { $0.index == index })
            {
                transactionLog.append(Touched(index: index, old: old))
            }
            property.set(model, newValue)
            return
        }
        let deliver = state.withLock { state -> Bool in
            let old = property.get(model)
            if property.same(old, newValue) { return false }
            let version = (state.binding?.clock ?? Self.standaloneClock).next()
            // A peer whose clock runs ahead beyond the drift bound may have written a version this
            // clock cannot pass yet: last-writer-wins says that write stands (as for a SET).
            if let held = state.versions[property.name], held >= version {
                supersededWrites.add(1, ordering: .relaxed)
                return false
            }
            property.set(model, newValue)
            state.versions[property.name] = version
            enqueue(
                &state,
                ErasedChange(property: property.name, old: old, new: newValue, version: version, isRemote: false))
            if let binding = state.binding {
                do {
                    let value = try ValueEncoder().encode(newValue)
                    binding.emit(binding.address, version, [PropertyWrite(name: property.name, value: value)])
                } catch {
                    binding.reportEncodingFailure(property.name, error)
                }
            }
            return claimDelivery(&state)
        }
        property.notifyObservation(model, registrar: observationRegistrar)
        if deliver { drain() }
    }

    // MARK: - Transactions

    /// Runs `body` with the model's lock held: reads and writes of `model` inside it see no other
    /// writer, and all its changes become one version, one delta and consecutive notifications.
    /// If `body` throws, every write it made is rolled back and nothing is notified.
    public func transaction<Model: ReplicatedModel, R, E: Error>(
        _ model: Model, _ body: (Model) throws(E) -> R
    ) throws(E) -> R {
        let schema = Model._$schema
        if inTransactionOnThisThread {
            // Nested: part of the outer transaction; if it throws, its own writes are undone
            // (the outer one may catch and go on).
            let mark = transactionLog.count
            let before = schema.properties.map { $0.currentValue(model) }
            do throws(E) {
                return try body(model)
            } catch {
                for (index, property) in schema.properties.enumerated() { property.restore(model, before[index]) }
                transactionLog.removeSubrange(mark...)
                throw error
            }
        }
        var result: R?
        var changedIndices: [Int] = []
        let deliver = try state.withLock { (state) throws(E) -> Bool in
            let me = currentThreadID()
            transactionOwner.store(me, ordering: .relaxed)
            transactionLog.removeAll(keepingCapacity: true)
            transactionVersions = state.versions
            defer {
                transactionLog.removeAll(keepingCapacity: true)
                transactionOwner.store(0, ordering: .relaxed)
            }
            do throws(E) {
                result = try body(model)
            } catch {
                for touched in transactionLog.reversed() {
                    schema.properties[touched.index].restore(model, touched.old)
                }
                throw error
            }
            let version = (state.binding?.clock ?? Self.standaloneClock).next()
            var changes: [(Int, any Sendable, any Sendable)] = []
            for touched in transactionLog {
                let property = schema.properties[touched.index]
                let new = property.currentValue(model)
                if property.sameErased(touched.old, new) { continue }
                if let held = state.versions[property.name], held >= version {
                    // Superseded by a version from a clock ahead of ours: the held value stands.
                    property.restore(model, touched.old)
                    supersededWrites.add(1, ordering: .relaxed)
                    continue
                }
                changes.append((touched.index, touched.old, new))
            }
            if changes.isEmpty { return false }
            var writes: [PropertyWrite] = []
            for (index, old, new) in changes {
                let property = schema.properties[index]
                state.versions[property.name] = version
                changedIndices.append(index)
                enqueue(
                    &state, ErasedChange(property: property.name, old: old, new: new, version: version, isRemote: false)
                )
                if let binding = state.binding {
                    do {
                        writes.append(PropertyWrite(name: property.name, value: try property.encodeErased(new)))
                    } catch {
                        binding.reportEncodingFailure(property.name, error)
                    }
                }
            }
            if let binding = state.binding, !writes.isEmpty {
                binding.emit(binding.address, version, writes)
            }
            return claimDelivery(&state)
        }
        for index in changedIndices {
            schema.properties[index].notifyObservation(model, registrar: observationRegistrar)
        }
        if deliver { drain() }
        return result!
    }

    // MARK: - Remote changes

    /// Outcome of applying remote writes to a model.
    struct RemoteApplyResult: Sendable {
        var applied = 0
        var stale = 0
        var unknownProperties: [String] = []
        var rejected: [(property: String, reason: String)] = []
    }

    /// One write set from a replica: a delta's properties with its version.
    struct RemoteWriteSet: Sendable {
        let writes: [PropertyWrite]
        let version: Version
        /// `false` for this node's own writes coming back (e.g. fetched after losing its log).
        var isRemote = true
    }

    /// Applies writes from a replica: each property whose version wins is decoded and stored, and
    /// its observers are notified (on the calling thread, outside the lock).
    func applyRemote<Model: ReplicatedModel>(
        _ model: Model, writes: [PropertyWrite], version: Version, isRemote: Bool = true
    ) -> RemoteApplyResult {
        applyRemote(model, [RemoteWriteSet(writes: writes, version: version, isRemote: isRemote)])
    }

    /// Applies several write sets in order, as one state transition: one lock, one look-up of each
    /// property's observers, one Observation notification per property, one delivery. Observers
    /// still get one change per write, in order, with exact old and new values.
    ///
    /// With `executor`, the values are applied now and the notifications (observers and
    /// Observation) run on the executor; without, on the calling thread before this returns.
    func applyRemote<Model: ReplicatedModel>(
        _ model: Model, _ sets: [RemoteWriteSet], notifyingOn executor: ObserverExecutor? = nil
    ) -> RemoteApplyResult {
        let schema = Model._$schema
        var result = RemoteApplyResult()
        var changed: [Bool] = []
        var queued = 0
        let deliver = state.withLock { state -> Bool in
            var observerLists: [[ObserverEntry]?] = Array(repeating: nil, count: schema.properties.count)
            changed = Array(repeating: false, count: schema.properties.count)
            for set in sets {
                for write in set.writes {
                    guard let index = schema.index(of: write.name) else {
                        result.unknownProperties.append(write.name)
                        continue
                    }
                    let slot = state.versions.index(forKey: write.name)  // one hash for the read and the write
                    if let slot, state.versions.values[slot] >= set.version {
                        result.stale += 1
                        continue
                    }
                    let property = schema.properties[index]
                    do {
                        if let slot {
                            state.versions.values[slot] = set.version
                        } else {
                            state.versions[write.name] = set.version
                        }
                        guard let (old, new) = try property.assign(model, from: write.value) else { continue }
                        result.applied += 1
                        changed[index] = true
                        if observerLists[index] == nil { observerLists[index] = observers(of: write.name) }
                        guard let list = observerLists[index], !list.isEmpty else { continue }
                        let change = ErasedChange(
                            property: write.name, old: old, new: new, version: set.version, isRemote: set.isRemote)
                        state.pending.append(Pending(change: change, observers: list))
                        queued += 1
                    } catch {
                        result.rejected.append((write.name, "\(error)"))
                    }
                }
            }
            return claimDelivery(&state)
        }
        let changedIndices = changed.indices.filter { changed[$0] }
        let notify: @Sendable () -> Void = { [self] in
            for index in changedIndices {
                schema.properties[index].notifyObservation(model, registrar: observationRegistrar)
            }
            if deliver { drain() }
        }
        if changedIndices.isEmpty && !deliver {
            return result
        } else if let executor {
            executor.run(weight: queued, notify)
        } else {
            notify()
        }
        return result
    }

    /// Attaches the model to a node: adopts the node's state for it silently (no notifications,
    /// no deltas) and from now on publishes local writes through `binding`.
    func attach<Model: ReplicatedModel>(
        _ model: Model, adopting registers: [String: ReplicaStore.Register], binding: ModelBinding
    ) {
        let schema = Model._$schema
        state.withLock { state in
            for (name, register) in registers {
                guard let property = schema.property(named: name) else { continue }
                // A value this model's type cannot hold keeps the initial value; a later write
                // of the right type still wins by version.
                _ = try? property.assign(model, from: register.value)
                state.versions[name] = register.version
            }
            state.binding = binding
        }
    }

    /// Detaches the model from its node; later writes stay local.
    func detach() {
        state.withLock { $0.binding = nil }
    }

    /// The version of each property that has one.
    public var propertyVersions: [String: Version] {
        if inTransactionOnThisThread { return transactionVersions }
        return state.withLock { $0.versions }
    }

    // MARK: - Observers

    /// Registers `callback` for changes of the property called `name`.
    @usableFromInline
    func addObserver(property name: String, _ callback: @escaping @Sendable (ErasedChange) -> Void) -> ObservationToken
    {
        let entry = observers.withLock { table in
            let entry = ObserverEntry(id: table.nextID, callback: callback)
            table.nextID += 1
            table.byProperty[name, default: []].append(entry)
            return entry
        }
        return ObservationToken { [weak self] in
            entry.cancelled.store(true, ordering: .releasing)
            self?.observers.withLock { table in
                table.byProperty[name]?.removeAll { $0 === entry }
            }
        }
    }

    // MARK: - Delivery

    private func enqueue(_ state: inout State, _ change: ErasedChange) {
        let list = observers(of: change.property)
        if list.isEmpty { return }
        state.pending.append(Pending(change: change, observers: list))
    }

    /// The observers registered for the property called `name`, now.
    private func observers(of name: String) -> [ObserverEntry] {
        observers.withLock { $0.byProperty[name] ?? [] }
    }

    /// Makes the caller the delivering thread if no delivery is running and there is work.
    private func claimDelivery(_ state: inout State) -> Bool {
        if state.delivering || state.pending.isEmpty { return false }
        state.delivering = true
        return true
    }

    /// Delivers queued notifications in order until the queue is empty.
    private func drain() {
        // Two buffers taking turns: the writers' queue and the batch being delivered, so a long
        // delivery (changes keep arriving) allocates no new queue per batch.
        var spare: [Pending] = []
        while true {
            var batch = state.withLock { state -> [Pending] in
                if state.pending.isEmpty {
                    state.delivering = false
                    return []
                }
                swap(&state.pending, &spare)
                return spare
            }
            spare = []
            if batch.isEmpty { return }
            for pending in batch {
                for observer in pending.observers where !observer.cancelled.load(ordering: .acquiring) {
                    observer.callback(pending.change)
                }
            }
            batch.removeAll(keepingCapacity: true)
            spare = batch
        }
    }
}
