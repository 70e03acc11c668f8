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
}
