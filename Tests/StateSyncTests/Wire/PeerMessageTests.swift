import Testing

@testable import StateSync

@Suite("Peer messages (PROTOCOL.md §Peer messages)")
struct PeerMessageTests {
    static let delta = Delta(
        channel: "demo", model: "greeting",
        version: Version(milliseconds: 1_763_769_600_123, counter: 0, node: "node1"),
        sequence: 1, properties: [PropertyWrite(name: "text", value: "hello"), PropertyWrite(name: "n", value: 1)])

    @Test func deltaRoundTripsAndTopicAllowsChannelPrefixSubscription() throws {
        let frames = PeerMessage.delta(Self.delta).encode()
        #expect(frames[0] == Array("Ddemo\u{0}greeting\u{0}".utf8))
        #expect(frames[0].starts(with: PeerMessage.subscriptionPrefix(channel: "demo")))
        #expect(!frames[0].starts(with: PeerMessage.subscriptionPrefix(channel: "dem")))
        #expect(try PeerMessage.decode(frames) == .delta(Self.delta))
    }

    @Test func deltaBatchesRoundTripAndFilterByChannel() throws {
        var second = Self.delta
        second.sequence = 2
        second.properties = [PropertyWrite(name: "text", value: "again")]
        let frames = PeerMessage.encodeBatch([Self.delta, second])
        #expect(frames.count == 3)
        #expect(frames[0].starts(with: PeerMessage.subscriptionPrefix(channel: "demo")))
        #expect(try PeerMessage.decodeAll(frames) == [.delta(Self.delta), .delta(second)])
        #expect(try PeerMessage.decodeAll(PeerMessage.delta(Self.delta).encode()) == [.delta(Self.delta)])
    }

    /// Two more deltas of ``delta``'s channel: one of another model, one (version 2) deleting.
    static var otherModelAndDeletion: (other: Delta, deletion: Delta) {
        var other = delta
        other.model = "farewell"
        other.sequence = 2
        var deletion = delta
        deletion.sequence = 3
        deletion.properties = [.deletion(of: "n")]
        return (other, deletion)
    }

    /// 7.6: a channel batch carries deltas of several models of one channel, each frame its
    /// model id then a DELTA body (version 1 or 2); a node that does not take them sees an
    /// unsupported topic.
    @Test func channelBatchesRoundTripAndAreUnsupportedWhereNotTaken() throws {
        let (other, deletion) = Self.otherModelAndDeletion
        let frames = PeerMessage.encodeChannelBatch([Self.delta, other, deletion])
        #expect(frames.count == 4 && frames[0] == Array("Mdemo\u{0}".utf8))
        #expect(Array(frames[2].prefix(9)) == [8] + Array("farewell".utf8))
        #expect(try PeerMessage.decodeDeltas(frames) == [Self.delta, other, deletion])
        #expect(try PeerMessage.decodeDeltas(frames, channelBatches: false) == nil)
        // A node that does not take them reads the model id's length as a protocol version.
        #expect(throws: WireError.unsupported("protocol version 8")) { try PeerMessage.decode(frames) }
    }

    @Test func malformedChannelBatchesAreRefused() throws {
        let good = PeerMessage.encodeChannelBatch([Self.delta])
        for topic in [Array("Mdemo".utf8), Array("M\u{0}".utf8), Array("Mde\u{0}mo\u{0}".utf8)] {
            #expect(throws: WireError.self) { try PeerMessage.decodeDeltas([topic, good[1]]) }
        }
        var emptyModel = WireWriter()
        emptyModel.string("")
        #expect(throws: WireError.self) {
            try PeerMessage.decodeDeltas([good[0], emptyModel.bytes + good[1].dropFirst(9)])
        }
        #expect(throws: WireError.self) { try PeerMessage.decodeDeltas([good[0], Array(good[1].prefix(12))]) }
    }

    /// A batch's deltas repeat their origin and property names, and the decoder compares them
    /// with the last delta's instead of decoding them again: names of the same length but other
    /// bytes, in other positions, a changed origin, more properties than it remembers and the
    /// empty name must all come back as sent, in every kind of batch.
    @Test func namesRepeatedAcrossABatchDecodeAsSent() throws {
        func delta(_ sequence: UInt64, origin: String, _ names: [String]) -> Delta {
            Delta(
                channel: "demo", model: "m", version: Version(milliseconds: 5, counter: 0, node: origin),
                sequence: sequence, properties: names.map { PropertyWrite(name: $0, value: .string($0)) })
        }
        let many = (0..<12).map { "p\($0)" }
        let deltas = [
            delta(1, origin: "node-a", ["ab", "cd"]), delta(2, origin: "node-a", ["cd", "ab"]),
            delta(3, origin: "node-b", ["ba", "cd", "é"]), delta(4, origin: "node-b", ["ab"]),
            delta(5, origin: "node-a", many), delta(6, origin: "node-a", many.reversed()),
            delta(7, origin: "node-a", ["abc"]), delta(8, origin: "node-aa", ["ab", "é"]),
            Delta(
                channel: "demo", model: "m", version: Version(milliseconds: 6, counter: 0, node: "node-a"),
                sequence: 9, properties: [.modelDeletion]),
            delta(10, origin: "node-a", ["ab"]),
        ]
        #expect(try PeerMessage.decodeDeltas(PeerMessage.encodePackedBatch(deltas)) == deltas)
        #expect(try PeerMessage.decodeDeltas(PeerMessage.encodeChannelBatch(deltas)) == deltas)
        #expect(try PeerMessage.decodeDeltas(PeerMessage.encodeBatch(deltas)) == deltas)
        // A non-ASCII name repeated in place, and a lone DELTA (decoded without the batch's
        // bookkeeping).
        let accented = [delta(1, origin: "nœud", ["é", "ü"]), delta(2, origin: "nœud", ["é", "ü"])]
        #expect(try PeerMessage.decodeDeltas(PeerMessage.encodePackedBatch(accented)) == accented)
        #expect(try PeerMessage.decodeDeltas(PeerMessage.delta(accented[0]).encode()) == [accented[0]])
        // A name of the remembered length whose bytes are not UTF-8 is refused, not taken for
        // the remembered one.
        var frames = PeerMessage.encodeChannelBatch([
            delta(1, origin: "node-a", ["ab"]), delta(2, origin: "node-a", ["ab"]),
        ])
        let name = try #require(frames[2].firstRange(of: [2, 0x61, 0x62]))  // length 2, "ab"
        frames[2].replaceSubrange(name, with: [2, 0xC3, 0x28])
        #expect(throws: WireError.invalidUTF8(field: "property name")) { try PeerMessage.decodeDeltas(frames) }
    }

    /// 7.7: a packed batch carries deltas of one channel, of any models, in one frame: a count,
    /// then per delta its length, model id and DELTA body (version 1 or 2). A node that does not
    /// take them sees an unsupported topic.
    @Test func packedBatchesRoundTripInOneFrameAndAreUnsupportedWhereNotTaken() throws {
        let (other, deletion) = Self.otherModelAndDeletion
        let deltas = [Self.delta, other, deletion]
        let frames = PeerMessage.encodePackedBatch(deltas)
        #expect(frames.count == 2 && frames[0] == Array("Pdemo\u{0}".utf8))
        // Each entry is its length, then exactly a channel batch's frame: model id, body.
        var expected = WireWriter()
        expected.varint(3)
        for frame in PeerMessage.encodeChannelBatch(deltas).dropFirst() {
            expected.varint(UInt64(frame.count))
            expected.bytes(frame)
        }
        #expect(frames[1] == expected.bytes)
        let decoded = try #require(try PeerMessage.decodeDeltaMessage(frames))
        #expect(decoded.deltas == deltas)
        let entries = try #require(decoded.packedEntries)
        #expect(entries.map { Array(frames[1][$0]) } == Array(PeerMessage.encodeChannelBatch(deltas).dropFirst()))
        #expect(try PeerMessage.decodeDeltas(frames, packedBatches: false) == nil)
        // A node that does not take them reads the count as a protocol version.
        #expect(throws: WireError.unsupported("protocol version 3")) { try PeerMessage.decode(frames) }
        // Frames after the pack are ignored; octets after an entry's body, within its length,
        // too (a later version's fields).
        #expect(try PeerMessage.decodeDeltas(frames + [[1, 2, 3]]) == deltas)
        var longer = WireWriter()
        longer.varint(1)
        let entry = PeerMessage.encodeChannelBatch([Self.delta])[1] + [0xEE, 0xEE]
        longer.varint(UInt64(entry.count))
        longer.bytes(entry)
        #expect(try PeerMessage.decodeDeltas([frames[0], longer.bytes]) == [Self.delta])
    }

    /// Deltas whose origins and property names change from one to the next (by one byte, or to a
    /// canonically equivalent spelling) decode to exactly what was sent, byte for byte, in every
    /// batch form.
    @Test func originsAndNamesThatChangeBetweenDeltasDecodeExactly() throws {
        let composed = "caf\u{E9}"
        let decomposed = "cafe\u{301}"
        let specs: [(origin: String, names: [String])] = [
            ("n2", ["x"]), ("n2", ["x"]), ("n3", ["x"]), ("n2", ["y", "x"]), ("n2", ["x", "y"]),
            ("n2", [composed]), ("n2", [decomposed]), ("n2", ["x"]), ("n4", ["xy"]), ("n44", ["x"]),
        ]
        let deltas = specs.enumerated().map { index, spec in
            Delta(
                channel: "demo", model: "greeting",
                version: Version(milliseconds: 5, counter: UInt16(index), node: spec.origin),
                sequence: UInt64(index + 1),
                properties: spec.names.map { PropertyWrite(name: $0, value: .int(Int64(index))) })
        }
        for frames in [
            PeerMessage.encodeBatch(deltas), PeerMessage.encodeChannelBatch(deltas),
            PeerMessage.encodePackedBatch(deltas),
        ] {
            let decoded = try #require(try PeerMessage.decodeDeltas(frames))
            #expect(decoded == deltas)
            #expect(decoded.map(\.origin).elementsEqual(deltas.map(\.origin)) { $0.utf8.elementsEqual($1.utf8) })
            #expect(
                decoded.flatMap { $0.properties.map(\.name) }.elementsEqual(
                    deltas.flatMap { $0.properties.map(\.name) }
                ) {
                    $0.utf8.elementsEqual($1.utf8)
                })
        }
    }

    /// PROTOCOL.md 15: the worked example's delta as a packed batch, octet for octet.
    @Test func theWorkedExamplesPackedBatch() throws {
        let frames = PeerMessage.encodePackedBatch([Self.delta])
        #expect(frames[0] == [0x50, 0x64, 0x65, 0x6d, 0x6f, 0x00])
        let body = PeerMessage.delta(Self.delta).encode()[1]
        #expect(body.count == 33)
        #expect(frames[1] == [0x01, 0x2a, 0x08] + Array("greeting".utf8) + body)
        #expect(frames[1].count == 44)
    }

    @Test func malformedPackedBatchesAreRefusedWhole() throws {
        let good = PeerMessage.encodePackedBatch([Self.delta])
        for topic in [Array("Pdemo".utf8), Array("P\u{0}".utf8), Array("Pde\u{0}mo\u{0}".utf8)] {
            #expect(throws: WireError.self) { try PeerMessage.decodeDeltas([topic, good[1]]) }
        }
        let frame = PeerMessage.encodeChannelBatch([Self.delta])[1]
        /// A pack of `count` entries, each `entry` with the length `length` (its own by default).
        func pack(count: UInt64, _ entries: [[UInt8]], length: Int? = nil) -> [[UInt8]] {
            var pack = WireWriter()
            pack.varint(count)
            for entry in entries {
                pack.varint(UInt64(length ?? entry.count))
                pack.bytes(entry)
            }
            return [good[0], pack.bytes]
        }
        #expect(try PeerMessage.decodeDeltas(pack(count: 1, [frame])) == [Self.delta])
        var emptyModel = WireWriter()
        emptyModel.string("")
        var nulModel = WireWriter()
        nulModel.string("a\u{0}b")
        let body = Array(frame.dropFirst(9))
        let malformed: [(String, [[UInt8]])] = [
            ("no entries", pack(count: 0, [])),
            ("more entries than it holds", pack(count: 2, [frame])),
            ("an entry longer than the frame", pack(count: 1, [frame], length: frame.count + 1)),
            ("an entry cut short", pack(count: 1, [Array(frame.prefix(12))])),
            ("an empty model id", pack(count: 1, [emptyModel.bytes + body])),
            ("a model id with NUL", pack(count: 1, [nulModel.bytes + body])),
            ("a model id that is not UTF-8", pack(count: 1, [[2, 0x61, 0xFF] + body])),
            ("a good entry, then one whose model id is not UTF-8", pack(count: 2, [frame, [2, 0x61, 0xFF] + body])),
            ("a model id longer than its entry", pack(count: 1, [[40, 0x61] + body], length: 2 + body.count)),
            ("an unknown body version", pack(count: 1, [Array(frame.prefix(9)) + [7] + body.dropFirst()])),
            ("a good entry, then a bad one", pack(count: 2, [frame, Array(frame.prefix(12))])),
        ]
        for (what, frames) in malformed {
            #expect(throws: WireError.self, "\(what)") { try PeerMessage.decodeDeltas(frames) }
        }
    }

    /// 7.3: capabilities travel after the member list, and only with one.
    @Test func capabilitiesTravelWithTheMemberList() throws {
        let member = Membership.Member(
            id: "n2", publish: "tcp://127.0.0.1:7102", api: "", state: .alive,
            version: Version(milliseconds: 5, counter: 0, node: "n2"))
        func beat(_ members: [Membership.Member]?, _ capabilities: UInt64?) -> PeerMessage.Heartbeat {
            PeerMessage.Heartbeat(
                node: "n2", latestSequence: 4, clock: 7 << 16, incarnation: 9, api: "", progress: [:], members: members,
                capabilities: capabilities)
        }
        func decoded(_ beat: PeerMessage.Heartbeat) throws -> PeerMessage.Heartbeat? {
            guard case .heartbeat(let decoded) = try PeerMessage.decode(PeerMessage.heartbeat(beat).encode()) else {
                return nil
            }
            return decoded
        }
        #expect(try decoded(beat([member], 1))?.capabilities == 1)
        #expect(try decoded(beat([member], 1))?.members == [member])
        #expect(try decoded(beat([member], nil))?.capabilities == nil)
        #expect(try decoded(beat(nil, 1))?.capabilities == nil)
        #expect(try decoded(beat(nil, 1)) == beat(nil, nil))
    }

    /// 7.3: the state digest travels after the incarnations section (written, with count 0 if
    /// need be, to make room for it), only with a member list; a node of an earlier version
    /// passes it over, and a reserved presence octet is passed over with the rest of the body.
    @Test func theStateDigestTravelsAfterTheIncarnations() throws {
        let member = Membership.Member(
            id: "n2", publish: "tcp://127.0.0.1:7102", api: "", state: .alive,
            version: Version(milliseconds: 5, counter: 0, node: "n2"))
        func beat(_ members: [Membership.Member]?, _ digest: UInt64?, incarnation: UInt64? = nil)
            -> PeerMessage.Heartbeat
        {
            var list = members
            if let incarnation {
                list = list?.map {
                    var m = $0
                    m.incarnation = incarnation
                    return m
                }
            }
            return PeerMessage.Heartbeat(
                node: "n2", latestSequence: 4, clock: 7 << 16, incarnation: 9, api: "", progress: ["n1": 3],
                members: list, capabilities: nil, stateDigest: digest)
        }
        func decoded(_ frames: [[UInt8]]) throws -> PeerMessage.Heartbeat? {
            guard case .heartbeat(let decoded) = try PeerMessage.decode(frames) else { return nil }
            return decoded
        }
        let digest: UInt64 = 0xFEED_FACE_CAFE_BEEF
        #expect(try decoded(PeerMessage.heartbeat(beat([member], digest)).encode())?.stateDigest == digest)
        let named = try decoded(PeerMessage.heartbeat(beat([member], digest, incarnation: 77)).encode())
        #expect(named?.stateDigest == digest && named?.members?.first?.incarnation == 77)
        #expect(try decoded(PeerMessage.heartbeat(beat([member], nil)).encode())?.stateDigest == nil)
        #expect(beat(nil, digest).stateDigest == nil, "only with a member list")
        // The body of a node without the digest is a prefix of the one with it.
        let with = PeerMessage.heartbeat(beat([member], digest)).encode()
        var without = with
        without[1].removeLast(9)
        let older = try decoded(without)
        #expect(older?.stateDigest == nil && older?.members == [member] && older?.progress == ["n1": 3])
        // Presence 00: none; a reserved octet: none, and what follows is passed over.
        var none = without
        none[1] += [0x00]
        #expect(try decoded(none)?.stateDigest == nil)
        var reserved = without
        reserved[1] += [0x07, 1, 2, 3]
        #expect(try decoded(reserved)?.stateDigest == nil)
        // A digest cut short is malformed.
        for cut in 1..<9 {
            #expect(throws: WireError.self) { try PeerMessage.decode([with[0], Array(with[1].dropLast(cut))]) }
        }
    }

    @Test func heartbeatRoundTrips() throws {
        let beat = PeerMessage.heartbeat(.init(node: "n2", latestSequence: 42, clock: 7 << 16, incarnation: 99))
        #expect(try PeerMessage.decode(beat.encode()) == beat)
    }

    @Test func trailingBytesFromNewerPeersAreIgnored() throws {
        var frames = PeerMessage.delta(Self.delta).encode()
        frames[1] += [0xAA, 0xBB]
        #expect(try PeerMessage.decode(frames) == .delta(Self.delta))
    }

    @Test func unknownProtocolVersionIsRejected() {
        var frames = PeerMessage.delta(Self.delta).encode()
        frames[1][0] = 3
        #expect(throws: WireError.unsupported("protocol version 3")) { try PeerMessage.decode(frames) }
        // Version 2 is a DELTA body only (section 7.1): a HEARTBEAT of version 2 is refused.
        var beat = PeerMessage.heartbeat(.init(node: "n2", latestSequence: 1, clock: 0, incarnation: 1)).encode()
        beat[1][0] = 2
        #expect(throws: WireError.unsupported("protocol version 2")) { try PeerMessage.decode(beat) }
    }

    @Test func everyTruncatedBodyIsAnErrorNotATrap() {
        let frames = PeerMessage.delta(Self.delta).encode()
        for cut in 0..<frames[1].count {
            #expect(throws: WireError.self) { try PeerMessage.decode([frames[0], Array(frames[1].prefix(cut))]) }
        }
        #expect(throws: WireError.self) { try PeerMessage.decode([frames[0]]) }
        #expect(throws: WireError.self) { try PeerMessage.decode([Array("Dnochannel".utf8), frames[1]]) }
    }
}

@Suite("DELTA batching")
struct DeltaBatchingTests {
    static func delta(_ model: String, _ sequence: UInt64) -> Delta {
        Delta(
            channel: "c", model: model, version: Version(milliseconds: sequence, counter: 0, node: "n1"),
            sequence: sequence, properties: [PropertyWrite(name: "p", value: .int(1))])
    }

    /// Runs of one model, cut at `network.batch_max_deltas`, in order, covering every delta once.
    @Test func batchesAreRunsOfOneModelCutAtTheLimit() {
        let deltas = ["a", "a", "a", "a", "a", "b", "a", "a"].enumerated().map { Self.delta($1, UInt64($0 + 1)) }
        #expect(NodeMachine.batchRanges(of: deltas, limit: 256) == [0..<5, 5..<6, 6..<8])
        #expect(NodeMachine.batchRanges(of: deltas, limit: 2) == [0..<2, 2..<4, 4..<5, 5..<6, 6..<8])
        #expect(NodeMachine.batchRanges(of: deltas, limit: 1) == (0..<8).map { $0..<($0 + 1) })
        #expect(NodeMachine.batchRanges(of: [], limit: 3).isEmpty)
    }
}

/// The FETCH reply body (PROTOCOL.md 10.8), with its appended void ranges.
@Suite("FETCH replies")
struct FetchReplyTests {
    static let deltas = [RepairMachineTests.delta("n1", 3), RepairMachineTests.delta("n1", 6)]

    /// Void ranges round-trip; a body without them (an older node's) declares none, and one
    /// with none is the older body, octet for octet.
    @Test func voidRangesRoundTripAndAreOptional() throws {
        let body = ClientProtocol.encodeFetched(Self.deltas, droppedThrough: 2, void: [4...5, 9...9])
        let (deltas, dropped, void) = try ClientProtocol.decodeFetched(body)
        #expect(deltas.map(\.sequence) == [3, 6] && dropped == 2 && void == [4...5, 9...9])
        let plain = ClientProtocol.encodeFetched(Self.deltas, droppedThrough: 2)
        #expect(try ClientProtocol.decodeFetched(plain).void.isEmpty)
        #expect(plain == ClientProtocol.encodeFetched(Self.deltas, droppedThrough: 2, void: []))
        #expect(body.starts(with: plain), "appended after the deltas")
    }

    /// Void ranges that start at 0, run backwards, overlap or come out of order make the body
    /// malformed; so does a truncated one.
    @Test func malformedVoidRangesAreRefused() {
        func body(_ pairs: [(UInt64, UInt64)]) -> [UInt8] {
            var w = WireWriter()
            w.varint(0)
            w.varint(0)
            w.varint(UInt64(pairs.count))
            for (first, last) in pairs {
                w.varint(first)
                w.varint(last)
            }
            return w.bytes
        }
        #expect(throws: WireError.self) { try ClientProtocol.decodeFetched(body([(0, 2)])) }
        #expect(throws: WireError.self) { try ClientProtocol.decodeFetched(body([(5, 4)])) }
        #expect(throws: WireError.self) { try ClientProtocol.decodeFetched(body([(3, 5), (5, 6)])) }
        #expect(throws: WireError.self) { try ClientProtocol.decodeFetched(body([(7, 8), (3, 4)])) }
        #expect(throws: WireError.self) { try ClientProtocol.decodeFetched(Array(body([(3, 300)]).dropLast())) }
        #expect(throws: Never.self) { try ClientProtocol.decodeFetched(body([(3, 5), (6, 6)])) }
    }
}
