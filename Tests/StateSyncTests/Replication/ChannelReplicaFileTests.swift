import Testing

@testable import StateSync

/// The watch state file (`statesync watch --state`): a replica written and read back exactly.
@Suite("Channel replica file")
struct ChannelReplicaFileTests {
    @Test func aReplicaReadsBackExactlyAndADamagedFileIsRefused() throws {
        let replica = ChannelReplica(channel: "demo", cursor: WatchCursor(["n1": 12, "n2": 7]))
        let values: [Value] = [
            .null, .bool(true), .int(-3), .double(1.0), .string("é"), .bytes([0, 255]),
            .array([.int(1), .double(2.5)]),
            .map(["k": .string("v")]),
        ]
        for (index, value) in values.enumerated() {
            _ = replica.apply(
                model: "m\(index % 3)", property: "p\(index)",
                register: .init(
                    value: value, version: Version(milliseconds: 1000 + UInt64(index), counter: 0, node: "n1")))
        }
        let bytes = replica.encoded()
        let back = try ChannelReplica(decoding: bytes)
        #expect(back.channel == "demo" && back.cursor == replica.cursor)
        #expect(Set(back.models) == Set(replica.models))
        for model in replica.models { #expect(back.properties(of: model) == replica.properties(of: model)) }
        #expect(back.encoded() == bytes, "the same replica writes the same bytes")

        var damaged = bytes
        damaged[damaged.count / 2] ^= 0x40
        #expect(throws: WireError.self) { try ChannelReplica(decoding: damaged) }
        #expect(throws: WireError.self) { try ChannelReplica(decoding: Array(bytes.dropLast(3))) }
        #expect(throws: WireError.self) { try ChannelReplica(decoding: Array("SSNAP2\n whatever".utf8)) }
    }

    /// What a replica took above its cursor (a delta the node sent above a gap, PROTOCOL.md
    /// 10.5.1 bit 5) goes into its file and comes back, also through a copy that records the
    /// printed changes one by one as `statesync watch --state` does (it holds the number once
    /// every line of the delta is printed): a watch resumed from the file names it, so that a node
    /// that lost it sends a `reset` rather than leave the file holding a write no node holds (the
    /// simulator's seed 1794, with the client restarted).
    @Test func whatAReplicaHoldsAboveItsCursorIsKeptInItsFile() throws {
        let live = ChannelReplica(channel: "c", cursor: WatchCursor(["n2": 1]))
        let printed = ChannelReplica(channel: "c", cursor: WatchCursor(["n2": 1]))
        for sequence: UInt64 in [3, 5] {
            let delta = Delta(
                channel: "c", model: "m", version: Version(milliseconds: 1_000 + sequence, counter: 0, node: "n2"),
                sequence: sequence, properties: [PropertyWrite(name: "p\(sequence)", value: .int(Int64(sequence)))])
            for change in live.apply(delta).changes {
                #expect(change.takenAbove?.origin == "n2" && change.takenAbove?.sequence == sequence)
                var plain = change
                plain.takenAbove = nil
                #expect(plain == change, "how a change was taken is not part of what changed")
                printed.record(change)
                if let (origin, sequence) = change.takenAbove { printed.holdAbove(sequence, of: origin) }
            }
        }
        #expect(live.heldAbove == ["n2": [3, 5]])
        #expect(printed.heldAbove == ["n2": [3, 5]], "the printed copy holds what it printed above its cursor")

        let back = try ChannelReplica(decoding: printed.encoded())
        #expect(back.heldAbove == ["n2": [3, 5]] && back.cursor == printed.cursor)
        #expect(back.properties(of: "m") == printed.properties(of: "m"))
        // The cursor moving past a number ends it, in the file too.
        back.advance(to: WatchCursor(["n2": 3]))
        #expect(try ChannelReplica(decoding: back.encoded()).heldAbove == ["n2": [5]])

        // A file written before the section existed (SSREPL1) still reads, holding nothing above.
        var legacy = WireWriter(capacity: 64)
        for byte in ChannelReplica.legacyFileMagic { legacy.byte(byte) }
        legacy.string("c")
        StateSnapshot.writeProgress(["n2": 4], to: &legacy)
        legacy.varint(0)
        legacy.uint64(StateSnapshot.fnv1a(legacy.bytes))
        let old = try ChannelReplica(decoding: legacy.bytes)
        #expect(old.cursor["n2"] == 4 && old.heldAbove.isEmpty)

        // Not as written (a damaged or foreign file), refused: a number at or below the cursor,
        // a number twice, origins out of order.
        func file(_ held: [(String, [UInt64])]) -> [UInt8] {
            var w = WireWriter(capacity: 64)
            for byte in ChannelReplica.fileMagic { w.byte(byte) }
            w.string("c")
            StateSnapshot.writeProgress(["n2": 4], to: &w)
            w.varint(0)
            w.varint(UInt64(held.count))
            for (origin, sequences) in held {
                w.string(origin)
                w.varint(UInt64(sequences.count))
                for sequence in sequences { w.varint(sequence) }
            }
            w.uint64(StateSnapshot.fnv1a(w.bytes))
            return w.bytes
        }
        #expect(
            try ChannelReplica(decoding: file([("n1", [2]), ("n2", [6, 9])])).heldAbove == ["n1": [2], "n2": [6, 9]])
        let refused: [[(String, [UInt64])]] = [
            [("n2", [4])], [("n2", [6, 6])], [("n2", [6]), ("n1", [2])], [("n2", [6]), ("n2", [7])],
        ]
        for wrong in refused {
            #expect(throws: WireError.self, "\(wrong)") { try ChannelReplica(decoding: file(wrong)) }
        }
    }
}
