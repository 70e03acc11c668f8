public import Observation
import Synchronization

/// Where a model attached to a node sends its local writes. A class: the registrar reaches it on
/// every write, and copying it out of the model's state is one retain, not one per closure.
package final class ModelBinding: Sendable {
    package let address: ModelAddress
    /// Stamps a version for a write from the node's clock. The node holds it as in flight until
    /// ``emit`` hands the write over or ``discard`` says there is none: until then it never
    /// claims, in the floor its HEARTBEATs carry, that no delta at or below it will come
    /// (docs/PROTOCOL.md 8.4).
    package let stamp: @Sendable () -> Version
    /// Hands a local write at a stamped version to the node. Called with the model's lock held,
    /// in version order; it must only enqueue.
    package let emit: @Sendable (_ address: ModelAddress, _ version: Version, _ writes: [PropertyWrite]) -> Void
    /// A stamped version makes no write after all (superseded, or nothing could be encoded).
    package let discard: @Sendable (_ version: Version) -> Void
    /// Reports a property that could not be encoded for the wire.
    package let reportEncodingFailure: @Sendable (_ property: String, _ error: any Error) -> Void
    /// Called by a thread that emitted a write, once it holds no lock of the model: returns when
    /// the node's queue of local writes has room (a writer must not outrun its node without bound).
    package let pace: @Sendable () -> Void
    /// The node's queue of local writes and the model's id for it (``LocalWrite/emitter``), for
    /// a model attached to a node in this process: a write whose value encodes stamps its
    /// version and queues itself there under one lock
    /// (``LocalWriteQueue/stampAndEnqueue(_:floor:write:emitter:)``) instead of calling
    /// ``stamp`` and then ``emit``.
    let localWrites: (queue: LocalWriteQueue, emitter: UInt64)?

    /// Stamps and queues `write` on ``localWrites`` (which the binding has) under the queue's one
    /// lock: ``LocalWriteQueue/stampAndEnqueue(_:floor:write:emitter:)`` for this model.
    func stampAndEnqueue(floor: Version?, write: PropertyWrite) -> Version? {
        localWrites!.queue.stampAndEnqueue(address, floor: floor, write: write, emitter: localWrites!.emitter)
    }

    package convenience init(
        address: ModelAddress, stamp: @escaping @Sendable () -> Version,
        emit: @escaping @Sendable (_ address: ModelAddress, _ version: Version, _ writes: [PropertyWrite]) -> Void,
        discard: @escaping @Sendable (_ version: Version) -> Void,
        reportEncodingFailure: @escaping @Sendable (_ property: String, _ error: any Error) -> Void,
        pace: @escaping @Sendable () -> Void = {}
    ) {
        self.init(
            address: address, localWrites: nil, stamp: stamp, emit: emit, discard: discard,
            reportEncodingFailure: reportEncodingFailure, pace: pace)
    }

    /// A binding to a node's queue of local writes (`localWrites`, with the model's `emitter`
    /// id): single-property writes go to it directly, the others through `stamp` and `emit`.
    init(
        address: ModelAddress, localWrites: (queue: LocalWriteQueue, emitter: UInt64)?,
        stamp: @escaping @Sendable () -> Version,
        emit: @escaping @Sendable (_ address: ModelAddress, _ version: Version, _ writes: [PropertyWrite]) -> Void,
        discard: @escaping @Sendable (_ version: Version) -> Void,
        reportEncodingFailure: @escaping @Sendable (_ property: String, _ error: any Error) -> Void,
        pace: @escaping @Sendable () -> Void
    ) {
        self.address = address
        self.stamp = stamp
        self.emit = emit
        self.discard = discard
        self.reportEncodingFailure = reportEncodingFailure
        self.pace = pace
        self.localWrites = localWrites
    }
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
/// ## Observation
/// Observation's notifications (what `withObservationTracking`'s `onChange` and SwiftUI react to)
/// travel in the same queue as the observers' changes: they are sent **after** the change is
/// applied (a read in `onChange` sees the new value, or a later one), by the one thread that
/// delivers the model's queue, for local and remote writes alike. Because one thread at a time
/// sends them, a tracking's `onChange` runs once, however many threads write: the first
/// notification cancels the tracking before the next one is sent. A write that changes nothing
/// (an equal value, or one that loses last-writer-wins) sends nothing.
///
/// Thread safety: every method may be called from any thread.
public final class ModelRegistrar: Sendable {
    /// One entry of the delivery queue.
    enum Notice: Sendable {
        /// A change for the observers registered when it was applied.
        case change(ErasedChange, [ObserverEntry])
        /// Observation's willSet/didSet for the tracked property at this schema index.
        case observation(Int)
        /// Observation's willSet/didSet for ``ReplicatedModel/isDeleted``.
        case deletionObservation
    }

    /// Per-property records are kept by schema index, not by name: a write, a remote apply and
    /// an observer look-up index an array instead of hashing the property's name.
    struct State: Sendable {
        /// By schema index (sized by ``prepare(_:)``): the version of each property that has one.
        var versions: [Version?] = []
        /// The version of the model's last deletion: every property written below it is deleted.
        var deletion: Version?
        /// By schema index: the property has a version but no value (deleted, or expired): it
        /// holds its initial value.
        var removed: [Bool] = []
        /// How many entries of ``removed`` are set; most models have none, and then no write
        /// looks at the array.
        var removedCount = 0
        /// The property names, by schema index (for ``ModelRegistrar/propertyVersions``).
        var names: [String] = []
        /// The model was deleted (or lost its last value) and no write gave it a value since.
        var isDeleted = false
        var pending: [Notice] = []
        var delivering = false
        var binding: ModelBinding?

        /// Sizes the per-property records for the model's schema; the first call only (a
        /// registrar belongs to one model instance, so the schema never changes).
        mutating func prepare<Model>(_ schema: ModelSchema<Model>) {
            guard names.count != schema.names.count else { return }
            versions = Array(repeating: nil, count: schema.names.count)
            removed = Array(repeating: false, count: schema.names.count)
            removedCount = 0
            names = schema.names
        }

        /// The version a write must exceed to change the property at `index`.
        func floor(of index: Int) -> Version? {
            guard let deletion else { return versions[index] }
            return max(versions[index] ?? deletion, deletion)
        }

        /// Whether the property at `index` has a version but no value.
        func isRemoved(_ index: Int) -> Bool { removedCount > 0 && removed[index] }

        /// Marks the property at `index` as holding no value (`true`) or a value (`false`).
        mutating func setRemoved(_ index: Int, _ isRemoved: Bool) {
            if !isRemoved && removedCount == 0 { return }
            guard removed[index] != isRemoved else { return }
            removed[index] = isRemoved
            removedCount += isRemoved ? 1 : -1
        }

        /// Whether the property at `index` holds a written value.
        func hasValue(_ index: Int) -> Bool {
            guard let version = versions[index], !isRemoved(index) else { return false }
            return deletion.map { version > $0 } ?? true
        }

        /// Whether any property of the model holds a written value.
        var anyValue: Bool { versions.indices.contains { hasValue($0) } }

        /// The version of each property that has one, by name.
        var versionsByName: [String: Version] {
            var byName: [String: Version] = [:]
            for (index, version) in versions.enumerated() {
                if let version { byName[names[index]] = version }
            }
            return byName
        }
    }

    struct Touched: Sendable {
        let index: Int
        let old: any Sendable
    }

    private let state = Mutex(State())
    /// The observers, by the schema index of the property they watch.
    private let observers = ObserverTable()
    /// Whether an observer was ever registered: until then a write looks up none (no lock).
    private let everObserved = Atomic<Bool>(false)
    /// The thread running a transaction on this model, or 0.
    private let transactionOwner = Atomic<UInt>(0)
    // Read and written only by the thread in `transactionOwner` while it holds `state`'s lock.
    // `@exclusivity(unchecked)`: no two accesses overlap either — each is one read, append or
    // removal, never one held across the app's code (the body's writes append between them) —
    // and the runtime check of a class's stored property (`swift_beginAccess`) ran on every
    // assignment inside a transaction.
    @exclusivity(unchecked) nonisolated(unsafe) private var transactionLog: [Touched] = []
    // The property names and versions (by schema index) while the running transaction's body
    // runs, for ``propertyVersions``; same guards as above. Emptied before the transaction stores
    // its versions, so the array is never copied.
    @exclusivity(unchecked) nonisolated(unsafe) private var transactionVersions:
        (names: [String], versions: [Version?]) = ([], [])
    private let supersededWrites = Atomic<Int>(0)
    /// ``State/isDeleted``, readable without the lock (also inside a transaction, which holds it).
    /// Sequentially consistent, as ``observationReached`` is: see ``noteObservationReached()``.
    private let deletedFlag = Atomic<Bool>(false)
    /// Whether Observation may be watching this model: something read a tracked property or
    /// ``isDeleted(_:)`` (each tells the registrar of the access, which is how
    /// `withObservationTracking` and SwiftUI start watching), or took ``observationRegistrar``.
    /// Until then no one can be, and writes tell the registrar nothing: its `willSet` and
    /// `didSet` for every set were a fifth of a writing thread's samples (issue #17).
    private let observationReached = Atomic<Bool>(false)

    /// Local writes that did not apply because the property holds a version from a clock ahead
    /// of this one (beyond the drift bound): last-writer-wins kept the held value.
    public var supersededWriteCount: Int { supersededWrites.load(ordering: .relaxed) }
    /// Observation interop: `withObservationTracking` and SwiftUI see reads and writes.
    public var observationRegistrar: ObservationRegistrar {
        noteObservationReached()
        return observationInterop
    }
    private let observationInterop = ObservationRegistrar()
    /// Unique in this process, never reused (unlike an `ObjectIdentifier`): tells a node which
    /// instance made a local write.
    let instanceID = ModelRegistrar.nextInstanceID.add(1, ordering: .relaxed).newValue
    private static let nextInstanceID = Atomic<UInt64>(0)

    /// The clock of models that are not attached to a node.
    static let standaloneClock = HybridLogicalClock(node: "local")

    /// A registrar for one model instance (the macro makes one per instance).
    public init() {}

    deinit {
        // The model is gone: observers still registered end (an `AsyncStream` of changes
        // finishes), and their closures are released with them, even where a token (which holds
        // the table) is kept.
        for entry in observers.removeAll() where !entry.isCancelled { entry.onEnd?() }
    }

    /// Notes that Observation may watch the model from now on (``observationReached``); called
    /// before the registrar is told of an access. Sequentially consistent (a plain load on x86
    /// once set), with the write side's load and ``deletedFlag``: a reader that notes the access,
    /// then reads a value a writer has not stored yet, is seen by that writer's later check, so
    /// it is told of the change. (A tracked property's read and write are also ordered by the
    /// model's lock; ``isDeleted(_:)`` reads without it.)
    @inline(__always) private func noteObservationReached() {
        if !observationReached.load(ordering: .sequentiallyConsistent) {
            observationReached.store(true, ordering: .sequentiallyConsistent)
        }
    }

    private var inTransactionOnThisThread: Bool {
        transactionOwner.load(ordering: .relaxed) == currentThreadID()
    }

    // MARK: - Accessors (called by macro-generated code)

    /// Reads a tracked property.
    public func read<Model: ReplicatedModel, T>(_ model: Model, _ property: ReplicatedProperty<Model, T>) -> T {
        noteObservationReached()
        observationInterop.access(model, keyPath: property.keyPath)
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

    /// Writes a tracked property: applies it, stamps a version, queues its notifications and
    /// (when attached to a node) its delta, then delivers notifications outside the lock. An equal
    /// value, or a write that loses last-writer-wins, changes nothing and notifies nothing. When
    /// the node's queue of local writes is full, returns once the node has taken them (the
    /// thread holds no lock of the model meanwhile).
    public func write<Model: ReplicatedModel, T>(
        _ model: Model, _ property: ReplicatedProperty<Model, T>, _ newValue: T
    ) {
        if inTransactionOnThisThread {
            let old = property.get(model)
            if !transactionLog.contains(where: { $0.index == property.index }) {
                transactionLog.append(Touched(index: property.index, old: old))
            }
            property.set(model, newValue)
            return
        }
        var emittedTo: ModelBinding?
        let claimed = state.withLock { state -> [Notice]? in
            let index = property.index
            if state.versions.count <= index {
                state.prepare(Model._$schema)
                precondition(index < state.versions.count, "\(property.name) is not in \(Model.self)'s schema")
            }
            let old = property.get(model)
            // An equal value changes nothing, unless the property has no value (deleted): then
            // writing its initial value gives it one.
            if property.same(old, newValue), state.hasValue(index) || state.versions[index] == nil {
                return nil
            }
            // A peer whose clock runs ahead beyond the drift bound may have written a version this
            // clock cannot pass yet: last-writer-wins says that write stands (as for a SET).
            let floor = state.floor(of: index)
            let version: Version
            var queued = false
            // The binding and its queue used where they lie, in the state (bound to names of their
            // own, each was a retain and a release per set; issue #17).
            if state.binding?.localWrites != nil, let value = try? ValueEncoder().encode(newValue) {
                // Stamped and queued under the queue's one lock (a value that does not encode
                // takes the path below, which reports it).
                guard
                    let stamped = state.binding!.stampAndEnqueue(
                        floor: floor, write: PropertyWrite(name: property.name, value: value))
                else {
                    supersededWrites.add(1, ordering: .relaxed)
                    return nil
                }
                version = stamped
                queued = true
                // Paced only when the queue is over its limit: holding the binding and calling its
                // closure cost every set two atomic reference counts and their releases (issue
                // #17). `pace` checks again, outside the lock.
                if state.binding!.localWrites!.queue.isOverLimit { emittedTo = state.binding }
            } else {
                version = state.binding?.stamp() ?? Self.standaloneClock.next()
                if let floor, floor >= version {
                    state.binding?.discard(version)
                    supersededWrites.add(1, ordering: .relaxed)
                    return nil
                }
            }
            property.set(model, newValue)
            state.versions[index] = version
            state.setRemoved(index, false)
            noteValue(&state)
            state.pending.append(.observation(index))
            enqueue(
                &state, index,
                ErasedChange(property: property.name, old: old, new: newValue, version: version, isRemote: false))
            if !queued, let binding = state.binding {
                do {
                    let value = try ValueEncoder().encode(newValue)
                    binding.emit(binding.address, version, [PropertyWrite(name: property.name, value: value)])
                    emittedTo = binding
                } catch {
                    binding.discard(version)
                    binding.reportEncodingFailure(property.name, error)
                }
            }
            return claimBatch(&state)
        }
        // Consumed, the optional and its payload: drain must hold the only reference to the batch.
        if let batch = consume claimed { drain(model, startingWith: consume batch) }
        emittedTo?.pace()
    }

    /// Runs `body` with the model's lock held and every read inside it consistent with the others
    /// (no writer in between); for encoding a whole model (`Codable`). `body` must not write.
    public func consistentRead<Model: ReplicatedModel, R, E: Error>(
        _ model: Model, _ body: (Model) throws(E) -> R
    ) throws(E) -> R {
        if inTransactionOnThisThread { return try body(model) }
        return try state.withLock { (state) throws(E) -> R in
            transactionOwner.store(currentThreadID(), ordering: .relaxed)
            transactionVersions = (state.names, state.versions)
            HeldModelLocks.enter()
            defer {
                HeldModelLocks.leave()
                transactionVersions = ([], [])
                transactionOwner.store(0, ordering: .relaxed)
            }
            return try body(model)
        }
    }

    // MARK: - Transactions

    /// Runs `body` with the model's lock held: reads and writes of `model` inside it see no other
    /// writer, and all its changes become one version, one delta and consecutive notifications.
    /// If `body` throws, every write it made is rolled back and nothing is notified.
    public func transaction<Model: ReplicatedModel, R, E: Error>(
        _ model: Model, _ body: (Model) throws(E) -> R
    ) throws(E) -> R {
        try transaction(model, timeToLive: 0, body)
    }

    /// Runs `body` as ``transaction(_:_:)``; with `timeToLive` (milliseconds, above 0) every
    /// property it assigns — also to an equal value — is written to expire that long after the
    /// transaction's version: the attached node deletes it on every replica then.
    public func transaction<Model: ReplicatedModel, R, E: Error>(
        _ model: Model, timeToLive: UInt64, _ body: (Model) throws(E) -> R
    ) throws(E) -> R {
        let schema = Model._$schema
        if inTransactionOnThisThread {
            // Nested: part of the outer transaction; if it throws, its own writes are undone
            // (the outer one may catch and go on).
            let mark = transactionLog.count
            let before = schema.access.map { $0.currentValue(of: model) }
            do throws(E) {
                return try body(model)
            } catch {
                for (index, property) in schema.access.enumerated() { property.restore(model, to: before[index]) }
                transactionLog.removeSubrange(mark...)
                throw error
            }
        }
        var result: R?
        var emittedTo: ModelBinding?
        let claimed = try state.withLock { (state) throws(E) -> [Notice]? in
            let me = currentThreadID()
            transactionOwner.store(me, ordering: .relaxed)
            transactionLog.removeAll(keepingCapacity: true)
            state.prepare(schema)
            transactionVersions = (state.names, state.versions)
            HeldModelLocks.enter()
            defer {
                HeldModelLocks.leave()
                transactionLog.removeAll(keepingCapacity: true)
                transactionOwner.store(0, ordering: .relaxed)
            }
            do throws(E) {
                result = try body(model)
                transactionVersions = ([], [])
            } catch {
                transactionVersions = ([], [])
                for touched in transactionLog.reversed() {
                    schema.access[touched.index].restore(model, to: touched.old)
                }
                throw error
            }
            // The schema's `access`, not its `properties`: see ErasedPropertyAccess.
            let access = schema.access
            var touched: [Touched] = []
            touched.reserveCapacity(transactionLog.count)
            for entry in transactionLog {
                // With a time to live every assignment is a write (it renews the expiry), and a
                // property without a value gets one even when assigned its initial value.
                if timeToLive > 0 || access[entry.index].differs(model, from: entry.old)
                    || (!state.hasValue(entry.index) && state.versions[entry.index] != nil)
                {
                    touched.append(entry)
                }
            }
            if touched.isEmpty { return nil }  // no version for a transaction that changed nothing
            let version = state.binding?.stamp() ?? Self.standaloneClock.next()
            var writes: [PropertyWrite] = []
            if state.binding != nil { writes.reserveCapacity(touched.count) }
            var changed = false
            for entry in touched {
                let index = entry.index
                let property = access[index]
                if let held = state.floor(of: index), held >= version {
                    // Superseded by a version from a clock ahead of ours: the held value stands.
                    property.restore(model, to: entry.old)
                    supersededWrites.add(1, ordering: .relaxed)
                    continue
                }
                changed = true
                state.versions[index] = version
                state.setRemoved(index, false)
                state.pending.append(.observation(index))
                let name = state.names[index]
                enqueue(
                    &state, index,
                    ErasedChange(
                        property: name, old: entry.old, new: property.currentValue(of: model), version: version,
                        isRemote: false))
                if let binding = state.binding {
                    do {
                        writes.append(
                            PropertyWrite(
                                name: name, value: try property.encodeCurrent(of: model), timeToLive: timeToLive))
                    } catch {
                        binding.reportEncodingFailure(name, error)
                    }
                }
            }
            if let binding = state.binding {
                if changed && !writes.isEmpty {
                    binding.emit(binding.address, version, writes)
                    emittedTo = binding
                } else {
                    binding.discard(version)
                }
            }
            if !changed { return nil }
            noteValue(&state)
            return claimBatch(&state)
        }
        // Consumed, the optional and its payload: drain must hold the only reference to the batch.
        if let batch = consume claimed { drain(model, startingWith: consume batch) }
        emittedTo?.pace()
        return result!
    }

    // MARK: - Remote changes

    /// Outcome of applying remote writes to a model.
    package struct RemoteApplyResult: Sendable {
        var applied = 0
        var stale = 0
        var unknownProperties: [String] = []
        var rejected: [(property: String, reason: String)] = []
    }

    /// One write set from a replica: a delta's properties with its version; or, with
    /// `expiredAt`, the expiry of the values its properties were written at `version`.
    package struct RemoteWriteSet: Sendable {
        // Every field a constant: with `var` fields, making a set (in `NodeMachine.deliver`) built
        // it twice and copied one into place, two more atomic reference counts and their releases
        // per set (issue #17).
        let writes: PropertyWrites
        let version: Version
        /// `false` for this node's own writes coming back (e.g. fetched after losing its log).
        let isRemote: Bool
        /// The ``instanceID`` of the model that made the write (0: none): that model holds it
        /// already and skips it.
        let emitter: UInt64
        /// For an expiry: the version it happened at (the writes name the properties whose values
        /// written at `version` expired).
        let expiredAt: Version?

        package init(
            writes: [PropertyWrite], version: Version, isRemote: Bool = true, emitter: UInt64 = 0,
            expiredAt: Version? = nil
        ) {
            self.init(
                writes: PropertyWrites(writes), version: version, isRemote: isRemote, emitter: emitter,
                expiredAt: expiredAt)
        }

        /// A set of a delta's writes as they are (no copy).
        package init(
            writes: PropertyWrites, version: Version, isRemote: Bool = true, emitter: UInt64 = 0,
            expiredAt: Version? = nil
        ) {
            self.writes = writes
            self.version = version
            self.isRemote = isRemote
            self.emitter = emitter
            self.expiredAt = expiredAt
        }
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
    /// still get one change per write, in order, with exact old and new values. A deletion (of a
    /// property, or of the whole model) or an expiry resets a property to its initial value and
    /// is reported as such (``Change/kind``).
    ///
    /// With `executor`, the values are applied now and the notifications (observers and
    /// Observation) run on the executor; without, on the calling thread before this returns —
    /// unless another thread is delivering this model's notifications, which then delivers these
    /// too, in order.
    package func applyRemote<Model: ReplicatedModel>(
        _ model: Model, _ sets: [RemoteWriteSet], notifyingOn executor: (any ObserverExecutor)? = nil
    ) -> RemoteApplyResult {
        let schema = Model._$schema
        var apply = RemoteApply(count: schema.properties.count)
        // Room for a notification per write and the Observation notices after them (one per
        // property changed, and one for isDeleted), taken at the first (see RemoteApply.notify);
        // a model's deletion, which may reset every property, grows the queue as it goes.
        var writes = 0
        for set in sets.indices { writes += sets[set].writes.count }
        apply.expectedNotices = writes + min(writes, schema.properties.count) + 1
        let deliver = state.withLock { state -> Bool in
            state.prepare(schema)
            let wasDeleted = state.isDeleted
            // Where the next property of a delta is looked for first (see ModelSchema.index(of:hint:)):
            // after the one before it; a delta's first property where the last delta's began (a
            // batch's deltas usually write the same properties).
            var hint = 0
            var firstHint = 0
            // By index, not `for set in sets`: each iteration would copy the set and each write
            // (their arrays and strings retained and released once more per delta).
            for s in sets.indices where sets[s].emitter == 0 || sets[s].emitter != instanceID {
                hint = firstHint
                var isFirst = true
                let version = sets[s].version
                let isRemote = sets[s].isRemote
                // A model on no node stamps its writes from the standalone clock: it must pass the
                // versions applied to it (the rule every node's clock follows, section 6.4), or a
                // write made right after, in the same millisecond, loses to them by node id and is
                // dropped as superseded.
                if state.binding == nil { Self.standaloneClock.observe(version) }
                if let expiredAt = sets[s].expiredAt {
                    for write in sets[s].writes {
                        guard let index = schema.index(of: write.name) else { continue }
                        // Only the value that expired: a later write replaced it already.
                        guard state.versions[index] == version, state.hasValue(index) else {
                            apply.result.stale += 1
                            continue
                        }
                        removeRemote(
                            index, version: expiredAt, kind: .expired, isRemote: isRemote, model: model,
                            apply: &apply, state: &state)
                    }
                    continue
                }
                // Each write borrowed where it lies, by position (a `let` of the set's writes is a
                // copy: an atomic reference count and its release per delta applied).
                for w in 0..<sets[s].writes.count {
                    if sets[s].writes[w].isModelDeletion {
                        if let deletion = state.deletion, deletion >= version {
                            apply.result.stale += 1
                            continue
                        }
                        for index in state.versions.indices {
                            if let held = state.versions[index], held < version, state.hasValue(index) {
                                removeRemote(
                                    index, version: version, kind: .deleted, isRemote: isRemote, model: model,
                                    apply: &apply, state: &state)
                            }
                        }
                        state.deletion = version
                        apply.removedAny = true
                        continue
                    }
                    guard let index = schema.index(of: sets[s].writes[w].name, hint: hint) else {
                        apply.result.unknownProperties.append(sets[s].writes[w].name)
                        continue
                    }
                    if isFirst {
                        firstHint = index
                        isFirst = false
                    }
                    hint = index + 1
                    if let floor = state.floor(of: index), floor >= version {
                        apply.result.stale += 1
                        continue
                    }
                    if sets[s].writes[w].isDeletion {
                        let hadVersion = state.versions[index] != nil
                        state.versions[index] = version
                        if hadVersion || !state.isRemoved(index) {
                            removeRemote(
                                index, version: version, kind: .deleted, isRemote: isRemote, model: model,
                                apply: &apply, state: &state)
                        }
                        continue
                    }
                    do {
                        let hadValue = state.hasValue(index)
                        let property = schema.access[index]
                        if !apply.hasObservers(index, of: self) {
                            // No one to tell the values to: stored without erasing them.
                            let stored = try property.assign(model, from: sets[s].writes[w].value)
                            state.versions[index] = version
                            state.setRemoved(index, false)
                            apply.setAny = true
                            if stored || !hadValue { apply.noteApplied(index) }
                            continue
                        }
                        let assigned = try property.assignReporting(model, from: sets[s].writes[w].value)
                        state.versions[index] = version
                        state.setRemoved(index, false)
                        apply.setAny = true
                        // An equal value still gives a property without one its value back.
                        guard assigned != nil || !hadValue else { continue }
                        // The values moved into the change and the change into the queue: copies
                        // of their boxes, and of the change, were 1.5 % of a reader's samples.
                        let change: ErasedChange
                        switch consume assigned {
                        case .some(let values):
                            change = ErasedChange(
                                property: sets[s].writes[w].name, old: values.old, new: values.new, version: version,
                                isRemote: isRemote)
                        case .none:
                            // Equal: nothing was stored, so the current value is both.
                            let current = property.currentValue(of: model)
                            change = ErasedChange(
                                property: sets[s].writes[w].name, old: current, new: current, version: version,
                                isRemote: isRemote)
                        }
                        apply.notify(index, change, registrar: self, state: &state)
                    } catch {
                        apply.result.rejected.append((sets[s].writes[w].name, "\(error)"))
                    }
                }
            }
            for index in apply.changed.indices where apply.changed[index] {
                state.pending.append(.observation(index))
                apply.queued += 1
            }
            if apply.setAny || apply.removedAny {
                setDeleted((state.deletion != nil || state.removedCount > 0) && !state.anyValue, &state)
            }
            if state.isDeleted != wasDeleted { apply.queued += 1 }
            return claimDelivery(&state)
        }
        let queued = apply.queued
        if let executor, queued > 0 {
            // Also when another thread is delivering (it sends these too): the job carries their
            // weight through the executor's queue, so a stuck observer shows as a backlog.
            executor.run(weight: queued) { [self] in if deliver { drain(model) } }
        } else if deliver {
            drain(model)
        }
        return apply.result
    }

    /// The scratch of one ``applyRemote(_:_:notifyingOn:)``, used under the lock: the observers
    /// looked up, what changed, what to tell. A struct with mutating methods, not local functions
    /// capturing the call's variables: those captures were checked for exclusive access at run
    /// time on every write applied (`swift_beginAccess`, 1 % of a reader applying single sets).
    /// Not generic: the registrar is not specialised for the app's model type, and a generic
    /// scratch's metadata was looked up at run time at every use (1.6 % of a reader applying
    /// transactions).
    private struct RemoteApply {
        /// By schema index, the observers of each property, once looked up.
        var observerLists: [[ObserverEntry]?]
        /// By schema index, whether the property changed: Observation is told once, at the end.
        var changed: [Bool]
        /// The model's initial values (a fresh instance), made when a property is reset to one.
        var initial: AnyObject?
        var removedAny = false
        var setAny = false
        var result = RemoteApplyResult()
        /// Notifications queued.
        var queued = 0
        /// How many notices this call can queue (a change per write, unless a model's deletion
        /// resets more), until room is made for them: the queue grown one doubling at a time
        /// took a batch of 256 single sets seven allocations and copies, the last of 68 KB (and
        /// freeing that made glibc consolidate its free lists).
        var expectedNotices = 0

        init(count: Int) {
            observerLists = Array(repeating: nil, count: count)
            changed = Array(repeating: false, count: count)
        }

        /// The observers of the property at `index` (looked up once per call).
        mutating func observerList(_ index: Int, of registrar: ModelRegistrar) -> [ObserverEntry] {
            lookUpObservers(index, of: registrar)
            return observerLists[index] ?? []
        }

        /// Whether the property at `index` has observers, without a copy of their list (an
        /// atomic reference count and its release, for every write applied).
        mutating func hasObservers(_ index: Int, of registrar: ModelRegistrar) -> Bool {
            lookUpObservers(index, of: registrar)
            return observerLists[index]?.isEmpty == false
        }

        private mutating func lookUpObservers(_ index: Int, of registrar: ModelRegistrar) {
            if observerLists[index] == nil { observerLists[index] = registrar.observers(of: index) }
        }

        /// The property at `index` changed.
        mutating func noteApplied(_ index: Int) {
            result.applied += 1
            changed[index] = true
        }

        mutating func notify(
            _ index: Int, _ change: consuming ErasedChange, registrar: ModelRegistrar, state: inout State
        ) {
            noteApplied(index)
            let list = observerList(index, of: registrar)
            guard !list.isEmpty else { return }
            if expectedNotices > 0 {
                // Geometric all the same: while a delivery runs elsewhere (or the executor's job
                // waits), the queue keeps what earlier calls queued, and reserving exactly what
                // each call needs would copy all of it at every call.
                let needed = state.pending.count + expectedNotices
                if needed > state.pending.capacity {
                    state.pending.reserveCapacity(max(needed, 2 * state.pending.capacity))
                }
                expectedNotices = 0
            }
            state.pending.append(.change(consume change, list))
            queued += 1
        }
    }

    /// Resets the property at `index` to its initial value (a remote deletion or expiry);
    /// reports it unless it had none.
    private func removeRemote<Model: ReplicatedModel>(
        _ index: Int, version: Version, kind: PropertyChange.Kind, isRemote: Bool, model: Model,
        apply: inout RemoteApply, state: inout State
    ) {
        let property = Model._$schema.properties[index]
        let hadValue = state.hasValue(index)
        state.setRemoved(index, true)
        apply.removedAny = true
        guard hadValue else { return }
        let initial = (apply.initial as? Model) ?? Model()
        apply.initial = initial
        let old = property.currentValue(model)
        let new = property.currentValue(initial)
        property.restore(model, new)
        apply.notify(
            index,
            ErasedChange(property: property.name, old: old, new: new, version: version, isRemote: isRemote, kind: kind),
            registrar: self, state: &state)
    }

    // MARK: - Deletion

    /// Whether the model is deleted: its deletion (or the removal of its last value) was applied
    /// and no write gave it a value since. Tracked by Observation.
    public func isDeleted<Model: ReplicatedModel>(_ model: Model) -> Bool {
        noteObservationReached()
        observationInterop.access(model, keyPath: \Model.isDeleted)
        return deletedFlag.load(ordering: .sequentiallyConsistent)
    }

    /// Sets whether the model is deleted; a change is told to Observation in the model's order of
    /// notifications (caller holds the lock).
    private func setDeleted(_ deleted: Bool, _ state: inout State) {
        guard state.isDeleted != deleted else { return }
        state.isDeleted = deleted
        deletedFlag.store(deleted, ordering: .sequentiallyConsistent)
        state.pending.append(.deletionObservation)
    }

    /// A local write gave the model a value: it is no longer deleted (caller holds the lock).
    private func noteValue(_ state: inout State) {
        setDeleted(false, &state)
    }

    /// Deletes the whole model (every property resets to its initial value, observers are told
    /// with kind ``PropertyChange/Kind/deleted``), and, attached to a node, replicates the
    /// deletion: every replica deletes every property written before it. A later write gives the
    /// model a value again.
    public func deleteModel<Model: ReplicatedModel>(_ model: Model) {
        deleteLocally(model, property: nil)
    }

    /// Deletes the tracked property at `index` of the schema: it resets to its initial value, its
    /// observers are told, and the deletion replicates.
    public func delete<Model: ReplicatedModel>(_ model: Model, propertyAt index: Int) {
        deleteLocally(model, property: index)
    }

    private func deleteLocally<Model: ReplicatedModel>(_ model: Model, property only: Int?) {
        precondition(!inTransactionOnThisThread, "delete inside a transaction is not supported")
        let schema = Model._$schema
        var emittedTo: ModelBinding?
        let claimed = state.withLock { state -> [Notice]? in
            state.prepare(schema)
            let indices = only.map { [$0] } ?? Array(schema.properties.indices)
            // Nothing to delete: no version, no delta.
            guard indices.contains(where: { state.hasValue($0) }) || only == nil && !state.isDeleted else {
                return nil
            }
            let version = state.binding?.stamp() ?? Self.standaloneClock.next()
            if let only, let held = state.floor(of: only), held >= version {
                state.binding?.discard(version)
                supersededWrites.add(1, ordering: .relaxed)
                return nil
            }
            var initial: Model?
            for index in indices {
                let property = schema.properties[index]
                let hadValue = state.hasValue(index)
                if only != nil { state.versions[index] = version }
                state.setRemoved(index, true)
                guard hadValue else { continue }
                if initial == nil { initial = Model() }
                let old = property.currentValue(model)
                let new = property.currentValue(initial!)
                property.restore(model, new)
                state.pending.append(.observation(index))
                enqueue(
                    &state, index,
                    ErasedChange(
                        property: property.name, old: old, new: new, version: version, isRemote: false, kind: .deleted))
            }
            if only == nil { state.deletion = version }
            setDeleted(!state.anyValue, &state)
            if let binding = state.binding {
                let write = only.map { PropertyWrite.deletion(of: schema.properties[$0].name) } ?? .modelDeletion
                binding.emit(binding.address, version, [write])
                emittedTo = binding
            }
            return claimBatch(&state)
        }
        // Consumed, the optional and its payload: drain must hold the only reference to the batch.
        if let batch = consume claimed { drain(model, startingWith: consume batch) }
        emittedTo?.pace()
    }

    /// Attaches the model to a node: adopts the node's records for it silently (no
    /// notifications, no deltas; deletions included) and from now on publishes local writes
    /// through `binding`.
    package func attach<Model: ReplicatedModel>(
        _ model: Model, adopting registers: [String: ReplicaStore.Register], binding: ModelBinding
    ) {
        let schema = Model._$schema
        state.withLock { state in
            state.prepare(schema)
            for (name, register) in registers {
                if name.isEmpty {
                    if register.isDeleted { state.deletion = register.version }
                    continue
                }
                guard let index = schema.index(of: name) else { continue }
                let property = schema.properties[index]
                state.versions[index] = register.version
                if register.isDeleted {
                    state.setRemoved(index, true)
                    continue
                }
                // A value this model's type cannot hold keeps the initial value; a later write
                // of the right type still wins by version.
                _ = try? property.assign(model, from: register.value)
            }
            let deleted = (state.deletion != nil || state.removedCount > 0) && !state.anyValue
            state.isDeleted = deleted
            deletedFlag.store(deleted, ordering: .sequentiallyConsistent)
            state.binding = binding
        }
    }

    /// A write made at the provisional version `provisional` was acknowledged by the node with
    /// `acknowledged`: the properties (and the model's deletion) still at the provisional version
    /// take the node's, against which later changes are merged. Nothing is notified: the values
    /// do not change.
    package func acknowledge(provisional: Version, as acknowledged: Version) {
        state.withLock { state in
            for index in state.versions.indices where state.versions[index] == provisional {
                state.versions[index] = acknowledged
            }
            if state.deletion == provisional { state.deletion = acknowledged }
        }
    }

    /// A write made at the provisional version `provisional` was refused by the node: the
    /// properties still at that version — every property, when it was the model's deletion —
    /// take back what the node holds (`registers`, its replica's records of the model, the
    /// model's deletion under the empty name; a property it holds no value for resets to its
    /// initial value), and their observers are told, as of a remote change (on `executor` when
    /// given).
    package func revert<Model: ReplicatedModel>(
        _ model: Model, provisional: Version, to registers: [String: ReplicaStore.Register],
        notifyingOn executor: (any ObserverExecutor)? = nil
    ) {
        let schema = Model._$schema
        let deliver = state.withLock { state -> Bool in
            state.prepare(schema)
            let revertsDeletion = state.deletion == provisional
            if revertsDeletion {
                state.deletion = registers[""].flatMap { $0.isDeleted ? $0.version : nil }
            }
            var initial: Model?
            for (index, property) in schema.properties.enumerated()
            where revertsDeletion || state.versions[index] == provisional {
                let old = property.currentValue(model)
                let held = registers[property.name]
                state.versions[index] = held?.version
                if let held, !held.isDeleted {
                    // A value this model's type cannot hold keeps the current one.
                    _ = try? property.assign(model, from: held.value)
                    state.setRemoved(index, false)
                } else {
                    if initial == nil { initial = Model() }
                    property.restore(model, property.currentValue(initial!))
                    state.setRemoved(index, held != nil)
                }
                let new = property.currentValue(model)
                guard !property.sameErased(old, new) else { continue }
                state.pending.append(.observation(index))
                enqueue(
                    &state, index,
                    ErasedChange(
                        property: property.name, old: old, new: new, version: held?.version ?? provisional,
                        isRemote: true))
            }
            setDeleted((state.deletion != nil || state.removedCount > 0) && !state.anyValue, &state)
            return !state.pending.isEmpty && claimDelivery(&state)
        }
        if let executor, deliver {
            executor.run(weight: 1) { [self] in drain(model) }
        } else if deliver {
            drain(model)
        }
    }

    /// Detaches the model from its node; later writes stay local.
    package func detach() {
        state.withLock { $0.binding = nil }
    }

    /// The version of each property that has one.
    public var propertyVersions: [String: Version] {
        if inTransactionOnThisThread {
            let (names, versions) = transactionVersions
            var byName: [String: Version] = [:]
            for (index, version) in versions.enumerated() {
                if let version { byName[names[index]] = version }
            }
            return byName
        }
        return state.withLock { $0.versionsByName }
    }

    // MARK: - Observers

    /// Registers `callback` for changes of the tracked property at schema index `index`. `onEnd`
    /// runs when the model is deallocated while the observer is still registered.
    ///
    /// The token refers to the observer weakly: the callback (and what it captures) is released
    /// when the observer is cancelled or the model goes away, whether the token is kept or not.
    @usableFromInline
    func addObserver(
        propertyAt index: Int, onEnd: (@Sendable () -> Void)? = nil,
        _ callback: @escaping @Sendable (ErasedChange) -> Void
    ) -> ObservationToken {
        let entry = observers.add(propertyAt: index, onEnd: onEnd, callback)
        everObserved.store(true, ordering: .releasing)
        // Neither the registrar nor the entry is captured (see ObserverEntry): the table and the
        // flag are, and the callback is released with the entry.
        let (table, cancellation, id) = (observers, entry.cancellation, entry.id)
        return ObservationToken {
            cancellation.flag.store(true, ordering: .releasing)
            table.remove(id: id, propertyAt: index)
        }
    }

    // MARK: - Delivery

    /// Queues `change` of the property at schema index `index` for the observers registered for
    /// it now (caller holds the state lock); without observers, the change is not even made.
    private func enqueue(_ state: inout State, _ index: Int, _ change: @autoclosure () -> ErasedChange) {
        let list = observers(of: index)
        if list.isEmpty { return }
        state.pending.append(.change(change(), list))
    }

    /// The observers registered for the property at schema index `index`, now.
    private func observers(of index: Int) -> [ObserverEntry] {
        guard everObserved.load(ordering: .acquiring) else { return [] }
        return observers.observers(of: index)
    }

    /// The largest notification queue a model keeps when idle (a large remote batch's queue is
    /// let go: a node may hold many models).
    private static let keptQueueCapacity = 64

    /// Makes the caller the delivering thread if no delivery is running and there is work.
    private func claimDelivery(_ state: inout State) -> Bool {
        if state.delivering || state.pending.isEmpty { return false }
        state.delivering = true
        return true
    }

    /// ``claimDelivery(_:)`` that also takes the queued notifications, for a caller that
    /// delivers them itself right after: ``drain(_:startingWith:)`` starts with them instead of
    /// taking the lock again for them (a local write took it three times; now twice).
    private func claimBatch(_ state: inout State) -> [Notice]? {
        guard claimDelivery(&state) else { return nil }
        var batch: [Notice] = []
        swap(&state.pending, &batch)
        return batch
    }

    /// Delivers queued notifications in order until the queue is empty, starting with `first`
    /// (taken by ``claimBatch(_:)``). Only the thread that claimed the delivery calls this: one
    /// thread at a time sends a model's notifications.
    private func drain<Model: ReplicatedModel>(_ model: Model, startingWith first: consuming [Notice] = []) {
        // Two buffers taking turns: the writers' queue and the batch being delivered, so a long
        // delivery (changes keep arriving) allocates no new queue per batch. When the queue is
        // empty, the emptied batch (with its capacity) stays as the queue for the next writes:
        // a write or transaction then queues its notices without growing a new array.
        var spare: [Notice] = []
        let properties = Model._$schema.access  // once, not once per notice; see ErasedPropertyAccess
        // Moved, not copied: the batch must be this loop's only reference to its buffer, or
        // moving its notices out below would copy it.
        var taken = consume first
        while true {
            var batch: [Notice] = []
            if !taken.isEmpty {
                swap(&batch, &taken)
            } else {
                batch = state.withLock { state -> [Notice] in
                    if state.pending.isEmpty {
                        state.delivering = false
                        if state.pending.capacity > Self.keptQueueCapacity {
                            state.pending = []  // a large batch's buffer, swapped in by a long delivery
                        }
                        if spare.capacity > state.pending.capacity, spare.capacity <= Self.keptQueueCapacity {
                            swap(&state.pending, &spare)
                        }
                        return []
                    }
                    swap(&state.pending, &spare)
                    return spare
                }
                spare = []
                if batch.isEmpty { return }
            }
            // Each notice is moved out of the batch, a payload-free one left in its place: `for
            // notice in batch` copied every change (its values' boxes and its observer list
            // retained, then released with the batch), 2–3 % of a single-set reader and writer.
            // The batch is this loop's own (writers queue into `state.pending`), and a callback
            // that writes to the model queues there too.
            // Read once a batch, after its values were stored (see noteObservationReached()).
            let observed = observationReached.load(ordering: .sequentiallyConsistent)
            batch.withUnsafeMutableBufferPointer { notices in
                for index in notices.indices {
                    let notice = notices.moveElement(from: index)
                    notices.initializeElement(at: index, to: .deletionObservation)
                    // Consumed: the payload is bound by move (switching over the binding copied
                    // the change and its observer list, then released the notice).
                    switch consume notice {
                    case .change(let change, let observers):
                        for observer in observers where !observer.isCancelled {
                            observer.callback(change)
                        }
                    case .observation(let index):
                        if observed { properties[index].notifyObservation(of: model, registrar: observationInterop) }
                    case .deletionObservation:
                        guard observed else { break }
                        observationInterop.willSet(model, keyPath: \Model.isDeleted)
                        observationInterop.didSet(model, keyPath: \Model.isDeleted)
                    }
                }
            }
            batch.removeAll(keepingCapacity: true)
            spare = batch
        }
    }
}
