/// An applied change of one property, untyped: what a node reports to watchers and clients.
public struct PropertyChange: Sendable, Equatable {
    /// What happened to the property.
    public enum Kind: String, Sendable, Equatable {
        /// It took a new value.
        case set
        /// It was deleted (by a deletion of the property or of its model); ``PropertyChange/new``
        /// is null.
        case deleted
        /// Its time to live ran out; ``PropertyChange/new`` is null.
        case expired
    }

    /// The model's channel.
    public var channel: String
    /// The model's id.
    public var model: String
    /// The property's name.
    public var property: String
    /// The value before the change; `nil` when the property had no value (never set, deleted or
    /// expired).
    public var old: Value?
    /// The value after the change (null when ``kind`` is not ``Kind/set``).
    public var new: Value
    /// The version of the write. For an expiry, the version the property expired at: its
    /// write's version moved to the expiry time (the same on every replica).
    public var version: Version
    /// What happened.
    public var kind: Kind
    /// For a ``Kind/set`` of an expiring value, the milliseconds since 1970 at which it expires.
    public var expiresAt: UInt64?
    /// For a ``Kind/deleted``: whether the deletion of the whole model made it (one change per
    /// property it deleted, all at its version).
    package var byModelDeletion = false
    /// For a change a client's replica took from a delta above its cursor (the node sent it
    /// above a gap): the delta's origin and sequence number, which a copy of the replica that
    /// records changes one by one (`statesync watch --state`) keeps as held above its cursor
    /// (``ChannelReplica/heldAbove``).
    package var takenAbove: (origin: String, sequence: UInt64)?
    /// For a ``Kind/expired``: the version of the write whose value expired.
    package var writtenVersion: Version?

    /// A change of `property` of `channel`/`model` from `old` to `new` at `version`.
    public init(
        channel: String, model: String, property: String, old: Value?, new: Value, version: Version,
        kind: Kind = .set, expiresAt: UInt64? = nil
    ) {
        self.channel = channel
        self.model = model
        self.property = property
        self.old = old
        self.new = new
        self.version = version
        self.kind = kind
        self.expiresAt = expiresAt
    }

    /// Equal when every field but ``takenAbove`` (how a client's replica took the change, not
    /// what changed) is.
    public static func == (lhs: PropertyChange, rhs: PropertyChange) -> Bool {
        lhs.channel == rhs.channel && lhs.model == rhs.model && lhs.property == rhs.property && lhs.old == rhs.old
            && lhs.new == rhs.new && lhs.version == rhs.version && lhs.kind == rhs.kind
            && lhs.expiresAt == rhs.expiresAt && lhs.byModelDeletion == rhs.byModelDeletion
            && lhs.writtenVersion == rhs.writtenVersion
    }

    /// The node that wrote the change.
    public var origin: String { version.node }

    /// Whether the property has no value after the change (deleted or expired).
    public var isRemoval: Bool { kind != .set }

    /// The register the property holds after the change: its value (with its time to live), or
    /// its deletion (an expired value keeps its write's version and time to live).
    package var register: ReplicaStore.Register {
        switch kind {
        case .set:
            return ReplicaStore.Register(
                value: new, version: version, timeToLive: expiresAt.map { $0 &- version.milliseconds } ?? 0)
        case .deleted:
            return .tombstone(version)
        case .expired:
            let written = writtenVersion ?? version
            return ReplicaStore.Register(
                value: .null, version: written, timeToLive: max(1, version.milliseconds &- written.milliseconds)
            ).expired
        }
    }
}
