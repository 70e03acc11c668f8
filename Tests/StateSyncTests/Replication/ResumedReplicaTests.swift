import Testing

@testable import StateSync

/// A watch resumed from a cursor alone (`statesync watch --from`, or a client's
/// `ChannelReplica(channel:cursor:)`) holds nothing of the state at the cursor: a deletion of a
/// property or model it holds no value of still happened after the cursor, and must be reported,
/// or a consumer resuming that way keeps the deleted value for good (a new user's trial found
/// `watch --from` printing nothing for `delete c3/m x`).
@Suite("A replica resumed from a cursor")
struct ResumedReplicaTests {
    static func version(_ milliseconds: UInt64) -> Version {
        Version(milliseconds: milliseconds, counter: 0, node: "n1")
    }

    static func delta(_ model: String, at milliseconds: UInt64, sequence: UInt64, _ writes: [PropertyWrite]) -> Delta {
        Delta(channel: "c", model: model, version: version(milliseconds), sequence: sequence, properties: writes)
    }

    @Test func deletionsOfWhatItNeverHeldAreReportedUntilASnapshotFillsIt() throws {
        let replica = ChannelReplica(channel: "c", cursor: WatchCursor(["n1": 12]))
        var session = WatchSession(replica: replica)
        func changes(_ delta: Delta) throws -> [PropertyChange] {
            try session.handle(.delta(delta, cursor: WatchCursor(["n1": delta.sequence])), from: "test").compactMap {
                if case .change(let change, _, _) = $0 { change } else { nil }
            }
        }
        // A property deleted, another set, in one write: both reported, the deletion with no old.
        let first = try changes(
            Self.delta("m", at: 1000, sequence: 13, [.deletion(of: "x"), .init(name: "y", value: .int(2))]))
        #expect(first.map(\.property) == ["x", "y"])
        #expect(first[0].kind == .deleted && first[0].old == nil && first[0].new == .null)
        #expect(first[1].kind != .deleted && first[1].new == .int(2))
        // A deletion that loses to what the replica holds changed nothing after the cursor.
        #expect(try changes(Self.delta("m", at: 900, sequence: 14, [.deletion(of: "y")])).isEmpty)
        // A whole model it never saw: one change, the empty property name, no old value.
        let model = try changes(Self.delta("gone", at: 1100, sequence: 15, [.modelDeletion]))
        #expect(model.count == 1)
        #expect(model.first?.property == "" && model.first?.byModelDeletion == true && model.first?.old == nil)
        #expect(model.first?.kind == .deleted)
        // Seen again (a watch resumed with this replica gets the deltas above its cursor once
        // more): nothing twice.
        #expect(
            try changes(
                Self.delta("m", at: 1000, sequence: 13, [.deletion(of: "x"), .init(name: "y", value: .int(2))])
            )
            .isEmpty)
        #expect(try changes(Self.delta("gone", at: 1100, sequence: 15, [.modelDeletion])).isEmpty)
        // A deletion of what it deleted already, later: nothing it held changed.
        #expect(try changes(Self.delta("m", at: 1150, sequence: 16, [.deletion(of: "x")])).isEmpty)
        // A whole model it holds part of: its properties, as any replica reports them, and the
        // model's line for the properties it never held.
        let held = try changes(Self.delta("m", at: 1200, sequence: 17, [.modelDeletion]))
        #expect(held.map(\.property) == ["y", ""] && held[0].old == .int(2) && held[1].byModelDeletion)

        // A resync's snapshot gives it the whole state: from then on, deleting what it holds no
        // value of is a no-op again, as in any replica.
        _ = try session.handle(.snapshotBegin(.lagged), from: "test")
        _ = try session.handle(
            .snapshotEnd(records: 0, digest: RegisterDigest().value, cursor: WatchCursor(["n1": 17])), from: "test")
        #expect(try changes(Self.delta("m", at: 1300, sequence: 18, [.deletion(of: "z")])).isEmpty)
    }

    /// A replica that holds the state it resumes from (a fresh watch, or one read back from its
    /// file) reports no deletion of what it never held: nothing anyone saw changed.
    @Test func aReplicaHoldingItsStateReportsNoDeletionOfWhatItNeverHeld() throws {
        let fresh = ChannelReplica(channel: "c")
        #expect(fresh.apply(Self.delta("m", at: 1000, sequence: 1, [.deletion(of: "x")])).changes.isEmpty)
        let resumed = ChannelReplica(channel: "c", cursor: WatchCursor(["n1": 3]))
        let back = try ChannelReplica(decoding: resumed.encoded())
        #expect(back.apply(Self.delta("m", at: 1000, sequence: 4, [.deletion(of: "x")])).changes.isEmpty)
        #expect(resumed.apply(Self.delta("m", at: 1000, sequence: 4, [.deletion(of: "x")])).changes.count == 1)
    }
}
