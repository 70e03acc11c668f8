/// An applied change of one property, untyped: what a node reports to watchers and clients.
public struct PropertyChange: Sendable, Equatable {
    /// The model's channel.
    public var channel: String
    /// The model's id.
    public var model: String
    /// The property's name.
    public var property: String
    /// The value before the change; `nil` when the property had never been set.
    public var old: Value?
    /// The value after the change.
    public var new: Value
    /// The version of the write.
    public var version: Version

    /// A change of `property` of `channel`/`model` from `old` to `new` at `version`.
    public init(channel: String, model: String, property: String, old: Value?, new: Value, version: Version) {
        self.channel = channel
        self.model = model
        self.property = property
        self.old = old
        self.new = new
        self.version = version
    }

    /// The node that wrote the change.
    public var origin: String { version.node }
}
