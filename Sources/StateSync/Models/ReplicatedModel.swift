public import Observation

/// A class whose tracked properties are observed per property and replicated: what
/// ``Replicated()`` makes of a `final class`. Do not conform by hand; apply the macro.
///
/// Thread safety: a replicated model may be read and written from any thread. Each instance has
/// one lock; ``ModelRegistrar`` documents where observer callbacks run.
public protocol ReplicatedModel: AnyObject, Observable, Sendable {
    /// Creates a model with its initial values. ``StateSyncNode/model(_:channel:id:)`` calls it
    /// and then adopts the channel's state.
    init()
    /// The per-instance engine (macro-generated).
    var _$registrar: ModelRegistrar { get }
    /// The tracked properties (macro-generated).
    static var _$schema: ModelSchema<Self> { get }
}

extension ReplicatedModel {
    /// Calls `callback` after every applied change of the property at `keyPath`, with its exact
    /// old and new value, in the model's apply order, local and remote changes alike.
    ///
    /// The observer lives as long as the model (or until cancelled): the model keeps `callback`
    /// and what it captures, the token does not. Capturing the model itself in `callback` keeps
    /// the model alive until the observer is cancelled; capture it `weak` (or `unowned`) instead.
    ///
    /// - Returns: a token; ``ObservationToken/cancel()`` stops the observer.
    /// - Precondition: `keyPath` names a tracked property (not `@Local`, not a `let`).
    @discardableResult
    @inlinable  // specialised for the property's type where it is called (see ErasedChange)
    public func observe<T: Sendable>(
        _ keyPath: KeyPath<Self, T>, _ callback: @escaping @Sendable (Change<T>) -> Void
    ) -> ObservationToken {
        guard let index = Self._$schema.index(of: keyPath) else {
            preconditionFailure("observe(_:): \(keyPath) is not a tracked property of \(Self.self)")
        }
        return _$registrar.addObserver(propertyAt: index) { change in callback(change.typed(as: T.self)) }
    }

    /// The changes of the property at `keyPath` as an `AsyncSequence`, from now on, in apply
    /// order. The stream buffers without bound; stop iterating (or cancel the task) to end it. It
    /// finishes when the model is deallocated (the stream does not keep the model alive).
    public func changes<T: Sendable>(of keyPath: KeyPath<Self, T>) -> AsyncStream<Change<T>> {
        let (stream, continuation) = AsyncStream.makeStream(of: Change<T>.self)
        guard let index = Self._$schema.index(of: keyPath) else {
            preconditionFailure("changes(of:): \(keyPath) is not a tracked property of \(Self.self)")
        }
        let token = _$registrar.addObserver(
            propertyAt: index, onEnd: { continuation.finish() },
            { change in continuation.yield(change.typed(as: T.self)) })
        continuation.onTermination = { _ in token.cancel() }
        return stream
    }

    /// Runs `body` atomically against every other writer of this model: its reads see no other
    /// write and all its changes become one version, one delta and consecutive notifications on
    /// every replica. If `body` throws, its writes are rolled back.
    ///
    /// ```swift
    /// counter.transaction { $0.count += 1; $0.title = "busy" }
    /// ```
    @discardableResult
    public func transaction<R, E: Error>(_ body: (Self) throws(E) -> R) throws(E) -> R {
        try _$registrar.transaction(self, body)
    }

    /// Like ``transaction(_:)``, and every property `body` assigns — also to an equal value — is
    /// written to live for `timeToLive`: once it runs out, the node the model is attached to
    /// deletes the property on every replica (each computes the same expiry from the write's
    /// version), and observers get a change of kind ``PropertyChange/Kind/expired``. A later
    /// write without a time to live keeps the value for good. A model not attached to a node
    /// never expires.
    @discardableResult
    public func transaction<R, E: Error>(timeToLive: Duration, _ body: (Self) throws(E) -> R) throws(E) -> R {
        let (seconds, attoseconds) = timeToLive.components
        let milliseconds = max(1, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
        return try _$registrar.transaction(self, timeToLive: UInt64(clamping: milliseconds), body)
    }

    /// Whether the model is deleted: a deletion of the model (``delete()``, or on any replica),
    /// or the deletion or expiry of its last property with a value, was applied, and no write
    /// gave it a value since. Observation tracks it (a SwiftUI view that reads it updates).
    public var isDeleted: Bool { _$registrar.isDeleted(self) }

    /// Deletes the model: every tracked property resets to its initial value (what `init()`
    /// gives it) and its observers get a change of kind ``PropertyChange/Kind/deleted``; attached
    /// to a node, the deletion replicates, and every replica deletes every property written
    /// before it (a concurrent later write wins, by last-writer-wins). Writing a property again
    /// re-creates the model.
    public func delete() {
        _$registrar.deleteModel(self)
    }

    /// Deletes the property at `keyPath`: it resets to its initial value, observers get a change
    /// of kind ``PropertyChange/Kind/deleted``, and the deletion replicates.
    ///
    /// - Precondition: `keyPath` names a tracked property (not `@Local`, not a `let`).
    public func delete<T>(_ keyPath: KeyPath<Self, T>) {
        guard let index = Self._$schema.index(of: keyPath) else {
            preconditionFailure("delete(_:): \(keyPath) is not a tracked property of \(Self.self)")
        }
        _$registrar.delete(self, propertyAt: index)
    }

    /// The version of each tracked property that has been written (locally or remotely).
    public var propertyVersions: [String: Version] { _$registrar.propertyVersions }
}

/// Makes a `final class` a replicated, observable model.
///
/// Every stored `var` becomes a tracked property: its observers receive exact old and new values
/// (``ReplicatedModel/observe(_:_:)``), `withObservationTracking` sees it, and, once the model is
/// attached to a node (``StateSyncNode/model(_:channel:id:)``), every change is replicated. `let`s
/// are constants; mark a `var` `@Local` to keep it out of tracking and replication. Property types
/// must be `Codable & Sendable`.
///
/// ```swift
/// @Replicated
/// final class Counter {
///     var count = 0
///     var title = "untitled"
/// }
/// ```
///
/// The class becomes `Observable` and `Sendable` (the compiler checks its `let`s); writing either
/// conformance yourself is accepted. Generic classes work (`final class Box<T: Codable & Sendable>`;
/// their properties are reached through a schema cached per specialisation, a look-up per
/// access). A class that declares `Codable` gets encoding of its tracked and `@Local` values,
/// read under the model's lock, and decoding into a fresh standalone model (`init()`, then the
/// values found; no versions, no notifications).
@attached(member, names: named(_$registrar), named(_$schema), named(CodingKeys), named(encode), named(init), arbitrary)
@attached(memberAttribute)
@attached(extension, conformances: ReplicatedModel, Observable, Sendable)
public macro Replicated() = #externalMacro(module: "StateSyncMacros", type: "ReplicatedMacro")

/// Generated by ``Replicated()`` on each tracked property; do not write it yourself.
@attached(accessor, names: named(init), named(get), named(set))
@attached(peer, names: prefixed(_))
public macro _ReplicatedTracked() = #externalMacro(module: "StateSyncMacros", type: "ReplicatedTrackedMacro")

/// Generated by ``Replicated()`` on each tracked property of a generic class; do not write it
/// yourself. `index` is the property's position in the schema.
@attached(accessor, names: named(init), named(get), named(set))
@attached(peer, names: prefixed(_))
public macro _ReplicatedTrackedGeneric(_ index: Int) =
    #externalMacro(module: "StateSyncMacros", type: "ReplicatedTrackedGenericMacro")

/// Keeps a `var` of a ``Replicated()`` model local: not tracked, not replicated, still guarded by
/// the model's lock.
@attached(accessor, names: named(init), named(get), named(set))
@attached(peer, names: prefixed(_))
public macro Local() = #externalMacro(module: "StateSyncMacros", type: "LocalMacro")
