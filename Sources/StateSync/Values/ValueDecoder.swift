import Foundation

/// Turns a ``Value`` back into any `Decodable` type; the inverse of ``ValueEncoder``.
///
/// A value of the wrong shape (a string where an `Int` is declared) throws a `DecodingError`
/// naming the path; callers on the replication path drop such a property and count it.
public struct ValueDecoder: Sendable {
    /// A decoder.
    public init() {}

    /// Decodes a `T` from `value`; throws when the value does not fit the type.
    public func decode<T: Decodable>(_ type: T.Type, from value: Value) throws -> T {
        if Self.decodesDirectly(type) { return try Self.directDecode(type, value, path: []) }
        return try T(from: _ValueDecoder(value: value, codingPath: []))
    }

    /// Whether ``directDecode(_:_:path:)`` decodes `T`: the common property types, compared by
    /// metadata (no dynamic cast).
    @inline(__always)
    static func decodesDirectly<T>(_ type: T.Type) -> Bool {
        T.self == Int.self || T.self == String.self || T.self == Bool.self || T.self == Double.self
            || T.self == Data.self || T.self == Date.self || T.self == Value.self
    }

    // Each `unsafeBitCast` follows a check that `T` is exactly that type: a reinterpretation of a
    // value as its own type, without the dynamic cast `as! T` costs in generic code. It returns
    // `T`, not `T?`: an optional of a generic type costs a metadata look-up on every call.
    /// Decodes one of the types ``decodesDirectly(_:)`` accepts (only those).
    @inline(__always)
    static func directDecode<T>(_ type: T.Type, _ value: Value, path: [any CodingKey]) throws -> T {
        if T.self == Int.self {
            guard case .int(let i) = value, let v = Int(exactly: i) else { throw mismatch(type, value, path) }
            return unsafeBitCast(v, to: T.self)
        }
        if T.self == String.self {
            guard case .string(let s) = value else { throw mismatch(type, value, path) }
            return unsafeBitCast(s, to: T.self)
        }
        if T.self == Bool.self {
            guard case .bool(let b) = value else { throw mismatch(type, value, path) }
            return unsafeBitCast(b, to: T.self)
        }
        if T.self == Double.self {
            switch value {
            case .double(let d): return unsafeBitCast(d, to: T.self)
            case .int(let i): return unsafeBitCast(Double(i), to: T.self)
            default: throw mismatch(type, value, path)
            }
        }
        if T.self == Data.self {
            guard case .bytes(let b) = value else { throw mismatch(type, value, path) }
            return unsafeBitCast(Data(b), to: T.self)
        }
        if T.self == Date.self {
            switch value {
            case .double(let d): return unsafeBitCast(Date(timeIntervalSinceReferenceDate: d), to: T.self)
            case .int(let i): return unsafeBitCast(Date(timeIntervalSinceReferenceDate: Double(i)), to: T.self)
            default: throw mismatch(type, value, path)
            }
        }
        precondition(T.self == Value.self, "directDecode(_:_:path:) is only for the types decodesDirectly accepts")
        return unsafeBitCast(value, to: T.self)
    }

    static func mismatch<T>(_ type: T.Type, _ value: Value, _ path: [any CodingKey]) -> DecodingError {
        .typeMismatch(type, .init(codingPath: path, debugDescription: "expected \(T.self), found \(value.kindName)"))
    }
}

private struct _ValueDecoder: Decoder {
    let value: Value
    var codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard case .map(let map) = value else {
            throw ValueDecoder.mismatch([String: Value].self, value, codingPath)
        }
        return KeyedDecodingContainer(KeyedContainer<Key>(map: map, codingPath: codingPath))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard case .array(let items) = value else { throw ValueDecoder.mismatch([Value].self, value, codingPath) }
        return UnkeyedContainer(items: items, codingPath: codingPath)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        SingleContainer(value: value, codingPath: codingPath)
    }

    static func decodeNested<T: Decodable>(_ type: T.Type, _ value: Value, path: [any CodingKey]) throws -> T {
        if ValueDecoder.decodesDirectly(type) { return try ValueDecoder.directDecode(type, value, path: path) }
        return try T(from: _ValueDecoder(value: value, codingPath: path))
    }

    static func integer<I: FixedWidthInteger>(_ type: I.Type, _ value: Value, _ path: [any CodingKey]) throws -> I {
        guard case .int(let i) = value, let v = I(exactly: i) else { throw ValueDecoder.mismatch(type, value, path) }
        return v
    }

    struct KeyedContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
        let map: [String: Value]
        var codingPath: [any CodingKey]
        var allKeys: [Key] { map.keys.compactMap { Key(stringValue: $0) } }

        func contains(_ key: Key) -> Bool { map[key.stringValue] != nil }

        private func value(for key: Key) throws -> Value {
            guard let v = map[key.stringValue] else {
                throw DecodingError.keyNotFound(
                    key, .init(codingPath: codingPath, debugDescription: "no value for '\(key.stringValue)'"))
            }
            return v
        }

        func decodeNil(forKey key: Key) throws -> Bool {
            if case .null = try value(for: key) { return true }
            return false
        }
        func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
            try _ValueDecoder.decodeNested(type, try value(for: key), path: codingPath + [key])
        }
        func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws
            -> KeyedDecodingContainer<NestedKey>
        {
            try _ValueDecoder(value: try value(for: key), codingPath: codingPath + [key]).container(keyedBy: type)
        }
        func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
            try _ValueDecoder(value: try value(for: key), codingPath: codingPath + [key]).unkeyedContainer()
        }
        func superDecoder() throws -> any Decoder {
            _ValueDecoder(value: map["super"] ?? .null, codingPath: codingPath)
        }
        func superDecoder(forKey key: Key) throws -> any Decoder {
            _ValueDecoder(value: map[key.stringValue] ?? .null, codingPath: codingPath + [key])
        }
    }

    struct UnkeyedContainer: UnkeyedDecodingContainer {
        let items: [Value]
        var codingPath: [any CodingKey]
        var currentIndex = 0
        var count: Int? { items.count }
        var isAtEnd: Bool { currentIndex >= items.count }

        init(items: [Value], codingPath: [any CodingKey]) {
            self.items = items
            self.codingPath = codingPath
        }

        private mutating func next() throws -> Value {
            guard !isAtEnd else {
                throw DecodingError.valueNotFound(
                    Value.self, .init(codingPath: codingPath, debugDescription: "array ended early"))
            }
            defer { currentIndex += 1 }
            return items[currentIndex]
        }

        mutating func decodeNil() throws -> Bool {
            guard !isAtEnd, case .null = items[currentIndex] else { return false }
            currentIndex += 1
            return true
        }
        mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
            let path = codingPath + [AnyKey(intValue: currentIndex)]
            return try _ValueDecoder.decodeNested(type, try next(), path: path)
        }
        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws
            -> KeyedDecodingContainer<NestedKey>
        {
            try _ValueDecoder(value: try next(), codingPath: codingPath).container(keyedBy: type)
        }
        mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
            try _ValueDecoder(value: try next(), codingPath: codingPath).unkeyedContainer()
        }
        mutating func superDecoder() throws -> any Decoder {
            _ValueDecoder(value: try next(), codingPath: codingPath)
        }
    }

    struct SingleContainer: SingleValueDecodingContainer {
        let value: Value
        var codingPath: [any CodingKey]

        func decodeNil() -> Bool {
            if case .null = value { return true }
            return false
        }
        func decode(_ type: Bool.Type) throws -> Bool { try _ValueDecoder.decodeNested(type, value, path: codingPath) }
        func decode(_ type: String.Type) throws -> String {
            try _ValueDecoder.decodeNested(type, value, path: codingPath)
        }
        func decode(_ type: Double.Type) throws -> Double {
            try _ValueDecoder.decodeNested(type, value, path: codingPath)
        }
        func decode(_ type: Float.Type) throws -> Float {
            Float(try _ValueDecoder.decodeNested(Double.self, value, path: codingPath))
        }
        func decode(_ type: Int.Type) throws -> Int { try _ValueDecoder.integer(type, value, codingPath) }
        func decode(_ type: Int8.Type) throws -> Int8 { try _ValueDecoder.integer(type, value, codingPath) }
        func decode(_ type: Int16.Type) throws -> Int16 { try _ValueDecoder.integer(type, value, codingPath) }
        func decode(_ type: Int32.Type) throws -> Int32 { try _ValueDecoder.integer(type, value, codingPath) }
        func decode(_ type: Int64.Type) throws -> Int64 { try _ValueDecoder.integer(type, value, codingPath) }
        func decode(_ type: UInt.Type) throws -> UInt { try _ValueDecoder.integer(type, value, codingPath) }
        func decode(_ type: UInt8.Type) throws -> UInt8 { try _ValueDecoder.integer(type, value, codingPath) }
        func decode(_ type: UInt16.Type) throws -> UInt16 { try _ValueDecoder.integer(type, value, codingPath) }
        func decode(_ type: UInt32.Type) throws -> UInt32 { try _ValueDecoder.integer(type, value, codingPath) }
        func decode(_ type: UInt64.Type) throws -> UInt64 { try _ValueDecoder.integer(type, value, codingPath) }
        func decode<T: Decodable>(_ type: T.Type) throws -> T {
            try _ValueDecoder.decodeNested(type, value, path: codingPath)
        }
    }
}
