import Foundation

/// Turns any `Encodable` value into a ``Value``: the bridge between typed model properties and
/// the wire. `Data` becomes ``Value/bytes(_:)``, `Date` a double of seconds since 2001 (Swift's
/// own `Date` encoding), `nil` ``Value/null``.
public struct ValueEncoder: Sendable {
    /// An encoder.
    public init() {}

    /// - Throws: `EncodingError` when the value cannot be represented, including nesting deeper
    ///   than the wire allows (``WireReader/maximumDepth``): peers would reject it.
    public func encode<T: Encodable>(_ value: T) throws -> Value {
        if let direct = Self.directValue(value) { return direct }
        let encoder = _ValueEncoder(codingPath: [])
        try value.encode(to: encoder)
        let result = encoder.storage.value ?? .map([:])
        // The wire's rule (PROTOCOL.md 4.2): no element deeper than level 32 (an empty array or
        // map at level 32 has none and is fine).
        if result.deepestLevel > WireReader.maximumDepth {
            throw EncodingError.invalidValue(
                value,
                .init(codingPath: [], debugDescription: "nested deeper than \(WireReader.maximumDepth) levels"))
        }
        return result
    }

    /// The fast path for the common property types: no encoder allocation.
    @inline(__always)
    static func directValue<T>(_ value: T) -> Value? {
        // Exact types first: a metadata comparison, no dynamic cast (`unsafeBitCast` reinterprets
        // a value as its own type). The casts below also catch these wrapped (e.g. optionals).
        if T.self == Int.self { return .int(Int64(unsafeBitCast(value, to: Int.self))) }
        if T.self == String.self { return .string(unsafeBitCast(value, to: String.self)) }
        if T.self == Double.self { return .double(unsafeBitCast(value, to: Double.self)) }
        if T.self == Bool.self { return .bool(unsafeBitCast(value, to: Bool.self)) }
        switch value {
        case let v as Int: return .int(Int64(v))
        case let v as String: return .string(v)
        case let v as Bool: return .bool(v)
        case let v as Double: return .double(v)
        case let v as Int64: return .int(v)
        case let v as Data: return .bytes(Array(v))
        case let v as Date: return .double(v.timeIntervalSinceReferenceDate)
        case let v as Value: return v
        default: return nil
        }
    }
}

/// A slot an encoder container writes into.
private final class ValueBox {
    enum Storage {
        case empty
        case value(Value)
        case array(ArrayBox)
        case map(MapBox)
    }
    var storage: Storage = .empty

    var value: Value? {
        switch storage {
        case .empty: nil
        case .value(let v): v
        case .array(let a): .array(a.items.map { $0.value ?? .null })
        case .map(let m): .map(m.items.mapValues { $0.value ?? .null })
        }
    }
}

private final class ArrayBox { var items: [ValueBox] = [] }
private final class MapBox { var items: [String: ValueBox] = [:] }

private struct _ValueEncoder: Encoder {
    var codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    let storage: ValueBox

    init(codingPath: [any CodingKey], storage: ValueBox = ValueBox()) {
        self.codingPath = codingPath
        self.storage = storage
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        let map: MapBox
        if case .map(let existing) = storage.storage {
            map = existing
        } else {
            map = MapBox()
            storage.storage = .map(map)
        }
        return KeyedEncodingContainer(KeyedContainer<Key>(codingPath: codingPath, map: map))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        let array: ArrayBox
        if case .array(let existing) = storage.storage {
            array = existing
        } else {
            array = ArrayBox()
            storage.storage = .array(array)
        }
        return UnkeyedContainer(codingPath: codingPath, array: array)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        SingleContainer(codingPath: codingPath, box: storage)
    }

    static func encodeNested<T: Encodable>(_ value: T, path: [any CodingKey], into box: ValueBox) throws {
        if let direct = ValueEncoder.directValue(value) {
            box.storage = .value(direct)
            return
        }
        try value.encode(to: _ValueEncoder(codingPath: path, storage: box))
    }

    struct KeyedContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
        var codingPath: [any CodingKey]
        let map: MapBox

        private func box(for key: Key) -> ValueBox {
            let box = ValueBox()
            map.items[key.stringValue] = box
            return box
        }

        mutating func encodeNil(forKey key: Key) throws { box(for: key).storage = .value(.null) }
        mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
            try _ValueEncoder.encodeNested(value, path: codingPath + [key], into: box(for: key))
        }
        mutating func nestedContainer<NestedKey: CodingKey>(
            keyedBy keyType: NestedKey.Type, forKey key: Key
        ) -> KeyedEncodingContainer<NestedKey> {
            _ValueEncoder(codingPath: codingPath + [key], storage: box(for: key)).container(keyedBy: keyType)
        }
        mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
            _ValueEncoder(codingPath: codingPath + [key], storage: box(for: key)).unkeyedContainer()
        }
        mutating func superEncoder() -> any Encoder {
            _ValueEncoder(codingPath: codingPath, storage: box(for: Key(stringValue: "super")!))
        }
        mutating func superEncoder(forKey key: Key) -> any Encoder {
            _ValueEncoder(codingPath: codingPath + [key], storage: box(for: key))
        }
    }

    struct UnkeyedContainer: UnkeyedEncodingContainer {
        var codingPath: [any CodingKey]
        let array: ArrayBox
        var count: Int { array.items.count }

        private func next() -> ValueBox {
            let box = ValueBox()
            array.items.append(box)
            return box
        }

        mutating func encodeNil() throws { next().storage = .value(.null) }
        mutating func encode<T: Encodable>(_ value: T) throws {
            try _ValueEncoder.encodeNested(value, path: codingPath + [AnyKey(intValue: count)], into: next())
        }
        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type)
            -> KeyedEncodingContainer<NestedKey>
        {
            _ValueEncoder(codingPath: codingPath, storage: next()).container(keyedBy: keyType)
        }
        mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
            _ValueEncoder(codingPath: codingPath, storage: next()).unkeyedContainer()
        }
        mutating func superEncoder() -> any Encoder { _ValueEncoder(codingPath: codingPath, storage: next()) }
    }

    struct SingleContainer: SingleValueEncodingContainer {
        var codingPath: [any CodingKey]
        let box: ValueBox

        mutating func encodeNil() throws { box.storage = .value(.null) }
        mutating func encode(_ value: Bool) throws { box.storage = .value(.bool(value)) }
        mutating func encode(_ value: String) throws { box.storage = .value(.string(value)) }
        mutating func encode(_ value: Double) throws { box.storage = .value(.double(value)) }
        mutating func encode(_ value: Float) throws { box.storage = .value(.double(Double(value))) }
        mutating func encode(_ value: Int) throws { box.storage = .value(.int(Int64(value))) }
        mutating func encode(_ value: Int8) throws { box.storage = .value(.int(Int64(value))) }
        mutating func encode(_ value: Int16) throws { box.storage = .value(.int(Int64(value))) }
        mutating func encode(_ value: Int32) throws { box.storage = .value(.int(Int64(value))) }
        mutating func encode(_ value: Int64) throws { box.storage = .value(.int(value)) }
        mutating func encode(_ value: UInt) throws { box.storage = .value(.int(try Self.signed(value, codingPath))) }
        mutating func encode(_ value: UInt8) throws { box.storage = .value(.int(Int64(value))) }
        mutating func encode(_ value: UInt16) throws { box.storage = .value(.int(Int64(value))) }
        mutating func encode(_ value: UInt32) throws { box.storage = .value(.int(Int64(value))) }
        mutating func encode(_ value: UInt64) throws {
            box.storage = .value(.int(try Self.signed(value, codingPath)))
        }
        mutating func encode<T: Encodable>(_ value: T) throws {
            try _ValueEncoder.encodeNested(value, path: codingPath, into: box)
        }

        static func signed<U: BinaryInteger>(_ value: U, _ path: [any CodingKey]) throws -> Int64 {
            guard let v = Int64(exactly: value) else {
                throw EncodingError.invalidValue(
                    value, .init(codingPath: path, debugDescription: "\(value) does not fit in a 64-bit signed integer")
                )
            }
            return v
        }
    }
}
