/// The messages nodes publish to each other on their PUB sockets (docs/PROTOCOL.md, "Peer
/// messages"). Each is two frames: a topic (for SUB prefix filtering) and a body.
public enum PeerMessage: Sendable, Equatable {
    case delta(Delta)
    case heartbeat(Heartbeat)

    /// The protocol version this implementation speaks; the first byte of every body.
    public static let protocolVersion: UInt8 = 1
    /// The version of a DELTA body that deletes, or writes a value with a time to live
    /// (docs/PROTOCOL.md 7.1): a node of version 1 drops it. Other deltas keep version 1.
    public static let deletionVersion: UInt8 = 2

    /// The first byte of a DELTA topic.
    public static let deltaTopicPrefix: UInt8 = UInt8(ascii: "D")
    /// The topic of a HEARTBEAT.
    public static let heartbeatTopic: [UInt8] = [UInt8(ascii: "H")]
    /// The first byte of the topic of a channel batch: deltas of several models of one channel
    /// (docs/PROTOCOL.md 7.6), sent only to peers that said they take them.
    public static let channelBatchTopicPrefix: UInt8 = UInt8(ascii: "M")
    /// The capability bit of a node that takes channel batches (HEARTBEAT `capabilities`).
    package static let channelBatchesCapability: UInt64 = 1
    /// The first byte of the topic of a packed batch: deltas of one channel in one frame
    /// (docs/PROTOCOL.md 7.7), sent only to peers that said they take them.
    public static let packedBatchTopicPrefix: UInt8 = UInt8(ascii: "P")
    /// The capability bit of a node that takes packed batches (HEARTBEAT `capabilities`).
    package static let packedBatchesCapability: UInt64 = 2
    /// The HEARTBEAT octet that says a state digest follows (section 7.3).
    static let stateDigestFollows: UInt8 = 1
    /// The fewest octets an entry of a packed batch takes, its length included (section 7.7).
    package static let packedEntryMinimumOctets = 18
    /// The largest entry a packed batch carries: with the count and the entry's length it stays
    /// under the 64 MiB receivers accept as a frame (section 3). A delta whose entry is larger,
    /// which a log record may hold, goes as a DELTA batch of its own.
    package static let packedEntryMaximumOctets = (64 << 20) - 16
    /// A sender starts a new packed batch before a delta that would take its frame past this
    /// many octets (only a pack of one delta is larger): a receiver's `ZMQ_MAXMSGSIZE` bounds
    /// each frame.
    package static let packedBatchTargetOctets = 1 << 20

    /// The SUB prefix that selects every DELTA of `channel`. Its channel batches (topic `M`, the
    /// channel, NUL) and packed batches (`P`, the channel, NUL) have prefixes of their own: a
    /// filter by channel subscribes to all three.
    public static func subscriptionPrefix(channel: String) -> [UInt8] {
        [deltaTopicPrefix] + Array(channel.utf8) + [0]
    }

    /// A node's periodic liveness and progress report.
    public struct Heartbeat: Sendable, Equatable {
        /// The sender's node id.
        public var node: String
        /// The highest sequence number the sender has assigned (0 before its first delta).
        public var latestSequence: UInt64
        /// The sender's wall clock when it sent the heartbeat, in the timestamp form
        /// (`milliseconds << 16`); informative.
        public var clock: UInt64
        /// A random number chosen at every start of the sender.
        public var incarnation: UInt64
        /// The sender's client API endpoint, where peers FETCH repairs; empty when it has none.
        public var api: String
        /// For each origin the sender tracks, the sequence number through which it has received
        /// every delta: lets a node notice deltas it lacks even when their origin is down, and a
        /// node that lost its own log notice its own missing deltas.
        public var progress: [String: UInt64]
        /// The sender's member list (section 7.5); `nil` from a node older than membership.
        package var members: [Membership.Member]?
        /// What the sender takes beyond version 1 (bits, section 7.3), carried only with a
        /// member list; `nil` when absent (a node older than capabilities, or no member list).
        package var capabilities: UInt64?
        /// The sender's state digest (section 9.2), carried only with a member list and only when
        /// the sender's state is exactly what its progress list says and that list is the one its
        /// previous HEARTBEAT sent (section 11.4, "Anti-entropy"): a peer at the same progress
        /// compares it with its own. `nil` when absent.
        package var stateDigest: UInt64?

        /// A heartbeat with these fields.
        public init(
            node: String, latestSequence: UInt64, clock: UInt64, incarnation: UInt64, api: String = "",
            progress: [String: UInt64] = [:]
        ) {
            self.node = node
            self.latestSequence = latestSequence
            self.clock = clock
            self.incarnation = incarnation
            self.api = api
            self.progress = progress
        }

        /// A heartbeat that carries the sender's member list.
        package init(
            node: String, latestSequence: UInt64, clock: UInt64, incarnation: UInt64, api: String,
            progress: [String: UInt64], members: [Membership.Member]?, capabilities: UInt64? = nil,
            stateDigest: UInt64? = nil
        ) {
            self.init(
                node: node, latestSequence: latestSequence, clock: clock, incarnation: incarnation, api: api,
                progress: progress)
            self.members = members
            self.capabilities = members == nil ? nil : capabilities
            self.stateDigest = members == nil ? nil : stateDigest
        }
    }

    /// The two frames of this message.
    public func encode() -> [[UInt8]] {
        switch self {
        case .delta(let delta):
            return [Self.deltaTopic(channel: delta.channel, model: delta.model), Self.deltaBody(delta)]
        case .heartbeat(let beat):
            var body = WireWriter()
            body.byte(Self.protocolVersion)
            body.string(beat.node)
            body.varint(beat.latestSequence)
            body.uint64(beat.clock)
            body.uint64(beat.incarnation)
            body.string(beat.api)
            body.varint(UInt64(beat.progress.count))
            for origin in beat.progress.keys.sorted() {
                body.string(origin)
                body.varint(beat.progress[origin]!)
            }
            if let members = beat.members {
                body.varint(UInt64(members.count))
                for member in members { Membership.write(member, to: &body) }
                // Which start each entry is about, when any says (section 7.5), after the
                // capabilities (0 when the sender takes nothing more: the same as none); then the
                // state digest, after both (each field present when a later one is).
                if beat.stateDigest != nil || members.contains(where: { $0.incarnation != nil }) {
                    body.varint(beat.capabilities ?? 0)
                    Membership.writeIncarnations(members, to: &body)
                } else if let capabilities = beat.capabilities {
                    body.varint(capabilities)
                }
                if let digest = beat.stateDigest {
                    body.byte(Self.stateDigestFollows)
                    body.uint64(digest)
                }
            }
            return [Self.heartbeatTopic, body.bytes]
        }
    }

    /// The body frame of a DELTA (everything but the topic), written to `sink`: the one
    /// definition of those bytes, shared by the wire and the log.
    static func writeDeltaBody<Sink: WireSink>(_ delta: Delta, to sink: inout Sink) {
        let version2 = delta.needsVersion2
        sink.byte(version2 ? Self.deletionVersion : Self.protocolVersion)
        sink.uint64(delta.version.timestamp)
        sink.string(delta.version.node)
        sink.varint(delta.sequence)
        sink.varint(UInt64(delta.writes.count))
        for position in 0..<delta.writes.count {  // by position: see DeltaPayloadWriter.append
            sink.string(delta.writes[position].name)
            if version2 { sink.propertyValue(delta.writes[position]) } else { sink.value(delta.writes[position].value) }
        }
    }

    /// A delta's DELTA body (section 7.1), encoded alone: what a DELTA message carries after its
    /// topic, and what a log record holds after the channel and model.
    static func deltaBody(_ delta: Delta) -> [UInt8] {
        var body = WireWriter(capacity: 32 + delta.writes.count * 16)
        writeDeltaBody(delta, to: &body)
        return body.bytes
    }

    /// The topic frame of a DELTA (or DELTA batch) of `model` in `channel`.
    static func deltaTopic(channel: String, model: String) -> [UInt8] {
        var topic: [UInt8] = [deltaTopicPrefix]
        topic.reserveCapacity(channel.utf8.count + model.utf8.count + 3)
        topic.append(contentsOf: channel.utf8)
        topic.append(0)
        topic.append(contentsOf: model.utf8)
        topic.append(0)
        return topic
    }

    /// ``encodeBatch(_:)`` of deltas whose bodies (``deltaBody(_:)``) are encoded already: the
    /// frames are those bytes, not a second encoding.
    static func encodeBatch(_ deltas: ArraySlice<Delta>, bodies: ArraySlice<[UInt8]>) -> [[UInt8]] {
        precondition(!deltas.isEmpty && deltas.count == bodies.count)
        let first = deltas[deltas.startIndex]
        var frames = [deltaTopic(channel: first.channel, model: first.model)]
        frames.reserveCapacity(deltas.count + 1)
        for index in deltas.indices {
            precondition(
                deltas[index].channel == first.channel && deltas[index].model == first.model, "a batch is of one model")
        }
        frames.append(contentsOf: bodies)
        return frames
    }

    /// ``encodeChannelBatch(_:)`` of deltas whose bodies are encoded already: each frame is the
    /// delta's model id followed by those bytes.
    static func encodeChannelBatch(_ deltas: ArraySlice<Delta>, bodies: ArraySlice<[UInt8]>) -> [[UInt8]] {
        precondition(!deltas.isEmpty && deltas.count == bodies.count)
        let channel = deltas[deltas.startIndex].channel
        var topic: [UInt8] = [channelBatchTopicPrefix]
        topic.append(contentsOf: channel.utf8)
        topic.append(0)
        var frames = [topic]
        frames.reserveCapacity(deltas.count + 1)
        for (index, body) in zip(deltas.indices, bodies) {
            precondition(deltas[index].channel == channel, "a channel batch is of one channel")
            var frame = WireWriter(capacity: 8 + deltas[index].model.utf8.count + body.count)
            frame.string(deltas[index].model)
            frame.bytes(body)
            frames.append(frame.bytes)
        }
        return frames
    }

    /// A packed batch (section 7.7) of consecutive deltas of `channel` encoded already, each
    /// entry its model id (with its length) and its DELTA body: the topic `P` channel NUL, then
    /// one frame of the count and the entries, each after its length. One frame, however many
    /// deltas: ZeroMQ
    /// handles each frame of a message as a message of its own (a multipart batch cost sender and
    /// receiver about 0.5 µs of CPU per delta in libzmq alone, a packed one 0.1).
    static func encodePackedBatch(channel: String, entries: [ArraySlice<UInt8>]) -> [[UInt8]] {
        var octets = 0
        for entry in entries { octets += entry.count }
        return encodePackedBatch(channel: channel, count: entries.count, octets: octets) { index, write in
            entries[index].withUnsafeBufferPointer(write)
        }
    }

    /// ``encodePackedBatch(channel:entries:)`` of `count` entries of `octets` bytes in all, that
    /// lie in buffers of their own: `withEntry(index, write)` calls `write` with the bytes of the
    /// `index`th, in place (a slice of each buffer was a retain and a release per delta published).
    static func encodePackedBatch(
        channel: String, count: Int, octets: Int,
        withEntry: (Int, (UnsafeBufferPointer<UInt8>) -> Void) -> Void
    ) -> [[UInt8]] {
        precondition(count > 0)
        var topic: [UInt8] = [packedBatchTopicPrefix]
        topic.append(contentsOf: channel.utf8)
        topic.append(0)
        var pack = WireWriter(capacity: 10 + octets + 5 * count)
        pack.varint(UInt64(count))
        for index in 0..<count {
            withEntry(index) { entry in
                pack.varint(UInt64(entry.count))
                pack.bytes(entry)
            }
        }
        return [topic, pack.bytes]
    }

    /// Encodes consecutive deltas of one channel, of any models, as one packed batch (section
    /// 7.7). Only for peers that take packed batches.
    package static func encodePackedBatch(_ deltas: [Delta]) -> [[UInt8]] {
        precondition(!deltas.isEmpty)
        let channel = deltas[0].channel
        precondition(deltas.allSatisfy { $0.channel == channel }, "a packed batch is of one channel")
        return encodePackedBatch(
            channel: channel, entries: encodeChannelBatch(deltas).dropFirst().map { $0[...] })
    }

    /// Encodes consecutive deltas of one model as one message: the topic, then one body frame
    /// per delta (a DELTA batch; a batch of one is a plain DELTA). Fewer, larger messages under
    /// load; subscribers filter batches by channel exactly like single deltas.
    public static func encodeBatch(_ deltas: [Delta]) -> [[UInt8]] {
        encodeBatch(deltas[...], bodies: deltas.map(deltaBody)[...])
    }

    /// Encodes consecutive deltas of one channel, of any models, as one channel batch (section
    /// 7.6): the topic `M` channel NUL, then one frame per delta, its model id followed by its
    /// DELTA body. Only for peers that take channel batches.
    package static func encodeChannelBatch(_ deltas: [Delta]) -> [[UInt8]] {
        encodeChannelBatch(deltas[...], bodies: deltas.map(deltaBody)[...])
    }

    /// Decodes a message that may be a DELTA batch (one body frame per delta); a heartbeat or a
    /// single delta gives one message.
    public static func decodeAll(_ frames: [[UInt8]]) throws(WireError) -> [PeerMessage] {
        if let deltas = try decodeDeltas(frames) { return deltas.map(PeerMessage.delta) }
        return [try decode(frames)]
    }

    /// Decodes a DELTA or a DELTA batch into its deltas, in order; `nil` for any other message.
    /// A channel batch (section 7.6) and a packed batch (section 7.7) are decoded too unless
    /// `channelBatches` or `packedBatches` is false (a node that does not take them: then it is a
    /// message of an unsupported topic).
    public static func decodeDeltas(
        _ frames: [[UInt8]], channelBatches: Bool = true, packedBatches: Bool = true
    ) throws(WireError) -> [Delta]? {
        try decodeDeltaMessage(frames, channelBatches: channelBatches, packedBatches: packedBatches)?.deltas
    }

    /// The deltas of a DELTA message, and for a packed batch where each delta's entry (its
    /// model id and DELTA body, as it came) lies in the second frame: what its log record holds.
    package struct DecodedDeltas {
        package var deltas: [Delta]
        /// For a packed batch, the range of each delta's model id and body in `frames[1]`; `nil`
        /// for the other forms (one frame per delta).
        package var packedEntries: [Range<Int>]?
    }

    /// ``decodeDeltas(_:channelBatches:packedBatches:)``, with where a packed batch's entries lie.
    package static func decodeDeltaMessage(
        _ frames: [[UInt8]], channelBatches: Bool = true, packedBatches: Bool = true
    ) throws(WireError) -> DecodedDeltas? {
        guard frames.count >= 2 else { return nil }
        if packedBatches, frames[0].first == packedBatchTopicPrefix { return try decodePackedBatch(frames) }
        guard let deltas = try decodeFramedDeltas(frames, channelBatches: channelBatches) else { return nil }
        return DecodedDeltas(deltas: deltas, packedEntries: nil)
    }

    /// A packed batch (section 7.7): its topic names the channel; its second frame holds every
    /// delta. Frames after the second are ignored; anything malformed in the pack drops it whole.
    private static func decodePackedBatch(_ frames: [[UInt8]]) throws(WireError) -> DecodedDeltas {
        let channel = try channelOfBatchTopic(frames[0], prefix: "P")
        var reader = WireReader(frames[1])
        // An entry is at least 18 octets: its length (1), a model id (2) and the shortest DELTA
        // body (15: version, timestamp, a one-octet origin, sequence, count, an empty name and a
        // one-octet value). A count the pack cannot hold is refused before anything is reserved.
        let count = try reader.count("packed batch count", minimumItemSize: packedEntryMinimumOctets)
        guard count > 0 else { throw .invalid(field: "packed batch count", reason: "a packed batch holds a delta") }
        var headers: [DeltaHeader] = []
        var entries: [Range<Int>] = []
        // One array for the properties of every delta of the batch (usually one each).
        var writes: [PropertyWrite] = []
        headers.reserveCapacity(min(count, WireReader.maximumReservation))
        entries.reserveCapacity(min(count, WireReader.maximumReservation))
        writes.reserveCapacity(min(count, WireReader.maximumReservation))
        // Consecutive entries usually name the same model: its id is decoded once per run (and
        // their origin and property names once per batch).
        var lastModel: (bytes: Range<Int>, name: String)?
        var recent = RecentNames()
        for _ in 0..<count {
            let length = try reader.count("packed entry length")
            let entry = reader.offset..<(reader.offset + length)
            // The entry is read by the batch's reader, limited to it (the octets after the fields
            // this version knows are passed over), and its model id compared in place: a reader
            // and two slices of the frame per entry were three retains of it, and their releases.
            let batchEnd = reader.limit(to: entry.upperBound)
            let modelLength = try reader.count("model")
            let modelBytes = reader.offset..<(reader.offset + modelLength)
            let model: String
            if let lastModel, reader.octets(lastModel.bytes, equal: modelBytes) {
                model = lastModel.name
                reader.skip(modelLength)
            } else {
                model = try reader.utf8("model", count: modelLength)
                guard !model.isEmpty, !model.utf8.contains(0) else {
                    throw .invalid(field: "model", reason: "empty or contains NUL")
                }
                lastModel = (modelBytes, model)
            }
            let version = try reader.byte("protocol version")
            guard version == protocolVersion || version == deletionVersion else {
                throw .unsupported("protocol version \(version)")
            }
            headers.append(
                try decodeDeltaBody(
                    &reader, model: model, version2: version == deletionVersion, names: &recent, into: &writes))
            reader.endLimit(restoring: batchEnd)
            entries.append(entry)
        }
        return DecodedDeltas(deltas: deltas(of: headers, channel: channel, writes: writes), packedEntries: entries)
    }

    /// A DELTA batch or a channel batch: one frame per delta.
    private static func decodeFramedDeltas(_ frames: [[UInt8]], channelBatches: Bool) throws(WireError) -> [Delta]? {
        let channel: String
        let topicModel: String?  // nil: a channel batch, whose frames each start with their model
        if channelBatches, frames[0].first == channelBatchTopicPrefix {
            channel = try channelOfBatchTopic(frames[0], prefix: "M")
            topicModel = nil
        } else if frames[0].first == deltaTopicPrefix {
            (channel, topicModel) = try splitDeltaTopic(frames[0])
        } else {
            return nil
        }
        // A lone DELTA decodes its names; a batch compares them with the last delta's.
        if frames.count == 2 {
            var names = FreshNames()
            return try decodeFrames(frames, channel: channel, topicModel: topicModel, names: &names)
        }
        var names = RecentNames()
        return try decodeFrames(frames, channel: channel, topicModel: topicModel, names: &names)
    }

    /// The deltas of `frames` after the topic, one per frame, each starting with its model id
    /// unless the topic names it (`topicModel`).
    private static func decodeFrames(
        _ frames: [[UInt8]], channel: String, topicModel: String?, names: inout some NameReading
    ) throws(WireError) -> [Delta] {
        var headers: [DeltaHeader] = []
        var writes: [PropertyWrite] = []
        headers.reserveCapacity(frames.count - 1)
        writes.reserveCapacity(frames.count - 1)
        for index in 1..<frames.count {
            var reader = WireReader(frames[index])
            let model: String
            if let topicModel {
                model = topicModel
            } else {
                model = try reader.string("model")
                guard !model.isEmpty, !model.utf8.contains(0) else {
                    throw .invalid(field: "model", reason: "empty or contains NUL")
                }
            }
            let version = try reader.byte("protocol version")
            guard version == protocolVersion || version == deletionVersion else {
                throw .unsupported("protocol version \(version)")
            }
            headers.append(
                try decodeDeltaBody(
                    &reader, model: model, version2: version == deletionVersion, names: &names, into: &writes))
        }
        return deltas(of: headers, channel: channel, writes: writes)
    }

    /// A decoded delta but for its properties, which are `writes` of its batch's array.
    private struct DeltaHeader {
        let model: String
        let version: Version
        let sequence: UInt64
        let writes: Range<Int>
    }

    /// The deltas of a batch, made once its properties are all decoded: they share one
    /// allocation, and `writes` (an array appended to while decoding would be copied at the first
    /// append after a delta took it).
    private static func deltas(of headers: [DeltaHeader], channel: String, writes: [PropertyWrite]) -> [Delta] {
        Delta.batch(count: headers.count) { index in
            Delta.Fields(
                channel: channel, model: headers[index].model, version: headers[index].version,
                sequence: headers[index].sequence, writes: PropertyWrites(writes, range: headers[index].writes))
        }
    }

    /// The channel of a channel batch's topic, `M` channel NUL (section 7.6), or a packed
    /// batch's, `P` channel NUL (section 7.7).
    private static func channelOfBatchTopic(_ topic: [UInt8], prefix: String) throws(WireError) -> String {
        guard topic.count >= 3, topic.last == 0, !topic.dropFirst().dropLast().contains(0),
            let channel = String(utf8Bytes: topic[1..<(topic.count - 1)])
        else {
            throw .invalid(field: "topic", reason: "expected \(prefix)<channel>\\0")
        }
        return channel
    }

    /// Decodes a message from its frames. Bytes after the fields this version knows are ignored
    /// (room for later versions); everything else malformed throws. Of a DELTA batch only the
    /// first delta is decoded: use ``decodeAll(_:)``.
    public static func decode(_ frames: [[UInt8]]) throws(WireError) -> PeerMessage {
        guard frames.count >= 2 else {
            throw .invalid(field: "message", reason: "expected 2 frames, got \(frames.count)")
        }
        let topic = frames[0]
        var body = WireReader(frames[1])
        let version = try body.byte("protocol version")
        // Version 2 is a DELTA body that deletes or expires; every other message is version 1.
        guard version == protocolVersion || (version == deletionVersion && topic != heartbeatTopic) else {
            throw .unsupported("protocol version \(version)")
        }
        if topic == heartbeatTopic {
            let node = try body.string("node")
            guard !node.isEmpty else { throw .invalid(field: "node", reason: "empty node id") }
            let sequence = try body.varint("latest sequence")
            let clock = try body.uint64("clock")
            let incarnation = try body.uint64("incarnation")
            let api = body.isAtEnd ? "" : try body.string("api endpoint")
            var progress: [String: UInt64] = [:]
            if !body.isAtEnd {
                let count = try body.count("progress count", minimumItemSize: 2)
                for _ in 0..<count {
                    let origin = try body.string("progress origin")
                    progress[origin] = try body.varint("progress sequence")
                }
            }
            var members: [Membership.Member]?
            if !body.isAtEnd {
                // id, publish, api, state, version, writer: at least 14 octets each.
                let count = try body.count("member count", minimumItemSize: 14)
                guard count <= Membership.maximumMembers else {
                    throw .invalid(field: "member count", reason: "\(count) is over \(Membership.maximumMembers)")
                }
                var list: [Membership.Member] = []
                list.reserveCapacity(count)
                for _ in 0..<count { list.append(try Membership.read(&body)) }
                members = list
            }
            let capabilities = members != nil && !body.isAtEnd ? try body.varint("capabilities") : nil
            var stateDigest: UInt64?
            if capabilities != nil, !body.isAtEnd, var list = members {
                try Membership.readIncarnations(&body, into: &list)
                members = list
                // The state digest's presence octet: 01 a digest follows, 00 none; others are
                // reserved (a later version's), and the rest of the body is passed over.
                if !body.isAtEnd, try body.byte("state digest presence") == Self.stateDigestFollows {
                    stateDigest = try body.uint64("state digest")
                }
            }
            return .heartbeat(
                Heartbeat(
                    node: node, latestSequence: sequence, clock: clock, incarnation: incarnation, api: api,
                    progress: progress, members: members, capabilities: capabilities, stateDigest: stateDigest))
        }
        guard topic.first == deltaTopicPrefix else {
            throw .unsupported("topic 0x\(String(topic.first ?? 0, radix: 16))")
        }
        let (channel, model) = try splitDeltaTopic(topic)
        var names = FreshNames()
        var writes: [PropertyWrite] = []
        let header = try decodeDeltaBody(
            &body, model: model, version2: version == deletionVersion, names: &names, into: &writes)
        return .delta(
            Delta(
                channel: channel, model: header.model, version: header.version, sequence: header.sequence,
                writes: PropertyWrites(writes)))
    }

    /// How a delta's origin and property names are read: decoded each time (a lone DELTA), or
    /// compared with the last delta's (a batch).
    private protocol NameReading {
        mutating func origin(from body: inout WireReader) throws(WireError) -> String
        mutating func property(at position: Int, from body: inout WireReader) throws(WireError) -> String
    }

    /// Every name decoded.
    private struct FreshNames: NameReading {
        func origin(from body: inout WireReader) throws(WireError) -> String { try body.string("origin") }
        func property(at position: Int, from body: inout WireReader) throws(WireError) -> String {
            try body.string("property name")
        }
    }

    /// The names the last delta of a batch decoded: the next one's equal names are compared
    /// with them, not decoded again.
    private struct RecentNames: NameReading {
        var lastOrigin: String?
        /// By position in the delta, the first ``remembered`` (a delta of more properties has
        /// the rest decoded as they come); grown as positions are first seen, once per batch.
        var lastProperties: [String?] = []
        static let remembered = 8

        mutating func origin(from body: inout WireReader) throws(WireError) -> String {
            try body.string("origin", repeating: &lastOrigin)
        }

        mutating func property(at position: Int, from body: inout WireReader) throws(WireError) -> String {
            guard position < Self.remembered else { return try body.string("property name") }
            if position == lastProperties.count { lastProperties.append(nil) }
            return try body.string("property name", repeating: &lastProperties[position])
        }
    }

    /// The fields of a DELTA body after its protocol version byte. A version-2 body's values are
    /// property values (section 4.3), and its one property may be the model's deletion (the
    /// empty name, deleted).
    ///
    /// The properties are appended to `properties` (the batch's array); the header says where.
    private static func decodeDeltaBody(
        _ body: inout WireReader, model: String, version2: Bool, names reading: inout some NameReading,
        into properties: inout [PropertyWrite]
    ) throws(WireError) -> DeltaHeader {
        let timestamp = try body.uint64("version")
        let origin = try reading.origin(from: &body)
        guard !origin.isEmpty else { throw .invalid(field: "origin", reason: "empty node id") }
        let sequence = try body.varint("sequence")
        let count = try body.count("property count", minimumItemSize: 2)
        guard count > 0 else { throw .invalid(field: "property count", reason: "a delta writes at least one property") }
        // No `reserveCapacity` per delta: it would grow the batch's array exactly, not geometrically.
        let first = properties.count
        // Duplicate names: a linear scan for the usual few properties, a set beyond.
        var names = count > 16 ? Set<String>() : nil
        for position in 0..<count {
            let name = try reading.property(at: position, from: &body)
            let duplicate =
                names != nil
                ? !names!.insert(name).inserted : properties[first...].contains { $0.name == name }
            guard !duplicate else {
                throw .invalid(field: "property name", reason: "'\(name)' appears twice")
            }
            if version2 {
                let write = try body.propertyWrite(named: name)
                if name.isEmpty, !(write.isDeletion && count == 1) {
                    throw .invalid(
                        field: "property name",
                        reason: "the empty name is the deletion of the model, the delta's only property")
                }
                properties.append(write)
            } else {
                properties.append(PropertyWrite(name: name, value: try body.value("property value")))
            }
        }
        return DeltaHeader(
            model: model, version: Version(timestamp: timestamp, node: origin), sequence: sequence,
            writes: first..<properties.count)
    }

    private static func splitDeltaTopic(_ topic: [UInt8]) throws(WireError) -> (String, String) {
        let rest = topic.dropFirst()
        guard let firstNul = rest.firstIndex(of: 0), topic.last == 0, firstNul < topic.count - 1 else {
            throw .invalid(field: "topic", reason: "expected D<channel>\\0<model>\\0")
        }
        let channelBytes = topic[1..<firstNul]
        let modelBytes = topic[(firstNul + 1)..<(topic.count - 1)]
        guard let channel = String(utf8Bytes: channelBytes), !channel.isEmpty else {
            throw .invalidUTF8(field: "topic channel")
        }
        guard let model = String(utf8Bytes: modelBytes), !model.isEmpty, !modelBytes.contains(0) else {
            throw .invalid(field: "topic model", reason: "empty, not UTF-8 or contains NUL")
        }
        return (channel, model)
    }
}
