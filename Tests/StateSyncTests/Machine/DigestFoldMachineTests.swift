import Testing

@testable import StateSync

/// When the node machine folds the store's digest (``NodeMachine/foldDigestsWhenDue()``): once a
/// second at a repair round, or at the next repair round once many models wait; the digest a
/// status reports is the same either way.
@Suite("The digest's fold on the node machine")
struct DigestFoldMachineTests {
    static func set(_ model: String, _ value: Int64, id: UInt64) -> NodeInput {
        .clientRequest(
            client: [1],
            frames: ClientProtocol.encodeRequest(
                .set, id: id,
                body: ClientProtocol.encodeSet(
                    ModelAddress(channel: "c", model: model), [PropertyWrite(name: "x", value: .int(value))])))
    }

    /// Each of `models` models written twice at `now`: the second write of a model in an epoch
    /// lists it for the fold.
    static func writeTwice(_ machine: inout NodeMachine, models: Range<Int>, now: UInt64, id: inout UInt64) {
        for round in 0..<2 {
            for model in models {
                id += 1
                _ = machine.handle(Self.set("m\(model)", Int64(round), id: id), now: now)
            }
        }
    }

    @Test func aFewChangedModelsWaitASecondForTheFold() {
        var machine = DurabilityMachineTests.machine()
        var id: UInt64 = 0
        _ = machine.handle(.tick(observerBacklog: 0), now: 1_000)  // the first repair round folds
        Self.writeTwice(&machine, models: 0..<3, now: 1_010, id: &id)
        #expect(machine.store.staleDigestCount == 3)
        // Repair rounds within the second leave them listed…
        for now in stride(from: 1_060 as UInt64, through: 1_960, by: 60) {
            _ = machine.handle(.tick(observerBacklog: 0), now: now)
        }
        #expect(machine.store.staleDigestCount == 3, "folded before a second had passed")
        Self.writeTwice(&machine, models: 3..<5, now: 1_980, id: &id)
        let listed = machine.store.digest
        // …and the first one after it folds them, to the digest they gave listed.
        _ = machine.handle(.tick(observerBacklog: 0), now: 2_040)
        #expect(machine.store.staleDigestCount == 0, "not folded after a second")
        #expect(machine.store.digest == listed)
        #expect(machine.status(now: 2_050).stateDigest == listed)
    }

    @Test func manyChangedModelsAreFoldedAtTheNextRepairRound() {
        var machine = DurabilityMachineTests.machine()
        var id: UInt64 = 0
        _ = machine.handle(.tick(observerBacklog: 0), now: 1_000)
        Self.writeTwice(&machine, models: 0..<NodeMachine.digestFoldModels, now: 1_010, id: &id)
        #expect(machine.store.staleDigestCount == NodeMachine.digestFoldModels)
        _ = machine.handle(.tick(observerBacklog: 0), now: 1_060)
        #expect(machine.store.staleDigestCount == 0, "\(NodeMachine.digestFoldModels) models waited for a second")
    }
}
