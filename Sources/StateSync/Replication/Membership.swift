/// The cluster's member list (docs/PROTOCOL.md section 7.5): which nodes exist, where they
/// publish and serve, and whether they are in the cluster or have left it.
///
/// It is replicated the way properties are: one entry per node id, and of two entries the one
/// with the higher ``Version`` wins. An entry is written by the node it describes when it starts
/// (alive, its endpoints) and when it stops cleanly (left), or by any member that forgets it for
/// good (forgotten). Whatever the order in which nodes hear of entries, and however often, they
/// end with the same list.
package struct Membership: Sendable, Equatable {
    /// What a member entry says of its node.
    package enum State: UInt8, Sendable, CaseIterable, CustomStringConvertible {
        /// In the cluster: its links are made, its deltas awaited.
        case alive = 0
        /// Stopped cleanly and said so: its links are dropped, its sequence numbers no longer
        /// awaited; it may come back (a newer alive entry).
        case left = 1
        /// Removed for good by an operator (`statesync forget`).
        case forgotten = 2

        package var description: String {
            switch self {
            case .alive: "alive"
            case .left: "left"
            case .forgotten: "forgotten"
            }
        }
    }

    /// One node's entry.
    package struct Member: Sendable, Equatable {
        package var id: String
        /// Where it publishes its deltas and heartbeats.
        package var publish: String
        /// Where it serves clients and repairs (its API, or its repair endpoint).
        package var api: String
        package var state: State
        /// When this entry was written, and by whom: the higher version wins.
        package var version: Version
        /// Which start of its node the entry is about, by that start's incarnation (section
        /// 7.3: random, new at every start): for an entry the node wrote about itself, its own;
        /// for a forgotten entry, that of the entry its forgetter replaced (section 7.5, "Which
        /// start a forget removes"). `nil` when unknown (written or relayed by a node of an
        /// earlier version). Not part of what the entry says: two entries that differ only in
        /// it are equal.
        package var incarnation: UInt64?

        package init(
            id: String, publish: String, api: String, state: State, version: Version, incarnation: UInt64? = nil
        ) {
            self.id = id
            self.publish = publish
            self.api = api
            self.state = state
            self.version = version
            self.incarnation = incarnation
        }

        /// Equal when id, endpoints, state and version are: the incarnation rides along.
        package static func == (lhs: Member, rhs: Member) -> Bool {
            lhs.id == rhs.id && lhs.publish == rhs.publish && lhs.api == rhs.api && lhs.state == rhs.state
                && lhs.version == rhs.version
        }
    }

    /// At most this many entries are carried or kept (section 7.5): a bound on every HEARTBEAT.
    package static let maximumMembers = 1024

    package private(set) var members: [String: Member] = [:]
    /// How many times the list changed: what the node saved is compared against it.
    package private(set) var revision = 0

    package init() {}

    /// Two lists are equal when they hold the same entries (however they got them).
    package static func == (lhs: Membership, rhs: Membership) -> Bool { lhs.members == rhs.members }

    /// Takes `member` if it is newer than the entry held for its id. Returns whether it did.
    /// Two different entries with one version (a writer's clock never gives one version twice,
    /// so only a faulty or forged writer makes them) are ordered by their content, so every node
    /// keeps the same one.
    @discardableResult
    package mutating func merge(_ member: Member) -> Bool {
        if let held = members[member.id] {
            if held.version == member.version {
                guard Self.contentPrecedes(held, member) else { return false }
            } else {
                guard held.version < member.version else { return false }
            }
        } else if members.count >= Self.maximumMembers {
            return false
        }
        members[member.id] = member
        revision += 1
        return true
    }

    /// The order of two entries with one version: state, then endpoints, as bytes, then the
    /// incarnation (none first: of one entry relayed by nodes of two versions, the copy that
    /// says which start it is about is kept).
    static func contentPrecedes(_ a: Member, _ b: Member) -> Bool {
        if a.state != b.state { return a.state.rawValue < b.state.rawValue }
        if !a.publish.hasSameUTF8(as: b.publish) { return a.publish.utf8Precedes(b.publish) }
        if !a.api.hasSameUTF8(as: b.api) { return a.api.utf8Precedes(b.api) }
        switch (a.incarnation, b.incarnation) {
        case (nil, nil), (.some, nil): return false
        case (nil, .some): return true
        case (let x?, let y?): return x < y
        }
    }

    /// The entries, by id.
    package var sorted: [Member] { members.values.sorted { $0.id < $1.id } }

    // MARK: - Wire form

    /// Writes `member`: id, publish, api (strings), state (one octet), version (timestamp,
    /// writer).
    package static func write<Sink: WireSink>(_ member: Member, to sink: inout Sink) {
        sink.string(member.id)
        sink.string(member.publish)
        sink.string(member.api)
        sink.byte(member.state.rawValue)
        sink.uint64(member.version.timestamp)
        sink.string(member.version.node)
    }

    /// The incarnations section that follows a member list (a HEARTBEAT's, the members file's):
    /// for each entry of `list` that names the start it is about, in list order: id (string),
    /// incarnation (uint64).
    package static func writeIncarnations<Sink: WireSink>(_ list: [Member], to sink: inout Sink) {
        var count = 0
        for member in list where member.incarnation != nil { count += 1 }
        sink.varint(UInt64(count))
        for member in list {
            guard let incarnation = member.incarnation else { continue }
            sink.string(member.id)
            sink.uint64(incarnation)
        }
    }

    /// Reads an incarnations section (``writeIncarnations(_:to:)``) into `list`: an id the list
    /// does not hold is passed over, and so is an incarnation of 0 (none is).
    package static func readIncarnations(_ reader: inout WireReader, into list: inout [Member]) throws(WireError) {
        // id, incarnation: at least 10 octets each.
        let count = try reader.count("incarnation count", minimumItemSize: 10)
        guard count <= maximumMembers else {
            throw .invalid(field: "incarnation count", reason: "\(count) is over \(maximumMembers)")
        }
        var positions: [String: Int] = [:]
        for (index, member) in list.enumerated() { positions[member.id] = index }
        for _ in 0..<count {
            let id = try reader.string("incarnation id")
            let incarnation = try reader.uint64("incarnation")
            if incarnation != 0, let index = positions[id] { list[index].incarnation = incarnation }
        }
    }

    /// Reads one entry; a malformed one throws.
    package static func read(_ reader: inout WireReader) throws(WireError) -> Member {
        let id = try reader.string("member id")
        guard !id.isEmpty else { throw .invalid(field: "member id", reason: "empty node id") }
        let publish = try reader.string("member publish endpoint")
        let api = try reader.string("member api endpoint")
        let raw = try reader.byte("member state")
        guard let state = State(rawValue: raw) else {
            throw .invalid(field: "member state", reason: "unknown state \(raw)")
        }
        let timestamp = try reader.uint64("member version")
        let writer = try reader.string("member version node")
        guard !writer.isEmpty else { throw .invalid(field: "member version node", reason: "empty node id") }
        return Member(
            id: id, publish: publish, api: api, state: state, version: Version(timestamp: timestamp, node: writer))
    }

    // MARK: - The members file

    /// The members file's magic (in the data directory, beside the snapshot): with the
    /// incarnations section. Files of ``legacyFileMagic`` (before 2026-11-29) lack it and are still read.
    static let fileMagic: [UInt8] = Array("SSMEMB2\n".utf8)
    static let legacyFileMagic: [UInt8] = Array("SSMEMB1\n".utf8)

    /// The list as a file: magic, entry count, the entries in id order, the incarnations section
    /// (``writeIncarnations(_:to:)``), FNV-1a 64 checksum.
    package static func encodeFile(_ list: [Member]) -> [UInt8] {
        var writer = WireWriter(capacity: 64 * list.count + 32)
        for byte in fileMagic { writer.byte(byte) }
        writer.varint(UInt64(list.count))
        for member in list { write(member, to: &writer) }
        writeIncarnations(list, to: &writer)
        writer.uint64(ReplicaStore.fnv1a(writer.bytes))
        return writer.bytes
    }

    /// The entries of a members file.
    package static func decodeFile(_ bytes: [UInt8]) throws(WireError) -> [Member] {
        let legacy = bytes.starts(with: legacyFileMagic)
        var reader = try StateSnapshot.checkedBody(
            bytes, magic: legacy ? legacyFileMagic : fileMagic, what: "members file")
        var list: [Member] = []
        for _ in 0..<(try reader.count("member count", minimumItemSize: 14)) { list.append(try read(&reader)) }
        if !legacy { try readIncarnations(&reader, into: &list) }
        try reader.expectEnd()
        return list
    }

    /// The body of an ANNOUNCE request: one entry, then its incarnation when known (appended:
    /// a node of an earlier version reads the entry and ignores it).
    package static func encodeAnnounce(_ member: Member) -> [UInt8] {
        var writer = WireWriter()
        write(member, to: &writer)
        if let incarnation = member.incarnation { writer.uint64(incarnation) }
        return writer.bytes
    }

    package static func decodeAnnounce(_ body: [UInt8]) throws(WireError) -> Member {
        var reader = WireReader(body)
        var member = try read(&reader)
        if !reader.isAtEnd {
            let incarnation = try reader.uint64("incarnation")
            if incarnation != 0 { member.incarnation = incarnation }
        }
        return member
    }
}
