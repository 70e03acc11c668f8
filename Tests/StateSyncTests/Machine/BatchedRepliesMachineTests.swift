import Testing

@testable import StateSync

/// OKS messages (PROTOCOL.md 10.1.1): a client that sets the batched-replies flag in its write
/// requests gets the OKs of its writes that became durable together in one message; every
/// other client, and every other reply, is as in the first version.
@Suite("Batched write replies on the node machine")
struct BatchedRepliesMachineTests {
    static let flagged: [UInt8] = [0x53, 1]
    static let plain: [UInt8] = [0x53, 2]
    /// A second client that asks: its OKs never share a message with the first's.
    static let other: [UInt8] = [0x53, 3]

    static func set(_ id: UInt64, _ value: Int64, batched: Bool) -> [[UInt8]] {
        ClientProtocol.encodeRequest(
            .set, id: id,
            body: ClientProtocol.encodeSet(
                ModelAddress(channel: "c", model: "m\(id)"), [PropertyWrite(name: "x", value: .int(value))]),
            flags: batched ? ClientProtocol.RequestFlags.batchedReplies : 0)
    }

    static func runner(_ fsync: NodeConfiguration.FsyncPolicy) -> MachineRunner {
        var configuration = MachineRunner.configuration("n1")
        configuration.fsync = fsync
        var node = MachineRunner(configuration)
        node.advance(1)
        return node
    }

    /// The messages sent to `client` from position `from` of `sent`, headers decoded.
    static func replies(_ node: MachineRunner, to client: [UInt8], from: Int) -> [(
        header: ClientProtocol.ReplyHeader, body: [UInt8]
    )] {
        node.sent[from...].compactMap { to, frames in
            guard to == client, frames.count == 2, let header = try? ClientProtocol.decodeReplyHeader(frames[0])
            else { return nil }
            return (header, frames[1])
        }
    }

    /// The client watching channel `c` in the tests of OKs and watch events.
    static let watcher: [UInt8] = [0x57, 1]

    /// Has ``watcher`` watch channel `c` (a tick, so the watch is set up), then the flagged
    /// client write m1, m2 and m3 (requests 1–3) with no tick; returns where `sent` stood
    /// before the writes.
    static func watchThenWriteThree(_ node: inout MachineRunner) -> Int {
        node.handle(
            .clientRequest(
                client: watcher,
                frames: ClientProtocol.encodeRequest(
                    .watch, id: 50, body: ClientProtocol.encodeWatch(channel: "c", from: nil)),
                identity: nil))
        node.handle(.tick(observerBacklog: 0))
        let before = node.sent.count
        for id in 1...3 as ClosedRange<UInt64> {
            node.handle(.clientRequest(client: flagged, frames: set(id, Int64(id), batched: true), identity: nil))
        }
        return before
    }

    /// Where, from position `from` of `sent`, the flagged client's OKS messages answered each
    /// request (by id), and where ``watcher`` was first told of each model.
    static func okAndEventPositions(_ node: MachineRunner, from: Int) throws -> (
        answered: [UInt64: Int], firstEvent: [String: Int]
    ) {
        var answered: [UInt64: Int] = [:]
        var firstEvent: [String: Int] = [:]
        for (index, message) in node.sent[from...].enumerated() {
            let header = try ClientProtocol.decodeReplyHeader(message.frames[0])
            if message.client == flagged, header.kind == .oks {
                for ok in try ClientProtocol.decodeBatchedOKs(message.frames[1]) { answered[ok.id] = index }
            }
            if message.client == watcher, header.kind == .event,
                case .delta(let delta, _) = try ClientProtocol.decodeWatchEvent(message.frames[1])
            {
                firstEvent[delta.model] = firstEvent[delta.model] ?? index
            }
        }
        return (answered, firstEvent)
    }

    @Test func theFlagTravelsInAnEleventhOctetThatOlderReadersIgnore() throws {
        let flagged = Self.set(7, 1, batched: true)
        #expect(flagged[0].count == 11 && flagged[0][10] == ClientProtocol.RequestFlags.batchedReplies)
        let header = try ClientProtocol.decodeRequestHeader(flagged[0])
        #expect(header.requestID == 7 && header.command == 0x01 && header.takesBatchedReplies)
        // Without the flag the header is the first version's ten octets.
        let plain = Self.set(8, 1, batched: false)
        #expect(plain[0].count == 10)
        #expect(try !ClientProtocol.decodeRequestHeader(plain[0]).takesBatchedReplies)
    }

    @Test func anOKSBodyRoundTripsAndAShortOneIsMalformed() throws {
        let replies: [(id: UInt64, body: [UInt8])] = [(3, [1, 2, 3]), (1, []), (UInt64.max, [9])]
        let frames = ClientProtocol.encodeBatchedOKs(replies)
        let header = try ClientProtocol.decodeReplyHeader(frames[0])
        #expect(header.kind == .oks && header.requestID == 0)
        let decoded = try ClientProtocol.decodeBatchedOKs(frames[1])
        #expect(decoded.map(\.id) == [3, 1, UInt64.max])
        #expect(decoded.map(\.body) == [[1, 2, 3], [], [9]])
        // Each cut short: a count the octets cannot hold, an entry or a body that runs past the end.
        for end in 0..<frames[1].count {
            #expect(throws: WireError.self, "cut at \(end)") {
                _ = try ClientProtocol.decodeBatchedOKs(Array(frames[1][..<end]))
            }
        }
    }

    /// With `fsync: always` the writes of a turn become durable together: the flagged client's
    /// OKs go in one OKS message, in the order of its writes, each body the OK a version-1
    /// client gets; the other client still gets one OK per request.
    @Test func theOKsOfWritesDurableTogetherGoInOneMessage() throws {
        var node = Self.runner(.always)
        let before = node.sent.count
        // Interleaved: the flagged client's OKs are one message all the same.
        node.handle(.clientRequest(client: Self.flagged, frames: Self.set(1, 10, batched: true), identity: nil))
        node.handle(.clientRequest(client: Self.plain, frames: Self.set(2, 20, batched: false), identity: nil))
        node.handle(.clientRequest(client: Self.flagged, frames: Self.set(3, 30, batched: true), identity: nil))
        node.handle(.clientRequest(client: Self.plain, frames: Self.set(4, 40, batched: false), identity: nil))
        node.handle(.clientRequest(client: Self.other, frames: Self.set(6, 60, batched: true), identity: nil))
        node.handle(.clientRequest(client: Self.flagged, frames: Self.set(5, 50, batched: true), identity: nil))
        // A DELETE asks the same way.
        let delete = ClientProtocol.encodeRequest(
            .delete, id: 7, body: ClientProtocol.encodeDelete(ModelAddress(channel: "c", model: "m6"), properties: []),
            flags: ClientProtocol.RequestFlags.batchedReplies)
        node.handle(.clientRequest(client: Self.other, frames: delete, identity: nil))
        #expect(node.sent.count == before, "nothing is acknowledged before the sync")
        node.handle(.tick(observerBacklog: 0))

        let flagged = Self.replies(node, to: Self.flagged, from: before)
        try #require(flagged.count == 1, "one message: \(flagged.map(\.header))")
        #expect(flagged[0].header.kind == .oks && flagged[0].header.requestID == 0)
        let oks = try ClientProtocol.decodeBatchedOKs(flagged[0].body)
        #expect(oks.map(\.id) == [1, 3, 5])
        for ok in oks {
            #expect(ok.body.last == 1, "outcome changed")
            #expect(try ClientProtocol.decodeVersion(Array(ok.body.dropLast())).node == "n1")
        }

        let other = Self.replies(node, to: Self.other, from: before)
        try #require(other.count == 1, "the second client's own message: \(other.map(\.header))")
        #expect(try ClientProtocol.decodeBatchedOKs(other[0].body).map(\.id) == [6, 7])

        let plain = Self.replies(node, to: Self.plain, from: before)
        #expect(plain.map(\.header.kind) == [.ok, .ok])
        #expect(plain.map(\.header.requestID) == [2, 4])
        #expect(plain.allSatisfy { $0.body.last == 1 })
        // The same OK body either way: the version of the write.
        let versions =
            try oks.map { try ClientProtocol.decodeVersion(Array($0.body.dropLast())) }
            + plain.map { try ClientProtocol.decodeVersion(Array($0.body.dropLast())) }
        #expect(Set(versions).count == 5, "five writes, five versions")
    }

    /// With `fsync: interval` a write is acknowledged as it is taken: a flagged client's OKs of
    /// the writes taken in one round go together at the round's tick (which the node asks for
    /// at once); a plain client's OK goes at once, as before.
    @Test func withIntervalTheOKsOfARoundGoAtItsTick() throws {
        var node = Self.runner(.interval)
        let before = node.sent.count
        let published = node.published.count
        node.handle(.clientRequest(client: Self.flagged, frames: Self.set(1, 10, batched: true), identity: nil))
        node.handle(.clientRequest(client: Self.plain, frames: Self.set(2, 20, batched: false), identity: nil))
        node.handle(.clientRequest(client: Self.flagged, frames: Self.set(3, 30, batched: true), identity: nil))
        #expect(Self.replies(node, to: Self.flagged, from: before).isEmpty)
        #expect(Self.replies(node, to: Self.plain, from: before).map(\.header.requestID) == [2])
        #expect(node.machine.awaitsTick && node.machine.nextDeadline() == node.now, "the tick is due now")
        let beforeTick = node.sent.count
        node.handle(.tick(observerBacklog: 0))
        let flagged = Self.replies(node, to: Self.flagged, from: before)
        try #require(flagged.count == 1)
        #expect(flagged[0].header.kind == .oks)
        #expect(try ClientProtocol.decodeBatchedOKs(flagged[0].body).map(\.id) == [1, 3])
        #expect(node.sent.count > beforeTick, "sent in the tick")
        #expect(node.published.count > published, "the tick published the writes")
        // Nothing is held once the tick sent it, and a stop sends what a round holds.
        #expect(!node.machine.awaitsTick || node.machine.nextDeadline() > node.now)
        node.handle(.clientRequest(client: Self.flagged, frames: Self.set(4, 40, batched: true), identity: nil))
        let beforeStop = node.sent.count
        node.handle(.stop)
        let atStop = Self.replies(node, to: Self.flagged, from: beforeStop)
        #expect(atStop.count == 1 && atStop.first?.header.kind == .oks)
        #expect(try atStop.first.map { try ClientProtocol.decodeBatchedOKs($0.body).map(\.id) } == [4])
    }

    /// With `interval` and a watch on the node, a held OK still goes before the watch events of
    /// its write at the round's tick. (For a pump in the middle of a round, see the next test.)
    @Test func withIntervalAHeldOKGoesBeforeItsWritesWatchEvents() throws {
        var node = Self.runner(.interval)
        let before = Self.watchThenWriteThree(&node)
        node.handle(.tick(observerBacklog: 0))
        let (answered, firstEvent) = try Self.okAndEventPositions(node, from: before)
        for id in 1...3 as ClosedRange<UInt64> {
            let ok = try #require(answered[id], "request \(id) answered")
            let event = try #require(firstEvent["m\(id)"], "the watcher told of m\(id)")
            #expect(ok < event, "request \(id): its OK at \(ok), its watch event at \(event)")
        }
    }

    /// With `interval`, OKs and watch events can go in the middle of a round. Here the writes
    /// wait for a sequence reservation while a SNAPSHOT served meanwhile forces a sync (it waits
    /// for the node's own writes to be durable, section 10.9): the pump after that sync sends
    /// the round's held OKs, though no watch event yet (the writes are not published). When the
    /// host then reports the reservation, the writes are published and, durable already, fed to
    /// the watch at once. All of it before the round's tick, and each OK before its events.
    @Test func withIntervalAHeldOKGoesBeforeWatchEventsSentMidRound() throws {
        var configuration = MachineRunner.configuration("n1")
        configuration.fsync = .interval
        configuration.fsyncIntervalMilliseconds = 60_000
        var node = MachineRunner(configuration)
        node.reportsReservations = false
        node.advance(1)
        let before = Self.watchThenWriteThree(&node)
        let reader: [UInt8] = [0x52, 1]
        node.handle(
            .clientRequest(
                client: reader, frames: ClientProtocol.encodeRequest(.snapshot, id: 60, body: []), identity: nil))
        #expect(
            node.sent[before...].allSatisfy { $0.client != Self.watcher },
            "the writes are durable, not published: no watch event yet")
        #expect(node.sent[before...].contains { $0.client == Self.flagged }, "the held OKs went after the sync")
        // No tick: the reservation alone publishes the writes and feeds the watch.
        let through = try #require(node.reservations.last)
        node.handle(.sequencesReserved(through: through))
        let (answered, firstEvent) = try Self.okAndEventPositions(node, from: before)
        for id in 1...3 as ClosedRange<UInt64> {
            let event = try #require(firstEvent["m\(id)"], "the watcher told of m\(id) before the tick")
            let ok = try #require(answered[id], "request \(id) answered")
            #expect(ok < event, "request \(id): its OK at \(ok), its watch event at \(event)")
        }
    }

    /// The flag asks for nothing else: an error, and a read, are answered as before.
    @Test func errorsAndReadsAreNotBatched() throws {
        var node = Self.runner(.always)
        let before = node.sent.count
        let invalid = ClientProtocol.encodeRequest(
            .set, id: 9,
            body: ClientProtocol.encodeSet(ModelAddress(channel: "", model: "m"), [PropertyWrite(name: "x", value: 1)]),
            flags: ClientProtocol.RequestFlags.batchedReplies)
        node.handle(.clientRequest(client: Self.flagged, frames: invalid, identity: nil))
        let get = ClientProtocol.encodeRequest(
            .get, id: 10, body: ClientProtocol.encodeAddress(ModelAddress(channel: "c", model: "m")),
            flags: ClientProtocol.RequestFlags.batchedReplies)
        node.handle(.clientRequest(client: Self.flagged, frames: get, identity: nil))
        node.handle(.tick(observerBacklog: 0))
        let replies = Self.replies(node, to: Self.flagged, from: before)
        #expect(replies.map(\.header.kind) == [.error, .ok])
        #expect(replies.map(\.header.requestID) == [9, 10])
    }
}
