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
///
/// Never referenced weakly (nor is its registrar): a weak reference gives an object a side table,
/// and every retain and release of it then takes the runtime's slow path — each delivered change
/// retains its observers. The token reaches an entry through ``ObserverTable`` and
/// ``ObserverCancellation`` instead.
final class ObserverEntry: Sendable {
    let id: UInt64
    let callback: @Sendable (ErasedChange) -> Void
    /// Called when the model is deallocated while this observer is registered.
    let onEnd: (@Sendable () -> Void)?
    /// Shared with the observer's token, which sets it.
    let cancellation = ObserverCancellation()

    init(id: UInt64, callback: @escaping @Sendable (ErasedChange) -> Void, onEnd: (@Sendable () -> Void)? = nil) {
        self.id = id
        self.callback = callback
        self.onEnd = onEnd
    }

    var isCancelled: Bool { cancellation.flag.load(ordering: .acquiring) }
}

/// Set when an observer is cancelled; held by its entry and by its token.
final class ObserverCancellation: Sendable {
    let flag = Atomic<Bool>(false)
}

/// A model's observers, by the schema index of the property they watch. Its own object, held by
/// the model's registrar and by the tokens of its observers: a token then removes its entry
/// without a weak reference to the registrar. The registrar empties the table when it goes
/// away, so a token kept after that holds no callback alive.
final class ObserverTable: Sendable {
    private let entries = Mutex<(nextID: UInt64, byProperty: [[ObserverEntry]])>((1, []))

    /// Registers `callback` for the property at schema index `index`.
    func add(
        propertyAt index: Int, onEnd: (@Sendable () -> Void)?, _ callback: @escaping @Sendable (ErasedChange) -> Void
    ) -> ObserverEntry {
        entries.withLock { table in
            let entry = ObserverEntry(id: table.nextID, callback: callback, onEnd: onEnd)
            table.nextID += 1
            if table.byProperty.count <= index {
                table.byProperty += Array(repeating: [], count: index + 1 - table.byProperty.count)
            }
            table.byProperty[index].append(entry)
            return entry
        }
    }

    /// Removes the observer `id` of the property at schema index `index` (if still there).
    func remove(id: UInt64, propertyAt index: Int) {
        entries.withLock { table in
            guard index < table.byProperty.count else { return }
            table.byProperty[index].removeAll { $0.id == id }
        }
    }

    /// The observers registered for the property at schema index `index`, now.
    func observers(of index: Int) -> [ObserverEntry] {
        entries.withLock { table in index < table.byProperty.count ? table.byProperty[index] : [] }
    }

    /// Every observer, the table left empty.
    func removeAll() -> [ObserverEntry] {
        entries.withLock { table in
            defer { table.byProperty = [] }
            return table.byProperty.flatMap { $0 }
        }
    }
}
