/// An applied change of one property, untyped: what a node reports to watchers and clients.
public struct PropertyChange: Sendable, Equatable {
    public var channel: String
    public var model: String
    public var property: String
    /// The value before the change; `nil` when the property had never been set.
    public var old: Value?
    public var new: Value
    public var version: Version

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
