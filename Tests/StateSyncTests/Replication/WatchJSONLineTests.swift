import StateSyncTesting
import Testing

@testable import StateSync

/// `statesync watch --json` writes a change's line directly; it must be byte for byte the map of
/// its fields as ``Value/jsonText()`` writes it (keys in order, the same escapes).
@Suite("The watch's JSON line")
struct WatchJSONLineTests {
    static let texts = [
        "", "plain", "k0001", "with \"quotes\"", "back\\slash", "new\nline", "tab\tand\rreturn", "\u{1}\u{1F}ctl",
        "é accent", "emoji 🙂", "mixed \" \\ \n é",
    ]

    static func text(_ random: inout SeededRandom) -> String {
        texts[Int(random.next() % UInt64(texts.count))]
    }

    static func value(_ random: inout SeededRandom, depth: Int = 0) -> Value {
        switch random.next() % (depth < 2 ? 9 : 7) {
        case 0: return .null
        case 1: return .bool(random.next() % 2 == 0)
        case 2: return .int(Int64(bitPattern: random.next()))
        case 3: return .double([0.5, -0.0, 1e-5, .infinity, .nan, 123456.789][Int(random.next() % 6)])
        case 4, 5: return .string(text(&random))
        case 6: return .bytes((0..<Int(random.next() % 5)).map { _ in UInt8(truncatingIfNeeded: random.next()) })
        case 7: return .array((0..<Int(random.next() % 3)).map { _ in value(&random, depth: depth + 1) })
        default:
            var map: [String: Value] = [:]
            for _ in 0..<Int(random.next() % 3) { map[text(&random)] = value(&random, depth: depth + 1) }
            return .map(map)
        }
    }

    @Test(arguments: 1...20 as ClosedRange<UInt64>)
    func theLineIsTheMapOfItsFields(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        for _ in 0..<50 {
            let kind: PropertyChange.Kind = [.set, .deleted, .expired][Int(random.next() % 3)]
            let change = PropertyChange(
                channel: Self.text(&random), model: Self.text(&random), property: Self.text(&random),
                old: random.next() % 3 == 0 ? nil : Self.value(&random),
                new: kind == .set ? Self.value(&random) : .null,
                version: Version(
                    milliseconds: 1_795_000_000_000 + random.next() % 1000, counter: UInt16(random.next() % 3),
                    node: "n\(random.next() % 3)"),
                kind: kind, expiresAt: kind == .set && random.next() % 2 == 0 ? 1_795_000_000_000 : nil)
            let watchKind: WatchEvent.Kind = [.live, .initial, .resync][Int(random.next() % 3)]
            let cursor = WatchCursor(["n0": random.next() % 100, "n1": random.next() % 100])
            let line = change.watchJSONLine(kind: watchKind, cursor: cursor)
            let reference = Value.map(change.watchJSONFields(kind: watchKind, cursor: cursor)).jsonText()
            #expect(line == reference, "seed \(seed)")
        }
    }

    /// The octets `jsonText()` writes read back as the value (JSON's own parser), and the
    /// escapes and numbers are spelt exactly: control characters as `\u00XX` in lower-case hex
    /// (`\n`, `\r`, `\t` short), multi-byte UTF-8 as it is, integers at both ends of their range.
    @Test func theTextIsExactJSON() throws {
        let cases: [(Value, String)] = [
            (.string("\u{0}\u{8}\u{C}\u{1F}"), #""\u0000\u0008\u000c\u001f""#),
            (.string("tab\tnl\ncr\rq\"b\\"), #""tab\tnl\ncr\rq\"b\\""#),
            (.string("é 🙂 \u{7F}"), "\"é 🙂 \u{7F}\""),
            (.int(0), "0"), (.int(9), "9"), (.int(10), "10"), (.int(-7), "-7"),
            (.int(.max), "9223372036854775807"), (.int(.min), "-9223372036854775808"),
            (.double(-1.5e-7), "-1.5e-07"), (.double(.nan), "null"), (.bytes([0, 255]), #"{"$bytes":"AP8="}"#),
            (.map(["b": .array([.bool(true), .null]), "a": .map([:])]), #"{"a":{},"b":[true,null]}"#),
        ]
        for (value, text) in cases {
            #expect(value.jsonText() == text)
            if case .double(let d) = value, !d.isFinite { continue }
            #expect(try Value(json: text) == value, "\(text)")
        }
        let version = Version(milliseconds: 1_795_000_000_123, counter: 65535, node: "n\"1")
        var octets: [UInt8] = []
        version.writeText(into: &octets)
        #expect(String(decoding: octets, as: UTF8.self) == #"1795000000123.65535@n\"1"#)
    }

    /// A cursor's text form (in every line): `origin:sequence` pairs sorted by origin, or `-`;
    /// it parses back to the same cursor.
    @Test func aCursorsTextIsItsSortedPairsAndParsesBack() throws {
        let cursor = WatchCursor(["n2": 7, "n10": 12, "n1": 3])
        #expect(cursor.description == "n1:3,n10:12,n2:7")
        #expect(WatchCursor(cursor.description) == cursor)
        #expect(WatchCursor().description == "-" && WatchCursor("-") == WatchCursor())
    }
}
