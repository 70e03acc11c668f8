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
}
