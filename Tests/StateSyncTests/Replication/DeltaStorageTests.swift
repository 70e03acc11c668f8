import Testing

@testable import StateSync

/// A decoded batch's deltas share one allocation for their fields and one array for their
/// properties (issue #17); each still behaves as a value of its own.
@Suite("Deltas sharing a batch's storage")
struct DeltaStorageTests {
    static func sent() -> [Delta] {
        (UInt64(1)...5).map { sequence in
            Delta(
                channel: "demo", model: sequence == 3 ? "other" : "m",
                version: Version(milliseconds: 1_000 + sequence, counter: 0, node: "n1"), sequence: sequence,
                properties: (0..<Int(sequence)).map { PropertyWrite(name: "p\($0)", value: .int(Int64($0))) })
        }
    }

    @Test func aDecodedBatchsDeltasAreWhatWasSentEachWithItsOwnProperties() throws {
        let sent = Self.sent()
        for frames in [PeerMessage.encodePackedBatch(sent), PeerMessage.encodeChannelBatch(sent)] {
            let decoded = try #require(try PeerMessage.decodeDeltas(frames))
            #expect(decoded == sent)
            for (got, expected) in zip(decoded, sent) {
                #expect(got.properties == expected.properties)
                #expect(Array(got.writes) == expected.properties)
                #expect(got.writes.indices == 0..<expected.properties.count)
                #expect(got.model == expected.model && got.sequence == expected.sequence)
                #expect(got.version == expected.version && got.channel == "demo")
            }
        }
    }

    @Test func changingOneDeltaOfABatchLeavesTheOthersAsTheyWere() throws {
        let sent = Self.sent()
        var decoded = try #require(try PeerMessage.decodeDeltas(PeerMessage.encodePackedBatch(sent)))
        let untouched = decoded
        decoded[1].model = "renamed"
        decoded[1].properties = [PropertyWrite(name: "q", value: "x")]
        decoded[2].sequence = 99
        #expect(decoded[1].model == "renamed" && decoded[1].properties == [PropertyWrite(name: "q", value: "x")])
        #expect(decoded[1].version == sent[1].version && decoded[1].sequence == sent[1].sequence)
        #expect(decoded[2].sequence == 99 && decoded[2].model == "other")
        #expect(untouched == sent)
        #expect(decoded[0] == sent[0] && decoded[3] == sent[3] && decoded[4] == sent[4])
        #expect(decoded[1] != sent[1] && decoded[2] != sent[2])
    }

    @Test func aRunOfABatchsPropertiesIsIndexedFromZeroAndCopiesOnlyItself() {
        let all = (0..<6).map { PropertyWrite(name: "p\($0)", value: .int(Int64($0))) }
        let run = PropertyWrites(all, range: 2..<5)
        #expect(run.count == 3 && run.startIndex == 0)
        #expect(run[0] == all[2] && run[2] == all[4])
        #expect(run.array == Array(all[2..<5]))
        #expect(run == PropertyWrites(Array(all[2..<5])))
        #expect(run != PropertyWrites(all, range: 2..<4))
        #expect(PropertyWrites(all).array == all)
    }

    @Test func deltasOfOneBatchAreEqualToTheSameDeltasMadeAlone() {
        let sent = Self.sent()
        let batch = Delta.batch(count: sent.count) { index in
            Delta.Fields(
                channel: sent[index].channel, model: sent[index].model, version: sent[index].version,
                sequence: sent[index].sequence, writes: sent[index].writes)
        }
        #expect(batch == sent)
        #expect(batch[0] != batch[1])
        #expect(String(describing: batch[2]) == String(describing: sent[2]))
    }
}
