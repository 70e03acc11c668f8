import Testing

@testable import StateSync

/// Links that libzmq dropped for good are replaced (PROTOCOL.md sections 3, 11.3 and 12), on the
/// node machine alone.
@Suite("Peer links on the node machine")
struct PeerLinkMachineTests {
    /// A peer heard from and then silent for the silence limit gets a new SUB link, once per
    /// silent period; a message resets the count; a peer never heard from gets a new link once
    /// per period from the start (a peer that rotated its key is reached by its other key).
    /// A status asked with a time read before a later input was handled (the HTTP listener's
    /// scrape racing the I/O thread) neither traps on a negative age nor moves time back.
    @Test func aStatusAskedWithAnEarlierTimeDoesNotGoBackInTime() {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        node.handle(.peerMessage(peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0)))
        let status = node.machine.status(now: node.now - 5)
        #expect(status.peers.first?.lastSeenMillisecondsAgo == 0)
        #expect(status.peers.first?.connected == true)
        #expect(node.machine.now == node.now)
    }

    /// A peer that beats five times slower than this node (its `network.heartbeat_ms` is 500,
    /// this node's 100) is connected and alive between its HEARTBEATs, and its link is not
    /// replaced while it keeps its pace: liveness follows each peer's pace, and the difference is
    /// logged once. Its silence is still found, at its own pace. (An operator trial saw every
    /// other node's readiness flap between its HEARTBEATs, with nothing logged.)
    @Test func aPeerThatBeatsSlowerIsLiveBetweenItsHeartbeats() throws {
        let logs = CapturedLogs()
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]), logger: logs.logger)
        let beat = MembershipMachineTests.heartbeat("n2", members: [MembershipMachineTests.member("n2", at: 100)])
        // Its pace is known from its second HEARTBEAT.
        node.handle(.peerMessage(peer: "inproc://n2", frames: beat))
        node.advance(500)
        for _ in 0..<6 {
            node.handle(.peerMessage(peer: "inproc://n2", frames: beat))
            for _ in 0..<5 {
                node.advance(99)
                let status = node.machine.status(now: node.now)
                #expect(status.peers.first?.connected == true, "at \(node.now)")
                #expect(status.members.first { $0.id == "n2" }?.state == "alive", "at \(node.now)")
            }
            node.advance(5)
        }
        #expect(node.linkResets.isEmpty, "no link replaced while it keeps its pace")
        #expect(logs.all.filter { $0.message.contains("sends HEARTBEATs every") }.count == 1)
        node.advance(5 * 500 + 1)
        #expect(node.machine.status(now: node.now).peers.first?.connected == false, "silent: no longer connected")
        node.advance(5 * 500)
        #expect(node.linkResets == ["inproc://n2"], "silent for ten of its intervals: link replaced")
    }

    /// A configured peer never heard from in three silence periods (down, or an endpoint that is
    /// not a node's publish socket: libzmq connects to an API's ROUTER and nothing ever comes) is
    /// logged once, saying what to check. (An operator trial pointed a peer at an API port and
    /// saw nothing but "never seen".)
    @Test func aPeerNeverHeardFromIsLoggedOnceWithWhatToCheck() {
        let logs = CapturedLogs()
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]), logger: logs.logger)
        let limit = node.machine.peerSilenceLimit
        for _ in 0..<10 { node.advance(limit) }
        let said = logs.all.filter { $0.message.contains("no message ever came from a peer this node links to") }
        #expect(said.count == 1 && said.first?.message.contains("network.publish endpoint (not its api") == true)
        #expect(said.first?.metadata["peer.endpoint"] == "inproc://n2")
    }

    @Test func aSilentPeerGetsANewLinkOncePerSilentPeriod() {
        var node = MachineRunner(MachineRunner.configuration("n1", peers: ["n2", "n3"]))
        let limit = node.machine.peerSilenceLimit
        #expect(limit == 1000, "10 heartbeat intervals of 100 ms")
        func resets(_ peer: String) -> Int { node.linkResets.filter { $0 == "inproc://\(peer)" }.count }
        node.handle(.peerMessage(peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0)))
        node.advance(limit - 1)
        #expect(node.linkResets.isEmpty)
        node.advance(1)
        #expect(resets("n2") == 1)
        node.advance(limit - 1)
        #expect(resets("n2") == 1, "not again within the same period")
        node.advance(1)
        #expect(resets("n2") == 2, "again while it stays silent")
        node.handle(.peerMessage(peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0)))
        node.advance(limit - 1)
        #expect(resets("n2") == 2, "a message starts a new period")
        #expect(resets("n3") == 2, "never heard from: once per period since its link was made")
        #expect(node.machine.counters.peerLinkResets == 4)
    }

    /// A FETCH that got no answer in time replaces the link it went out on (a reply over the
    /// maximum size would otherwise cut that peer off repairs for good), and goes to another peer.
    @Test func anUnansweredRepairRequestReplacesItsLink() throws {
        var node = RepairMachineTests.connectedNode()
        for sequence: UInt64 in [1, 3] {
            node.handle(
                .peerMessage(
                    peer: "inproc://n1", frames: PeerMessage.delta(RepairMachineTests.delta("n1", sequence)).encode()))
        }
        node.advance(60)
        let first = try #require(RepairMachineTests.requests(node).first)
        #expect(first.peer == "inproc://n1" && first.command == .fetch)
        let linksBefore = node.machine.counters.repairLinkResets
        // Peers stay connected (heartbeats), the FETCH stays unanswered past its deadline.
        for _ in 0..<12 {
            for peer in ["n1", "n2", "n3"] {
                node.handle(
                    .peerMessage(
                        peer: "inproc://\(peer)",
                        frames: RepairMachineTests.heartbeat(peer, latest: peer == "n1" ? 3 : 0)))
            }
            node.advance(100)
        }
        #expect(node.machine.counters.repairLinkResets > linksBefore)
        #expect(node.repairLinksConnected.filter { $0 == "inproc://n1" }.count >= 2, "connected, then replaced")
        #expect(RepairMachineTests.requests(node).dropFirst().contains { $0.peer != "inproc://n1" })
    }
}

/// A HEARTBEAT's `api` is dialled only on the host the peer's stream comes from (PROTOCOL.md 14).
@Suite("Advertised API endpoints")
struct AdvertisedAPITests {
    @Test func onlyAnAPIOnThePeersHostIsDialled() {
        #expect(NodeMachine.sameHost("tcp://10.0.0.2:7101", "tcp://10.0.0.2:7001"))
        #expect(!NodeMachine.sameHost("tcp://10.9.9.9:22", "tcp://10.0.0.2:7001"))
        #expect(
            NodeMachine.sameHost("tcp://10.0.0.2:7101", "tcp://node2.example:7001"), "a host name cannot be compared")
        #expect(
            NodeMachine.sameHost("inproc://n2.api", "inproc://n2")
                && !NodeMachine.sameHost("tcp://1.2.3.4:1", "ipc:///x"))

        var configuration = MachineRunner.configuration("n1")
        configuration.peers = ["tcp://10.0.0.2:7001"]
        var node = MachineRunner(configuration)
        func beat(api: String) -> [[UInt8]] {
            PeerMessage.heartbeat(
                PeerMessage.Heartbeat(node: "n2", latestSequence: 0, clock: 0, incarnation: 1, api: api)
            )
            .encode()
        }
        node.handle(.peerMessage(peer: "tcp://10.0.0.2:7001", frames: beat(api: "tcp://10.9.9.9:22")))
        node.advance(60)
        #expect(node.repairLinksConnected.isEmpty, "not dialled")
        #expect(node.machine.counters.foreignRepairEndpoints == 1)
        node.handle(.peerMessage(peer: "tcp://10.0.0.2:7001", frames: beat(api: "tcp://10.0.0.2:7101")))
        node.advance(60)
        #expect(node.repairLinksConnected == ["tcp://10.0.0.2:7001"])
    }
}
