/// One applied change of one property of a model, as an observer sees it.
///
/// `old` is the exact value the property held just before this change was applied and `new`
/// the exact value it applied; for each property, the `old` of a notification equals the `new`
/// of the one before it.
public struct Change<Value: Sendable>: Sendable {
    /// The name of the property that changed.
    public let property: String
    /// The value before the change (a property without a value holds its initial value).
    public let old: Value
    /// The value after the change; for a deletion or an expiry, the property's initial value
    /// (what `init()` gives it).
    public let new: Value
    /// The version of the write; for a standalone model, a version of this process's local clock.
    public let version: Version
    /// `true` when the write came from another node.
    public let isRemote: Bool
    /// What happened: a new value, a deletion (of the property or of its model), or an expiry.
    public let kind: PropertyChange.Kind

    /// The node that made the write (`"local"` for a standalone model).
    public var origin: String { version.node }

    // Explicit to be @usableFromInline: the inlinable observe(_:_:) builds changes.
    // swift-format-ignore: UseSynthesizedInitializer
    @usableFromInline
    init(property: String, old: Value, new: Value, version: Version, isRemote: Bool, kind: PropertyChange.Kind) {
        self.property = property
        self.old = old
        self.new = new
        self.version = version
        self.isRemote = isRemote
        self.kind = kind
    }

    /// Whether the property lost its value (deleted or expired): ``new`` is its initial value.
    public var isRemoval: Bool { kind != .set }
}

extension Change: Equatable where Value: Equatable {}

/// A change with its values type-erased, as the registrar queues it.
///
/// Inlinable with ``typed(as:)`` so that the observer wrapper ``ReplicatedModel/observe(_:_:)``
/// builds is specialised in the caller's module for the property's type: the casts back to it
/// are then cheap, and no generic metadata is looked up per notification.
@usableFromInline
struct ErasedChange: Sendable {
    @usableFromInline let property: String
    @usableFromInline let old: any Sendable
    @usableFromInline let new: any Sendable
    @usableFromInline let version: Version
    @usableFromInline let isRemote: Bool
    @usableFromInline let kind: PropertyChange.Kind

    init(
        property: String, old: any Sendable, new: any Sendable, version: Version, isRemote: Bool,
        kind: PropertyChange.Kind = .set
    ) {
        self.property = property
        self.old = old
        self.new = new
        self.version = version
        self.isRemote = isRemote
        self.kind = kind
    }

    @inlinable
    func typed<T: Sendable>(as type: T.Type) -> Change<T> {
        // The registrar only hands an observer changes of the property it registered for, whose
        // type the macro fixed at compile time: the casts cannot fail.
        Change(
            property: property, old: Self.unbox(old, as: T.self), new: Self.unbox(new, as: T.self), version: version,
            isRemote: isRemote, kind: kind)
    }

    /// The `T` that `box` holds. The registrar boxes a property's own value, so the box holds a
    /// `T` itself (not a subtype, nor a value a cast converts): opened and checked by type, it is
    /// taken as it is; `as! T` (the runtime's general cast, about 1 % of a reader of single sets)
    /// is left for anything else.
    @inlinable
    static func unbox<T>(_ box: any Sendable, as type: T.Type) -> T {
        func take<Boxed>(_ value: Boxed) -> T {
            Boxed.self == T.self ? unsafeBitCast(value, to: T.self) : value as! T
        }
        return take(box)
    }
}
