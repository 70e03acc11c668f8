import Foundation
import StateSync
import StateSyncClient
import Testing

/// `statesync watch --state FILE`'s record of what it printed (`WatchState`, in StateSyncClient),
/// fed the events a watch prints, read back from its file.
@Suite("Watch state file")
struct WatchStateFileTests {
    static func change(_ property: String, _ value: Int64, at milliseconds: UInt64, by node: String) -> PropertyChange {
        PropertyChange(
            channel: "c", model: "m", property: property, old: nil, new: .int(value),
            version: Version(milliseconds: milliseconds, counter: 0, node: node))
    }

    /// A `reset` snapshot replaces what the watch holds with the node's state, and moves its
    /// cursor back where the node lost deltas (PROTOCOL.md 10.5.8): the file does the same.
    /// Before, its cursor moved only forwards (a watch resumed from the file named a cursor
    /// covering deltas the node would send again, which it then skipped), and the reset's
    /// removals, which carry no version, were recorded as writes that lost to the values they
    /// removed (the file kept writes the node no longer holds).
    @Test func aResetMovesTheFilesCursorBackAsTheWatchsOwn() throws {
        let directory = NSTemporaryDirectory() + "statesync-watch-state-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/watch.state"
        let state = try WatchState(path: path, channel: "c")
        let printed = { (event: WatchEvent) in state.printing(event) {} }

        func saved() throws -> ChannelReplica {
            try ChannelReplica(decoding: Array(try Data(contentsOf: URL(fileURLWithPath: path))))
        }
        let before = WatchCursor(["n2": 5])
        printed(.initialStateComplete(records: 0, cursor: WatchCursor(["n2": 0])))
        printed(.change(Self.change("a", 1, at: 1_000, by: "n2"), kind: .live, cursor: WatchCursor(["n2": 4])))
        printed(.change(Self.change("b", 2, at: 1_001, by: "n2"), kind: .live, cursor: before))
        printed(.caughtUp(cursor: before, latest: nil, nodeMissing: 0))
        #expect(try saved().cursor["n2"] == 5)

        // The node lost n2's 4 and 5 (it holds 3, where a was 0 and b unset): its reset
        // snapshot (what differs removed first, with no version; then its records), its cursor.
        printed(.resyncStarted(.reset))
        for (property, old) in [("a", Value.int(1)), ("b", .int(2))] {
            let removal = PropertyChange(
                channel: "c", model: "m", property: property, old: old, new: .null, version: .zero, kind: .deleted)
            printed(.change(removal, kind: .resync, cursor: before))
        }
        printed(.change(Self.change("a", 0, at: 900, by: "n2"), kind: .resync, cursor: before))
        printed(.resyncComplete(records: 1, cursor: WatchCursor(["n2": 3])))
        #expect(try saved().cursor["n2"] == 3, "resumed, the watch is sent 4 and 5 again when the node has them back")
        #expect(
            try saved().properties(of: "m").mapValues(\.value) == ["a": .int(0)], "the file holds what the node holds")

        // A lagged snapshot's end moves the cursor only forwards, as every marker does.
        printed(.resyncStarted(.lagged))
        printed(.resyncComplete(records: 1, cursor: WatchCursor(["n2": 2])))
        printed(.caughtUp(cursor: WatchCursor(["n2": 2]), latest: nil, nodeMissing: 0))
        state.saveNow()
        #expect(try saved().cursor["n2"] == 3)
    }

    /// What a `reset` changes without a line to print is in the file too: a deletion the watch
    /// held over the node's older value (the value is printed, but recorded after the deletion it
    /// would lose to), and a deletion's record the node no longer holds (dropped in silence).
    /// The file takes what the watch's replica held at the reset's end. Events pass through the
    /// `WatchSession` the client runs, on the file's live replica, as `statesync watch` does.
    @Test func aResetsSilentRemovalsLeaveTheFileToo() throws {
        let directory = NSTemporaryDirectory() + "statesync-watch-state-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/watch.state"
        let state = try WatchState(path: path, channel: "c")
        var session = WatchSession(replica: state.liveReplica)
        func deliver(_ event: ClientProtocol.WatchEventBody) throws {
            for printed in try session.handle(event, from: "test") { state.printing(printed) {} }
        }
        func snapshot(
            _ reason: ClientProtocol.SnapshotReason, _ records: [(String, ReplicaStore.Register)], cursor: WatchCursor
        ) throws {
            var digest = RegisterDigest()
            for (name, register) in records {
                digest.add(channel: "c", model: "m", property: name, register: register)
            }
            try deliver(.snapshotBegin(reason))
            try deliver(.records([(model: "m", properties: records)]))
            try deliver(.snapshotEnd(records: records.count, digest: digest.value, cursor: cursor))
        }
        func version(_ milliseconds: UInt64) -> Version { Version(milliseconds: milliseconds, counter: 0, node: "n2") }
        func saved() throws -> ChannelReplica {
            try ChannelReplica(decoding: Array(try Data(contentsOf: URL(fileURLWithPath: path))))
        }

        let a = ReplicaStore.Register(value: .int(1), version: version(1_000))
        try snapshot(.initial, [("a", a)], cursor: WatchCursor(["n2": 1]))
        // n2's 2 deletes a, its 3 deletes b (which never had a value here).
        for (sequence, property, at) in [(UInt64(2), "a", UInt64(1_100)), (3, "b", 1_200)] {
            let deletion = Delta(
                channel: "c", model: "m", version: version(at), sequence: sequence,
                properties: [.deletion(of: property)])
            try deliver(.delta(deletion, cursor: WatchCursor(["n2": sequence])))
        }
        try deliver(.caughtUp(cursor: WatchCursor(["n2": 3]), latest: nil, missing: 0))
        #expect(try saved().records(of: "m")["a"]?.isDeleted == true)

        // The node lost n2's 2 and 3: it holds a = 1 again, and nothing of b.
        try snapshot(.reset, [("a", a)], cursor: WatchCursor(["n2": 1]))
        state.saveNow()
        let file = try saved()
        #expect(file.cursor == WatchCursor(["n2": 1]))
        #expect(file.records(of: "m") == ["a": a], "the file holds what the node and the watch hold")
        #expect(file.records(of: "m") == state.liveReplica.records(of: "m"))
    }
}
