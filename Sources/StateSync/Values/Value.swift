/// A replicated property value: the wire's dynamic type.
///
/// Every `Codable` property type maps onto these cases (see ``ValueEncoder``/``ValueDecoder``),
/// and the wire encodes them compactly (docs/PROTOCOL.md, "Values").
///
/// Equality is the wire's: doubles compare by bit pattern (so `-0.0 != 0.0` and a NaN equals
/// the same NaN), strings by their UTF-8 bytes.
public enum Value: Sendable, Hashable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case bytes([UInt8])
    case array([Value])
    case map([String: Value])

    /// A short name of the case, for error messages.
    public var kindName: String {
        switch self {
        case .null: "null"
        case .bool: "bool"
        case .int: "int"
        case .double: "double"
        case .string: "string"
        case .bytes: "bytes"
        case .array: "array"
        case .map: "map"
        }
    }
}

extension Value {
    public static func == (lhs: Value, rhs: Value) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): true
        case (.bool(let a), .bool(let b)): a == b
        case (.int(let a), .int(let b)): a == b
        case (.double(let a), .double(let b)): a.bitPattern == b.bitPattern
        case (.string(let a), .string(let b)): a.hasSameUTF8(as: b)
        case (.bytes(let a), .bytes(let b)): a == b
        case (.array(let a), .array(let b)): a == b
        case (.map(let a), .map(let b)): a == b
        default: false
        }
    }

    public func hash(into hasher: inout Hasher) {
        switch self {
        case .null: hasher.combine(0)
        case .bool(let b): hasher.combine(b)
        case .int(let i): hasher.combine(i)
        case .double(let d): hasher.combine(d.bitPattern)
        case .string(let s): for byte in s.utf8 { hasher.combine(byte) }
        case .bytes(let b): hasher.combine(b)
        case .array(let a): hasher.combine(a)
        case .map(let m): hasher.combine(m)
        }
    }

    /// The level of the deepest element, the value itself at level 1 (PROTOCOL.md 4.2): a scalar
    /// or an empty array or map is 1, a container 1 + its deepest element's level.
    var deepestLevel: Int {
        switch self {
        case .array(let items): 1 + (items.map(\.deepestLevel).max() ?? 0)
        case .map(let map): 1 + (map.values.map(\.deepestLevel).max() ?? 0)
        default: 1
        }
    }

    /// How deeply arrays and maps nest (a scalar is 0).
    public var depth: Int {
        switch self {
        case .array(let items): 1 + (items.map(\.depth).max() ?? 0)
        case .map(let map): 1 + (map.values.map(\.depth).max() ?? 0)
        default: 0
        }
    }
}

extension Value: ExpressibleByNilLiteral, ExpressibleByBooleanLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByFloatLiteral, ExpressibleByStringLiteral, ExpressibleByArrayLiteral,
    ExpressibleByDictionaryLiteral
{
    public init(nilLiteral: ()) { self = .null }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(stringLiteral value: String) { self = .string(value) }
    public init(arrayLiteral elements: Value...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, Value)...) {
        self = .map(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }
}

extension Value: CustomStringConvertible {
    /// The value as compact JSON (bytes as `{"$bytes":"<base64>"}`).
    public var description: String { jsonText() }
}
