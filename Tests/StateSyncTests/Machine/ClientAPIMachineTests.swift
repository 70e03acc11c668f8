import Testing

@testable import StateSync

/// The client API, byte by byte, on the node machine alone (PROTOCOL.md section 10).
@Suite("Client API on the node machine")
struct ClientAPIMachineTests {
    /// PROTOCOL.md 10.3: a SET reports changed, unchanged, and superseded when a peer whose clock
    /// is ahead already wrote a newer version.
    @Test func setReportsChangedUnchangedAndSuperseded() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        let address = ModelAddress(channel: "c", model: "m")
        let set = ClientProtocol.encodeSet(address, [PropertyWrite(name: "x", value: 1)])
        let first = node.request(.set, id: 1, set)
        let second = node.request(.set, id: 2, set)
        #expect(first?.1.last == 1)  // changed
        #expect(second?.1.last == 0)  // unchanged
        // A peer far ahead in time wrote x: a local write now loses and says so.
        let future = Delta(
            channel: "c", model: "m",
            version: Version(milliseconds: node.wall.milliseconds + 3_600_000, counter: 0, node: "zeta"),
            sequence: 1, properties: [PropertyWrite(name: "x", value: 5)])
        node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(future).encode()))
        #expect(node.machine.counters.clockDriftRejections == 1)
        let answer = node.request(.set, id: 3, ClientProtocol.encodeSet(address, [PropertyWrite(name: "x", value: 2)]))
        let reply = try #require(answer)
        #expect(reply.1.last == 2)  // superseded
        #expect(try ClientProtocol.decodeVersion(Array(reply.1.dropLast())) == future.version)
        #expect(node.machine.store.properties(of: address)["x"]?.value == 5)
    }

    /// A SET of several properties writes those it changes, at one new version, and leaves the
    /// others at theirs; unchanged, it reports the newest of theirs. A deleted property holds no
    /// value: setting it to null changes it, also in a single-property SET (looked up alone).
    @Test func aSetWritesOnlyThePropertiesItChanges() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        let address = ModelAddress(channel: "c", model: "m")
        func set(_ id: UInt64, _ writes: [PropertyWrite]) throws -> (version: Version, result: UInt8) {
            let answer = node.request(.set, id: id, ClientProtocol.encodeSet(address, writes))
            let reply = try #require(answer)
            #expect(reply.0.kind == .ok)
            return (try ClientProtocol.decodeVersion(Array(reply.1.dropLast())), try #require(reply.1.last))
        }
        let first = try set(1, [PropertyWrite(name: "x", value: 1), PropertyWrite(name: "y", value: 1)])
        #expect(first.result == 1)
        let second = try set(2, [PropertyWrite(name: "x", value: 1), PropertyWrite(name: "y", value: 2)])
        #expect(second.result == 1)
        #expect(second.version > first.version)
        let held = node.machine.store.properties(of: address)
        #expect(held["x"]?.version == first.version, "x did not change: it keeps its version")
        #expect(held["y"]?.version == second.version && held["y"]?.value == 2)
        let again = try set(3, [PropertyWrite(name: "x", value: 1), PropertyWrite(name: "y", value: 2)])
        #expect(again.result == 0 && again.version == second.version)
        let single = try set(4, [PropertyWrite(name: "x", value: 1)])
        #expect(single.result == 0 && single.version == first.version)

        let deletion = node.request(.delete, id: 5, ClientProtocol.encodeDelete(address, properties: ["y"]))
        #expect(try #require(deletion).0.kind == .ok)
        // Null is a value: set on a deleted property (whose record holds null), it changes it.
        let back = try set(6, [PropertyWrite(name: "y", value: .null)])
        #expect(back.result == 1 && back.version > second.version)
        #expect(node.machine.store.properties(of: address)["y"]?.value == .null)
    }

    /// A write larger than a delta may carry is refused with ERROR 3, naming the limit, and
    /// changes nothing (its size is counted only when its request is that large).
    @Test func aWriteLargerThanADeltaMayCarryIsRefused() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        let address = ModelAddress(channel: "c", model: "m")
        let large = [UInt8](repeating: 7, count: NodeMachine.maximumWriteBytes)
        let answer = node.request(
            .set, id: 1, ClientProtocol.encodeSet(address, [PropertyWrite(name: "x", value: .bytes(large))]))
        let reply = try #require(answer)
        #expect(reply.0.kind == .error)
        let error = try ClientProtocol.decodeError(reply.1)
        #expect(error.code == ClientProtocol.ErrorCode.invalidArgument.rawValue)
        #expect(error.message.contains("a delta may carry at most \(NodeMachine.maximumWriteBytes)"))
        #expect(node.machine.store.channelModelCounts.isEmpty, "nothing was written")
        // Just under the limit (the name and the value's tag and length count too), it is taken.
        let fits = [UInt8](repeating: 7, count: NodeMachine.maximumWriteBytes - 8)
        let taken = node.request(
            .set, id: 2, ClientProtocol.encodeSet(address, [PropertyWrite(name: "x", value: .bytes(fits))]))
        #expect(try #require(taken).0.kind == .ok)
    }
}

/// Bad requests get a clear error and change nothing (PROTOCOL.md sections 10.1, 10.10, 12).
@Suite("Bad requests on the node machine")
struct BadRequestMachineTests {
    static func error(_ reply: (ClientProtocol.ReplyHeader, [UInt8])?) -> UInt64? {
        guard let reply, reply.0.kind == .error else { return nil }
        return try? ClientProtocol.decodeError(reply.1).code
    }

    @Test func unknownCommandsMalformedBodiesAndBadNamesGetTheirCodes() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        var unknown = ClientProtocol.encodeRequest(.get, id: 5, body: [])
        unknown[0][1] = 0x0A
        node.handle(.clientRequest(client: [0x53, 1], frames: unknown))
        #expect(
            node.sent.last.flatMap { try? ClientProtocol.decodeError($0.frames[1]).code }
                == ClientProtocol.ErrorCode.unknownCommand.rawValue)
        #expect(Self.error(node.request(.set, id: 6, [1, 2, 3])) == ClientProtocol.ErrorCode.malformed.rawValue)
        let badName = ClientProtocol.encodeSet(
            ModelAddress(channel: "a/b", model: "m"), [PropertyWrite(name: "x", value: 1)])
        #expect(Self.error(node.request(.set, id: 7, badName)) == ClientProtocol.ErrorCode.invalidArgument.rawValue)
        let repeated = ClientProtocol.encodeSet(
            ModelAddress(channel: "c", model: "m"),
            [PropertyWrite(name: "x", value: 1), PropertyWrite(name: "x", value: 2)])
        #expect(Self.error(node.request(.set, id: 8, repeated)) == ClientProtocol.ErrorCode.invalidArgument.rawValue)
        // The empty name is the model's deletion in a DELETE only: in a SET it is invalid, also as
        // a deletion (section 10.3).
        let modelDeletion = ClientProtocol.encodeSet(ModelAddress(channel: "c", model: "m"), [.modelDeletion])
        let refused = node.request(.set, id: 9, modelDeletion)
        #expect(Self.error(refused) == ClientProtocol.ErrorCode.invalidArgument.rawValue)
        #expect(refused.flatMap { try? ClientProtocol.decodeError($0.1).message }?.contains("DELETE") == true)
        #expect(node.machine.store.channelModelCounts.isEmpty, "nothing was written")
        #expect(node.machine.counters.clientErrors == 5)
    }

    /// 10.1: a header of another protocol version gets ERROR 4 with request id 0; frames that
    /// are not header + body are dropped and counted.
    @Test func aWrongVersionGetsErrorFourAndBadFramingIsCounted() {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        var request = ClientProtocol.encodeRequest(.get, id: 5, body: [])
        request[0][0] = 2
        node.handle(.clientRequest(client: [0x53, 1], frames: request))
        let header = node.sent.last.flatMap { try? ClientProtocol.decodeReplyHeader($0.frames[0]) }
        #expect(header?.kind == .error && header?.requestID == 0)
        node.handle(.clientRequest(client: [0x53, 1], frames: []))
        #expect(node.machine.counters.malformedMessages == 2)
    }

    /// 3 and 10.10: a node without a client API serves its peers' repairs and refuses clients
    /// with ERROR 7.
    @Test func aRepairEndpointRefusesClientsWithErrorSeven() throws {
        var node = MachineRunner(MachineRunner.configuration("n1", api: false))
        let get = node.request(.get, id: 1, ClientProtocol.encodeAddress(ModelAddress(channel: "c", model: "m")))
        #expect(Self.error(get) == ClientProtocol.ErrorCode.denied.rawValue)
        let fetch = node.request(.fetch, id: 2, ClientProtocol.encodeFetch(origin: "n2", range: 1...3))
        #expect(fetch?.0.kind == .ok)
    }

    /// The journal serves watches, which only a client API takes: a node without one keeps
    /// none, of its own writes or its peers'; with one, it journals both.
    @Test(arguments: [false, true])
    func onlyANodeWithAClientAPIJournalsDeltas(api: Bool) throws {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"], api: api))
        let address = ModelAddress(channel: "c", model: "m")
        node.handle(
            .localWrites([
                LocalWrite(
                    address: address, version: node.machine.clock.next(), writes: [PropertyWrite(name: "a", value: 1)])
            ]))
        let remote = Delta(
            channel: "c", model: "m", version: Version(milliseconds: 1_800_000_000_000, counter: 1, node: "n2"),
            sequence: 1,
            properties: [PropertyWrite(name: "b", value: 2)])
        node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.encodeBatch([remote])))
        #expect(node.machine.store.properties(of: address).count == 2, "both writes applied")
        #expect(node.machine.journal.end == (api ? 2 : 0))
    }

    /// 10.6: PING names the watches the node does not hold (dropped while the client was away).
    @Test func pingNamesWatchesTheNodeNoLongerHolds() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        _ = node.request(.watch, id: 77, ClientProtocol.encodeWatch(channel: "c", from: nil))
        var ping = WireWriter()
        ping.varint(2)
        ping.uint64(77)
        ping.uint64(78)
        let replyAnswer = node.request(.ping, id: 5, ping.bytes)
        let reply = try #require(replyAnswer)
        guard case .map(let map) = try ClientProtocol.decodeValue(reply.1) else {
            Issue.record("not a map")
            return
        }
        #expect(map["lost"] == .array([.int(78)]))
    }
}
