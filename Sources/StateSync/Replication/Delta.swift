/// One replicated write: some properties of one model, all with one version.
///
/// A delta is what a node publishes for every local write (a `set`, a property assignment or a
/// whole ``ReplicatedModel/transaction(_:)``) and what replicas apply (docs/PROTOCOL.md, "DELTA").
public struct Delta: Sendable, Equatable {
    /// The fields, in one allocation shared by every copy. A received delta is held at once by
    /// the store's merge, the repair history, the watch journal and model delivery: copying it
    /// is one reference count, not one per string and array (the reader of single sets spent
    /// nearly a fifth of its samples in retain and release, issue #17). Immutable: a setter
    /// makes a new one.
    private final class Fields: Sendable {
        let channel: String
        let model: String
        let version: Version
        let sequence: UInt64
        let properties: [PropertyWrite]

        init(channel: String, model: String, version: Version, sequence: UInt64, properties: [PropertyWrite]) {
            self.channel = channel
            self.model = model
            self.version = version
            self.sequence = sequence
            self.properties = properties
        }
    }

    private var fields: Fields

    /// The channel the model belongs to.
    public var channel: String {
        get { fields.channel }
        set { change { $0.channel = newValue } }
    }
    /// The model's id within its channel.
    public var model: String {
        get { fields.model }
        set { change { $0.model = newValue } }
    }
    /// The version of every property in this delta; its `node` is the writer.
    public var version: Version {
        get { fields.version }
        set { change { $0.version = newValue } }
    }
    /// The writer's sequence number: 1, 2, 3, … per origin, without gaps, in publish order.
    public var sequence: UInt64 {
        get { fields.sequence }
        set { change { $0.sequence = newValue } }
    }
    /// The properties written, with their new values.
    public var properties: [PropertyWrite] {
        get { fields.properties }
        set { change { $0.properties = newValue } }
    }

    private typealias AllFields = (
        channel: String, model: String, version: Version, sequence: UInt64, properties: [PropertyWrite]
    )

    /// A setter's work: new fields, with what `body` changes.
    private mutating func change(_ body: (inout AllFields) -> Void) {
        var all = (channel: channel, model: model, version: version, sequence: sequence, properties: properties)
        body(&all)
        fields = Fields(
            channel: all.channel, model: all.model, version: all.version, sequence: all.sequence,
            properties: all.properties)
    }

    /// A delta of `properties` of `channel`/`model`, at `version`, numbered `sequence` by its writer.
    public init(channel: String, model: String, version: Version, sequence: UInt64, properties: [PropertyWrite]) {
        fields = Fields(channel: channel, model: model, version: version, sequence: sequence, properties: properties)
    }

    public static func == (lhs: Delta, rhs: Delta) -> Bool {
        lhs.fields === rhs.fields
            || (lhs.sequence == rhs.sequence && lhs.version == rhs.version && lhs.channel == rhs.channel
                && lhs.model == rhs.model && lhs.properties == rhs.properties)
    }

    /// The node that wrote the delta.
    public var origin: String { version.node }

    /// The model the delta writes.
    public var address: ModelAddress { ModelAddress(channel: channel, model: model) }

    /// Whether the delta deletes the whole model (its one property is ``PropertyWrite/modelDeletion``).
    public var deletesModel: Bool { properties.count == 1 && properties[0].isModelDeletion }

    /// Whether the delta needs the version-2 body (docs/PROTOCOL.md 7.1): it deletes, or a value
    /// expires.
    var needsVersion2: Bool { properties.contains { $0.isDeletion || $0.timeToLive > 0 } }
}

extension Delta: CustomReflectable {
    /// The fields, as a struct's would be (`dump`, test failures, log lines that print a delta).
    public var customMirror: Mirror {
        Mirror(
            self,
            children: [
                "channel": channel, "model": model, "version": version, "sequence": sequence, "properties": properties,
            ])
    }
}

/// One property of a ``Delta``: a new value (possibly expiring), or a deletion.
///
/// A write with the empty name is the deletion of the whole model
/// (``PropertyWrite/modelDeletion``): every property whose version is lower than the delta's is
/// deleted (docs/PROTOCOL.md 8.2). It is a delta's only property.
public struct PropertyWrite: Sendable, Equatable {
    /// The property's name; empty for the deletion of the whole model.
    public var name: String
    /// Its new value (`.null` for a deletion).
    public var value: Value
    /// The time to live and the deletion flag in one word (a write is one or the other): 0 a
    /// plain value, ``deletionMark`` a deletion, anything else the milliseconds the value lives.
    private var lifetime: UInt64

    private static let deletionMark = UInt64.max

    /// The longest time to live, in milliseconds (about 8,900 years: a version's milliseconds
    /// plus it still fit 48 bits).
    public static let maximumTimeToLive: UInt64 = (1 << 48) - 1

    /// A write of `value` to the property `name`.
    public init(name: String, value: Value) {
        self.name = name
        self.value = value
        self.lifetime = 0
    }

    /// A write of `value` to the property `name` that expires `timeToLive` milliseconds after
    /// the write's version (0: never; clamped to ``maximumTimeToLive``).
    public init(name: String, value: Value, timeToLive: UInt64) {
        self.name = name
        self.value = value
        self.lifetime = min(timeToLive, Self.maximumTimeToLive)
    }

    /// The deletion of the property `name`.
    public static func deletion(of name: String) -> PropertyWrite {
        var write = PropertyWrite(name: name, value: .null)
        write.lifetime = deletionMark
        return write
    }

    /// The deletion of the whole model: every property written before it.
    public static let modelDeletion = deletion(of: "")

    /// Whether this write deletes its property (or, with the empty name, the model).
    public var isDeletion: Bool { lifetime == Self.deletionMark }

    /// Whether this write deletes the whole model.
    public var isModelDeletion: Bool { lifetime == Self.deletionMark && name.isEmpty }

    /// Milliseconds after the write's version at which the value expires; 0: never (and for a
    /// deletion).
    public var timeToLive: UInt64 { lifetime == Self.deletionMark ? 0 : lifetime }
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
