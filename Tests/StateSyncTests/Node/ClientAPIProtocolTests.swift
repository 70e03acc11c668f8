import Foundation
import StateSyncZeroMQ
import Testing
import ZeroMQ

@testable import StateSync

/// The client API spoken byte by byte from a raw DEALER (PROTOCOL.md §Client API).
@Suite("Client API protocol")
struct ClientAPIProtocolTests {
    final class RawClient {
        let context: Context
        let dealer: Socket

        init(_ endpoint: String) throws {
            context = try Context()
            dealer = try context.socket(.dealer)
            try dealer.connect(endpoint)
        }

        func request(_ frames: [[UInt8]]) throws -> [[UInt8]]? {
            try dealer.send(frames)
            var poller = Poller([.socket(dealer, .readable)])
            for _ in 0..<200 where try poller.poll(timeoutMilliseconds: 25)[0].contains(.readable) == false {}
            return try dealer.receive(dontWait: true)
        }

        /// Sends a request and returns its reply, collecting the watch EVENTs that arrive meanwhile.
        func call(_ command: ClientProtocol.Command, id: UInt64, _ body: [UInt8]) throws -> (
            ClientProtocol.ReplyHeader, [UInt8]
        ) {
            var reply = try #require(try request(ClientProtocol.encodeRequest(command, id: id, body: body)))
            while true {
                let header = try ClientProtocol.decodeReplyHeader(reply[0])
                if header.kind != .event && header.requestID == id { return (header, reply[1]) }
                events.append((header.requestID, try ClientProtocol.decodeWatchEvent(reply[1])))
                reply = try #require(try next())
            }
        }

        var events: [(UInt64, ClientProtocol.WatchEventBody)] = []

        func next() throws -> [[UInt8]]? {
            var poller = Poller([.socket(dealer, .readable)])
            for _ in 0..<200 where try poller.poll(timeoutMilliseconds: 25)[0].contains(.readable) == false {}
            return try dealer.receive(dontWait: true)
        }
    }

    static func withNode(_ body: (StateSyncNode, RawClient) async throws -> Void) async throws {
        let config = meshConfigurations(1, label: "api", api: true)[0]
        let node = try await StateSyncNode.start(configuration: config)
        do {
            try await body(node, try RawClient(try #require(node.apiEndpoint)))
        } catch {
            Issue.record(error)
        }
        await node.stop()
    }

    /// WATCH flag bit 3 over real sockets: a burst of a model's writes reaches a watch that asked
    /// for batched events in messages of several DELTA bodies (at most 32), in order; a watch that
    /// did not ask gets the same deltas one per message.
    @Test func aBurstReachesABatchedWatchInMessagesOfSeveralEvents() async throws {
        try await Self.withNode { node, batched in
            let single = try RawClient(try #require(node.apiEndpoint))
            for (client, asks) in [(batched, true), (single, false)] {
                let (header, _) = try client.call(
                    .watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: nil, batchedEvents: asks))
                #expect(header.kind == .ok)
            }
            let model = try await node.model(Counter.self, channel: "c", id: "m")
            for value in 1...200 { model.count = value }
            func read(_ client: RawClient) throws -> (counts: [Int], bodies: [Int]) {
                var counts: [Int] = []
                var bodies: [Int] = []
                while counts.count < 200, let message = try client.next() {
                    let header = try ClientProtocol.decodeReplyHeader(message[0])
                    guard header.kind == .event, header.requestID == 7 else { continue }
                    var deltas = 0
                    for body in message.dropFirst() {
                        guard case .delta(let delta, _) = try ClientProtocol.decodeWatchEvent(body) else { continue }
                        deltas += 1
                        for property in delta.properties where property.name == "count" {
                            if case .int(let value) = property.value { counts.append(Int(value)) }
                        }
                    }
                    if deltas > 0 { bodies.append(message.count - 1) }
                }
                return (counts, bodies)
            }
            let (batchedCounts, batchedBodies) = try read(batched)
            #expect(batchedCounts == Array(1...200))
            #expect(batchedBodies.max() ?? 0 > 1, "runs of deltas share a message: \(batchedBodies)")
            #expect(batchedBodies.max() ?? 0 <= 32)
            let (singleCounts, singleBodies) = try read(single)
            #expect(singleCounts == Array(1...200))
            #expect(Set(singleBodies) == [1])
        }
    }

    /// Request flag bit 0 over real sockets (10.1.1): a client that sends 200 SETs without
    /// waiting, each asking for batched replies, gets every OK once, all in OKS messages, and
    /// fewer messages than writes; a client that does not ask gets one plain OK per SET. (Fewer:
    /// the client queues its 200 SETs in well under a millisecond, while the node takes each
    /// turn's SETs, syncs them with `fsync: always` and answers them together; for every SET
    /// to get a turn of its own, the node would have to finish a turn, sync included, before
    /// the next SET arrived, 200 times over.)
    @Test func writesInFlightAreAnsweredInOKSMessagesOnlyWhenAsked() async throws {
        try await Self.withNode { node, flagged in
            let plain = try RawClient(try #require(node.apiEndpoint))
            for (client, asks, writes) in [(flagged, true, 200), (plain, false, 50)] {
                for id in 1...writes {
                    let body = ClientProtocol.encodeSet(
                        ModelAddress(channel: "c", model: "m\(id % 7)"),
                        [PropertyWrite(name: asks ? "a" : "p", value: .int(Int64(id)))])
                    try client.dealer.send(
                        ClientProtocol.encodeRequest(
                            .set, id: UInt64(id), body: body,
                            flags: asks ? ClientProtocol.RequestFlags.batchedReplies : 0
                        ))
                }
                var answered: [UInt64] = []
                var messages: [ClientProtocol.ReplyKind] = []
                while answered.count < writes, let message = try client.next() {
                    let header = try ClientProtocol.decodeReplyHeader(message[0])
                    messages.append(header.kind)
                    switch header.kind {
                    case .oks:
                        let oks = try ClientProtocol.decodeBatchedOKs(message[1])
                        #expect(oks.allSatisfy { $0.body.last == 1 }, "every write changed its property")
                        answered += oks.map(\.id)
                    case .ok:
                        #expect(message[1].last == 1)
                        answered.append(header.requestID)
                    case .error, .event:
                        Issue.record("unexpected \(header.kind): \(message)")
                    }
                }
                #expect(answered.sorted() == (1...UInt64(writes)).map { $0 }, "every SET answered once")
                if asks {
                    #expect(messages.allSatisfy { $0 == .oks }, "\(messages)")
                    #expect(messages.count < writes, "\(messages.count) messages for \(writes) writes")
                } else {
                    #expect(messages == Array(repeating: .ok, count: writes))
                }
            }
        }
    }

    @Test func unknownCommandGetsErrorTwoAndTheNodeGoesOn() async throws {
        try await Self.withNode { node, client in
            var header = WireWriter()
            header.byte(1)
            header.byte(0x7E)
            header.uint64(9)
            let reply = try #require(try client.request([header.bytes, []]))
            let decoded = try ClientProtocol.decodeReplyHeader(reply[0])
            #expect(decoded.kind == .error && decoded.requestID == 9)
            #expect(try ClientProtocol.decodeError(reply[1]).code == ClientProtocol.ErrorCode.unknownCommand.rawValue)
            // Garbage and wrong frame counts are dropped and counted; the node still answers.
            try client.dealer.send([[1, 2, 3]])
            try client.dealer.send([[0xFF, 0x01], [], [], []])
            let (ok, _) = try client.call(.status, id: 10, [])
            #expect(ok.kind == .ok && ok.requestID == 10)
            #expect(node.status.counters["malformed_messages"] ?? 0 >= 2)
        }
    }
}

@Suite("Review fixes")
struct WireStrictnessTests {
    @Test func valueEqualityIsTheWiresBitwiseEquality() {
        #expect(Value.double(0.0) != Value.double(-0.0))
        #expect(Value.double(.nan) == Value.double(.nan))
        #expect(Value.string("é") != Value.string("e\u{301}"))
    }

    @Test func deltasWithoutPropertiesOrWithRepeatedNamesAreMalformed() {
        var none = PeerMessage.delta(PeerMessageTests.delta).encode()
        var writer = WireWriter()
        writer.byte(1)
        writer.uint64(1 << 16)
        writer.string("n")
        writer.varint(1)
        writer.varint(0)
        none[1] = writer.bytes
        #expect(throws: WireError.self) { try PeerMessage.decode(none) }
        let twice = Delta(
            channel: "c", model: "m", version: Version(milliseconds: 1, counter: 0, node: "n"), sequence: 1,
            properties: [PropertyWrite(name: "x", value: 1), PropertyWrite(name: "x", value: 2)])
        #expect(throws: WireError.self) { try PeerMessage.decode(PeerMessage.delta(twice).encode()) }
        let anonymous = PeerMessage.heartbeat(.init(node: "", latestSequence: 0, clock: 0, incarnation: 1))
        #expect(throws: WireError.self) { try PeerMessage.decode(anonymous.encode()) }
    }

    @Test func slashIsForbiddenInChannelsEvenBeforeACombiningMark() {
        #expect(throws: StateSyncError.self) { try Names.validateChannel("a/\u{301}") }
    }

    @Test func valuesTooDeepForTheWireAreNotEncoded() {
        indirect enum Deep: Codable {
            case leaf
            case node(Deep)
        }
        var deep = Deep.leaf
        for _ in 0..<40 { deep = .node(deep) }
        #expect(throws: EncodingError.self) { try ValueEncoder().encode(deep) }
    }

}
