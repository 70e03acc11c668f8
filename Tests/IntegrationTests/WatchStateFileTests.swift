import Foundation
import StateSync
import StateSyncClient
import Synchronization
import Testing

/// `statesync watch --state FILE`'s record of what it printed (`WatchState`, in StateSync),
/// fed the events a watch prints, read back from its file.
@Suite("Watch state file")
struct WatchStateFileTests {
    static func change(_ property: String, _ value: Int64, at milliseconds: UInt64, by node: String) -> PropertyChange {
        PropertyChange(
            channel: "c", model: "m", property: property, old: nil, new: .int(value),
            version: version(milliseconds, node))
    }

    /// A `reset` snapshot replaces what the watch holds with the node's state, and moves its
    /// cursor back where the node lost deltas (PROTOCOL.md 10.5.8): the file does the same.
    /// Before, its cursor moved only forwards (a watch resumed from the file named a cursor
    /// covering deltas the node would send again, which it then skipped), and the reset's
    /// removals, which carry no version, were recorded as writes that lost to the values they
    /// removed (the file kept writes the node no longer holds).
    @Test func aResetMovesTheFilesCursorBackAsTheWatchsOwn() throws {
        let watch = try WatchedFile()
        let state = watch.state
        let printed = { (event: WatchEvent) in state.printing(event) {} }

        let before = WatchCursor(["n2": 5])
        printed(.initialStateComplete(records: 0, cursor: WatchCursor(["n2": 0])))
        printed(.change(Self.change("a", 1, at: 1_000, by: "n2"), kind: .live, cursor: WatchCursor(["n2": 4])))
        printed(.change(Self.change("b", 2, at: 1_001, by: "n2"), kind: .live, cursor: before))
        printed(.caughtUp(cursor: before, latest: nil, nodeMissing: 0))
        #expect(try watch.saved().cursor["n2"] == 5)

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
        #expect(
            try watch.saved().cursor["n2"] == 3, "resumed, the watch is sent 4 and 5 again when the node has them back")
        #expect(
            try watch.saved().properties(of: "m").mapValues(\.value) == ["a": .int(0)],
            "the file holds what the node holds")

        // A lagged snapshot's end moves the cursor only forwards, as every marker does.
        printed(.resyncStarted(.lagged))
        printed(.resyncComplete(records: 1, cursor: WatchCursor(["n2": 2])))
        printed(.caughtUp(cursor: WatchCursor(["n2": 2]), latest: nil, nodeMissing: 0))
        state.saveNow()
        #expect(try watch.saved().cursor["n2"] == 3)
    }

    /// What a `reset` changes without a line to print is in the file too: a deletion the watch
    /// held over the node's older value (the value is printed, but recorded after the deletion it
    /// would lose to), and a deletion's record the node no longer holds (dropped in silence).
    /// The file takes what the watch's replica held at the reset's end. Events pass through the
    /// `WatchSession` the client runs, on the file's live replica, as `statesync watch` does.
    @Test func aResetsSilentRemovalsLeaveTheFileToo() throws {
        let watch = try WatchedFile()
        let state = watch.state
        let a = ReplicaStore.Register(value: .int(1), version: version(1_000))
        try watch.snapshot(.initial, [("a", a)], end: WatchCursor(["n2": 1]))
        // n2's 2 deletes a, its 3 deletes b (which never had a value here).
        for (sequence, property, at) in [(UInt64(2), "a", UInt64(1_100)), (3, "b", 1_200)] {
            let deletion = Delta(
                channel: "c", model: "m", version: version(at), sequence: sequence,
                properties: [.deletion(of: property)])
            try watch.deliver(.delta(deletion, cursor: WatchCursor(["n2": sequence])))
        }
        try watch.deliver(.caughtUp(cursor: WatchCursor(["n2": 3]), latest: nil, missing: 0))
        #expect(try watch.saved().records(of: "m")["a"]?.isDeleted == true)

        // The node lost n2's 2 and 3: it holds a = 1 again, and nothing of b.
        try watch.snapshot(.reset, [("a", a)], end: WatchCursor(["n2": 1]))
        state.saveNow()
        let file = try watch.saved()
        #expect(file.cursor == WatchCursor(["n2": 1]))
        #expect(file.records(of: "m") == ["a": a], "the file holds what the node and the watch hold")
        #expect(file.records(of: "m") == state.liveReplica.records(of: "m"))
    }

    /// What a delta or a snapshot changes without a line to print (the deletion of a property or
    /// a model the watch never saw with a value) is in the file too, once the watch's cursor is
    /// past it: a watch resumed from the file then takes an older write as the live one does
    /// (it lost to the deletion, no line) instead of printing it as the property's value. Before,
    /// the file held only what was printed, and the resumed watch printed `b: 5` although the
    /// node (and the live watch) held `b` deleted.
    @Test func whatChangesWithoutALineIsInTheFileToo() throws {
        let watch = try WatchedFile()
        let state = watch.state
        func delta(
            _ model: String, _ writes: [PropertyWrite], at milliseconds: UInt64, _ origin: String, _ sequence: UInt64
        )
            -> Delta
        {
            Delta(
                channel: "c", model: model, version: version(milliseconds, origin), sequence: sequence,
                properties: writes)
        }

        // The initial snapshot: a = 1, and the record of x's deletion (x never had a value here).
        let a = ReplicaStore.Register(value: .int(1), version: version(1_000))
        let x = ReplicaStore.Register.tombstone(version(1_050))
        try watch.snapshot(.initial, [("a", a), ("x", x)], end: WatchCursor(["n2": 1]))
        // n2's 2 deletes b of m and sets a (one line); its 3 deletes model z (never seen); its 5
        // (above a gap: 4 is missing) deletes y.
        try watch.deliver(
            .delta(
                delta("m", [.deletion(of: "b"), PropertyWrite(name: "a", value: .int(2))], at: 1_200, "n2", 2),
                cursor: WatchCursor(["n2": 2])))
        try watch.deliver(.delta(delta("z", [.modelDeletion], at: 1_300, "n2", 3), cursor: WatchCursor(["n2": 3])))
        try watch.deliver(.delta(delta("m", [.deletion(of: "y")], at: 1_500, "n2", 5), cursor: WatchCursor(["n2": 3])))
        try watch.deliver(.caughtUp(cursor: WatchCursor(["n2": 3]), latest: nil, missing: 1))
        var file = try watch.saved()
        #expect(file.cursor == WatchCursor(["n2": 3]))
        #expect(file.records(of: "m")["b"] == .tombstone(version(1_200)), "a deletion with no line, its delta covered")
        #expect(file.records(of: "m")["x"] == x, "a snapshot's record with no line")
        #expect(file.records(of: "z")[""] == .tombstone(version(1_300)), "a model's deletion with no line")
        #expect(file.records(of: "m")["y"] == .tombstone(version(1_500)), "5, above the gap, with 3 (its cursor)")
        #expect(file.heldAbove == ["n2": [5]], "and the file names 5: a watch resumed from it is not sent 5 again")

        // 4 fills the gap: the cursor covers 5 now.
        try watch.deliver(
            .delta(
                delta("m", [PropertyWrite(name: "c", value: .int(4))], at: 1_400, "n2", 4),
                cursor: WatchCursor(["n2": 5])))
        try watch.deliver(.caughtUp(cursor: WatchCursor(["n2": 5]), latest: nil, missing: 0))
        file = try watch.saved()
        #expect(file.records(of: "m") == state.liveReplica.records(of: "m"))
        #expect(file.records(of: "z") == state.liveReplica.records(of: "z"))

        // Resumed from the file, older writes of n3 that lost to those deletions print nothing,
        // as they print nothing on the live watch.
        var resumed = WatchSession(replica: file)
        var live = watch.session
        for (sequence, model, property, at) in [
            (UInt64(1), "m", "b", UInt64(1_150)), (2, "m", "x", 1_040), (3, "z", "q", 1_250), (4, "m", "y", 1_450),
        ] {
            let older = delta(model, [PropertyWrite(name: property, value: .int(5))], at: at, "n3", sequence)
            let position = WatchCursor(["n2": 5, "n3": sequence])
            let fromFile = try resumed.handle(.delta(older, cursor: position), from: "test")
            let fromLive = try live.handle(.delta(older, cursor: position), from: "test")
            #expect(fromLive.isEmpty)
            #expect(fromFile.isEmpty, "\(model).\(property) = 5 at \(at) lost to a deletion the file holds")
        }
    }

    /// A `reset` snapshot's end gives the file the watch's whole replica: the silent records taken
    /// before it are in that image and are dropped; one taken after it is recorded, even when the
    /// watch applied it before the lines of the reset (and of a delta before it) were printed,
    /// whose cursors cover the reset's (it moved the cursor back). Printing lags the watch's
    /// replica, as in `statesync watch`: all the events are applied first, then printed.
    @Test func aSilentRecordAfterAResetIsRecordedAfterItsImage() throws {
        let watch = try WatchedFile()
        let state = watch.state
        var unprinted: [WatchEvent] = []
        func deliver(_ event: ClientProtocol.WatchEventBody) throws { unprinted += try watch.apply(event) }
        func delta(_ sequence: UInt64, _ write: PropertyWrite, at milliseconds: UInt64) -> ClientProtocol.WatchEventBody
        {
            .delta(
                Delta(
                    channel: "c", model: "m", version: version(milliseconds), sequence: sequence, properties: [write]),
                cursor: WatchCursor(["n2": sequence]))
        }
        try deliver(.snapshotBegin(.initial))
        try deliver(.snapshotEnd(records: 0, digest: RegisterDigest().value, cursor: WatchCursor(["n2": 1])))
        // 2 deletes x (no value: silent), 3 sets a.
        try deliver(delta(2, .deletion(of: "x"), at: 1_200))
        try deliver(delta(3, PropertyWrite(name: "a", value: .int(1)), at: 1_300))
        // The node was reset to n2's 1, with nothing: a goes, x's deletion with it.
        try deliver(.snapshotBegin(.reset))
        try deliver(.snapshotEnd(records: 0, digest: RegisterDigest().value, cursor: WatchCursor(["n2": 1])))
        // Its new 2 deletes y (no value: silent).
        try deliver(delta(2, .deletion(of: "y"), at: 1_400))
        try deliver(.caughtUp(cursor: WatchCursor(["n2": 2]), latest: nil, missing: 0))
        for event in unprinted { state.printing(event) {} }
        state.saveNow()
        let file = try watch.saved()
        #expect(file.cursor == WatchCursor(["n2": 2]))
        #expect(file.records(of: "m") == ["y": .tombstone(version(1_400))])
        #expect(file.records(of: "m") == state.liveReplica.records(of: "m"))
    }

    /// An expiry printed is in the file (before, the file kept the value: an expiry keeps its
    /// write's version, and did not win over it), so a watch resumed from the file does not print
    /// it again at its first caught-up marker. And a resync snapshot that deletes several models
    /// leaves all their deletions in the file, not only the last one's.
    @Test func expiriesAndSeveralModelsDeletedInOneSnapshotAreInTheFile() throws {
        let watch = try WatchedFile()

        // a and b of models m and n, and t of m with a time to live of 100 ms.
        let value = { (milliseconds: UInt64) in ReplicaStore.Register(value: .int(1), version: version(milliseconds)) }
        let t = ReplicaStore.Register(value: .int(7), version: version(1_000), timeToLive: 100)
        try watch.snapshot(
            .initial, models: [("m", [("a", value(1_000)), ("t", t)]), ("n", [("b", value(1_000))])],
            end: WatchCursor(["n2": 1]))
        try watch.deliver(.caughtUp(cursor: WatchCursor(["n2": 1]), latest: nil, missing: 0, expiredThrough: 1_200))
        #expect(try watch.saved().records(of: "m")["t"]?.isDeleted == true, "t expired, and the file says so")

        // Resumed from the file, the first marker expires nothing more: t's expiry was printed.
        var resumed = WatchSession(replica: try watch.saved())
        let again = try resumed.handle(
            .caughtUp(cursor: WatchCursor(["n2": 1]), latest: nil, missing: 0, expiredThrough: 1_300), from: "test")
        #expect(again.count == 1, "only the marker: \(again)")

        // The watch lagged: its resync snapshot has both models deleted at 1,500.
        try watch.snapshot(
            .lagged, models: [("m", [("", .tombstone(version(1_500)))]), ("n", [("", .tombstone(version(1_500)))])],
            end: WatchCursor(["n2": 5]))
        try watch.deliver(.caughtUp(cursor: WatchCursor(["n2": 5]), latest: nil, missing: 0, expiredThrough: 1_300))
        let file = try watch.saved()
        #expect(file.records(of: "m")[""] == .tombstone(version(1_500)))
        #expect(file.records(of: "n")[""] == .tombstone(version(1_500)))
    }

    /// A delta the node sent above a gap is named by the file (held above its cursor) only once
    /// every line of it is printed, and with what it changed without a line (a model's own
    /// deletion): a watch resumed from a file that names it is not sent it again. Saved while its
    /// lines were being printed (a save every 200 ms, here at every line), the file does not name
    /// it, and a resumed watch gets it again.
    @Test func aDeltaAboveAGapIsNamedOnlyWhenAllOfItIsInTheFile() throws {
        let saves = Mutex<[[UInt8]]>([])
        let clock = Mutex<UInt64>(0)
        let state = try WatchState(
            path: "(memory)", channel: "c", saved: nil,
            milliseconds: {
                clock.withLock {
                    $0 += 300
                    return $0
                }
            },
            write: { bytes in saves.withLock { $0.append(bytes) } })
        let watch = try WatchedFile(state)
        let (a, b) = (
            ReplicaStore.Register(value: .int(1), version: version(1_000)),
            ReplicaStore.Register(value: .int(2), version: version(1_000))
        )
        try watch.snapshot(.initial, [("a", a), ("b", b)], end: WatchCursor(["n2": 3]))
        // 5 (4 is missing) deletes model m: two lines, a and b deleted, and m's own deletion.
        let deletion = Delta(
            channel: "c", model: "m", version: version(1_500), sequence: 5, properties: [.modelDeletion])
        let events = try watch.apply(.delta(deletion, cursor: WatchCursor(["n2": 3])))
        #expect(events.count == 2)
        state.printing(events[0]) {}
        let midway = try ChannelReplica(decoding: try #require(saves.withLock { $0.last }))
        #expect(midway.heldAbove.isEmpty, "saved with a line of 5 still to print: the file does not name 5")
        state.printing(events[1]) {}
        try watch.deliver(.caughtUp(cursor: WatchCursor(["n2": 3]), latest: nil, missing: 1))
        let file = try ChannelReplica(decoding: try #require(saves.withLock { $0.last }))
        #expect(file.heldAbove == ["n2": [5]])
        #expect(file.records(of: "m")[""] == .tombstone(version(1_500)), "named, 5 is in the file whole")
    }

    /// What a snapshot drops without a line leaves the file too: a `reset` snapshot's page drops a
    /// deletion the node no longer holds, and the reset is then replaced by a `lagged` snapshot
    /// (no reset image to take); a collected deletion drops a value written at the horizon
    /// itself (its removal carries the horizon as version, which would lose to that value).
    @Test func whatASnapshotDropsWithoutALineLeavesTheFile() throws {
        let watch = try WatchedFile()
        let state = watch.state
        let x = ReplicaStore.Register.tombstone(version(1_200))
        let b = ReplicaStore.Register(value: .int(2), version: Version(timestamp: 5_000 << 16, node: "n2"))
        try watch.snapshot(.initial, [("x", x), ("b", b)], end: WatchCursor(["n2": 3]))
        try watch.deliver(.caughtUp(cursor: WatchCursor(["n2": 3]), latest: nil, missing: 0))
        #expect(try watch.saved().records(of: "m")["x"] == x)

        // A reset's page has b alone: the watch drops x's deletion (no line). The reset is
        // replaced by a lagged snapshot (b alone too), and then n3 writes x, older than that
        // deletion: the watch takes it (a line), and so must the file.
        try watch.snapshot(.reset, [("b", b)], end: nil)
        try watch.snapshot(.lagged, [("b", b)], end: WatchCursor(["n2": 6]))
        let older = Delta(
            channel: "c", model: "m", version: version(1_100, "n3"), sequence: 1,
            properties: [PropertyWrite(name: "x", value: .int(9))])
        try watch.deliver(.delta(older, cursor: WatchCursor(["n2": 6, "n3": 1])))
        try watch.deliver(.caughtUp(cursor: WatchCursor(["n2": 6, "n3": 1]), latest: nil, missing: 0))
        #expect(try watch.saved().records(of: "m")["x"]?.value == .int(9))
        // A lagged snapshot whose end collects through b's own time: b goes (a line whose
        // version is the horizon, no writer's), from the file too.
        let x9 = try #require(state.liveReplica.records(of: "m")["x"])
        try watch.snapshot(
            .lagged, [("x", x9)], end: WatchCursor(["n2": 6, "n3": 1]), collectedThrough: b.version.timestamp)
        try watch.deliver(.caughtUp(cursor: WatchCursor(["n2": 6, "n3": 1]), latest: nil, missing: 0))
        let file = try watch.saved()
        #expect(file.records(of: "m") == ["x": x9], "x as the node holds it, b collected")
        #expect(file.records(of: "m") == state.liveReplica.records(of: "m"))
    }

    /// A line of a `reset` snapshot's page replaces what the file holds of that property, as the
    /// watch dropped what it held first: an older value of the node's replaces the deletion the
    /// watch held (merged, it would lose to it), also when the reset is then replaced by a
    /// `lagged` snapshot and its image never comes.
    @Test func aResetsLineReplacesWhatTheFileHolds() throws {
        let watch = try WatchedFile()
        let state = watch.state
        let deletion = ReplicaStore.Register.tombstone(version(1_200))
        let older = ReplicaStore.Register(value: .int(9), version: version(1_100))
        try watch.snapshot(.initial, [("x", deletion)], end: WatchCursor(["n2": 6]))
        try watch.snapshot(.reset, [("x", older)], end: nil)
        try watch.snapshot(.lagged, [("x", older)], end: WatchCursor(["n2": 6]))
        try watch.deliver(.caughtUp(cursor: WatchCursor(["n2": 6]), latest: nil, missing: 0))
        let file = try watch.saved()
        #expect(file.records(of: "m") == ["x": older])
        #expect(file.records(of: "m") == state.liveReplica.records(of: "m"))
    }

    /// A `reset` given up (another snapshot begins before its end) ends there for the file too:
    /// the file takes what the watch then held. Here the watch held model m deleted; the reset's
    /// page drops that deletion (no line) and brings an older p (a line, which the deletion held
    /// by the file would otherwise keep out), and a lagged snapshot replaces the reset.
    @Test func aResetGivenUpLeavesTheFileAsTheWatch() throws {
        let watch = try WatchedFile()
        let state = watch.state
        try watch.snapshot(
            .initial, [("p", ReplicaStore.Register(value: .int(1), version: version(1_000)))],
            end: WatchCursor(["n2": 1]))
        let deletion = Delta(
            channel: "c", model: "m", version: version(1_500), sequence: 2, properties: [.modelDeletion])
        try watch.deliver(.delta(deletion, cursor: WatchCursor(["n2": 2])))
        try watch.deliver(.caughtUp(cursor: WatchCursor(["n2": 2]), latest: nil, missing: 0))
        let older = ReplicaStore.Register(value: .int(9), version: version(1_200))
        try watch.snapshot(.reset, [("p", older)], end: nil)
        try watch.snapshot(.lagged, [("p", older)], end: WatchCursor(["n2": 6]))
        try watch.deliver(.caughtUp(cursor: WatchCursor(["n2": 6]), latest: nil, missing: 0))
        let file = try watch.saved()
        #expect(file.records(of: "m") == ["p": older])
        #expect(file.records(of: "m") == state.liveReplica.records(of: "m"))
    }
}

/// A watch's version of `node` (n2 unless said) at `milliseconds`.
private func version(_ milliseconds: UInt64, _ node: String = "n2") -> Version {
    Version(milliseconds: milliseconds, counter: 0, node: node)
}

/// `statesync watch --state FILE` in a test: the file in a directory of its own (removed at the
/// end), and the watch's session, on the file's live replica as the client's, whose events are
/// printed as they come (``deliver(_:)``) or later (``apply(_:)``).
private final class WatchedFile {
    let directory: String?
    let state: WatchState
    var session: WatchSession

    /// A new file of channel `c`.
    init() throws {
        let directory = NSTemporaryDirectory() + "statesync-watch-state-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        self.directory = directory
        state = try WatchState(path: directory + "/watch.state", channel: "c")
        session = WatchSession(replica: state.liveReplica)
    }

    /// A watch on `state`, kept where it says.
    init(_ state: WatchState) throws {
        directory = nil
        self.state = state
        session = WatchSession(replica: state.liveReplica)
    }

    deinit {
        if let directory { try? FileManager.default.removeItem(atPath: directory) }
    }

    /// Applies `event` to the watch's replica and prints what it means.
    func deliver(_ event: ClientProtocol.WatchEventBody) throws {
        for printed in try apply(event) { state.printing(printed) {} }
    }

    /// Applies `event` to the watch's replica; returns what it means, not printed.
    func apply(_ event: ClientProtocol.WatchEventBody) throws -> [WatchEvent] {
        try session.handle(event, from: "test")
    }

    /// Delivers a snapshot of model `m`'s `records` (see ``snapshot(_:models:end:collectedThrough:)``).
    func snapshot(
        _ reason: ClientProtocol.SnapshotReason, _ records: [(String, ReplicaStore.Register)], end: WatchCursor?,
        collectedThrough: UInt64 = 0
    ) throws {
        try snapshot(reason, models: [("m", records)], end: end, collectedThrough: collectedThrough)
    }

    /// Delivers a snapshot of `models`: its start, one page, and its end at `end`, with its count
    /// and digest (nil: the snapshot is left without an end).
    func snapshot(
        _ reason: ClientProtocol.SnapshotReason, models: [(String, [(String, ReplicaStore.Register)])],
        end: WatchCursor?, collectedThrough: UInt64 = 0
    ) throws {
        var digest = RegisterDigest()
        for (model, records) in models {
            for (name, register) in records {
                digest.add(channel: "c", model: model, property: name, register: register)
            }
        }
        try deliver(.snapshotBegin(reason))
        try deliver(.records(models.map { (model: $0.0, properties: $0.1) }))
        guard let end else { return }
        try deliver(
            .snapshotEnd(
                records: models.reduce(0) { $0 + $1.1.count }, digest: digest.value, cursor: end,
                collectedThrough: collectedThrough))
    }

    /// The file, read back.
    func saved() throws -> ChannelReplica {
        try ChannelReplica(decoding: Array(try Data(contentsOf: URL(fileURLWithPath: state.path))))
    }
}
