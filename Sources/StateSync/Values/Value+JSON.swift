import Foundation

/// JSON text to and from ``Value``, for the CLI and for people. Not used on the replication path.
extension Value {
    /// An error parsing JSON text into a ``Value``.
    public struct JSONError: Error, Sendable, CustomStringConvertible {
        /// The text that did not parse.
        public let text: String
        /// Why.
        public let reason: String
        public var description: String { "'\(text)' is not valid JSON: \(reason)" }
    }

    /// Parses one JSON value (any JSON, including a bare string, number or `null`).
    ///
    /// Integers that fit in 64 bits become ``int(_:)``, other numbers ``double(_:)``; an object
    /// of the single key `$bytes` with a base64 string becomes ``bytes(_:)``.
    public init(json text: String) throws(JSONError) {
        do {
            let wrapper = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
            self = wrapper.value
        } catch {
            throw JSONError(text: text, reason: Self.describe(error))
        }
    }

    private static func describe(_ error: any Error) -> String {
        if let decoding = error as? DecodingError {
            switch decoding {
            case .dataCorrupted(let context):
                if let underlying = context.underlyingError as NSError?,
                    let detail = underlying.userInfo[NSDebugDescriptionErrorKey] as? String
                {
                    return detail
                }
                return context.debugDescription
            default:
                return "\(decoding)"
            }
        }
        return "\(error)"
    }

    /// The value as compact JSON with sorted keys (deterministic).
    public func jsonText() -> String {
        var out = ""
        writeJSON(into: &out)
        return out
    }

    /// Appends the value as compact JSON with sorted keys to `out`.
    package func writeJSON(into out: inout String) {
        switch self {
        case .null: out += "null"
        case .bool(let b): out += b ? "true" : "false"
        case .int(let i): out += String(i)
        case .double(let d):
            // Swift prints the shortest text that reads back exactly ("1.0", "1e-05").
            out += d.isFinite ? "\(d)" : "null"
        case .string(let s): Self.writeJSONString(s, into: &out)
        case .bytes(let bytes):
            out += "{\"$bytes\":\""
            out += Data(bytes).base64EncodedString()
            out += "\"}"
        case .array(let items):
            out += "["
            for (index, item) in items.enumerated() {
                if index > 0 { out += "," }
                item.writeJSON(into: &out)
            }
            out += "]"
        case .map(let map):
            out += "{"
            for (index, key) in map.keys.sorted().enumerated() {
                if index > 0 { out += "," }
                Self.writeJSONString(key, into: &out)
                out += ":"
                map[key]!.writeJSON(into: &out)
            }
            out += "}"
        }
    }

    static func writeJSONString(_ string: String, into out: inout String) {
        out += "\""
        // Most strings need no escape: appended whole. (The scan runs over the string's bytes in
        // place; a generic walk of the UTF-8 view cost the watch CLI 2 % of its time.)
        let needsEscape: (UInt8) -> Bool = { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }
        let escaped =
            string.utf8.withContiguousStorageIfAvailable { $0.contains(where: needsEscape) }
            ?? string.utf8.contains(where: needsEscape)
        if !escaped {
            out += string
            out += "\""
            return
        }
        for scalar in string.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case let s where s.value < 0x20:
                out +=
                    "\\u" + String(repeating: "0", count: 4 - String(s.value, radix: 16).count)
                    + String(s.value, radix: 16)
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }
}

/// Decodes arbitrary JSON into a ``Value`` through `JSONDecoder`.
private struct JSONValue: Decodable {
    let value: Value

    init(from decoder: any Decoder) throws {
        if var array = try? decoder.unkeyedContainer() {
            var items: [Value] = []
            while !array.isAtEnd { items.append(try array.decode(JSONValue.self).value) }
            value = .array(items)
            return
        }
        if let object = try? decoder.container(keyedBy: AnyKey.self) {
            var map: [String: Value] = [:]
            for key in object.allKeys { map[key.stringValue] = try object.decode(JSONValue.self, forKey: key).value }
            if map.count == 1, let content = map["$bytes"] {
                // The form of a bytes value: anything else under it is a mistake, not a map that
                // would print exactly like bytes.
                guard case .string(let base64) = content, let data = Data(base64Encoded: base64) else {
                    throw DecodingError.dataCorrupted(
                        .init(
                            codingPath: decoder.codingPath,
                            debugDescription: "{\"$bytes\": …} holds bytes as base64 text, and this is not base64"))
                }
                value = .bytes(Array(data))
            } else {
                value = .map(map)
            }
            return
        }
        let single = try decoder.singleValueContainer()
        if single.decodeNil() {
            value = .null
        } else if let b = try? single.decode(Bool.self) {
            value = .bool(b)
        } else if let i = try? single.decode(Int64.self) {
            value = .int(i)
        } else if let d = try? single.decode(Double.self) {
            value = .double(d)
        } else {
            value = .string(try single.decode(String.self))
        }
    }
}

struct AnyKey: CodingKey {
    var stringValue: String
    var intValue: Int?
    init(stringValue: String) { self.stringValue = stringValue }
    init(intValue: Int) {
        self.stringValue = String(intValue)
        self.intValue = intValue
    }
}
