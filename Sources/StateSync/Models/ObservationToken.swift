import Synchronization

/// The handle of one observer registered with ``ReplicatedModel/observe(_:_:)``.
///
/// The observer stays registered until ``cancel()`` is called or the model is deallocated;
/// dropping the token does not cancel it. After `cancel()` returns, the observer receives no
/// further changes, except one whose delivery was already running on another thread.
///
/// The token does not keep the observer alive: once the model is deallocated (or the observer
/// cancelled), the callback and everything it captures are released, even while the token is
/// still held.
public final class ObservationToken: Sendable, Hashable {
    private let cancelled = Atomic<Bool>(false)
    private let onCancel: @Sendable () -> Void

    init(onCancel: @escaping @Sendable () -> Void) {
        self.onCancel = onCancel
    }

    /// Stops the observer. Safe to call more than once, from any thread.
    public func cancel() {
        if cancelled.exchange(true, ordering: .acquiringAndReleasing) == false {
            onCancel()
        }
    }

    /// Whether ``cancel()`` was called.
    public var isCancelled: Bool { cancelled.load(ordering: .acquiring) }

    public static func == (lhs: ObservationToken, rhs: ObservationToken) -> Bool { lhs === rhs }
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
}

/// A registered observer callback.
final class ObserverEntry: Sendable {
    let id: UInt64
    let callback: @Sendable (ErasedChange) -> Void
    /// Called when the model is deallocated while this observer is registered.
    let onEnd: (@Sendable () -> Void)?
    let cancelled = Atomic<Bool>(false)

    init(id: UInt64, callback: @escaping @Sendable (ErasedChange) -> Void, onEnd: (@Sendable () -> Void)? = nil) {
        self.id = id
        self.callback = callback
        self.onEnd = onEnd
    }
}
