/// The version of a write: a hybrid logical clock timestamp and the id of the node that wrote it.
///
/// Versions are totally ordered: by physical milliseconds, then the logical counter, then the
/// node id (the deterministic tie-break). Each property is a last-writer-wins register ordered by
/// its version (docs/PROTOCOL.md, "Versions").
///
/// The text form is `<milliseconds>.<counter>@<node>`, for example `1763769600123.0@node1`.
public struct Version: Sendable, Hashable, Comparable, CustomStringConvertible {
    /// Milliseconds since 1970-01-01 UTC of the writer's hybrid clock.
    public var milliseconds: UInt64
    /// The logical counter that orders writes within one millisecond.
    public var counter: UInt16
    /// The id of the node that made the write.
    public var node: String

    /// A version from its parts: wall-clock milliseconds, a counter within them, the writer.
    public init(milliseconds: UInt64, counter: UInt16, node: String) {
        self.milliseconds = milliseconds
        self.counter = counter
        self.node = node
    }

    /// The version that precedes every write.
    public static let zero = Version(milliseconds: 0, counter: 0, node: "")

    /// The clock part as one integer: `milliseconds << 16 | counter` (its wire form).
    public var timestamp: UInt64 { milliseconds << 16 | UInt64(counter) }

    /// A version from its timestamp form (`milliseconds << 16 | counter`) and writer.
    public init(timestamp: UInt64, node: String) {
        self.init(milliseconds: timestamp >> 16, counter: UInt16(truncatingIfNeeded: timestamp), node: node)
    }

    public static func < (lhs: Version, rhs: Version) -> Bool {
        if lhs.milliseconds != rhs.milliseconds { return lhs.milliseconds < rhs.milliseconds }
        if lhs.counter != rhs.counter { return lhs.counter < rhs.counter }
        return lhs.node.utf8Precedes(rhs.node)
    }

    /// Equal when the clock parts and the node ids' UTF-8 bytes are equal (consistent with `<`).
    public static func == (lhs: Version, rhs: Version) -> Bool {
        lhs.milliseconds == rhs.milliseconds && lhs.counter == rhs.counter && lhs.node.hasSameUTF8(as: rhs.node)
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(milliseconds)
        hasher.combine(counter)
        for byte in node.utf8 { hasher.combine(byte) }
    }

    public var description: String { "\(milliseconds).\(counter)@\(node)" }

    /// Appends the text form to `out`, as inside a JSON string (the node id escaped as JSON does).
    package func writeText(into out: inout [UInt8]) {
        JSONOctets.appendDecimal(milliseconds, to: &out)
        out.append(UInt8(ascii: "."))
        JSONOctets.appendDecimal(UInt64(counter), to: &out)
        out.append(UInt8(ascii: "@"))
        JSONOctets.appendEscaped(node, to: &out)
    }

    /// Parses the text form `<milliseconds>.<counter>@<node>`.
    public init?(_ text: String) {
        guard let at = text.firstIndex(of: "@") else { return nil }
        let clock = text[..<at]
        let node = String(text[text.index(after: at)...])
        let parts = clock.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 2, let ms = UInt64(parts[0]), let counter = UInt16(parts[1]), !node.isEmpty else {
            return nil
        }
        self.init(milliseconds: ms, counter: counter, node: node)
    }
}
