/// One replicated write: some properties of one model, all with one version.
///
/// A delta is what a node publishes for every local write (a `set`, a property assignment or a
/// whole ``ReplicatedModel/transaction(_:)``) and what replicas apply (docs/PROTOCOL.md, "DELTA").
public struct Delta: Sendable, Equatable {
    /// One delta's fields.
    package struct Fields: Sendable {
        var channel: String
        var model: String
        var version: Version
        var sequence: UInt64
        var writes: PropertyWrites

        package init(channel: String, model: String, version: Version, sequence: UInt64, writes: PropertyWrites) {
            self.channel = channel
            self.model = model
            self.version = version
            self.sequence = sequence
            self.writes = writes
        }
    }

    /// The fields of one delta, or of every delta of a decoded batch, in one allocation shared
    /// by every copy. A received delta is held at once by the store's merge, the repair
    /// history, the watch journal and model delivery: copying it is one reference count, not
    /// one per string and array (the reader of single sets spent nearly a fifth of its samples
    /// in retain and release, issue #17); and a batch's deltas are one allocation, not one each
    /// (a received single set cost two allocations until 2026-11-27, its fields and its array
    /// of properties). Immutable: a setter makes a new one.
    private final class Storage: ManagedBuffer<Int, Fields> {
        static func make(count: Int, _ fields: (Int) -> Fields) -> Storage {
            let storage = unsafeDowncast(Storage.create(minimumCapacity: count) { _ in 0 }, to: Storage.self)
            storage.withUnsafeMutablePointers { initialised, elements in
                for index in 0..<count {
                    (elements + index).initialize(to: fields(index))
                    initialised.pointee = index + 1
                }
            }
            return storage
        }

        deinit {
            _ = withUnsafeMutablePointers { count, elements in elements.deinitialize(count: count.pointee) }
        }
    }

    /// `nonisolated(unsafe)` (a `ManagedBuffer` cannot be `Sendable`): the elements are
    /// initialised in ``Storage/make(count:_:)``, before the storage is shared, and never written
    /// again (nor the header, their count); the storage is only read after, which is safe from
    /// any number of threads, and its reference count is atomic.
    nonisolated(unsafe) private let storage: Storage
    private let index: Int

    private init(storage: Storage, index: Int) {
        self.storage = storage
        self.index = index
    }

    /// This delta's fields, where they lie in the storage. Valid while the storage is held (a
    /// `ManagedBuffer`'s elements never move), so only to be read within an access to `self`,
    /// never stored or used after it: the pointer leaves `withUnsafeMutablePointerToElements`,
    /// which is safe only because `self` holds the storage for the whole access. The fields
    /// below are yielded from it (`_read`), borrowed for the caller's access, not copied out:
    /// a copy of the writes is an atomic reference count on their array and its release, and a
    /// receiver that took one to count or index them paid that per delta (issue #17).
    private var fields: UnsafePointer<Fields> {
        storage.withUnsafeMutablePointerToElements { UnsafePointer($0 + index) }
    }

    /// The channel the model belongs to.
    public var channel: String {
        _read { yield fields.pointee.channel }
        set { change { $0.channel = newValue } }
    }
    /// The model's id within its channel.
    public var model: String {
        _read { yield fields.pointee.model }
        set { change { $0.model = newValue } }
    }
    /// The version of every property in this delta; its `node` is the writer.
    public var version: Version {
        _read { yield fields.pointee.version }
        set { change { $0.version = newValue } }
    }
    /// The writer's sequence number: 1, 2, 3, … per origin, without gaps, in publish order.
    public var sequence: UInt64 {
        get { fields.pointee.sequence }
        set { change { $0.sequence = newValue } }
    }
    /// The properties written, with their new values. (A delta decoded from a batch shares one
    /// array with the batch's other deltas: this copies its part out; the node reads ``writes``.)
    public var properties: [PropertyWrite] {
        get { writes.array }
        set { change { $0.writes = PropertyWrites(newValue) } }
    }

    /// The properties written, borrowed in place (a copy only when the caller keeps them).
    package var writes: PropertyWrites {
        _read { yield fields.pointee.writes }
    }

    /// A setter's work: new fields, with what `body` changes.
    private mutating func change(_ body: (inout Fields) -> Void) {
        var changed = fields.pointee
        body(&changed)
        self = Delta(changed)
    }

    /// A delta of `properties` of `channel`/`model`, at `version`, numbered `sequence` by its writer.
    public init(channel: String, model: String, version: Version, sequence: UInt64, properties: [PropertyWrite]) {
        self.init(
            Fields(
                channel: channel, model: model, version: version, sequence: sequence,
                writes: PropertyWrites(properties)))
    }

    /// A delta whose properties are `writes` (no copy).
    package init(channel: String, model: String, version: Version, sequence: UInt64, writes: PropertyWrites) {
        self.init(Fields(channel: channel, model: model, version: version, sequence: sequence, writes: writes))
    }

    private init(_ fields: Fields) {
        self.init(storage: Storage.make(count: 1) { _ in fields }, index: 0)
    }

    /// `count` deltas sharing one allocation: the `index`th has the fields `fields(index)`.
    package static func batch(count: Int, _ fields: (Int) -> Fields) -> [Delta] {
        let storage = Storage.make(count: count, fields)
        var deltas: [Delta] = []
        deltas.reserveCapacity(count)
        for index in 0..<count { deltas.append(Delta(storage: storage, index: index)) }
        return deltas
    }

    public static func == (lhs: Delta, rhs: Delta) -> Bool {
        (lhs.storage === rhs.storage && lhs.index == rhs.index)
            || (lhs.sequence == rhs.sequence && lhs.version == rhs.version && lhs.channel == rhs.channel
                && lhs.model == rhs.model && lhs.writes == rhs.writes)
    }

    /// The node that wrote the delta.
    public var origin: String { version.node }

    /// The model the delta writes.
    public var address: ModelAddress { ModelAddress(channel: channel, model: model) }

    /// Whether the delta deletes the whole model (its one property is ``PropertyWrite/modelDeletion``).
    public var deletesModel: Bool { writes.count == 1 && writes[0].isModelDeletion }

    /// Whether the delta needs the version-2 body (docs/PROTOCOL.md 7.1): it deletes, or a value
    /// expires.
    var needsVersion2: Bool {
        for position in 0..<writes.count where writes[position].isDeletion || writes[position].timeToLive > 0 {
            return true
        }
        return false
    }
}

/// The properties a delta writes, in order: a run of an array that may hold the properties of
/// every delta of a received batch. Decoding a batch makes one array for all its deltas, not one
/// per delta (with the deltas' fields, also one allocation per batch, a received single set costs
/// no allocation of its own, where it cost two until 2026-11-27: issue #17). Indexed from 0, like
/// an array.
package struct PropertyWrites: RandomAccessCollection, Sendable, Equatable {
    /// The array the writes are a run of.
    private let storage: [PropertyWrite]
    private let offset: Int
    package let count: Int

    /// All of `writes` (no copy).
    package init(_ writes: [PropertyWrite]) {
        storage = writes
        offset = 0
        count = writes.count
    }

    /// `range` of `storage` (no copy; the array is kept while any run of it is).
    package init(_ storage: [PropertyWrite], range: Range<Int>) {
        precondition(range.lowerBound >= 0 && range.upperBound <= storage.count, "a run within the array")
        self.storage = storage
        offset = range.lowerBound
        count = range.count
    }

    package var startIndex: Int { 0 }
    package var endIndex: Int { count }

    /// The write at `position`, borrowed in place (its name and value are copied only by a
    /// caller that keeps them).
    package subscript(position: Int) -> PropertyWrite {
        _read {
            precondition(position >= 0 && position < count, "a write's position within the delta")
            yield storage[offset &+ position]
        }
    }

    /// The room of the array the writes are a run of (what a delta keeps alive; tests).
    package var sharedCapacity: Int { storage.capacity }

    /// The writes as an array of their own: the array itself when they are all of it.
    package var array: [PropertyWrite] {
        offset == 0 && count == storage.count ? storage : Array(storage[offset..<(offset + count)])
    }

    package static func == (lhs: PropertyWrites, rhs: PropertyWrites) -> Bool { lhs.elementsEqual(rhs) }
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
public struct PropertyWrite: Sendable, Hashable {
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
