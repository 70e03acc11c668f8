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
}
