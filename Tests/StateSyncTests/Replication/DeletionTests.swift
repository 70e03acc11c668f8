import StateSyncTesting
import Testing

@testable import StateSync

/// Deletion and expiry in the replica store (PROTOCOL.md 8.2 and 8.3): a deletion is a register
/// merged by last-writer-wins like a value, the deletion of a model is a version below which every
/// property counts as deleted, and an expiry is a function of a register and the time.
@Suite("Deletion and expiry merge rules (PROTOCOL.md 8.2, 8.3)")
struct DeletionTests {
    static let address = ModelAddress(channel: "c", model: "m")

    static func version(_ ms: UInt64, _ node: String = "a") -> Version {
        Version(milliseconds: ms, counter: 0, node: node)
    }

    static func delta(_ ms: UInt64, by node: String = "a", model: String = "m", _ writes: [PropertyWrite]) -> Delta {
        Delta(channel: "c", model: model, version: version(ms, node), sequence: ms, properties: writes)
    }

    static func set(_ ms: UInt64, by node: String = "a", _ name: String, _ value: Value, ttl: UInt64 = 0) -> Delta {
        delta(ms, by: node, [PropertyWrite(name: name, value: value, timeToLive: ttl)])
    }

    static func delete(_ ms: UInt64, by node: String = "a", _ names: String...) -> Delta {
        delta(ms, by: node, names.isEmpty ? [.modelDeletion] : names.map(PropertyWrite.deletion(of:)))
    }

    @Test func aDeletionIsAChangeWithTheExactOldValueAndLeavesNoValue() {
        var store = ReplicaStore()
        _ = store.apply(Self.set(10, "x", "hello"))
        let digestWithout = {
            var other = ReplicaStore()
            _ = other.apply(Self.set(11, "y", 1))
            return other.digest
        }()
        _ = store.apply(Self.set(11, "y", 1))
        let changes = store.apply(Self.delete(20, "x"))
        #expect(changes.count == 1)
        #expect(changes.first?.old == "hello" && changes.first?.new == .null && changes.first?.kind == .deleted)
        #expect(changes.first?.version == Self.version(20))
        #expect(store.properties(of: Self.address).keys.sorted() == ["y"])
        #expect(store.records(of: Self.address)["x"] == .tombstone(Self.version(20)))
        // The digest counts values only: a tombstone is invisible to it.
        #expect(store.digest == digestWithout)
        // Deleting what has no value changes nothing anyone can see (but is merged).
        #expect(store.apply(Self.delete(30, "never")).isEmpty)
        #expect(store.records(of: Self.address)["never"] == .tombstone(Self.version(30)))
    }

    @Test(arguments: [true, false])
    func aDeletionAndAConcurrentSetEndAsTheLaterVersionWhateverTheOrder(deletionIsLater: Bool) {
        let deletion = Self.delete(deletionIsLater ? 30 : 20, by: "b", "x")
        let set = Self.set(deletionIsLater ? 20 : 30, by: "c", "x", "new")
        var one = ReplicaStore()
        var two = ReplicaStore()
        for store in [0, 1] {
            let order =
                store == 0 ? [Self.set(10, "x", "old"), deletion, set] : [Self.set(10, "x", "old"), set, deletion]
            for delta in order {
                if store == 0 { _ = one.apply(delta) } else { _ = two.apply(delta) }
            }
        }
        #expect(one.digest == two.digest)
        #expect(one.records(of: Self.address) == two.records(of: Self.address))
        #expect(one.properties(of: Self.address)["x"]?.value == (deletionIsLater ? nil : "new"))
    }

    @Test func aModelDeletionDeletesWhatWasWrittenBeforeItAndNothingAfter() {
        var store = ReplicaStore()
        _ = store.apply(Self.set(10, "x", 1))
        _ = store.apply(Self.set(12, "y", 2))
        _ = store.apply(Self.set(30, "later", 3))
        let changes = store.apply(Self.delete(20))
        #expect(changes.map(\.property).sorted() == ["x", "y"])
        #expect(changes.allSatisfy { $0.kind == .deleted && $0.version == Self.version(20) })
        #expect(store.properties(of: Self.address).keys.sorted() == ["later"])
        #expect(store.isLive(Self.address))
        // A write older than the deletion loses, also to a property the deletion never saw.
        #expect(store.apply(Self.set(15, by: "b", "unseen", 9)).isEmpty)
        // A later one re-creates it.
        #expect(store.apply(Self.set(25, by: "b", "unseen", 9)).map(\.property) == ["unseen"])
        // An older deletion of the model changes nothing.
        #expect(store.apply(Self.delete(5)).isEmpty)
        #expect(store.records(of: Self.address)[""] == .tombstone(Self.version(20)))
    }

    @Test func aModelDeletionReportsOnlyPropertiesThatHadAValue() {
        var store = ReplicaStore()
        _ = store.apply(
            Self.delta(10, [PropertyWrite(name: "text", value: "hello"), PropertyWrite(name: "n", value: 1)]))
        _ = store.apply(Self.delete(20, "text"))
        #expect(store.records(of: Self.address)["text"] == .tombstone(Self.version(20)))
        let changes = store.apply(Self.delete(30))
        #expect(changes.map(\.property) == ["n"], "\(changes)")
        #expect(changes.first?.old == 1)
    }

    @Test func aModelWithoutValuesIsNotListedNorCounted() {
        var store = ReplicaStore()
        _ = store.apply(Self.set(10, "x", 1))
        _ = store.apply(Self.delta(11, model: "other", [PropertyWrite(name: "x", value: 1)]))
        #expect(store.channelModelCounts == ["c": 2])
        _ = store.apply(Self.delete(20))
        #expect(store.channelModelCounts == ["c": 1])
        #expect(store.list(channel: "c", prefix: "", after: "", limit: 10).entries.map(\.name) == ["other"])
        _ = store.apply(Self.delta(30, model: "other", [.modelDeletion]))
        #expect(store.channelModelCounts.isEmpty)
        #expect(store.list(channel: "", prefix: "", after: "", limit: 10).entries.isEmpty)
        _ = store.apply(Self.set(40, "x", 2))
        #expect(store.channelModelCounts == ["c": 1])
    }

    @Test func anExpiredValueIsDeletedOnceAtTheVersionItsWriteGaveIt() {
        var store = ReplicaStore()
        let write = Self.set(1_000, by: "node1", "session", "alive", ttl: 2_000)
        let set = store.apply(write)
        #expect(set.first?.expiresAt == 3_000)
        #expect(store.nextExpiry == 3_000)
        #expect(store.expire(through: 2_999).isEmpty)
        let expired = store.expire(through: 3_000)
        #expect(expired.count == 1)
        #expect(expired.first?.kind == .expired && expired.first?.old == "alive")
        #expect(expired.first?.version == Version(milliseconds: 3_000, counter: 0, node: "node1"))
        #expect(store.properties(of: Self.address).isEmpty)
        #expect(store.digest == ReplicaStore().digest)
        #expect(store.expire(through: 10_000).isEmpty)
        // The expired register keeps the write's version: an older write still loses to it.
        #expect(store.apply(Self.set(900, by: "b", "session", "stale")).isEmpty)
    }

    @Test(arguments: [true, false])
    func aWriteBetweenASetAndItsExpiryWinsWhetherItArrivesBeforeOrAfterTheExpiry(afterExpiry: Bool) {
        var store = ReplicaStore()
        _ = store.apply(Self.set(1_000, by: "a", "x", "short", ttl: 100))
        let replacement = Self.set(1_050, by: "b", "x", "kept")
        if afterExpiry {
            #expect(store.expire(through: 2_000).count == 1)
            _ = store.apply(replacement)
        } else {
            _ = store.apply(replacement)
            #expect(store.expire(through: 2_000).isEmpty)
        }
        #expect(store.properties(of: Self.address)["x"]?.value == "kept")
    }

    @Test func aLaterWriteWithoutTimeToLiveKeepsTheValueForGood() {
        var store = ReplicaStore()
        _ = store.apply(Self.set(1_000, "x", 1, ttl: 100))
        _ = store.apply(Self.set(1_010, "x", 1))
        #expect(store.expire(through: 5_000).isEmpty)
        #expect(store.properties(of: Self.address)["x"]?.value == 1)
    }

    /// Random sets, deletions, model deletions and expiring writes on several models, applied to
    /// replicas in different orders with duplicates, with expiry run at random moments: every
    /// replica ends with the same records and the same digest.
    @Test(arguments: 1...30)
    func replicasConvergeWhateverTheOrderOfDeletionsAndExpiries(seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        var deltas: [Delta] = []
        for index in 0..<120 {
            let ms = 1_000 + UInt64(index) * 7 + rng.next() % 5
            let node = ["a", "b", "c"][Int(rng.next() % 3)]
            let model = "m\(rng.next() % 3)"
            let kind = rng.next() % 10
            let writes: [PropertyWrite]
            switch kind {
            case 0: writes = [.modelDeletion]
            case 1, 2: writes = [.deletion(of: "p\(rng.next() % 4)")]
            case 3, 4:
                writes = [
                    PropertyWrite(
                        name: "p\(rng.next() % 4)", value: .int(Int64(index)), timeToLive: rng.next() % 300 + 1)
                ]
            default:
                writes = (0..<(1 + rng.next() % 2)).map { _ in "p\(rng.next() % 4)" }.reduce(into: [String]()) {
                    if !$0.contains($1) { $0.append($1) }
                }.map { PropertyWrite(name: $0, value: .int(Int64(index))) }
            }
            deltas.append(
                Delta(
                    channel: "c", model: model, version: Version(milliseconds: ms, counter: 0, node: node),
                    sequence: UInt64(index + 1), properties: writes))
        }
        var replicas: [ReplicaStore] = []
        for _ in 0..<3 {
            var order = deltas + deltas.filter { _ in rng.next() % 4 == 0 }
            order.shuffle(using: &rng)
            var store = ReplicaStore()
            for delta in order {
                _ = store.apply(delta)
                if rng.next() % 10 == 0 { _ = store.expire(through: 1_000 + rng.next() % 1_500) }
            }
            _ = store.expire(through: 2_000)
            replicas.append(store)
        }
        for model in ["m0", "m1", "m2"] {
            let address = ModelAddress(channel: "c", model: model)
            let reference = replicas[0].records(of: address)
            for other in replicas.dropFirst() {
                #expect(other.records(of: address) == reference, "seed \(seed), \(model)")
            }
        }
        #expect(Set(replicas.map(\.digest)).count == 1, "seed \(seed)")
    }

    /// A model's registers merged at once, or as they are given (a page merged while it is
    /// decoded), end in exactly the state merging them one by one does: digest, registers,
    /// deletions held, live models, latest version; and the same registers win. Random states and registers from fixed seeds (in every failure message),
    /// into models held and a model new to the store (a joiner's: written without a floor
    /// look-up), a name given twice now and then.
    @Test(arguments: 1...40 as ClosedRange<UInt64>)
    func mergingAModelsRegistersAtOnceEqualsOneByOne(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        var base = ReplicaStore()
        for step in 0..<30 {
            let model = "m\(random.below(3))"
            let ms = UInt64(100 + random.below(100))
            let node = ["a", "b"][random.below(2)]
            switch random.below(5) {
            case 0: _ = base.apply(Self.delta(ms, by: node, model: model, [.modelDeletion]))
            case 1: _ = base.apply(Self.delta(ms, by: node, model: model, [.deletion(of: "p\(random.below(4))")]))
            default:
                _ = base.apply(
                    Self.delta(
                        ms, by: node, model: model,
                        [PropertyWrite(name: "p\(random.below(4))", value: .int(Int64(step)))]))
            }
        }
        for model in ["m0", "m1", "m2", "m3", "new\(seed)"] {
            let address = ModelAddress(channel: "c", model: model)
            var registers: [(name: String, register: ReplicaStore.Register)] = []
            for property in 0..<5 where random.below(4) != 0 {
                let version = Self.version(UInt64(100 + random.below(100)), ["a", "b", "c"][random.below(3)])
                let register: ReplicaStore.Register =
                    switch random.below(3) {
                    case 0: .tombstone(version)
                    case 1: ReplicaStore.Register(value: .int(7), version: version, timeToLive: 60_000)
                    default: ReplicaStore.Register(value: .string("s\(property)"), version: version)
                    }
                registers.append(("p\(property)", register))
            }
            // A name given twice, at a random version: the later wins only if newer.
            if !registers.isEmpty, random.below(2) == 0 {
                let again = registers[random.below(registers.count)].name
                let version = Self.version(UInt64(100 + random.below(100)), ["a", "b", "c"][random.below(3)])
                registers.append((again, ReplicaStore.Register(value: .int(-1), version: version)))
            }
            // The model's deletion, if any, first (as a snapshot has it) or anywhere (in order).
            if random.below(3) == 0 {
                let deletion = ReplicaStore.Register.tombstone(Self.version(UInt64(100 + random.below(100)), "b"))
                registers.insert(("", deletion), at: random.below(2) == 0 ? 0 : random.below(registers.count + 1))
            }
            var batched = base
            var single = base
            var streamed = base
            let won = batched.merge(address, registers: registers)
            let wonOneByOne = registers.map { single.merge(address, property: $0.name, register: $0.register) != nil }
            var given = registers[...]
            let newest = streamed.merge(address, expected: registers.count) {
                given.popFirst().map { ReplicaStore.NamedRegister($0.name, $0.register) }
            }
            #expect(won == wonOneByOne, "seed \(seed)")
            #expect(
                newest == zip(registers, won).filter(\.1).map(\.0.register.version).max(),
                "the newest that won, seed \(seed)")
            for other in [single, streamed] {
                #expect(batched.digest == other.digest, "seed \(seed)")
                #expect(batched.records(of: address) == other.records(of: address), "seed \(seed)")
                #expect(batched.tombstones == other.tombstones, "seed \(seed)")
                #expect(batched.channelModelCounts == other.channelModelCounts, "seed \(seed)")
                #expect(batched.latestVersion == other.latestVersion, "seed \(seed)")
            }
            base = batched
        }
    }
}

@Suite("Property values on the wire (PROTOCOL.md 4.3, 7.1)")
struct PropertyValueWireTests {
    @Test func aVersion2DeltaCarriesDeletionsTimesToLiveAndModelDeletions() throws {
        let deltas = [
            Delta(
                channel: "c", model: "m", version: Version(milliseconds: 5, counter: 1, node: "n"), sequence: 3,
                properties: [.deletion(of: "gone"), PropertyWrite(name: "ttl", value: "v", timeToLive: 30_000)]),
            Delta(
                channel: "c", model: "m", version: Version(milliseconds: 6, counter: 0, node: "n"), sequence: 4,
                properties: [.modelDeletion]),
        ]
        for delta in deltas {
            let frames = PeerMessage.delta(delta).encode()
            #expect(frames[1][0] == PeerMessage.deletionVersion)
            #expect(try PeerMessage.decode(frames) == .delta(delta))
            #expect(try DeltaLog.decodePayload(DeltaLog.encodePayload(delta)) == delta)
        }
        // A plain delta keeps version 1, which every node reads.
        let plain = Delta(
            channel: "c", model: "m", version: Version(milliseconds: 5, counter: 0, node: "n"), sequence: 1,
            properties: [PropertyWrite(name: "x", value: 1)])
        #expect(PeerMessage.delta(plain).encode()[1][0] == PeerMessage.protocolVersion)
    }

    @Test func theEmptyNameIsOnlyTheDeletionOfAModelAlone() {
        func body(_ properties: [(String, [UInt8])]) -> [[UInt8]] {
            var w = WireWriter()
            w.byte(PeerMessage.deletionVersion)
            w.uint64(5 << 16)
            w.string("n")
            w.varint(1)
            w.varint(UInt64(properties.count))
            for (name, value) in properties {
                w.string(name)
                w.bytes(value)
            }
            return [Array("Dc\u{0}m\u{0}".utf8), w.bytes]
        }
        #expect(throws: WireError.self) { try PeerMessage.decode(body([("", [0x03, 0x02])])) }
        #expect(throws: WireError.self) { try PeerMessage.decode(body([("", [0x09]), ("x", [0x09])])) }
        #expect(throws: WireError.self) { try PeerMessage.decode(body([("x", [0x0A, 0x00, 0x03, 0x02])])) }
        #expect((try? PeerMessage.decode(body([("", [0x09])]))) != nil)
        // Inside an array the deletion tag is unknown.
        #expect(throws: WireError.self) { try PeerMessage.decode(body([("x", [0x07, 0x01, 0x09])])) }
    }

    @Test func aVersion1BodyHasNoDeletionTag() {
        var w = WireWriter()
        w.byte(PeerMessage.protocolVersion)
        w.uint64(5 << 16)
        w.string("n")
        w.varint(1)
        w.varint(1)
        w.string("x")
        w.byte(0x09)
        #expect(throws: WireError.unknownTag(0x09)) { try PeerMessage.decode([Array("Dc\u{0}m\u{0}".utf8), w.bytes]) }
    }

    @Test func snapshotsKeepDeletionsExpiriesAndTheModelsDeletion() throws {
        var store = ReplicaStore()
        let v = { (ms: UInt64) in Version(milliseconds: ms, counter: 0, node: "n") }
        _ = store.apply(
            Delta(
                channel: "c", model: "m", version: v(10), sequence: 1, properties: [PropertyWrite(name: "a", value: 1)])
        )
        _ = store.apply(Delta(channel: "c", model: "m", version: v(20), sequence: 2, properties: [.modelDeletion]))
        _ = store.apply(
            Delta(
                channel: "c", model: "m", version: v(30), sequence: 3,
                properties: [PropertyWrite(name: "b", value: "soon", timeToLive: 5), .deletion(of: "c")]))
        _ = store.apply(
            Delta(
                channel: "c", model: "n", version: v(31), sequence: 4,
                properties: [PropertyWrite(name: "d", value: "later", timeToLive: 1_000)]))
        _ = store.expire(through: 35)
        let decoded = try StateSnapshot.decode(StateSnapshot.encode(StateSnapshot(store: store, latestSequence: 4)))
        for model in ["m", "n"] {
            let address = ModelAddress(channel: "c", model: model)
            #expect(decoded.store.records(of: address) == store.records(of: address))
        }
        #expect(decoded.store.digest == store.digest)
        #expect(decoded.store.records(of: ModelAddress(channel: "c", model: "m"))["b"]?.isDeleted == true)
        #expect(decoded.store.records(of: ModelAddress(channel: "c", model: "m"))["b"]?.timeToLive == 5)
    }
}
