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
    /// Per origin, the sequence number through which everything was delivered (0s left out).
    public var positions: [String: UInt64]

    /// A cursor at `positions` (origins at 0 are dropped).
    public init(_ positions: [String: UInt64] = [:]) {
        self.positions = positions.filter { $0.value > 0 }
    }

    /// The position of `origin` (0 when none).
    public subscript(origin: String) -> UInt64 {
        get { positions[origin] ?? 0 }
        set { positions[origin] = newValue > 0 ? newValue : nil }
    }

    /// The text form: `origin:sequence` pairs sorted by origin, or `-`.
    public var description: String {
        positions.isEmpty ? "-" : positions.keys.sorted().map { "\($0):\(positions[$0]!)" }.joined(separator: ",")
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
        let origins = positions.keys.sorted()
        writer.varint(UInt64(origins.count))
        for origin in origins {
            writer.string(origin)
            writer.varint(positions[origin]!)
        }
    }

    static func decode(from reader: inout WireReader) throws(WireError) -> WatchCursor {
        let count = try reader.count("cursor size", minimumItemSize: 2)
        var positions: [String: UInt64] = [:]
        for _ in 0..<count {
            let origin = try reader.string("cursor origin")
            positions[origin] = try reader.varint("cursor sequence")
        }
        return WatchCursor(positions)
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
