import Testing

@testable import StateSync

/// Channel batches on the node machine alone (PROTOCOL.md 7.6): sent only when every linked peer
/// said it takes them, applied and logged as they came, refused by a node that does not.
@Suite("Channel batches on the node machine")
struct ChannelBatchMachineTests {
    static let models = ["a", "b", "c"]

    /// One round of local writes, one to each of ``models`` of channel `c`.
    static func writes(_ node: inout MachineRunner, value: Int64) -> [LocalWrite] {
        models.map { model in
            LocalWrite(
                address: ModelAddress(channel: "c", model: model), version: node.machine.clock.next(),
                writes: [PropertyWrite(name: "x", value: .int(value))])
        }
    }

    /// A heartbeat from `peer` with its member list (where capabilities travel).
    static func heartbeat(from peer: String, incarnation: UInt64, capabilities: UInt64?) -> [[UInt8]] {
        let member = Membership.Member(
            id: peer, publish: "inproc://\(peer)", api: "", state: .alive,
            version: Version(milliseconds: 1_000, counter: 0, node: peer))
        return PeerMessage.heartbeat(
            PeerMessage.Heartbeat(
                node: peer, latestSequence: 0, clock: 1_000 << 16, incarnation: incarnation, api: "", progress: [:],
                members: [member], capabilities: capabilities)
        ).encode()
    }

    /// The topics' first octets of the DELTA messages published from `index` on.
    static func deltaTopics(_ node: MachineRunner, from index: Int) -> [String] {
        node.published[index...].compactMap { frames in
            guard let first = frames.first?.first, first != UInt8(ascii: "H") else { return nil }
            return String(UnicodeScalar(first))
        }
    }

    @Test func sentOnlyWhileEveryLinkedPeerTakesThem() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2", "n3"]))
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: Self.heartbeat(from: "n2", incarnation: 1, capabilities: 1)))
        node.handle(
            .peerMessage(peer: "inproc://n3", frames: Self.heartbeat(from: "n3", incarnation: 1, capabilities: nil)))
        func round(_ value: Int64) -> [String] {
            let before = node.published.count
            node.handle(.localWrites(Self.writes(&node, value: value)))
            node.handle(.tick(observerBacklog: 0))
            return Self.deltaTopics(node, from: before)
        }
        // n3 did not say it takes them: one DELTA per model, as always.
        #expect(round(1) == ["D", "D", "D"])
        // Once it says so, the round's deltas of three models travel as one channel batch.
        node.handle(
            .peerMessage(peer: "inproc://n3", frames: Self.heartbeat(from: "n3", incarnation: 1, capabilities: 1)))
        #expect(round(2) == ["M"])
        #expect(node.machine.counters.channelBatchesPublished == 1)
        let batch = try #require(node.published.last { $0.first?.first == UInt8(ascii: "M") })
        #expect(try PeerMessage.decodeDeltas(batch)?.map(\.model) == Self.models)
        // A heartbeat without a member list changes nothing; a restart (a new incarnation) may be
        // an older version: per model again until it says otherwise.
        var plain = PeerMessage.Heartbeat(node: "n3", latestSequence: 0, clock: 1_000 << 16, incarnation: 1)
        node.handle(.peerMessage(peer: "inproc://n3", frames: PeerMessage.heartbeat(plain).encode()))
        #expect(round(3) == ["M"])
        plain.incarnation = 2
        node.handle(.peerMessage(peer: "inproc://n3", frames: PeerMessage.heartbeat(plain).encode()))
        #expect(round(4) == ["D", "D", "D"])
    }

    /// A local write's body is encoded once, for its log record and for the message that
    /// publishes it: the bytes on the wire and in the log are exactly those of encoding the
    /// deltas afresh, for DELTA batches and channel batches alike (the wire does not change).
    @Test func localWritesGoOutAndIntoTheLogAsTheyWouldBeEncodedAfresh() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        var deltas: [Delta] = []
        for takesChannelBatches in [false, true] {
            node.handle(
                .peerMessage(
                    peer: "inproc://n2",
                    frames: Self.heartbeat(
                        from: "n2", incarnation: takesChannelBatches ? 2 : 1,
                        capabilities: takesChannelBatches ? 1 : nil)))
            let before = node.published.count
            var writes = Self.writes(&node, value: 7)
            // Two writes of one model (one DELTA batch of two), a deletion and an expiring value
            // (version-2 bodies).
            writes.append(
                LocalWrite(
                    address: ModelAddress(channel: "c", model: "c"), version: node.machine.clock.next(),
                    writes: [.deletion(of: "x"), PropertyWrite(name: "y", value: .string("é"), timeToLive: 5_000)]))
            node.handle(.localWrites(writes))
            node.handle(.tick(observerBacklog: 0))
            let sent = node.published[before...].filter { $0.first?.first != UInt8(ascii: "H") }
            #expect(sent.count == (takesChannelBatches ? 1 : 3), "\(sent.map { String(UnicodeScalar($0[0][0])) })")
            for frames in sent {
                let decoded = try #require(try PeerMessage.decodeDeltas(frames))
                let afresh =
                    frames[0].first == PeerMessage.channelBatchTopicPrefix
                    ? PeerMessage.encodeChannelBatch(decoded) : PeerMessage.encodeBatch(decoded)
                #expect(frames == afresh)
                deltas += decoded
            }
        }
        #expect(deltas.count == 8)
        #expect(try DeltaLog.parse(DeltaLog.magic + node.logBytes, path: "test").deltas == deltas)
        #expect(node.logBytes == MachineRunner.freshRecords(of: deltas))
    }

    @Test func writesOfOneModelStayADeltaBatch() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: Self.heartbeat(from: "n2", incarnation: 1, capabilities: 1)))
        let before = node.published.count
        let writes = (1...3).map { value in
            LocalWrite(
                address: ModelAddress(channel: "c", model: "a"), version: node.machine.clock.next(),
                writes: [PropertyWrite(name: "x", value: .int(Int64(value)))])
        }
        node.handle(.localWrites(writes))
        node.handle(.tick(observerBacklog: 0))
        #expect(Self.deltaTopics(node, from: before) == ["D"])
    }

    @Test func aNodeThatDoesNotTakeThemNeverSaysSoNorSendsThem() throws {
        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        // A node older than channel batches is older than packed batches too (PROTOCOL.md 7.7).
        configuration.channelBatches = false
        configuration.packedBatches = false
        var node = MachineRunner(configuration)
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: Self.heartbeat(from: "n2", incarnation: 1, capabilities: 1)))
        let before = node.published.count
        node.handle(.localWrites(Self.writes(&node, value: 1)))
        node.handle(.tick(observerBacklog: 0))
        #expect(Self.deltaTopics(node, from: before) == ["D", "D", "D"])
        let beats = node.published.compactMap { frames -> PeerMessage.Heartbeat? in
            guard case .heartbeat(let beat)? = try? PeerMessage.decode(frames) else { return nil }
            return beat
        }
        #expect(!beats.isEmpty && beats.allSatisfy { $0.capabilities == nil })
        // One sent to it anyway is an unsupported message: dropped and counted, nothing applied.
        let deltas = ["a", "b"].enumerated().map { index, model in
            Delta(
                channel: "d", model: model, version: Version(milliseconds: 5, counter: UInt16(index), node: "n2"),
                sequence: UInt64(index + 1), properties: [PropertyWrite(name: "x", value: 1)])
        }
        node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.encodeChannelBatch(deltas)))
        #expect(node.machine.counters.malformedMessages == 1)
        #expect(node.machine.store.properties(of: ModelAddress(channel: "d", model: "a")).isEmpty)
    }

    /// A received channel batch is applied model by model and each new delta logged as the
    /// channel followed by its frame as it came (model id, DELTA body).
    @Test func aReceivedChannelBatchIsAppliedAndLoggedAsItCame() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        let deltas = ["a", "b", "a"].enumerated().map { index, model in
            Delta(
                channel: "c", model: model, version: Version(milliseconds: 5, counter: UInt16(index), node: "n2"),
                sequence: UInt64(index + 1), properties: [PropertyWrite(name: "x", value: .int(Int64(index)))])
        }
        var frames = PeerMessage.encodeChannelBatch(deltas)
        frames[2] += [0xEE]  // octets a later version added: kept in the log, ignored on reading
        node.handle(.peerMessage(peer: "inproc://n2", frames: frames))
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "a"))["x"]?.value == .int(2))
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "b"))["x"]?.value == .int(1))
        func record(_ frame: [UInt8]) -> [UInt8] {
            var payload = WireWriter()
            payload.string("c")
            payload.bytes(frame)
            var record = WireWriter()
            record.uint64(UInt64(payload.bytes.count) << 32 | UInt64(CRC32C.checksum(payload.bytes)))
            return record.bytes + payload.bytes
        }
        #expect(node.logBytes == frames.dropFirst().flatMap(record))
        #expect(try DeltaLog.parse(DeltaLog.magic + node.logBytes, path: "test").deltas == deltas)
    }

    /// Each frame of a channel batch names its model: a name is checked unless it is byte for
    /// byte the one checked before it, so the NFD twin of a valid NFC name is refused, not
    /// taken for it.
    @Test func everyModelNameOfAChannelBatchIsChecked() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        let composed = "caf\u{E9}"
        let decomposed = "cafe\u{301}"
        #expect(composed == decomposed && !composed.utf8.elementsEqual(decomposed.utf8))
        let deltas = [composed, decomposed].enumerated().map { index, model in
            Delta(
                channel: "c", model: model, version: Version(milliseconds: 5, counter: UInt16(index), node: "n2"),
                sequence: UInt64(index + 1), properties: [PropertyWrite(name: "x", value: .int(Int64(index)))])
        }
        node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.encodeChannelBatch(deltas)))
        #expect(node.machine.counters.malformedMessages == 1)
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: composed))["x"]?.value == .int(0))
        #expect(try DeltaLog.parse(DeltaLog.magic + node.logBytes, path: "test").deltas.count == 1)
    }
}
