import StateSyncTesting
import Testing

@testable import StateSync

/// The one-append writer of a local delta's log payload must write exactly the bytes the
/// primitives write (recovery and the wire decode them by one definition).
@Suite("Delta payloads written in one append")
struct DeltaPayloadWriterTests {
    /// What ``DeltaLog/writePayload(_:to:)`` writes after `prefix`, and what the one-append writer
    /// writes (with where it says the model and body begin).
    private func both(_ delta: Delta, after prefix: [UInt8]) -> (
        expected: [UInt8], written: [UInt8], placement: DeltaPayloadWriter.Placement?
    ) {
        var reference = WireWriter()
        reference.bytes(prefix)
        DeltaLog.writePayload(delta, to: &reference)
        var fast = WireWriter()
        fast.bytes(prefix)
        let placement = DeltaPayloadWriter.append(delta, to: &fast)
        return (reference.bytes, fast.bytes, placement)
    }

    private func expectSameBytes(_ delta: Delta, seed: UInt64? = nil) {
        let prefix: [UInt8] = [0xEE, 0xEE, 0xEE]
        let (expected, written, placement) = both(delta, after: prefix)
        let context: Comment = "seed \(seed.map(String.init) ?? "-"), delta \(delta)"
        #expect(written == expected, context)
        guard let placement else {
            Issue.record("no placement for a delta without nested values; \(context)")
            return
        }
        // The model id and the body start where the primitives put them.
        var channel = WireWriter()
        channel.string(delta.channel)
        var model = WireWriter()
        model.string(delta.model)
        #expect(placement.model == prefix.count + channel.bytes.count, context)
        #expect(placement.body == placement.model + model.bytes.count, context)
        #expect(Array(written[placement.body...]) == PeerMessage.deltaBody(delta), context)
    }

    @Test func everyKindOfFlatValueIsWrittenAsThePrimitivesWriteIt() {
        let version = Version(milliseconds: 1_763_769_600_123, counter: 7, node: "node-1")
        let long = String(repeating: "é", count: 200)  // 400 UTF-8 bytes: a two-byte length
        let values: [Value] = [
            .null, .bool(true), .bool(false), .int(0), .int(-1), .int(63), .int(-64), .int(64), .int(.max), .int(.min),
            .double(0), .double(-0.0), .double(3.25), .double(.infinity), .string(""), .string("ünïcode ✓"),
            .string(long), .bytes([]), .bytes(Array(0...255)),
        ]
        for (index, value) in values.enumerated() {
            expectSameBytes(
                Delta(
                    channel: "chan", model: "m\(index)", version: version, sequence: UInt64(index) + 1,
                    properties: [PropertyWrite(name: "p", value: value)]))
        }
        // Deletions and times to live make a version-2 body, for every property in it.
        expectSameBytes(
            Delta(
                channel: "chan", model: "m", version: version, sequence: 1 << 40,
                properties: [
                    PropertyWrite(name: "a", value: .int(5)), .deletion(of: "b"),
                    PropertyWrite(name: "c", value: .string("x"), timeToLive: 1_000),
                    PropertyWrite(name: "d", value: .null, timeToLive: PropertyWrite.maximumTimeToLive),
                ]))
        expectSameBytes(
            Delta(channel: "chan", model: "m", version: version, sequence: 9, properties: [.modelDeletion]))
        expectSameBytes(
            Delta(
                channel: long, model: long, version: Version(milliseconds: 0, counter: 0, node: long), sequence: 0,
                properties: []))
    }

    @Test func randomDeltasAreWrittenAsThePrimitivesWriteThem() {
        let seed: UInt64 = 0x5EED_DE17A
        var random = SeededRandom(seed: seed)
        func text() -> String {
            String(
                (0..<Int.random(in: 0...140, using: &random)).map { _ in
                    Character(Unicode.Scalar(UInt8.random(in: 0x20...0x7E, using: &random)))
                })
        }
        func value() -> Value {
            switch Int.random(in: 0..<6, using: &random) {
            case 0: .null
            case 1: .bool(Bool.random(using: &random))
            case 2: .int(Int64(bitPattern: random.next()) >> Int64.random(in: 0...63, using: &random))
            case 3: .double(Double(bitPattern: random.next()))
            case 4: .string(text())
            default:
                .bytes(
                    (0..<Int.random(in: 0...300, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
                )
            }
        }
        for _ in 0..<500 {
            let properties = (0..<Int.random(in: 1...6, using: &random)).map { index -> PropertyWrite in
                switch Int.random(in: 0..<8, using: &random) {
                case 0: .deletion(of: "p\(index)")
                case 1: PropertyWrite(name: "p\(index)", value: value(), timeToLive: random.next() >> 20)
                default: PropertyWrite(name: "p\(index)" + text(), value: value())
                }
            }
            let delta = Delta(
                channel: text(), model: text(),
                version: Version(
                    milliseconds: random.next() >> 16, counter: UInt16.random(in: 0...9, using: &random), node: text()),
                sequence: random.next() >> Int.random(in: 0...63, using: &random), properties: properties)
            expectSameBytes(delta, seed: seed)
        }
    }

    @Test func aNestedValueIsLeftToThePrimitivesAndNothingIsWritten() {
        for nested: Value in [.array([.int(1)]), .map(["k": .string("v")])] {
            let delta = Delta(
                channel: "chan", model: "m", version: Version(milliseconds: 1, counter: 0, node: "n"), sequence: 1,
                properties: [PropertyWrite(name: "flat", value: .int(1)), PropertyWrite(name: "nested", value: nested)])
            var writer = WireWriter()
            writer.bytes([1, 2])
            #expect(DeltaPayloadWriter.append(delta, to: &writer) == nil)
            #expect(writer.bytes == [1, 2])
        }
    }

    @Test func aLoggedBatchOfLocalWritesRecoversAsWritten() throws {
        // The batch's records (written by the one-append writer) read back through recovery's
        // decoder: the same deltas, nested values included (written by the primitives).
        let version = Version(milliseconds: 42, counter: 1, node: "n1")
        let deltas = [
            Delta(
                channel: "c", model: "a", version: version, sequence: 1,
                properties: [PropertyWrite(name: "x", value: .int(-3))]),
            Delta(
                channel: "c", model: "b", version: version, sequence: 2,
                properties: [PropertyWrite(name: "y", value: .array([.string("s"), .double(1.5)]))]),
            Delta(channel: "c", model: "a", version: version, sequence: 3, properties: [.deletion(of: "x")]),
        ]
        var batch = DeltaLog.Batch()
        var placements: [DeltaLog.Batch.Placement] = []
        for delta in deltas {
            let placement = batch.addPlaced(delta)
            placements.append(try #require(placement))
        }
        for (delta, placement) in zip(deltas, placements) {
            #expect(Array(batch.bytes[placement.body..<placement.end]) == PeerMessage.deltaBody(delta))
            let payload = Array(batch.bytes[(placement.model - delta.channel.utf8.count - 1)..<placement.end])
            #expect(try DeltaLog.decodePayload(payload) == delta)
        }
    }
}
