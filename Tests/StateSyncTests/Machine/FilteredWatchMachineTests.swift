import Testing

@testable import StateSync

/// Filtered watches (PROTOCOL.md 10.5.1, flag bit 2) on the node machine: the node sends only
/// models with the prefix and the properties asked for, skips the initial state when asked, and
/// a resumed filtered watch continues exactly (its cursor moved over what was filtered out).
@Suite("Filtered watches on the node machine")
struct FilteredWatchMachineTests {
    static func changes(_ events: [ClientProtocol.WatchEventBody], session: inout WatchSession) throws
        -> [PropertyChange]
    {
        var changes: [PropertyChange] = []
        for event in events {
            for meaning in try session.handle(event, from: "n1") {
                if case .change(let change, _, _) = meaning { changes.append(change) }
            }
        }
        return changes
    }

    @Test func aFilteredWatchGetsOnlyWhatPassesAndResumesExactly() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        WatchMachineTests.set(&node, 1, ["t": 1, "h": 50], model: "sensor-1")
        WatchMachineTests.set(&node, 2, ["t": 9], model: "door-1")
        let filter = ClientProtocol.WatchFilter(prefix: "sensor-", properties: ["t"])
        #expect(
            node.request(.watch, id: 10, ClientProtocol.encodeWatch(channel: "c", from: nil, filter: filter))?.0.kind
                == .ok)
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        var seen = try Self.changes(node.events(watch: 10), session: &session)
        #expect(seen.map { "\($0.model).\($0.property)=\($0.new)" } == ["sensor-1.t=1"], "initial state, filtered")

        let before = node.sent.count
        WatchMachineTests.set(&node, 3, ["t": 2, "h": 51], model: "sensor-1")  // h filtered out
        WatchMachineTests.set(&node, 4, ["t": 8], model: "door-1")  // model filtered out
        WatchMachineTests.set(&node, 5, ["h": 52], model: "sensor-2")  // nothing passes
        WatchMachineTests.set(&node, 6, ["t": 3], model: "sensor-2")
        node.advance(1)
        seen = try Self.changes(node.events(watch: 10, from: before), session: &session)
        #expect(
            seen.map { "\($0.model).\($0.property):\($0.old.map { "\($0)" } ?? "nil")->\($0.new)" } == [
                "sensor-1.t:1->2", "sensor-2.t:nil->3",
            ])
        #expect(session.replica.properties(of: "sensor-1").keys.sorted() == ["t"])

        // Resumed elsewhere from the replica's cursor: only what came after, filtered, and the
        // cursor covers the filtered-out deltas (none of them comes back).
        var other = MachineRunner(MachineRunner.configuration("n1"))
        for (index, (model, properties)) in [
            ("sensor-1", ["t": Value.int(1), "h": 50]), ("door-1", ["t": 9]), ("sensor-1", ["t": 2, "h": 51]),
            ("door-1", ["t": 8]), ("sensor-2", ["h": 52]), ("sensor-2", ["t": 3]), ("sensor-1", ["t": 4]),
            ("door-1", ["t": 7]),
        ].enumerated() {
            WatchMachineTests.set(&other, UInt64(index + 1), properties, model: model)
        }
        other.advance(1)
        #expect(
            other.request(
                .watch, id: 20,
                ClientProtocol.encodeWatch(channel: "c", from: session.replica.cursor, filter: filter))?.0.kind == .ok)
        let resumed = try Self.changes(other.events(watch: 20), session: &session)
        #expect(
            resumed.map { "\($0.model).\($0.property):\($0.old.map { "\($0)" } ?? "nil")->\($0.new)" } == [
                "sensor-1.t:2->4"
            ])
    }

    @Test func noInitialStateMeansChangesOnlyButAResyncStillSendsTheState() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        WatchMachineTests.set(&node, 1, ["t": 1], model: "m")
        let filter = ClientProtocol.WatchFilter(initialState: false)
        _ = node.request(.watch, id: 5, ClientProtocol.encodeWatch(channel: "c", from: nil, filter: filter))
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        var meanings: [WatchEvent] = []
        for event in node.events(watch: 5) { meanings += try session.handle(event, from: "n1") }
        #expect(meanings.contains { if case .initialStateComplete(0, _) = $0 { true } else { false } })
        #expect(!meanings.contains { if case .change = $0 { true } else { false } }, "no initial state")
        let before = node.sent.count
        WatchMachineTests.set(&node, 2, ["t": 2], model: "m")
        node.advance(1)
        let changes = try Self.changes(node.events(watch: 5, from: before), session: &session)
        #expect(changes.count == 1 && changes[0].new == 2 && changes[0].old == nil)
        // The filter survives its own wire form, and an old-style WATCH still decodes.
        let request = try ClientProtocol.decodeWatchRequest(
            ClientProtocol.encodeWatch(channel: "c", from: nil, filter: .init(prefix: "p", properties: ["a", "b"])))
        #expect(request.filter == .init(prefix: "p", properties: ["a", "b"], initialState: true))
        #expect(
            try ClientProtocol.decodeWatchRequest(ClientProtocol.encodeWatch(channel: "c", from: nil)).filter == nil)
        // Batched events (flag bit 3) travel alone and with a cursor and a filter; without the
        // flag a WATCH asks for one event per message.
        #expect(
            try ClientProtocol.decodeWatchRequest(
                ClientProtocol.encodeWatch(channel: "c", from: nil, batchedEvents: true)
            )
            .batchedEvents)
        let everythingAsked = try ClientProtocol.decodeWatchRequest(
            ClientProtocol.encodeWatch(
                channel: "c", from: WatchCursor(["n1": 4]), onLag: .end, filter: .init(prefix: "p"),
                batchedEvents: true))
        #expect(
            everythingAsked.batchedEvents && everythingAsked.cursor?.positions == ["n1": 4]
                && everythingAsked.onLag == .end && everythingAsked.filter?.prefix == "p")
        #expect(
            try !ClientProtocol.decodeWatchRequest(ClientProtocol.encodeWatch(channel: "c", from: nil)).batchedEvents)
        // An empty property set is "every property" on both sides, as count 0 is on the wire.
        let everything = ClientProtocol.WatchFilter(properties: [])
        #expect(everything.properties == nil && everything.passes(model: "m", property: "any"))
    }
}
