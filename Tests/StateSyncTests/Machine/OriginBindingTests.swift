import Logging
import Testing

@testable import StateSync

/// With security, a peer's live stream carries only its own origin (PROTOCOL.md section 14), on
/// the node machine alone; repair may carry any origin.
@Suite("Origins bound to peers")
struct OriginBindingTests {
    static func securedNode() -> MachineRunner {
        var configuration = MachineRunner.configuration("n1", peers: ["n2", "n3"])
        configuration.peerNodeIDs = ["inproc://n2": "n2", "inproc://n3": "n3"]
        configuration.security = SecurityConfiguration(secretKeyFile: "unused", peerKeys: [:])
        return MachineRunner(configuration)
    }

    @Test func aPeerCannotWriteInAnotherNodesNameOnItsLiveStream() throws {
        var node = Self.securedNode()
        let address = ModelAddress(channel: "c", model: "m")
        // n2 sends n3's delta, then a heartbeat in n3's name: both dropped and counted.
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(RepairMachineTests.delta("n3", 1)).encode()))
        node.handle(.peerMessage(peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n3", latest: 9)))
        #expect(node.machine.store.properties(of: address).isEmpty)
        #expect(node.machine.counters.forgedOrigins == 2)
        #expect(node.machine.missingDeltas == 0, "the forged heartbeat announced nothing")
        // Its own deltas are taken.
        node.handle(
            .peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(RepairMachineTests.delta("n2", 1)).encode()))
        #expect(node.machine.store.properties(of: address)["n"]?.value == 1)
        // Without security the same stream is taken as before (ids in the config are not proof).
        var configuration = MachineRunner.configuration("n1", peers: ["n2", "n3"])
        configuration.peerNodeIDs = ["inproc://n2": "n2"]
        var plain = MachineRunner(configuration)
        plain.handle(
            .peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(RepairMachineTests.delta("n3", 1)).encode()))
        #expect(plain.machine.counters.forgedOrigins == 0 && !plain.machine.store.properties(of: address).isEmpty)
    }

    /// A HEARTBEAT in another id's name on a bound stream is most often a node whose
    /// configuration was copied, node.id unchanged: the warning says so and what to do (the two
    /// signs of PROTOCOL.md 7.5 "Two nodes under one id" cannot be seen through the binding).
    @Test func aHeartbeatInAnotherIDsNameSuggestsACopiedConfiguration() throws {
        let logs = CapturedLogs()
        var configuration = MachineRunner.configuration("n1", peers: ["n2", "n4"])
        configuration.peerNodeIDs = ["inproc://n2": "n2", "inproc://n4": "n4"]
        configuration.security = SecurityConfiguration(secretKeyFile: "unused", peerKeys: [:])
        var node = MachineRunner(configuration, logger: logs.logger)
        node.handle(.peerMessage(peer: "inproc://n4", frames: RepairMachineTests.heartbeat("n2", latest: 0)))
        let warning = try #require(logs.all.first { $0.message.contains("in another node's name") })
        #expect(
            warning.message.contains("configured with node.id n2 by mistake")
                && warning.message.contains("give it node.id n4"))
    }

    /// A stream from an endpoint that is neither configured nor a learned member carries no
    /// origin at all (the simulator's forge fault found a node that had not learned the sender).
    @Test func aStreamFromAnUnknownEndpointCarriesNothing() {
        var node = Self.securedNode()
        node.handle(
            .peerMessage(peer: "inproc://n9", frames: PeerMessage.delta(RepairMachineTests.delta("n9", 1)).encode()))
        node.handle(
            .peerMessage(peer: "inproc://n9", frames: PeerMessage.delta(RepairMachineTests.delta("n2", 1)).encode()))
        #expect(node.machine.store.properties(of: ModelAddress(channel: "c", model: "m")).isEmpty)
        #expect(node.machine.counters.forgedOrigins == 2)
    }

    /// Repair relays other origins' deltas by design: a FETCH answer from n2 with n3's deltas is
    /// applied.
    @Test func repairStillCarriesOtherOrigins() throws {
        var node = Self.securedNode()
        node.handle(
            .peerMessage(
                peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0, progress: ["n3": 2])))
        node.handle(.peerMessage(peer: "inproc://n3", frames: RepairMachineTests.heartbeat("n3", latest: 0)))
        node.advance(60)
        let request = try #require(RepairMachineTests.requests(node).first { $0.fetch?.origin == "n3" })
        let id = try ClientProtocol.decodeRequestHeader(
            node.repairRequests.first { $0.peer == request.peer }!.frames[0]
        ).requestID
        node.handle(
            .repairReply(
                peer: request.peer,
                frames: ClientProtocol.encodeReply(
                    .ok, id: id,
                    body: ClientProtocol.encodeFetched(
                        [RepairMachineTests.delta("n3", 1), RepairMachineTests.delta("n3", 2)], droppedThrough: 0))))
        #expect(node.machine.missingDeltas == 0)
        #expect(node.machine.counters.forgedOrigins == 0)
    }

    /// Per-channel access (section 14): each request is checked against its sender's patterns;
    /// peers and full clients may do anything, a read-only key reads its channels only, and
    /// repairs are for peers and clients that may read everything.
    @Test func requestsAreCheckedAgainstTheSendersPermissions() {
        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        configuration.security = SecurityConfiguration(
            secretKeyFile: "unused", peerKeys: [:],
            clients: [.init(key: "full"), .init(key: "reader", read: ["sensors/*"], write: [])])
        var node = MachineRunner(configuration)
        node.handle(
            .clientAccessChanged(
                [
                    "client:0": .init(key: "full"), "client:1": .init(key: "reader", read: ["sensors/*"], write: []),
                ], peers: ["n2"]))
        let sensor = ClientProtocol.encodeSet(
            ModelAddress(channel: "sensors", model: "t"), [PropertyWrite(name: "c", value: 1)])
        func kind(_ reply: (ClientProtocol.ReplyHeader, [UInt8])?) -> String {
            guard let (header, body) = reply else { return "none" }
            if header.kind == .ok { return "ok" }
            return (try? ClientProtocol.decodeError(body)).map { "error \($0.code)" } ?? "error"
        }
        #expect(kind(node.request(.set, id: 1, sensor, identity: "client:0")) == "ok")
        #expect(kind(node.request(.set, id: 2, sensor, identity: "client:1")) == "error 8")
        let get = ClientProtocol.encodeAddress(ModelAddress(channel: "sensors", model: "t"))
        let other = ClientProtocol.encodeAddress(ModelAddress(channel: "billing", model: "b"))
        #expect(kind(node.request(.get, id: 3, get, identity: "client:1")) == "ok")
        #expect(kind(node.request(.get, id: 4, other, identity: "client:1")) == "error 8")
        #expect(
            kind(
                node.request(
                    .watch, id: 5, ClientProtocol.encodeWatch(channel: "billing", from: nil), identity: "client:1"))
                == "error 8")
        #expect(kind(node.request(.snapshot, id: 6, [], identity: "client:1")) == "error 8")
        #expect(kind(node.request(.snapshot, id: 7, [], identity: "node:n2")) == "ok")
        #expect(
            kind(node.request(.get, id: 8, other, identity: "client:9")) == "error 8",
            "an unknown identity may do nothing")
        #expect(
            kind(node.request(.get, id: 9, other, identity: nil)) == "error 8", "with security, no identity: nothing")
        #expect(SecurityConfiguration.ClientAccess.allows(["sensors/*"], "sensors"))
        #expect(!SecurityConfiguration.ClientAccess.allows(["sensors/*"], "sensors2"))
        #expect(SecurityConfiguration.ClientAccess.allows(["sens*"], "sensors2"))
        #expect(!SecurityConfiguration.ClientAccess.allows(["a"], "ab"))
    }

    /// A reload that takes a key's read permission away ends that key's watches with ERROR 8;
    /// watches of keys that keep it go on.
    @Test func aReloadEndsTheWatchesOfKeysThatLostTheirChannel() throws {
        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        configuration.security = SecurityConfiguration(secretKeyFile: "unused", peerKeys: [:])
        var node = MachineRunner(configuration)
        node.handle(.clientAccessChanged(["client:A": .init(key: "a"), "client:B": .init(key: "b")]))
        let watch = ClientProtocol.encodeWatch(channel: "c", from: nil)
        #expect(node.request(.watch, id: 1, watch, client: [0x53, 1], identity: "client:A")?.0.kind == .ok)
        #expect(node.request(.watch, id: 2, watch, client: [0x53, 2], identity: "client:B")?.0.kind == .ok)
        let before = node.sent.count
        node.handle(.clientAccessChanged(["client:A": .init(key: "a")]))  // B removed
        let ended = node.sent[before...].filter { $0.client == [0x53, 2] }
        let header = try #require(ended.first.flatMap { try? ClientProtocol.decodeReplyHeader($0.frames[0]) })
        #expect(header.kind == .error && header.requestID == 2)
        #expect(node.sent[before...].allSatisfy { $0.client != [0x53, 1] }, "A's watch goes on")
        #expect(node.machine.watches.byKey.count == 1)
        // B's requests are now refused.
        let get = ClientProtocol.encodeAddress(ModelAddress(channel: "c", model: "m"))
        #expect(node.request(.get, id: 3, get, client: [0x53, 2], identity: "client:B")?.0.kind == .error)
    }

    /// A peer's key may ask for repairs, PING and STATUS, nothing else (it cannot write through
    /// another node's API in that node's name); a removed peer or client may do nothing.
    @Test func peersOnlyRepairAndRemovedKeysDoNothing() {
        let clients: [String: SecurityConfiguration.ClientAccess] = ["client:A": .init(key: "a")]
        func refused(_ command: ClientProtocol.Command, _ identity: String?) -> Bool {
            NodeMachine.refusal(command, identity: identity, security: true, clients: clients, peers: ["n2"]) != nil
        }
        #expect(!refused(.fetch, "node:n2") && !refused(.snapshot, "node:n2") && !refused(.status, "node:n2"))
        #expect(refused(.set, "node:n2") && refused(.get, "node:n2") && refused(.watch, "node:n2"))
        #expect(refused(.fetch, "node:n9"), "a peer no longer admitted")
        #expect(!refused(.status, "client:A") && refused(.status, "client:B"), "a client no longer admitted")
        #expect(refused(.ping, nil))
        #expect(NodeMachine.refusal(.set, identity: nil, security: false, clients: [:], peers: []) == nil)
    }
}
