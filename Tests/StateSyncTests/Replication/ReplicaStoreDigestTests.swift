import StateSyncTesting
import Testing

@testable import StateSync

/// The state digest (docs/PROTOCOL.md, "Digest") keeps a model's share up to date at its first
/// change between two folds; a small model changed again waits, listed, for the next fold to
/// hash it once; a large one is always kept up to date. Whatever the mix, and wherever a read or
/// a fold falls, it equals the digest recomputed from scratch.
@Suite("The state digest")
struct ReplicaStoreDigestTests {
    static let channels = ["c", "d"]

    /// The version timestamp of `milliseconds` (what collection and dropping compare with).
    static func timestamp(_ milliseconds: UInt64) -> UInt64 {
        Version(milliseconds: milliseconds, counter: 0, node: "").timestamp
    }

    /// Every register with a value, hashed and summed: the definition, with no bookkeeping.
    static func recomputed(_ store: ReplicaStore) -> UInt64 {
        var sum: UInt64 = 0
        for channel in channels {
            for model in store.models(in: channel) {
                for (property, register) in store.properties(of: ModelAddress(channel: channel, model: model)) {
                    sum &+= ReplicaStore.registerHash(
                        channel: channel, model: model, property: property, register: register)
                }
            }
        }
        return sum
    }

    /// Random writes, deletions of properties and models, expiring values, collections, dropped
    /// channels and snapshot pages, to models that stay small and models that grow past
    /// ``ReplicaStore/lazyDigestRegisters`` (in one page, or write by write) and shrink again;
    /// the digest read after every step, and folded at random points.
    @Test(arguments: 1...30 as ClosedRange<UInt64>)
    func theDigestEqualsTheOneRecomputedAfterEveryStep(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        var store = ReplicaStore()
        let limit = ReplicaStore.lazyDigestRegisters
        var clock: UInt64 = 1_000
        var sawLarge = false
        func version() -> Version {
            clock += UInt64(1 + random.below(3))
            return Version(milliseconds: clock, counter: 0, node: ["a", "b", "c"][random.below(3)])
        }
        for step in 0..<400 {
            let channel = Self.channels[random.below(2)]
            let model = "m\(random.below(4))"
            let address = ModelAddress(channel: channel, model: model)
            // m0 stays small; the others range over up to three times the limit of properties.
            let span = model == "m0" ? 8 : 3 * limit
            let action = random.below(20)
            switch action {
            case 0..<10:
                let writes = (0..<(1 + random.below(8))).map { _ in
                    PropertyWrite(
                        name: "p\(random.below(span))", value: .int(Int64(random.below(1000))),
                        timeToLive: random.below(6) == 0 ? UInt64(50 + random.below(200)) : 0)
                }
                _ = store.apply(
                    Delta(channel: channel, model: model, version: version(), sequence: 0, properties: writes))
            case 10..<13:
                let names = (0..<(1 + random.below(limit))).map { _ in "p\(random.below(span))" }
                _ = store.apply(
                    Delta(
                        channel: channel, model: model, version: version(), sequence: 0,
                        properties: names.map(PropertyWrite.deletion(of:))))
            case 13:
                _ = store.apply(
                    Delta(channel: channel, model: model, version: version(), sequence: 0, properties: [.modelDeletion])
                )
            case 14, 15:
                // A snapshot page: many registers of one model in one merge.
                let registers = (0..<(1 + random.below(2 * limit))).map { index in
                    (
                        name: "p\(random.below(span))",
                        register: index % 7 == 0
                            ? ReplicaStore.Register.tombstone(version())
                            : ReplicaStore.Register(value: .string("s\(index)"), version: version())
                    )
                }
                _ = store.merge(address, registers: registers)
            case 16: _ = store.expire(through: clock - UInt64(random.below(100)))
            case 17: store.collect(through: Self.timestamp(clock - UInt64(random.below(200))))
            case 18:
                // Sometimes every record of the channel goes: models with values are emptied.
                let keepNone = random.below(2) == 0
                _ = store.drop(channel: channel, through: Self.timestamp(clock - UInt64(random.below(50)))) { _ in
                    !keepNone && random.below(2) == 0
                }
            default: store.foldDigests()
            }
            #expect(
                store.digest == Self.recomputed(store), "seed \(seed), step \(step), action \(action), \(address)")
            sawLarge = sawLarge || store.records(of: address).count > limit
        }
        store.foldDigests()
        #expect(store.digest == Self.recomputed(store), "seed \(seed), folded at the end")
        // The run reached both ways of keeping a model's share (checked, not assumed).
        #expect(sawLarge, "seed \(seed): no model grew past \(limit) registers")
    }

    /// A model dropped whole (every record of a client's channel older than a horizon) takes
    /// its share of the digest with it, whether its share was summed in (folded) or kept up to
    /// date (large), and whether a change waits to be summed.
    @Test(arguments: [(4, true), (4, false), (100, true), (100, false)])
    func aModelDroppedTakesItsShareWithIt(properties: Int, folded: Bool) {
        var store = ReplicaStore()
        let kept = ModelAddress(channel: "c", model: "kept")
        _ = store.apply(
            Delta(
                channel: "c", model: "kept", version: Version(milliseconds: 900, counter: 0, node: "a"), sequence: 0,
                properties: [PropertyWrite(name: "x", value: .int(1))]))
        _ = store.apply(
            Delta(
                channel: "c", model: "gone", version: Version(milliseconds: 100, counter: 0, node: "a"), sequence: 0,
                properties: (0..<properties).map { PropertyWrite(name: "p\($0)", value: .int(Int64($0))) }))
        if folded { store.foldDigests() }
        let horizon = Version(milliseconds: 500, counter: 0, node: "").timestamp
        let dropped = store.drop(channel: "c", through: horizon) { $0.model == kept.model }
        #expect(dropped.count == properties)
        #expect(store.models(in: "c") == ["kept"])
        #expect(store.digest == Self.recomputed(store))
        store.foldDigests()
        #expect(store.digest == Self.recomputed(store))
        #expect(store.digest != 0)
    }

    /// Two replicas that merged the same deltas in different orders, one folding after every
    /// delta and one never, have the same digest.
    @Test func foldingOrNotGivesTheSameDigest() {
        var random = SeededRandom(seed: 7)
        var deltas: [Delta] = []
        for index in 0..<300 {
            let writes = (0..<(1 + random.below(4))).map { _ in
                PropertyWrite(name: "p\(random.below(100))", value: .int(Int64(index)))
            }
            deltas.append(
                Delta(
                    channel: "c", model: "m\(random.below(3))",
                    version: Version(milliseconds: UInt64(100 + index), counter: 0, node: "a"), sequence: 0,
                    properties: writes))
        }
        var folding = ReplicaStore()
        for delta in deltas {
            _ = folding.apply(delta)
            folding.foldDigests()
        }
        var lazy = ReplicaStore()
        for delta in deltas.shuffled(using: &random) { _ = lazy.apply(delta) }
        #expect(folding.digest == lazy.digest)
        #expect(folding.digest == Self.recomputed(folding))
    }
}
