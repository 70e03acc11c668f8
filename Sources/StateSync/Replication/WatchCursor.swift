/// A position in a channel's stream of changes that means the same on every node: for each
/// origin, the sequence number through which its deltas have been delivered.
///
/// Why not a single version: writers are many and leaderless, so deltas reach different nodes in
/// different orders; no one number orders them the same everywhere. A node tracks, per watch,
/// every sequence number it has delivered; this vector is the part without gaps (through which
/// everything was delivered), so a watch resumed from it on any node gets every later delta —
/// and, when a gap was open, possibly a few it already had, which a client holding its replica
/// ignores.
///
/// Text form: `origin:sequence` pairs sorted by origin, comma-separated (`n1:120,n2:57`); the
/// empty cursor is `-`.
public struct WatchCursor: Sendable, Hashable, CustomStringConvertible {
    // Sorted by origin, no zero positions: the canonical form, cheap to encode in order (every
    // DELTA event carries a cursor) and to look up among the few origins of a cluster.
    private var origins: [String] = []
    private var sequences: [UInt64] = []

    /// Per origin, the sequence number through which everything was delivered (0s left out).
    public var positions: [String: UInt64] {
        get { Dictionary(uniqueKeysWithValues: zip(origins, sequences)) }
        set { self = WatchCursor(newValue) }
    }

    /// A cursor at `positions` (origins at 0 are dropped).
    public init(_ positions: [String: UInt64] = [:]) {
        for (origin, sequence) in positions.sorted(by: { $0.key < $1.key }) where sequence > 0 {
            origins.append(origin)
            sequences.append(sequence)
        }
    }

    /// The position of `origin` (0 when none).
    public subscript(origin: String) -> UInt64 {
        get {
            guard let index = origins.firstIndex(of: origin) else { return 0 }
            return sequences[index]
        }
        set {
            if let index = origins.firstIndex(of: origin) {
                if newValue > 0 {
                    sequences[index] = newValue
                } else {
                    origins.remove(at: index)
                    sequences.remove(at: index)
                }
            } else if newValue > 0 {
                let index = origins.firstIndex { $0 > origin } ?? origins.count
                origins.insert(origin, at: index)
                sequences.insert(newValue, at: index)
            }
        }
    }

    /// Whether the cursor is at the start of every origin.
    public var isEmpty: Bool { origins.isEmpty }

    /// The text form: `origin:sequence` pairs sorted by origin, or `-`.
    public var description: String {
        guard !origins.isEmpty else { return "-" }
        // Built in place: every watch event line carries it.
        var text = ""
        for index in origins.indices {
            if index > 0 { text += "," }
            text += origins[index]
            text += ":"
            text += String(sequences[index])
        }
        return text
    }

    /// Appends the text form to `out`, as inside a JSON string (origins escaped as JSON does).
    package func writeText(into out: inout [UInt8]) {
        guard !origins.isEmpty else { return out.append(UInt8(ascii: "-")) }
        for index in origins.indices {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            JSONOctets.appendEscaped(origins[index], to: &out)
            out.append(UInt8(ascii: ":"))
            JSONOctets.appendDecimal(sequences[index], to: &out)
        }
    }

    /// Parses the text form; `nil` when it is not one.
    public init?(_ text: String) {
        if text == "-" {
            self.init()
            return
        }
        var positions: [String: UInt64] = [:]
        for pair in text.split(separator: ",") {
            guard let colon = pair.lastIndex(of: ":"), colon != pair.startIndex,
                let sequence = UInt64(pair[pair.index(after: colon)...])
            else { return nil }
            positions[String(pair[..<colon])] = sequence
        }
        guard !positions.isEmpty else { return nil }
        self.init(positions)
    }

    func encode(into writer: inout WireWriter) {
        writer.varint(UInt64(origins.count))
        for index in origins.indices {
            writer.string(origins[index])
            writer.varint(sequences[index])
        }
    }

    static func decode(from reader: inout WireReader) throws(WireError) -> WatchCursor {
        let count = try reader.count("cursor size", minimumItemSize: 2)
        var cursor = WatchCursor()
        var canonical = true  // sorted, unique, no zeros: as this implementation writes it
        for _ in 0..<count {
            let origin = try reader.string("cursor origin")
            let sequence = try reader.varint("cursor sequence")
            if let last = cursor.origins.last, last >= origin { canonical = false }
            if sequence == 0 { canonical = false }
            cursor.origins.append(origin)
            cursor.sequences.append(sequence)
        }
        guard !canonical else { return cursor }
        // Another writer's order: the last entry of an origin counts, as for map keys.
        var positions: [String: UInt64] = [:]
        for (origin, sequence) in zip(cursor.origins, cursor.sequences) { positions[origin] = sequence }
        return WatchCursor(positions)
    }

    /// Calls `body` with each origin and its position, in origin order.
    package func forEachPosition(_ body: (String, UInt64) -> Void) {
        for index in origins.indices { body(origins[index], sequences[index]) }
    }
}

/// A running digest of registers, computed the same way by a node sending a snapshot and by the
/// client receiving it, so the client can verify the snapshot arrived whole.
public struct RegisterDigest: Sendable, Equatable {
    /// The digest so far.
    public private(set) var value: UInt64 = StreamingFNV.offsetBasis
    /// How many registers were added.
    public private(set) var count = 0

    /// A digest of no registers.
    public init() {}

    /// Adds one register, as sent.
    public mutating func add(channel: String, model: String, property: String, register: ReplicaStore.Register) {
        var fnv = StreamingFNV(hash: value)
        fnv.register(channel: channel, model: model, property: property, register: register)
        value = fnv.hash
        count += 1
    }
}
