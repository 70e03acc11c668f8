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
    }
}

/// The deterministic generator of randomised tests (seeds are printed on failure): the harness's.
typealias SplitMix64 = SeededGenerator
