/// One replicated write: some properties of one model, all with one version.
///
/// A delta is what a node publishes for every local write (a `set`, a property assignment or a
/// whole ``ReplicatedModel/transaction(_:)``) and what replicas apply (docs/PROTOCOL.md, "DELTA").
public struct Delta: Sendable, Equatable {
    /// The channel the model belongs to.
    public var channel: String
    /// The model's id within its channel.
    public var model: String
    /// The version of every property in this delta; its `node` is the writer.
    public var version: Version
    /// The writer's sequence number: 1, 2, 3, … per origin, without gaps, in publish order.
    public var sequence: UInt64
    /// The properties written, with their new values.
    public var properties: [PropertyWrite]

    /// A delta of `properties` of `channel`/`model`, at `version`, numbered `sequence` by its writer.
    public init(channel: String, model: String, version: Version, sequence: UInt64, properties: [PropertyWrite]) {
        self.channel = channel
        self.model = model
        self.version = version
        self.sequence = sequence
        self.properties = properties
    }

    /// The node that wrote the delta.
    public var origin: String { version.node }

    /// The model the delta writes.
    public var address: ModelAddress { ModelAddress(channel: channel, model: model) }
}

/// One property of a ``Delta``.
public struct PropertyWrite: Sendable, Equatable {
    /// The property's name.
    public var name: String
    /// Its new value.
    public var value: Value

    /// A write of `value` to the property `name`.
    public init(name: String, value: Value) {
        self.name = name
        self.value = value
    }
}

/// A model's address: its channel and its id within the channel.
public struct ModelAddress: Sendable, Hashable, CustomStringConvertible {
    /// The channel.
    public var channel: String
    /// The model's id within the channel.
    public var model: String

    /// The address of model `model` in `channel`.
    public init(channel: String, model: String) {
        self.channel = channel
        self.model = model
    }

    /// `channel/model`, as the CLI writes it.
    public var description: String { "\(channel)/\(model)" }
}
