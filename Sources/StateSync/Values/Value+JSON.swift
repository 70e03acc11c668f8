import Foundation

/// JSON text to and from ``Value``, for the CLI and for people. Not used on the replication path.
extension Value {
    /// An error parsing JSON text into a ``Value``.
    public struct JSONError: Error, Sendable, CustomStringConvertible {
        /// The text that did not parse.
        public let text: String
        /// Why.
        public let reason: String
        /// Whether the text is JSON that no value holds (a number out of range), not malformed.
        let isOutOfRange: Bool

        init(text: String, reason: String, isOutOfRange: Bool = false) {
            self.text = text
            self.reason = reason
            self.isOutOfRange = isOutOfRange
        }

        public var description: String {
            // A long text (a file, standard input) is quoted by its start only: one line.
            let start = text.count <= 80 ? text : "\(text.prefix(60))… (\(text.utf8.count) bytes)"
            let shown = start.replacingOccurrences(of: "\n", with: "\\n").replacingOccurrences(of: "\r", with: "\\r")
            return "'\(shown)' \(isOutOfRange ? "is JSON no value holds" : "is not valid JSON"): \(reason)"
        }
    }

    /// Parses one JSON value (any JSON, including a bare string, number or `null`).
    ///
    /// Integers become ``int(_:)``, other numbers ``double(_:)``; an object of the single key
    /// `$bytes` with a base64 string becomes ``bytes(_:)``. An integer that 64 bits do not hold
    /// is an error, not rounded into a double (write it with a fraction or an exponent to mean a
    /// double, or as a string to keep its digits).
    public init(json text: String) throws(JSONError) {
        do {
            let wrapper = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
            self = wrapper.value
        } catch {
            let reason = Self.describe(error)
            throw JSONError(text: text, reason: reason, isOutOfRange: reason == JSONValue.outOfRange)
        }
        if let integer = Self.firstIntegerOutOfRange(in: text) {
            throw JSONError(
                text: text,
                reason:
                    "\(integer) is an integer out of range (a value holds a 64-bit integer; write \(integer).0 for a double, or \"\(integer)\" for its digits)",
                isOutOfRange: true)
        }
    }

    /// The first number of valid JSON `text` written as an integer (no fraction, no exponent)
    /// that `Int64` does not hold: `JSONDecoder` gives it as a rounded double.
    private static func firstIntegerOutOfRange(in text: String) -> String? {
        func isDigit(_ octet: UInt8) -> Bool { octet >= UInt8(ascii: "0") && octet <= UInt8(ascii: "9") }
        let octets = Array(text.utf8)
        var index = 0
        while index < octets.count {
            let octet = octets[index]
            if octet == UInt8(ascii: "\"") {
                // A string: skipped to its closing quote, escapes included.
                index += 1
                while index < octets.count, octets[index] != UInt8(ascii: "\"") {
                    index += octets[index] == UInt8(ascii: "\\") ? 2 : 1
                }
                index += 1
            } else if octet == UInt8(ascii: "-") || isDigit(octet) {
                // A number: outside strings, only numbers start so in valid JSON.
                let start = index
                var integral = true
                index += 1
                while index < octets.count {
                    if isDigit(octets[index]) {
                        index += 1
                    } else if ".eE+-".utf8.contains(octets[index]) {
                        integral = false
                        index += 1
                    } else {
                        break
                    }
                }
                let number = String(decoding: octets[start..<index], as: UTF8.self)
                if integral, Int64(number) == nil { return number }
            } else {
                index += 1
            }
        }
        return nil
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
        var out: [UInt8] = []
        writeJSON(into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends the value as compact JSON with sorted keys to `out`, as UTF-8. (Written as
    /// octets, not appended to a `String`: `statesync watch --json` writes one line per change,
    /// and a `String`'s appends, each keeping its count and flags, took a third of its time.)
    package func writeJSON(into out: inout [UInt8]) {
        switch self {
        case .null: JSONOctets.append("null", to: &out)
        case .bool(let b): JSONOctets.append(b ? "true" : "false", to: &out)
        case .int(let i): JSONOctets.appendDecimal(i, to: &out)
        case .double(let d):
            // Swift prints the shortest text that reads back exactly ("1.0", "1e-05").
            if d.isFinite { out.append(contentsOf: d.description.utf8) } else { JSONOctets.append("null", to: &out) }
        case .string(let s): JSONOctets.appendString(s, to: &out)
        case .bytes(let bytes):
            JSONOctets.append("{\"$bytes\":\"", to: &out)
            out.append(contentsOf: Data(bytes).base64EncodedString().utf8)
            JSONOctets.append("\"}", to: &out)
        case .array(let items):
            out.append(UInt8(ascii: "["))
            for (index, item) in items.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                item.writeJSON(into: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .map(let map):
            out.append(UInt8(ascii: "{"))
            for (index, key) in map.keys.sorted().enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                JSONOctets.appendString(key, to: &out)
                out.append(UInt8(ascii: ":"))
                map[key]!.writeJSON(into: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }
}

/// The pieces of compact JSON text, appended to UTF-8 octets.
package enum JSONOctets {
    /// Appends `text` as it is (for literals that need no escape).
    package static func append(_ text: StaticString, to out: inout [UInt8]) {
        text.withUTF8Buffer { out.append(contentsOf: $0) }
    }

    /// Appends `value` in decimal.
    package static func appendDecimal(_ value: UInt64, to out: inout [UInt8]) {
        guard value >= 10 else { return out.append(UInt8(ascii: "0") + UInt8(value)) }
        // At most 20 digits, written from the end into a fixed buffer.
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)
        withUnsafeMutableBytes(of: &digits) { buffer in
            var rest = value
            var at = buffer.count
            while rest > 0 {
                at -= 1
                buffer[at] = UInt8(ascii: "0") + UInt8(rest % 10)
                rest /= 10
            }
            out.append(contentsOf: buffer[at...])
        }
    }

    /// Appends `value` in decimal, with its sign.
    package static func appendDecimal(_ value: Int64, to out: inout [UInt8]) {
        if value < 0 { out.append(UInt8(ascii: "-")) }
        appendDecimal(value.magnitude, to: &out)
    }

    /// Appends `text` as a JSON string: quoted, with `"`, `\\` and control characters escaped.
    package static func appendString(_ text: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        appendEscaped(text, to: &out)
        out.append(UInt8(ascii: "\""))
    }

    /// Appends `text` as the inside of a JSON string (escaped, not quoted).
    package static func appendEscaped(_ text: String, to out: inout [UInt8]) {
        // Most strings need no escape: appended whole. (The scan runs over the string's octets in
        // place; a generic walk of the UTF-8 view cost the watch CLI 2 % of its time.)
        var text = text
        text.withUTF8 { octets in
            guard octets.contains(where: needsEscape) else { return out.append(contentsOf: octets) }
            for octet in octets {
                guard needsEscape(octet) else {
                    out.append(octet)
                    continue
                }
                out.append(UInt8(ascii: "\\"))
                switch octet {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"): out.append(octet)
                case UInt8(ascii: "\n"): out.append(UInt8(ascii: "n"))
                case UInt8(ascii: "\r"): out.append(UInt8(ascii: "r"))
                case UInt8(ascii: "\t"): out.append(UInt8(ascii: "t"))
                default:
                    // Other control characters as \u00XX, lower-case hex.
                    let hex: StaticString = "0123456789abcdef"
                    out.append(contentsOf: [UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0")])
                    hex.withUTF8Buffer { digits in
                        out.append(digits[Int(octet >> 4)])
                        out.append(digits[Int(octet & 0x0F)])
                    }
                }
            }
        }
    }

    private static func needsEscape(_ octet: UInt8) -> Bool {
        octet < 0x20 || octet == UInt8(ascii: "\"") || octet == UInt8(ascii: "\\")
    }
}

/// Decodes arbitrary JSON into a ``Value`` through `JSONDecoder`.
private struct JSONValue: Decodable {
    static let outOfRange = "a number out of range (a value holds a 64-bit integer or a finite double)"
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
        } else if let string = try? single.decode(String.self) {
            value = .string(string)
        } else {
            // Not null, a bool, an integer, a double or a string: a number no value holds (the
            // decoder would say only that it expected a string).
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: Self.outOfRange))
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
