/// The client API between a client's DEALER and a node's ROUTER (docs/PROTOCOL.md, "Client
/// API"). Every message is two frames: a header (version, kind, request id) and a body.
public enum ClientProtocol {
    /// The client protocol version: the first octet of every header.
    public static let version: UInt8 = 1

    /// The largest frame a node takes (its sockets' `ZMQ_MAXMSGSIZE`, 64 MiB): libzmq drops the
    /// connection of a peer or client that sends a larger one, with every request in flight on
    /// it, so a client refuses to send one (docs/PROTOCOL.md section 3).
    public static let maximumFrameOctets = 64 << 20

    /// What a request asks for.
    public enum Command: UInt8, Sendable {
        case set = 0x01
        case get = 0x02
        case watch = 0x03
        case unwatch = 0x04
        case status = 0x05
        case ping = 0x06
        /// An operator removes a member for good (its entry becomes forgotten, section 7.5).
        case forget = 0x07
        /// The models of a channel, or the channels, a page at a time (section 10.13).
        case list = 0x08
        /// Deletes properties of a model, or the whole model (section 10.14).
        case delete = 0x09
        /// Node to node: retained deltas of one origin (gap repair).
        case fetch = 0x10
        /// Node to node: the whole state (repair when history is gone; late join).
        case snapshot = 0x11
        /// Node to node: the sender's own member entry (a node joining through a seed).
        case announce = 0x12
    }

    /// What a node's message to a client is.
    public enum ReplyKind: UInt8, Sendable {
        case ok = 0x80
        case error = 0x81
        case event = 0x82
        /// The OKs of several requests in one message (section 10.1.1): sent only to a client
        /// that asked for them with ``RequestFlags/batchedReplies``.
        case oks = 0x83
    }

    /// The optional eleventh octet of a request header (section 10.1.1). A node older than it
    /// ignores it, as every octet after the tenth.
    public enum RequestFlags {
        /// The client takes the OK of this request (a SET or a DELETE) in an OKS message, with
        /// the OKs of its other writes that became durable together.
        public static let batchedReplies: UInt8 = 0x01
    }

    /// Error codes of an ERROR reply.
    public enum ErrorCode: UInt64, Sendable {
        case malformed = 1
        case unknownCommand = 2
        case invalidArgument = 3
        case unsupportedVersion = 4
        case `internal` = 5
        /// A watch with the "end on lag" policy fell behind the node's history: it ended.
        case lagged = 6
        /// The endpoint does not serve this request: a node without `network.api` answers only
        /// its peers' repair requests (FETCH, SNAPSHOT, PING) on its repair endpoint.
        case denied = 7
        /// With security: this client's key may not do this on this channel (its read and write
        /// patterns in `security.client_keys`), or may not ask for repairs.
        case forbidden = 8
        /// The node's disk is (nearly) full: it takes no writes until space returns
        /// (`storage.reserve_bytes`); reads, watches and repairs go on.
        case diskFull = 9
    }

    /// A request header.
    public struct RequestHeader: Sendable, Equatable {
        /// The command octet (not necessarily a known one).
        public var command: UInt8
        /// The id the client gave the request.
        public var requestID: UInt64
        /// The flags octet (``RequestFlags``), 0 when the header has none.
        public var flags: UInt8 = 0

        /// Whether the client takes this request's OK in an OKS message.
        public var takesBatchedReplies: Bool { flags & RequestFlags.batchedReplies != 0 }
    }

    /// A reply header.
    public struct ReplyHeader: Sendable, Equatable {
        /// What the reply is.
        public var kind: ReplyKind
        /// The id of the request it answers (or of the watch it belongs to).
        public var requestID: UInt64
    }

    /// The two frames of a request: header (version, command, id, and the flags octet unless
    /// `flags` is 0) and body.
    public static func encodeRequest(_ command: Command, id: UInt64, body: [UInt8], flags: UInt8 = 0) -> [[UInt8]] {
        var header = WireWriter(capacity: 11)
        header.byte(version)
        header.byte(command.rawValue)
        header.uint64(id)
        if flags != 0 { header.byte(flags) }
        return [header.bytes, body]
    }

    /// Decodes a request's header frame.
    public static func decodeRequestHeader(_ frame: [UInt8]) throws(WireError) -> RequestHeader {
        var reader = WireReader(frame)
        let v = try reader.byte("protocol version")
        guard v == version else { throw .unsupported("client protocol version \(v)") }
        let command = try reader.byte("command")
        let id = try reader.uint64("request id")
        let flags = frame.count > 10 ? frame[10] : 0
        return RequestHeader(command: command, requestID: id, flags: flags)
    }

    /// The two frames of a reply: header (version, kind, id) and body.
    public static func encodeReply(_ kind: ReplyKind, id: UInt64, body: [UInt8]) -> [[UInt8]] {
        var header = WireWriter(capacity: 10)
        header.byte(version)
        header.byte(kind.rawValue)
        header.uint64(id)
        return [header.bytes, body]
    }

    /// Decodes a reply's header frame.
    public static func decodeReplyHeader(_ frame: [UInt8]) throws(WireError) -> ReplyHeader {
        var reader = WireReader(frame)
        let v = try reader.byte("protocol version")
        guard v == version else { throw .unsupported("client protocol version \(v)") }
        let rawKind = try reader.byte("kind")
        guard let kind = ReplyKind(rawValue: rawKind) else {
            throw .unsupported("reply kind 0x\(String(rawKind, radix: 16))")
        }
        return ReplyHeader(kind: kind, requestID: try reader.uint64("request id"))
    }

    /// An OKS message (section 10.1.1): the OK bodies of several requests, each with its
    /// request id, in the order the requests' writes became durable; header request id 0.
    public static func encodeBatchedOKs(_ replies: [(id: UInt64, body: [UInt8])]) -> [[UInt8]] {
        var body = WireWriter(capacity: replies.reduce(1) { $0 + 10 + $1.body.count })
        body.varint(UInt64(replies.count))
        for reply in replies {
            body.uint64(reply.id)
            body.blob(reply.body)
        }
        return encodeReply(.oks, id: 0, body: body.bytes)
    }

    /// Decodes an OKS body: each request id with its OK body.
    public static func decodeBatchedOKs(_ body: [UInt8]) throws(WireError) -> [(id: UInt64, body: [UInt8])] {
        var reader = WireReader(body)
        // An entry is at least a request id and an empty body's length.
        let count = try reader.count("reply count", minimumItemSize: 9)
        var replies: [(id: UInt64, body: [UInt8])] = []
        replies.reserveCapacity(count)
        for _ in 0..<count {
            let id = try reader.uint64("request id")
            replies.append((id, try reader.blob("OK body")))
        }
        return replies
    }

    // MARK: Bodies

    /// An ERROR body: code and message.
    public static func encodeError(_ code: ErrorCode, _ message: String) -> [UInt8] {
        var w = WireWriter()
        w.varint(code.rawValue)
        w.string(message)
        return w.bytes
    }

    /// Decodes an ERROR body.
    public static func decodeError(_ body: [UInt8]) throws(WireError) -> (code: UInt64, message: String) {
        var r = WireReader(body)
        return (try r.varint("error code"), try r.string("error message"))
    }

    /// SET: `channel`, `model`, then the properties.
    public static func encodeSet(_ address: ModelAddress, _ properties: [PropertyWrite]) -> [UInt8] {
        var w = WireWriter()
        w.string(address.channel)
        w.string(address.model)
        w.varint(UInt64(properties.count))
        for p in properties {
            w.string(p.name)
            w.propertyValue(p)
        }
        return w.bytes
    }

    /// Decodes a SET body.
    public static func decodeSet(_ body: [UInt8]) throws(WireError) -> (ModelAddress, [PropertyWrite]) {
        var r = WireReader(body)
        let address = ModelAddress(channel: try r.string("channel"), model: try r.string("model"))
        let n = try r.count("property count", minimumItemSize: 2)
        var writes: [PropertyWrite] = []
        // No more than a first batch: a count within a 64 MiB body's bound may still claim
        // millions of properties that are not there (WireReader.maximumReservation).
        writes.reserveCapacity(Swift.min(n, WireReader.maximumReservation))
        for _ in 0..<n {
            let name = try r.string("property name")
            writes.append(try r.propertyWrite(named: name))
        }
        return (address, writes)
    }

    /// DELETE: `channel`, `model`, then the names of the properties to delete; none deletes the
    /// whole model.
    public static func encodeDelete(_ address: ModelAddress, properties: [String]) -> [UInt8] {
        var w = WireWriter()
        w.string(address.channel)
        w.string(address.model)
        w.varint(UInt64(properties.count))
        for name in properties { w.string(name) }
        return w.bytes
    }

    /// Decodes a DELETE body.
    public static func decodeDelete(_ body: [UInt8]) throws(WireError) -> (ModelAddress, [String]) {
        var r = WireReader(body)
        let address = ModelAddress(channel: try r.string("channel"), model: try r.string("model"))
        var names: [String] = []
        for _ in 0..<(try r.count("property count")) { names.append(try r.string("property name")) }
        return (address, names)
    }

    /// The start of the OK body of a SET: a version (the node appends a changed flag byte).
    /// Its buffer has room for the outcome octet the node appends (section 10.3): one allocation.
    public static func encodeVersion(_ version: Version) -> [UInt8] {
        var w = WireWriter(capacity: 8 + 10 + version.node.utf8.count + 1)
        w.uint64(version.timestamp)
        w.string(version.node)
        return w.bytes
    }

    /// Decodes a version.
    public static func decodeVersion(_ body: [UInt8]) throws(WireError) -> Version {
        var r = WireReader(body)
        return Version(timestamp: try r.uint64("version"), node: try r.string("version node"))
    }

    /// GET and WATCH name a model or a channel.
    public static func encodeAddress(_ address: ModelAddress) -> [UInt8] {
        var w = WireWriter()
        w.string(address.channel)
        w.string(address.model)
        return w.bytes
    }

    /// Decodes a model address (GET).
    public static func decodeAddress(_ body: [UInt8]) throws(WireError) -> ModelAddress {
        var r = WireReader(body)
        return ModelAddress(channel: try r.string("channel"), model: try r.string("model"))
    }

    /// The OK body of a GET: every property with its value and version.
    public static func encodeProperties(_ registers: [String: ReplicaStore.Register]) -> [UInt8] {
        var w = WireWriter()
        w.varint(UInt64(registers.count))
        for name in registers.keys.sorted() {
            let register = registers[name]!
            w.string(name)
            w.propertyValue(register)
            w.uint64(register.version.timestamp)
            w.string(register.version.node)
        }
        return w.bytes
    }

    /// Decodes a GET reply's properties.
    public static func decodeProperties(_ body: [UInt8]) throws(WireError) -> [String: ReplicaStore.Register] {
        var r = WireReader(body)
        let n = try r.count("property count", minimumItemSize: 4)
        var result: [String: ReplicaStore.Register] = [:]
        for _ in 0..<n {
            let name = try r.string("property name")
            let value = try r.propertyValue("property value")
            let version = Version(timestamp: try r.uint64("version"), node: try r.string("version node"))
            result[name] = ReplicaStore.Register(value, version: version)
        }
        return result
    }

    /// What a node does with a watch whose client fell behind its history.
    public enum LagPolicy: Sendable, Equatable {
        /// Resynchronise it with a snapshot (the default).
        case resync
        /// End it with ERROR `lagged` (code 6).
        case end
    }

    /// A WATCH request: the channel, to resume the cursor the client has reached, the lag
    /// policy, a filter, and whether the client takes several events in one message. Flags: bit 0
    /// = a cursor follows, bit 1 = end on lag, bit 2 = a filter follows, bit 3 = batched events
    /// (section 10.5.1).
    public static func encodeWatch(
        channel: String, from cursor: WatchCursor?, onLag: LagPolicy = .resync, filter: WatchFilter? = nil,
        batchedEvents: Bool = false, takesResets: Bool = false, heldAbove: [String: [UInt64]] = [:]
    ) -> [UInt8] {
        var w = WireWriter()
        w.string(channel)
        let above = cursor == nil ? [:] : heldAbove.filter { !$0.value.isEmpty }
        let flags: UInt8 =
            (cursor == nil ? 0 : 1) | (onLag == .end ? 2 : 0) | (filter == nil ? 0 : 4) | (batchedEvents ? 8 : 0)
            | (takesResets ? 16 : 0) | (above.isEmpty ? 0 : 32)
        if flags != 0 { w.byte(flags) }
        cursor?.encode(into: &w)
        if let filter {
            w.string(filter.prefix)
            w.varint(UInt64(filter.properties?.count ?? 0))
            for name in (filter.properties ?? []).sorted() { w.string(name) }
            w.byte(filter.initialState ? 1 : 0)
        }
        if !above.isEmpty { writeHeldAbove(above, to: &w) }
        return w.bytes
    }

    /// A held-above list (section 10.5.1): origin count, then per origin in ascending order of
    /// its UTF-8 bytes: origin (string), sequence count, the sequence numbers ascending
    /// (varints). The same layout in a WATCH and in a replica's file.
    package static func writeHeldAbove(_ above: [String: some Collection<UInt64>], to w: inout WireWriter) {
        w.varint(UInt64(above.count))
        for origin in above.keys.sorted(by: { $0.utf8Precedes($1) }) {
            let sequences = above[origin]!.sorted()
            w.string(origin)
            w.varint(UInt64(sequences.count))
            for sequence in sequences { w.varint(sequence) }
        }
    }

    /// Decodes a WATCH body.
    public static func decodeWatch(_ body: [UInt8]) throws(WireError) -> (
        channel: String, cursor: WatchCursor?, onLag: LagPolicy
    ) {
        let request = try decodeWatchRequest(body)
        return (request.channel, request.cursor, request.onLag)
    }

    /// Decodes a WATCH body, its filter (flag bit 2), batched events (flag bit 3), resets
    /// (flag bit 4) and the deltas held above the cursor (flag bit 5) included (section 10.5.1).
    public static func decodeWatchRequest(_ body: [UInt8]) throws(WireError) -> (
        channel: String, cursor: WatchCursor?, onLag: LagPolicy, filter: WatchFilter?, batchedEvents: Bool,
        takesResets: Bool, heldAbove: [String: [UInt64]]
    ) {
        var r = WireReader(body)
        let channel = try r.string("channel")
        guard !r.isAtEnd else { return (channel, nil, .resync, nil, false, false, [:]) }
        let flags = try r.byte("watch flags")
        let cursor = flags & 1 != 0 ? try WatchCursor.decode(from: &r) : nil
        var filter: WatchFilter?
        if flags & 4 != 0 {
            let prefix = try r.string("filter prefix")
            var properties: Set<String> = []
            for _ in 0..<(try r.count("filter property count", minimumItemSize: 2)) {
                properties.insert(try r.string("filter property"))
            }
            let initial = try r.byte("filter initial state")
            filter = WatchFilter(
                prefix: prefix, properties: properties.isEmpty ? nil : properties, initialState: initial != 0)
        }
        var heldAbove: [String: [UInt64]] = [:]
        if flags & 32 != 0, cursor != nil {
            for _ in 0..<(try r.count("held-above origin count", minimumItemSize: 2)) {
                let origin = try r.string("held-above origin")
                var sequences: [UInt64] = []
                for _ in 0..<(try r.count("held-above count", minimumItemSize: 1)) {
                    sequences.append(try r.varint("held-above sequence"))
                }
                heldAbove[origin, default: []] += sequences
            }
        }
        return (
            channel, cursor, flags & 2 != 0 ? .end : .resync, filter, flags & 8 != 0, flags & 16 != 0, heldAbove
        )
    }

    /// What a watch asks to be sent (section 10.5.1): models whose ids start with `prefix`, only
    /// `properties` of them (`nil`: all), and whether a new watch starts with the channel's
    /// current state. Resumption, markers and lag handling are those of any watch: the cursor
    /// moves over the deltas filtered out too.
    public struct WatchFilter: Sendable, Equatable {
        public var prefix: String
        public var properties: Set<String>?
        public var initialState: Bool

        /// An empty `properties` set means every property, as on the wire (count 0).
        public init(prefix: String = "", properties: Set<String>? = nil, initialState: Bool = true) {
            self.prefix = prefix
            self.properties = properties?.isEmpty == true ? nil : properties
            self.initialState = initialState
        }

        /// Whether a change of `property` of `model` passes. The deletion of a model (the empty
        /// property name) passes whenever its model does.
        public func passes(model: String, property: String) -> Bool {
            model.utf8.starts(with: prefix.utf8) && (property.isEmpty || (properties?.contains(property) ?? true))
        }

        /// `delta` with only the properties that pass (`nil`: none does).
        public func apply(to delta: Delta) -> Delta? {
            guard delta.model.utf8.starts(with: prefix.utf8) else { return nil }
            guard let properties, !delta.deletesModel else { return delta }
            // Over `writes`, not `properties`: a delta's writes may be a run of a shared array,
            // which `properties` copies out.
            let kept = delta.writes.filter { properties.contains($0.name) }
            if kept.isEmpty { return nil }
            if kept.count == delta.writes.count { return delta }
            var reduced = delta
            reduced.properties = kept
            return reduced
        }
    }

    /// What one EVENT of a watch carries (the first byte of its body).
    public enum WatchEventBody: Sendable, Equatable {
        /// One delta of the channel, in the node's apply order, with the watch's cursor after it.
        case delta(Delta, cursor: WatchCursor)
        /// Snapshot records: model → property → register.
        case records([(model: String, properties: [(String, ReplicaStore.Register)])])
        /// A snapshot starts (it may repeat an earlier, interrupted one).
        case snapshotBegin(SnapshotReason)
        /// The snapshot is complete: how many records it had, their digest, and the cursor it
        /// stands for; `collectedThrough` is the timestamp through which the node may have
        /// collected deletions (0: none, or the snapshot left records out on purpose): a record
        /// the client holds at or below it that the snapshot did not carry was deleted.
        case snapshotEnd(records: Int, digest: UInt64, cursor: WatchCursor, collectedThrough: UInt64 = 0)
        /// The watch has everything the node has applied, up to `cursor`; `missing` is how many
        /// deltas the node itself still lacks (0 = fully synced), `latest` its newest version,
        /// `expiredThrough` the time (milliseconds since 1970) through which it deleted the values
        /// whose time to live ran out (0 from a node that predates expiry).
        case caughtUp(cursor: WatchCursor, latest: Version?, missing: Int, expiredThrough: UInt64 = 0)

        public static func == (lhs: WatchEventBody, rhs: WatchEventBody) -> Bool {
            ClientProtocol.encodeWatchEvent(lhs) == ClientProtocol.encodeWatchEvent(rhs)
        }
    }

    /// Why a snapshot is sent on a watch.
    public enum SnapshotReason: UInt8, Sendable {
        /// The initial state of a new watch.
        case initial = 0
        /// The client fell behind further than the node's history reaches.
        case lagged = 1
        /// The resume cursor is older than the node's history.
        case historyGone = 2
        /// The node dropped its state and took a peer's (it was forgotten while away, section
        /// 7.5): the snapshot replaces what the client holds. Sent only on watches that ask for
        /// it (WATCH flag bit 4); others get `lagged`.
        case reset = 3
    }

    /// An EVENT body.
    public static func encodeWatchEvent(_ event: WatchEventBody) -> [UInt8] {
        var w = WireWriter(capacity: 64)
        switch event {
        case .delta(let delta, let cursor):
            w.byte(0x01)
            cursor.encode(into: &w)
            return w.bytes + DeltaLog.encodePayload(delta)
        case .records(let models):
            w.byte(0x02)
            w.varint(UInt64(models.count))
            for (model, properties) in models {
                w.string(model)
                w.varint(UInt64(properties.count))
                for (name, register) in properties {
                    w.string(name)
                    w.propertyValue(register)
                    w.uint64(register.version.timestamp)
                    w.string(register.version.node)
                }
            }
        case .snapshotBegin(let reason):
            w.byte(0x03)
            w.byte(reason.rawValue)
        case .snapshotEnd(let records, let digest, let cursor, let collectedThrough):
            w.byte(0x04)
            w.varint(UInt64(records))
            w.uint64(digest)
            cursor.encode(into: &w)
            w.uint64(collectedThrough)
        case .caughtUp(let cursor, let latest, let missing, let expiredThrough):
            w.byte(0x05)
            cursor.encode(into: &w)
            w.uint64(latest?.timestamp ?? 0)
            w.string(latest?.node ?? "")
            w.varint(UInt64(missing))
            w.uint64(expiredThrough)
        }
        return w.bytes
    }

    /// Decodes an EVENT body.
    public static func decodeWatchEvent(_ body: [UInt8]) throws(WireError) -> WatchEventBody {
        var r = WireReader(body)
        let kind = try r.byte("event kind")
        switch kind {
        case 0x01:
            let cursor = try WatchCursor.decode(from: &r)
            return .delta(try DeltaLog.decodePayload(r.rest()), cursor: cursor)
        case 0x02:
            let modelCount = try r.count("model count", minimumItemSize: 2)
            var models: [(String, [(String, ReplicaStore.Register)])] = []
            for _ in 0..<modelCount {
                let model = try r.string("model")
                let count = try r.count("record count", minimumItemSize: 4)
                var properties: [(String, ReplicaStore.Register)] = []
                for _ in 0..<count {
                    let name = try r.string("property name")
                    let value = try r.propertyValue("property value")
                    let version = Version(timestamp: try r.uint64("version"), node: try r.string("version node"))
                    properties.append((name, ReplicaStore.Register(value, version: version)))
                }
                models.append((model, properties))
            }
            return .records(models)
        case 0x03:
            let raw = try r.byte("snapshot reason")
            guard let reason = SnapshotReason(rawValue: raw) else {
                throw .invalid(field: "snapshot reason", reason: "unknown \(raw)")
            }
            return .snapshotBegin(reason)
        case 0x04:
            let records = Int(clamping: try r.varint("record count"))
            let digest = try r.uint64("digest")
            let cursor = try WatchCursor.decode(from: &r)
            // Appended field (section 13): absent from a node that predates collection.
            let collectedThrough = r.isAtEnd ? 0 : try r.uint64("collected through")
            return .snapshotEnd(records: records, digest: digest, cursor: cursor, collectedThrough: collectedThrough)
        case 0x05:
            let cursor = try WatchCursor.decode(from: &r)
            let timestamp = try r.uint64("latest version")
            let node = try r.string("latest version node")
            let missing = Int(clamping: try r.varint("missing"))
            // Appended field (section 13): absent from a node that predates expiry.
            let expiredThrough = r.isAtEnd ? 0 : try r.uint64("expired through")
            return .caughtUp(
                cursor: cursor, latest: node.isEmpty ? nil : Version(timestamp: timestamp, node: node),
                missing: missing,
                expiredThrough: expiredThrough)
        default:
            throw .unsupported("watch event kind 0x\(String(kind, radix: 16))")
        }
    }

    /// FETCH: `origin`, first and last sequence number wanted (inclusive).
    public static func encodeFetch(origin: String, range: ClosedRange<UInt64>) -> [UInt8] {
        var w = WireWriter()
        w.string(origin)
        w.varint(range.lowerBound)
        w.varint(range.upperBound)
        return w.bytes
    }

    /// Decodes a FETCH body (a range with first 0 or first > last is malformed).
    public static func decodeFetch(_ body: [UInt8]) throws(WireError) -> (origin: String, range: ClosedRange<UInt64>) {
        var r = WireReader(body)
        let origin = try r.string("origin")
        let first = try r.varint("first sequence")
        let last = try r.varint("last sequence")
        guard first >= 1, first <= last else {
            throw .invalid(field: "sequence range", reason: "\(first)...\(last) is empty")
        }
        return (origin, first...last)
    }

    /// The OK body of a FETCH: through which sequence number the server no longer holds deltas,
    /// then the deltas it holds in the range, each as a log payload (channel, model, DELTA body),
    /// then, only when the server is the origin and declares some, the ranges of the origin's
    /// numbers in the range that will never exist (void, section 10.8).
    static func encodeFetched(
        _ deltas: [Delta], droppedThrough: UInt64, void: [ClosedRange<UInt64>] = []
    ) -> [UInt8] {
        var w = WireWriter(capacity: 64 * deltas.count + 16 + 20 * void.count)
        w.varint(droppedThrough)
        w.varint(UInt64(deltas.count))
        for delta in deltas { w.blob(DeltaLog.encodePayload(delta)) }
        if !void.isEmpty {
            w.varint(UInt64(void.count))
            for range in void {
                w.varint(range.lowerBound)
                w.varint(range.upperBound)
            }
        }
        return w.bytes
    }

    /// The most void ranges a FETCH reply may carry.
    static let maximumVoidRanges = 2000

    static func decodeFetched(_ body: [UInt8]) throws(WireError) -> (
        deltas: [Delta], droppedThrough: UInt64, void: [ClosedRange<UInt64>]
    ) {
        var r = WireReader(body)
        let dropped = try r.varint("dropped through")
        let count = try r.count("delta count", minimumItemSize: 2)
        var deltas: [Delta] = []
        deltas.reserveCapacity(min(count, WireReader.maximumReservation))
        for _ in 0..<count { deltas.append(try DeltaLog.decodePayload(try r.blob("delta"))) }
        // Void ranges were appended to the body (section 13): a body that ends here has none.
        var void: [ClosedRange<UInt64>] = []
        if !r.isAtEnd {
            let ranges = try r.count("void range count", minimumItemSize: 2)
            guard ranges <= Self.maximumVoidRanges else {
                throw .invalid(field: "void range count", reason: "\(ranges) is more than \(Self.maximumVoidRanges)")
            }
            void.reserveCapacity(ranges)
            for _ in 0..<ranges {
                let first = try r.varint("void first")
                let last = try r.varint("void last")
                guard first >= 1, first <= last, first > (void.last?.upperBound ?? 0) else {
                    throw .invalid(
                        field: "void range",
                        reason: "\(first)...\(last) is empty, starts at 0 or is not after the one before")
                }
                void.append(first...last)
            }
        }
        return (deltas, dropped, void)
    }

    /// STATUS and PING bodies are a ``Value`` map: extensible, unknown keys ignored.
    public static func encodeValue(_ value: Value) -> [UInt8] {
        var w = WireWriter()
        w.value(value)
        return w.bytes
    }

    /// Decodes a body holding one value (STATUS, PING).
    public static func decodeValue(_ body: [UInt8]) throws(WireError) -> Value {
        var r = WireReader(body)
        return try r.value()
    }
}

// MARK: - LIST (section 10.13)

extension ClientProtocol {
    /// What a LIST asks for: the models of `channel` (the channels, when it is empty) whose names
    /// start with `prefix` and sort after `after`, at most `limit` of them, in name order.
    public struct ListRequest: Sendable, Equatable {
        public var channel: String
        public var prefix: String
        public var after: String
        public var limit: Int

        /// The most entries one reply carries, whatever the request asks.
        public static let maximumLimit = 1000

        public init(channel: String, prefix: String = "", after: String = "", limit: Int = maximumLimit) {
            self.channel = channel
            self.prefix = prefix
            self.after = after
            self.limit = limit
        }
    }

    /// One listed model (its property count) or channel (its model count), and the newest
    /// version among what it holds.
    public struct ListEntry: Sendable, Equatable {
        public var name: String
        public var count: Int
        public var latest: Version

        public init(name: String, count: Int, latest: Version) {
            self.name = name
            self.count = count
            self.latest = latest
        }
    }

    /// The body of a LIST: channel, prefix, after (strings), limit (varint).
    public static func encodeList(_ request: ListRequest) -> [UInt8] {
        var w = WireWriter()
        w.string(request.channel)
        w.string(request.prefix)
        w.string(request.after)
        w.varint(UInt64(max(0, request.limit)))
        return w.bytes
    }

    public static func decodeList(_ body: [UInt8]) throws(WireError) -> ListRequest {
        var r = WireReader(body)
        let channel = try r.string("channel")
        let prefix = try r.string("prefix")
        let after = try r.string("after")
        let limit = try r.varint("limit")
        // Trailing octets are ignored (section 13): a later version may add fields.
        guard limit >= 1 else { throw .invalid(field: "limit", reason: "must be at least 1") }
        return ListRequest(
            channel: channel, prefix: prefix, after: after, limit: Int(min(limit, UInt64(ListRequest.maximumLimit))))
    }

    /// The OK body of a LIST: the entries (name, count, latest version) in name order, then
    /// whether more follow (1) or not (0).
    public static func encodeListReply(_ entries: [ListEntry], more: Bool) -> [UInt8] {
        var w = WireWriter()
        w.varint(UInt64(entries.count))
        for entry in entries {
            w.string(entry.name)
            w.varint(UInt64(entry.count))
            w.uint64(entry.latest.timestamp)
            w.string(entry.latest.node)
        }
        w.byte(more ? 1 : 0)
        return w.bytes
    }

    public static func decodeListReply(_ body: [UInt8]) throws(WireError) -> (entries: [ListEntry], more: Bool) {
        var r = WireReader(body)
        var entries: [ListEntry] = []
        for _ in 0..<(try r.count("entry count", minimumItemSize: 11)) {
            let name = try r.string("name")
            let count = try r.varint("count")
            let latest = Version(timestamp: try r.uint64("latest version"), node: try r.string("version node"))
            entries.append(ListEntry(name: name, count: Int(clamping: count), latest: latest))
        }
        let more = try r.byte("more")
        guard more <= 1 else { throw .invalid(field: "more", reason: "must be 0 or 1") }
        return (entries, more == 1)
    }
}
