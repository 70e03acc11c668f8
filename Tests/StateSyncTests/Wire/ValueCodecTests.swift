import Foundation
import StateSyncHarness
import Testing

@testable import StateSync

@Suite("Value encoding (PROTOCOL.md §Values)")
struct ValueCodecTests {
    static let samples: [Value] = [
        .null, .bool(true), .bool(false), .int(0), .int(-1), .int(.max), .int(.min), .double(3.25),
        .double(-0.0), .double(.infinity), .string(""), .string("héllo ✓"), .bytes([]), .bytes([0, 255]),
        .array([]), .array([1, "two", [3.5]]), .map([:]), .map(["b": 1, "a": ["nested": [true, nil]]]),
    ]

    static func encode(_ value: Value) -> [UInt8] {
        var writer = WireWriter()
        writer.value(value)
        return writer.bytes
    }

    @Test(arguments: samples)
    func roundTrips(_ value: Value) throws {
        var reader = WireReader(Self.encode(value))
        #expect(try reader.value() == value)
        #expect(reader.isAtEnd)
    }

    /// Strings compare as bytes where the wire, digests and versions need it: canonically
    /// equivalent spellings are different names and values.
    @Test func stringsCompareAsTheirBytes() {
        let long = String(repeating: "a name long enough to live on the heap ", count: 3)
        #expect("model".hasSameUTF8(as: "model") && "".hasSameUTF8(as: ""))
        #expect(long.hasSameUTF8(as: String(long.utf8.map { Character(UnicodeScalar($0)) })))
        #expect(!"model".hasSameUTF8(as: "modeL") && !"model".hasSameUTF8(as: "model ") && !"".hasSameUTF8(as: "a"))
        #expect(!long.hasSameUTF8(as: long + "!"))
        // Either side of the lengths held in place (15), compared by a loop (16) or by memcmp:
        // equal bytes in another representation, and a difference in the last byte.
        for length in [15, 16, 17, 40] {
            let name = String(repeating: "x", count: length)
            #expect(name.hasSameUTF8(as: String(name.utf8.map { Character(UnicodeScalar($0)) })), "\(length)")
            let last = String(repeating: "x", count: length - 1) + "y"
            #expect(!name.hasSameUTF8(as: last) && !last.hasSameUTF8(as: name), "\(length)")
        }
        let composed = "caf\u{e9}"
        let decomposed = "cafe\u{301}"
        #expect(composed == decomposed, "Swift's == is canonical equivalence")
        #expect(!composed.hasSameUTF8(as: decomposed))
        let reordered = ("a\u{301}\u{316}", "a\u{316}\u{301}")  // same length, same meaning
        #expect(reordered.0 == reordered.1 && !reordered.0.hasSameUTF8(as: reordered.1))
        #expect(Value.string(composed) != Value.string(decomposed))
        #expect(
            Version(milliseconds: 1, counter: 0, node: composed)
                != Version(milliseconds: 1, counter: 0, node: decomposed))
        #expect(
            Version(milliseconds: 1, counter: 0, node: long) == Version(milliseconds: 1, counter: 0, node: long + ""))
    }

    @Test func knownBytes() {
        #expect(Self.encode(.null) == [0x00])
        #expect(Self.encode(.int(1)) == [0x03, 0x02])
        #expect(Self.encode(.int(-1)) == [0x03, 0x01])
        #expect(Self.encode(.int(300)) == [0x03, 0xD8, 0x04])
        #expect(Self.encode(.string("hi")) == [0x05, 0x02, 0x68, 0x69])
        #expect(Self.encode(.double(1)) == [0x04, 0x3F, 0xF0, 0, 0, 0, 0, 0, 0])
        // Map keys are sorted, so equal maps encode to equal bytes.
        #expect(Self.encode(["b": 1, "a": 2]) == [0x08, 0x02, 0x01, 0x61, 0x03, 0x04, 0x01, 0x62, 0x03, 0x02])
    }

    @Test(arguments: samples)
    func everyTruncationThrowsAndNeverTraps(_ value: Value) {
        let bytes = Self.encode(value)
        for cut in 0..<bytes.count {
            var reader = WireReader(Array(bytes.prefix(cut)))
            #expect(throws: WireError.self) { try reader.value() }
        }
    }

    @Test func hugeCountsAreRejectedBeforeAllocating() {
        // An array claiming 2^62 items in a 12-byte frame.
        var writer = WireWriter()
        writer.byte(0x07)
        writer.varint(1 << 62)
        var reader = WireReader(writer.bytes + [0, 0])
        #expect(throws: WireError.tooLarge(field: "value", count: 1 << 62)) { try reader.value() }
    }

    @Test func badUTF8UnknownTagsDeepNestingAndLongVarintsAreErrors() {
        var bad = WireReader([0x05, 0x02, 0xC3, 0x28])
        #expect(throws: WireError.invalidUTF8(field: "value")) { try bad.value() }
        var unknown = WireReader([0x7F])
        #expect(throws: WireError.unknownTag(0x7F)) { try unknown.value() }
        var deep = WireReader(Array(repeating: 0x07, count: 100).flatMap { [$0, 0x01] })
        #expect(throws: WireError.tooDeep) { try deep.value() }
        var long = WireReader([0x03] + Array(repeating: 0xFF, count: 11))
        #expect(throws: WireError.self) { try long.value() }
    }

    /// The depth rule (4.2) is the same for the decoder and for `ValueEncoder`: an empty array at
    /// level 32 is valid (it has no element at level 33), a scalar at level 33 is not.
    @Test func theEncoderAndTheDecoderAgreeOnTheDepthLimit() throws {
        func nested(_ levels: Int, innermost: Value) -> Value {
            var value = innermost
            for _ in 0..<levels { value = .array([value]) }
            return value
        }
        /// `levels` arrays around `leaf` (an empty array when `nil`), as a typed model encodes.
        struct Nested: Encodable {
            let levels: Int
            let leaf: Int?
            func encode(to encoder: any Encoder) throws {
                if levels == 0, let leaf {
                    var container = encoder.singleValueContainer()
                    try container.encode(leaf)
                    return
                }
                var container = encoder.unkeyedContainer()
                if levels > 0 { try container.encode(Nested(levels: levels - 1, leaf: leaf)) }
            }
        }
        let cases: [(Nested, Value, Bool)] = [
            (Nested(levels: 31, leaf: nil), nested(31, innermost: .array([])), true),  // empty array at level 32
            (Nested(levels: 32, leaf: 1), nested(32, innermost: .int(1)), false),  // the 1 at level 33
            (Nested(levels: 31, leaf: 1), nested(31, innermost: .int(1)), true),
        ]
        for (typed, value, valid) in cases {
            var writer = WireWriter()
            writer.value(value)
            var reader = WireReader(writer.bytes)
            let decoded = Result { try reader.value() }
            let encoded = Result { try ValueEncoder().encode(typed) }
            // (`Value` is nil-literal expressible: spell the absent value out.)
            let expected: Value? = valid ? value : Optional<Value>.none
            #expect((try? decoded.get()) == expected, "decoder, valid: \(valid)")
            #expect((try? encoded.get()) == expected, "ValueEncoder, valid: \(valid)")
        }
    }

    @Test func randomBytesNeverTrap() {
        var rng = SplitMix64(seed: 0x5EED)
        for _ in 0..<20_000 {
            let length = Int(rng.next() % 40)
            let bytes = (0..<length).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
            var reader = WireReader(bytes)
            _ = try? reader.value()
            _ = try? PeerMessage.decode([[UInt8(ascii: "D")] + bytes.prefix(5), bytes])
        }
    }

    @Test func jsonRoundTripForTheCLI() throws {
        #expect(try Value(json: "3") == .int(3))
        #expect(try Value(json: "3.5") == .double(3.5))
        #expect(try Value(json: "\"hi\"") == .string("hi"))
        #expect(try Value(json: "null") == .null)
        #expect(try Value(json: "true") == .bool(true))
        #expect(try Value(json: "[1,{\"a\":null}]") == [1, ["a": nil]])
        #expect(try Value(json: "{\"$bytes\":\"AP8=\"}") == .bytes([0, 255]))
        #expect(Value.map(["b": [1, 2.5], "a": "x\"y\n"]).jsonText() == #"{"a":"x\"y\n","b":[1,2.5]}"#)
        #expect(throws: Value.JSONError.self) { try Value(json: "hello") }
        // A number no value holds is said to be one (the decoder alone says it expected a string).
        for number in ["1e400", "-1e400", "[1, 1e400]"] {
            #expect {
                try Value(json: number)
            } throws: { error in
                "\(error)".contains("is JSON no value holds: a number out of range") && !"\(error)".contains("String")
            }
        }
        // An integer no 64 bits hold is refused, not rounded into a double (`a=12345678901234567890123`
        // was stored as 1.2345678901234568e+22); a double or a string of its digits is written so.
        for (text, number) in [
            ("12345678901234567890123", "12345678901234567890123"), ("9223372036854775808", "9223372036854775808"),
            ("-9223372036854775809", "-9223372036854775809"), ("[1, 18446744073709551615]", "18446744073709551615"),
            (#"{"a": {"b": [-99999999999999999999]}}"#, "-99999999999999999999"),
        ] {
            #expect {
                try Value(json: text)
            } throws: { error in
                "\(error)".contains("'\(text)' is JSON no value holds: \(number) is an integer out of range")
            }
        }
        #expect(try Value(json: "9223372036854775807") == .int(.max))
        #expect(try Value(json: "[-9223372036854775808]") == [.int(.min)])
        #expect(try Value(json: "12345678901234567890123.0") == .double(12345678901234567890123.0))
        #expect(try Value(json: "1.2e22") == .double(1.2e22))
        #expect(
            try Value(json: #"{"12345678901234567890123": "-12345678901234567890123 \" 1e999"}"#) == [
                "12345678901234567890123": "-12345678901234567890123 \" 1e999"
            ])
    }
}

/// The deterministic generator of randomised tests (seeds are printed on failure): the harness's.
typealias SplitMix64 = SeededGenerator
