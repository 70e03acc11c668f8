import Testing

@testable import StateSync

/// Packed batches on the node machine alone (PROTOCOL.md 7.7): sent only when every linked peer
/// said it takes them, applied and logged as they came, refused by a node that does not.
@Suite("Packed batches on the node machine")
struct PackedBatchMachineTests {
    typealias Channel = ChannelBatchMachineTests

    /// A received delta of `channel`/`model` from n2.
    static func delta(_ model: String, sequence: UInt64, origin: String = "n2", channel: String = "c") -> Delta {
        Delta(
            channel: channel, model: model,
            version: Version(milliseconds: 5, counter: UInt16(sequence), node: origin), sequence: sequence,
            properties: [PropertyWrite(name: "x", value: .int(Int64(sequence)))])
    }

    /// The log record of a delta of channel `c` that arrived as `entry` (model id, DELTA body).
    static func record(_ entry: some Collection<UInt8>) -> [UInt8] {
        var payload = WireWriter()
        payload.string("c")
        payload.bytes(entry)
        var record = WireWriter()
        record.uint64(UInt64(payload.bytes.count) << 32 | UInt64(CRC32C.checksum(payload.bytes)))
        return record.bytes + payload.bytes
    }

    @Test func sentOnlyWhileEveryLinkedPeerTakesThem() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2", "n3"]))
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: Channel.heartbeat(from: "n2", incarnation: 1, capabilities: 3)))
        node.handle(
            .peerMessage(peer: "inproc://n3", frames: Channel.heartbeat(from: "n3", incarnation: 1, capabilities: 1)))
        func round(_ value: Int64) -> [String] {
            let before = node.published.count
            node.handle(.localWrites(Channel.writes(&node, value: value)))
            node.handle(.tick(observerBacklog: 0))
            return Channel.deltaTopics(node, from: before)
        }
        // n3 takes channel batches, not packed ones.
        #expect(round(1) == ["M"])
        // Once it says it takes both, the round travels as one packed batch, of one frame.
        node.handle(
            .peerMessage(peer: "inproc://n3", frames: Channel.heartbeat(from: "n3", incarnation: 1, capabilities: 3)))
        #expect(round(2) == ["P"])
        #expect(node.machine.counters.packedBatchesPublished == 1)
        let batch = try #require(node.published.last { $0.first?.first == PeerMessage.packedBatchTopicPrefix })
        #expect(batch.count == 2)
        #expect(try PeerMessage.decodeDeltas(batch)?.map(\.model) == Channel.models)
        // Writes of one model go packed too.
        let before = node.published.count
        node.handle(
            .localWrites(
                (1...3).map { value in
                    LocalWrite(
                        address: ModelAddress(channel: "c", model: "a"), version: node.machine.clock.next(),
                        writes: [PropertyWrite(name: "x", value: .int(Int64(value)))])
                }))
        node.handle(.tick(observerBacklog: 0))
        #expect(Channel.deltaTopics(node, from: before) == ["P"])
        // A restart (a new incarnation) may be an older version: per model again until it says
        // otherwise.
        let plain = PeerMessage.Heartbeat(node: "n3", latestSequence: 0, clock: 1_000 << 16, incarnation: 2)
        node.handle(.peerMessage(peer: "inproc://n3", frames: PeerMessage.heartbeat(plain).encode()))
        #expect(round(4) == ["D", "D", "D"])
    }

    /// A local write's body is encoded once: the packed batch and the log hold exactly the bytes
    /// of encoding the deltas afresh.
    @Test func localWritesGoOutAndIntoTheLogAsTheyWouldBeEncodedAfresh() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: Channel.heartbeat(from: "n2", incarnation: 1, capabilities: 3)))
        let before = node.published.count
        var writes = Channel.writes(&node, value: 7)
        writes.append(
            LocalWrite(
                address: ModelAddress(channel: "c", model: "c"), version: node.machine.clock.next(),
                writes: [.deletion(of: "x"), PropertyWrite(name: "y", value: .string("é"), timeToLive: 5_000)]))
        node.handle(.localWrites(writes))
        node.handle(.tick(observerBacklog: 0))
        let sent = node.published[before...].filter { $0.first?.first != UInt8(ascii: "H") }
        #expect(sent.count == 1)
        let frames = try #require(sent.first)
        let decoded = try #require(try PeerMessage.decodeDeltas(frames))
        #expect(decoded.count == 4)
        #expect(frames == PeerMessage.encodePackedBatch(decoded))
        #expect(try DeltaLog.parse(DeltaLog.magic + node.logBytes, path: "test").deltas == decoded)
        #expect(node.logBytes == MachineRunner.freshRecords(of: decoded))
    }

    /// A received packed batch is applied model by model, and each new delta logged as the
    /// channel followed by its entry as it came (octets a later version added included). A
    /// delta refused (this node's own, echoed) or already held is not logged; the others are,
    /// each with its own entry.
    @Test func aReceivedPackedBatchIsAppliedAndLoggedAsItCame() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        let deltas = [
            Self.delta("a", sequence: 1), Self.delta("b", sequence: 2), Self.delta("own", sequence: 1, origin: "n1"),
            Self.delta("a", sequence: 3),
        ]
        var entries = PeerMessage.encodeChannelBatch(deltas).dropFirst().map { $0 }
        entries[1] += [0xEE]  // octets a later version added: kept in the log, ignored on reading
        var pack = WireWriter()
        pack.varint(UInt64(entries.count))
        for entry in entries {
            pack.varint(UInt64(entry.count))
            pack.bytes(entry)
        }
        let frames = [Array("Pc\u{0}".utf8), pack.bytes]
        node.handle(.peerMessage(peer: "inproc://n2", frames: frames))
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "a"))["x"]?.value == .int(3))
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "b"))["x"]?.value == .int(2))
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "own")).isEmpty)
        #expect(node.logBytes == [entries[0], entries[1], entries[3]].flatMap { Self.record($0) })
        #expect(
            try DeltaLog.parse(DeltaLog.magic + node.logBytes, path: "test").deltas == [0, 1, 3].map { deltas[$0] })
        // The same batch again: every delta is held already, nothing more is logged.
        let logged = node.logBytes
        node.handle(.peerMessage(peer: "inproc://n2", frames: frames))
        #expect(node.logBytes == logged)
        #expect(node.machine.counters.malformedMessages == 0)
    }

    /// The older forms, a frame per delta, logged the same way: a channel batch's frame (model
    /// id and body) after the channel, a DELTA batch's body after the channel and model; a
    /// refused delta in the middle is not logged, and each delta after it is logged with its own
    /// frame, not its neighbour's.
    @Test func aReceivedFramedBatchIsLoggedFrameByFrameAroundARefusedDelta() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        let channelBatch = [
            Self.delta("a", sequence: 1), Self.delta("own", sequence: 1, origin: "n1"), Self.delta("b", sequence: 2),
            Self.delta("a", sequence: 3),
        ]
        let channelFrames = PeerMessage.encodeChannelBatch(channelBatch)
        #expect(channelFrames[0].first == PeerMessage.channelBatchTopicPrefix && channelFrames.count == 5)
        node.handle(.peerMessage(peer: "inproc://n2", frames: channelFrames))
        #expect(node.logBytes == [1, 3, 4].flatMap { Self.record(channelFrames[$0]) })
        let modelBatch = [
            Self.delta("m", sequence: 4), Self.delta("m", sequence: 2, origin: "n1"), Self.delta("m", sequence: 5),
        ]
        let modelFrames = PeerMessage.encodeBatch(modelBatch)
        #expect(modelFrames.count == 4)
        let logged = node.logBytes
        node.handle(.peerMessage(peer: "inproc://n2", frames: modelFrames))
        var model = WireWriter()
        model.string("m")
        #expect(
            node.logBytes[logged.count...].elementsEqual([1, 3].flatMap { Self.record(model.bytes + modelFrames[$0]) }))
        #expect(
            try DeltaLog.parse(DeltaLog.magic + node.logBytes, path: "test").deltas
                == [0, 2, 3].map { channelBatch[$0] } + [0, 2].map { modelBatch[$0] })
        #expect(node.machine.counters.malformedMessages == 0)
    }

    @Test func aNodeThatDoesNotTakeThemNeverSaysSoNorSendsThem() throws {
        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        configuration.packedBatches = false
        var node = MachineRunner(configuration)
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: Channel.heartbeat(from: "n2", incarnation: 1, capabilities: 3)))
        let before = node.published.count
        node.handle(.localWrites(Channel.writes(&node, value: 1)))
        node.handle(.tick(observerBacklog: 0))
        #expect(Channel.deltaTopics(node, from: before) == ["M"])
        let beats = node.published.compactMap { frames -> PeerMessage.Heartbeat? in
            guard case .heartbeat(let beat)? = try? PeerMessage.decode(frames) else { return nil }
            return beat
        }
        #expect(!beats.isEmpty && beats.allSatisfy { $0.capabilities == nil || $0.capabilities == 1 })
        // One sent to it anyway is an unsupported message: dropped and counted, nothing applied.
        let deltas = [Self.delta("a", sequence: 1, channel: "d"), Self.delta("b", sequence: 2, channel: "d")]
        node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.encodePackedBatch(deltas)))
        #expect(node.machine.counters.malformedMessages == 1)
        #expect(node.machine.store.properties(of: ModelAddress(channel: "d", model: "a")).isEmpty)
    }

    /// Each entry names its model: a name is checked unless it is byte for byte the one before
    /// it, so the NFD twin of a valid NFC name is refused, not taken for it.
    @Test func everyModelNameOfAPackedBatchIsChecked() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        let composed = "caf\u{E9}"
        let decomposed = "cafe\u{301}"
        let deltas = [Self.delta(composed, sequence: 1), Self.delta(decomposed, sequence: 2)]
        node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.encodePackedBatch(deltas)))
        #expect(node.machine.counters.malformedMessages == 1)
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: composed))["x"]?.value == .int(1))
        #expect(try DeltaLog.parse(DeltaLog.magic + node.logBytes, path: "test").deltas.count == 1)
    }

    /// A local write's body is encoded once, into its log record, and published from there; one
    /// too large for a record stays local (neither logged nor published, counted), and the
    /// writes around it go out, each with its own bytes.
    @Test func aLocalWriteTooLargeToLogStaysLocalAndTheOthersGoOut() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: Channel.heartbeat(from: "n2", incarnation: 1, capabilities: 3)))
        let before = node.published.count
        let huge = PropertyWrite(name: "x", value: .bytes([UInt8](repeating: 7, count: DeltaLog.maximumRecord)))
        let writes = [PropertyWrite(name: "x", value: 1), huge, PropertyWrite(name: "x", value: 3)].map { write in
            LocalWrite(
                address: ModelAddress(channel: "c", model: "a"), version: node.machine.clock.next(), writes: [write])
        }
        node.handle(.localWrites(writes))
        node.handle(.tick(observerBacklog: 0))
        let sent = try node.published[before...].filter { $0.first?.first == PeerMessage.packedBatchTopicPrefix }
            .flatMap { try #require(try PeerMessage.decodeDeltas($0)) }
        #expect(sent.map(\.sequence) == [1, 3])
        #expect(sent.map { $0.properties[0].value } == [1, 3])
        #expect(node.machine.counters.encodingFailures == 1)
        #expect(try DeltaLog.parse(DeltaLog.magic + node.logBytes, path: "test").deltas == sent)
    }

    /// A delta whose record fits the log but whose entry would take a pack's frame past what
    /// receivers accept goes alone as a DELTA batch, whose frame is its body only.
    @Test func aDeltaTooLargeForAPackGoesAsADeltaBatch() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: Channel.heartbeat(from: "n2", incarnation: 1, capabilities: 3)))
        let before = node.published.count
        // Entry: model "a" (2) + body (21 + the value's octets): 7 octets under 64 MiB, past the
        // largest entry; the record (channel "c" too) is 5 under 64 MiB.
        let octets = (64 << 20) - 30
        let writes = [
            PropertyWrite(name: "x", value: 1),
            PropertyWrite(name: "x", value: .bytes([UInt8](repeating: 1, count: octets))),
        ]
        .map { write in
            LocalWrite(
                address: ModelAddress(channel: "c", model: "a"), version: node.machine.clock.next(),
                writes: [write])
        }
        node.handle(.localWrites(writes))
        node.handle(.tick(observerBacklog: 0))
        #expect(Channel.deltaTopics(node, from: before) == ["P", "D"])
        let sent = try node.published[before...].filter { $0.first?.first != UInt8(ascii: "H") }
            .flatMap { try #require(try PeerMessage.decodeDeltas($0)) }
        #expect(sent.map(\.sequence) == [1, 2])
        #expect(node.machine.counters.encodingFailures == 0)
        let frame = try #require(node.published.last { $0.first?.first == PeerMessage.deltaTopicPrefix })
        #expect(frame.count == 2 && frame[1].count < 64 << 20)
    }

    /// A pack's frame is bounded (a receiver's maximum message size bounds each frame): a round
    /// of large writes goes out in several packed batches, none past its target unless it holds
    /// one delta, with every delta in order.
    @Test func largeWritesGoOutInSeveralBoundedPacks() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: Channel.heartbeat(from: "n2", incarnation: 1, capabilities: 3)))
        let before = node.published.count
        let large = String(repeating: "x", count: 300_000)
        var writes = (0..<10).map { index in
            LocalWrite(
                address: ModelAddress(channel: "c", model: "m\(index % 3)"), version: node.machine.clock.next(),
                writes: [PropertyWrite(name: "x", value: .string(large + "\(index)"))])
        }
        // A delta larger than the target after small ones goes alone, not on top of them.
        writes.insert(
            LocalWrite(
                address: ModelAddress(channel: "c", model: "m0"), version: node.machine.clock.next(),
                writes: [PropertyWrite(name: "x", value: .string(String(repeating: "y", count: 1_200_000)))]),
            at: 1)
        node.handle(.localWrites(writes))
        node.handle(.tick(observerBacklog: 0))
        let packs = node.published[before...].filter { $0.first?.first == PeerMessage.packedBatchTopicPrefix }
        let sent = try packs.map { try #require(try PeerMessage.decodeDeltas($0)) }
        // The first write, the large one alone, then three 300 KB writes a pack (a fourth would
        // take it past 1 MiB).
        #expect(sent.map(\.count) == [1, 1, 3, 3, 3], "\(packs.map { $0[1].count })")
        for (pack, deltas) in zip(packs, sent) where deltas.count > 1 {
            #expect(pack[1].count <= PeerMessage.packedBatchTargetOctets + 16)
        }
        #expect(sent.flatMap { $0 }.map(\.sequence) == Array(1...11))
    }
}
