import StateSyncTesting
import Testing

@testable import StateSync

/// The byte order of names (versions' node ids, snapshot pages): the fast comparison must say
/// exactly what comparing the UTF-8 views says, for every kind of name.
@Suite("Name order")
struct NameOrderTests {
    /// Names that share long prefixes, are prefixes of each other, hold NUL or DEL bytes or are
    /// not ASCII (composed and decomposed spellings).
    static func names(seed: UInt64, count: Int) -> [String] {
        var random = SeededRandom(seed: seed)
        let stems = [
            "", "p", "p1", "p10", "a\u{0}", "a", "property-with-a-long-shared-prefix-",
            "0123456789abcdef", "0123456789abcdeg", "caf\u{e9}", "cafe\u{301}", "\u{1F600}", "Z", "~",
        ]
        var names = Set<String>()
        while names.count < count {
            var name = stems.randomElement(using: &random)!
            for _ in 0..<Int.random(in: 0...20, using: &random) {
                name.unicodeScalars.append(
                    ["a", "b", "z", "0", "\u{0}", "\u{7F}", "\u{e9}", "\u{301}"].randomElement(using: &random)!)
            }
            names.insert(name)
        }
        return Array(names)
    }

    @Test(arguments: [4, 5] as [UInt64])
    func namesCompareAsTheirBytes(seed: UInt64) {
        let names = Self.names(seed: seed, count: 120)
        for a in names {
            for b in names {
                #expect(
                    a.utf8Precedes(b) == a.utf8.lexicographicallyPrecedes(b.utf8),
                    "seed \(seed): \(a.debugDescription) against \(b.debugDescription)")
            }
        }
        let node = Version(milliseconds: 5, counter: 1, node: "caf\u{e9}")
        let decomposed = Version(milliseconds: 5, counter: 1, node: "cafe\u{301}")
        #expect(decomposed < node, "a version's node id sorts by its bytes")
        #expect(!(node < node))
    }
}
