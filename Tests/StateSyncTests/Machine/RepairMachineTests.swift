import Testing

@testable import StateSync

/// Gap repair on the node machine alone (PROTOCOL.md sections 8.1 and 11.3).
@Suite("Repair on the node machine")
struct RepairMachineTests {
    static func delta(_ origin: String, _ sequence: UInt64, value: Int64? = nil) -> Delta {
        Delta(
            channel: "c", model: "m",
            version: Version(milliseconds: 1_800_000_000_000 + sequence, counter: 0, node: origin),
            sequence: sequence, properties: [PropertyWrite(name: "n", value: .int(value ?? Int64(sequence)))])
    }

    static func heartbeat(_ node: String, latest: UInt64, progress: [String: UInt64] = [:]) -> [[UInt8]] {
        PeerMessage.heartbeat(
            PeerMessage.Heartbeat(
                node: node, latestSequence: latest, clock: 0, incarnation: 1, api: "inproc://\(node).api",
                progress: progress)
        ).encode()
    }

    /// The requests sent since `from`, decoded: (peer, command, FETCH origin and range).
    static func requests(_ node: MachineRunner, from: Int = 0) -> [(
        peer: String, command: ClientProtocol.Command, fetch: (origin: String, range: ClosedRange<UInt64>)?
    )] {
        node.repairRequests[from...].compactMap { peer, frames in
            guard let header = try? ClientProtocol.decodeRequestHeader(frames[0]),
                let command = ClientProtocol.Command(rawValue: header.command)
            else { return nil }
            return (peer, command, command == .fetch ? try? ClientProtocol.decodeFetch(frames[1]) : nil)
        }
    }

    static func requestID(_ node: MachineRunner, at index: Int) throws -> UInt64 {
        try ClientProtocol.decodeRequestHeader(node.repairRequests[index].frames[0]).requestID
    }

    /// A node whose peers n1, n2 and n3 advertise repair endpoints and are connected.
    static func connectedNode(history: Int = 1000) -> MachineRunner {
        var configuration = MachineRunner.configuration("n4", peers: ["n1", "n2", "n3"])
        configuration.historyDeltas = history
        var node = MachineRunner(configuration)
        for peer in ["n1", "n2", "n3"] {
            node.handle(.peerMessage(peer: "inproc://\(peer)", frames: Self.heartbeat(peer, latest: 0)))
        }
        return node
    }

    /// 8.1 and 11.3 step 4: a gap is fetched from the origin itself first, exactly the missing
    /// numbers; the reply fills it.
    @Test func aGapIsFetchedFromItsOriginFirst() throws {
        var node = Self.connectedNode()
        for sequence: UInt64 in [1, 2, 5] {
            node.handle(
                .peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(Self.delta("n1", sequence)).encode()))
        }
        node.advance(60)
        let sent = Self.requests(node)
        #expect(sent.count == 1)
        #expect(
            sent.first?.peer == "inproc://n1" && sent.first?.fetch?.origin == "n1" && sent.first?.fetch?.range == 3...4)
        #expect(node.machine.missingDeltas == 2)
        let reply = ClientProtocol.encodeReply(
            .ok, id: try Self.requestID(node, at: 0),
            body: ClientProtocol.encodeFetched([Self.delta("n1", 3), Self.delta("n1", 4)], droppedThrough: 0))
        node.handle(.repairReply(peer: "inproc://n1", frames: reply))
        #expect(node.machine.missingDeltas == 0)
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "m"))["n"]?.value == 5)
        #expect(node.machine.counters.deltasFetched == 2)
    }

    /// 11.3: a peer that answers with no delta is exhausted for that origin and the next peer is
    /// asked; an unanswered FETCH times out after 1000 ms and moves on too.
    @Test func emptyAnswersAndTimeoutsMoveTheGapFromPeerToPeer() throws {
        var node = Self.connectedNode()
        node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(Self.delta("n1", 3)).encode()))
        node.advance(60)
        #expect(Self.requests(node).map(\.peer) == ["inproc://n1"])
        node.handle(
            .repairReply(
                peer: "inproc://n1",
                frames: ClientProtocol.encodeReply(
                    .ok, id: try Self.requestID(node, at: 0), body: ClientProtocol.encodeFetched([], droppedThrough: 2))
            ))
        node.advance(60)
        let second = Self.requests(node, from: 1)
        #expect(second.count == 1 && second[0].peer != "inproc://n1" && second[0].fetch?.range == 1...2)
        // No answer: after the timeout the gap goes to the remaining peer (the peers stay
        // connected: they keep sending heartbeats).
        for _ in 0..<25 {
            for peer in ["n1", "n2", "n3"] {
                node.handle(.peerMessage(peer: "inproc://\(peer)", frames: Self.heartbeat(peer, latest: 0)))
            }
            node.advance(50)
        }
        let third = Self.requests(node, from: 2)
        #expect(third.first.map { ![second[0].peer, "inproc://n1"].contains($0.peer) } == true)
    }

    /// Names a DELTA could not carry are not merged from a peer's snapshot either (section 5):
    /// the valid registers are, the others are counted and logged.
    @Test func aSnapshotsInvalidNamesAreNotMerged() {
        var node = Self.connectedNode()
        var store = ReplicaStore()
        let version = Version(milliseconds: 1_800_000_000_000, counter: 0, node: "n1")
        for (channel, model, property) in [("c", "m", "ok"), ("bad/channel", "m", "x"), ("c", "m2", "")] {
            _ = store.apply(
                Delta(
                    channel: channel, model: model, version: version, sequence: 1,
                    properties: [PropertyWrite(name: property, value: 1)]))
        }
        _ = node.machine.merge(StateSnapshot(store: store, latestSequence: 1, progress: ["n1": 1]))
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "m"))["ok"]?.value == 1)
        #expect(node.machine.store.properties(of: ModelAddress(channel: "bad/channel", model: "m")).isEmpty)
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "m2")).isEmpty)
        #expect(node.machine.counters.malformedMessages == 1)
    }

    /// 11.3 step 3: when no peer holds the deltas any more, a SNAPSHOT is asked — of a peer whose
    /// heartbeat shows it holds what is missing, and not the same peer over and over when it
    /// does not (the simulator found a node asking one such peer forever).
    @Test func aSnapshotIsAskedOfAPeerThatHoldsWhatIsMissing() throws {
        var node = Self.connectedNode()
        // n3 reports holding n1's deltas through 9; n1 and n2 report nothing of n1's.
        node.handle(.peerMessage(peer: "inproc://n3", frames: Self.heartbeat("n3", latest: 0, progress: ["n1": 9])))
        node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(Self.delta("n1", 10)).encode()))
        var answered = 0
        for _ in 0..<200 {
            for peer in ["n1", "n2"] {
                node.handle(.peerMessage(peer: "inproc://\(peer)", frames: Self.heartbeat(peer, latest: 0)))
            }
            node.handle(.peerMessage(peer: "inproc://n3", frames: Self.heartbeat("n3", latest: 0, progress: ["n1": 9])))
            node.advance(50)
            // Every FETCH is answered "I hold nothing of that" at once; SNAPSHOTs go unanswered.
            while answered < node.repairRequests.count {
                let request = node.repairRequests[answered]
                answered += 1
                let header = try ClientProtocol.decodeRequestHeader(request.frames[0])
                guard header.command == ClientProtocol.Command.fetch.rawValue else { continue }
                node.handle(
                    .repairReply(
                        peer: request.peer,
                        frames: ClientProtocol.encodeReply(
                            .ok, id: header.requestID, body: ClientProtocol.encodeFetched([], droppedThrough: 9))))
            }
        }
        let asked = Self.requests(node).filter { $0.command == .snapshot }.map(\.peer)
        #expect(!asked.isEmpty)
        #expect(Set(asked) == ["inproc://n3"], "snapshots asked of \(asked)")
    }

    /// 10.8: a FETCH is served from the retained history, at most 2000 deltas, with the
    /// dropped-through mark.
    @Test func fetchIsServedFromTheHistoryWithItsDroppedThroughMark() throws {
        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        configuration.historyDeltas = 3000
        var node = MachineRunner(configuration)
        for sequence in 1...2500 as ClosedRange<UInt64> {
            node.handle(
                .peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(Self.delta("n2", sequence)).encode()))
        }
        let reply = node.request(.fetch, id: 3, ClientProtocol.encodeFetch(origin: "n2", range: 10...5000))
        let (deltas, dropped, _) = try ClientProtocol.decodeFetched(try #require(reply).1)
        #expect(deltas.count == 2000 && deltas.first?.sequence == 10 && deltas.last?.sequence == 2009)
        #expect(dropped == 0)
        let unknown = node.request(.fetch, id: 4, ClientProtocol.encodeFetch(origin: "zz", range: 1...5))
        #expect(try ClientProtocol.decodeFetched(try #require(unknown).1).deltas.isEmpty)
    }
}
