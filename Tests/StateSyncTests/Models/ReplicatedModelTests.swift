import Foundation
import Observation
import Synchronization
import Testing

@testable import StateSync

@Suite("Replicated models")
struct ReplicatedModelTests {
    @Test func observerGetsExactOldAndNewAfterTheChange() {
        let counter = Counter()
        let seen = Mutex<[(Int, Int, Int)]>([])
        counter.observe(\.count) { change in
            // didSet semantics: the model already holds the new value.
            seen.withLock { $0.append((change.old, change.new, counter.count)) }
        }
        counter.count = 5
        counter.count = 7
        let result = seen.withLock { $0 }
        #expect(result.map(\.0) == [0, 5])
        #expect(result.map(\.1) == [5, 7])
        #expect(result.map(\.2) == [5, 7])
    }

    @Test func equalValueMakesNoChangeAndFiresNothing() {
        let counter = Counter()
        let fired = Atomic<Int>(0)
        counter.observe(\.title) { _ in fired.add(1, ordering: .relaxed) }
        counter.title = "untitled"
        #expect(fired.load(ordering: .relaxed) == 0)
        counter.title = "x"
        #expect(fired.load(ordering: .relaxed) == 1)
    }

    @Test func observersArePerProperty() {
        let counter = Counter()
        let titles = Atomic<Int>(0)
        counter.observe(\.title) { _ in titles.add(1, ordering: .relaxed) }
        counter.count = 1
        counter.scratch = 3
        #expect(titles.load(ordering: .relaxed) == 0)
        #expect(counter.scratch == 3)
    }

    @Test func cancelledObserverStopsReceiving() {
        let counter = Counter()
        let fired = Atomic<Int>(0)
        let token = counter.observe(\.count) { _ in fired.add(1, ordering: .relaxed) }
        counter.count = 1
        token.cancel()
        counter.count = 2
        #expect(fired.load(ordering: .relaxed) == 1)
        #expect(token.isCancelled)
    }

    @Test func transactionIsOneVersionAndAllItsChanges() {
        let counter = Counter()
        let changes = Mutex<[(String, Version)]>([])
        counter.observe(\.count) { c in changes.withLock { $0.append(("count", c.version)) } }
        counter.observe(\.title) { c in changes.withLock { $0.append(("title", c.version)) } }
        counter.transaction {
            $0.count += 1
            $0.title = "busy"
        }
        let result = changes.withLock { $0 }
        #expect(result.map(\.0) == ["count", "title"])
        #expect(result[0].1 == result[1].1)
        #expect(counter.count == 1 && counter.title == "busy")
    }

    @Test func throwingTransactionRollsBackAndFiresNothing() {
        struct Abort: Error {}
        let counter = Counter()
        let fired = Atomic<Int>(0)
        counter.observe(\.count) { _ in fired.add(1, ordering: .relaxed) }
        #expect(throws: Abort.self) {
            try counter.transaction { (model) throws(Abort) in
                model.count = 42
                throw Abort()
            }
        }
        #expect(counter.count == 0)
        #expect(fired.load(ordering: .relaxed) == 0)
    }

    @Test func transactionThatRestoresAValueIsNoChange() {
        let counter = Counter()
        let fired = Atomic<Int>(0)
        counter.observe(\.count) { _ in fired.add(1, ordering: .relaxed) }
        counter.transaction {
            $0.count = 9
            $0.count = 0
        }
        #expect(fired.load(ordering: .relaxed) == 0)
    }

    @Test func observerMayReadAndWriteTheModelWithoutDeadlock() {
        let counter = Counter()
        let seen = Mutex<[(Int, Int)]>([])
        counter.observe(\.count) { change in
            seen.withLock { $0.append((change.old, change.new)) }
            // A write from inside a callback is delivered after this notification.
            if change.new < 3 { counter.count = counter.count + 1 }
        }
        counter.count = 1
        #expect(seen.withLock { $0 }.map(\.1) == [1, 2, 3])
        #expect(seen.withLock { $0 }.map(\.0) == [0, 1, 2])
    }

    @Test func asyncSequenceOfChanges() async {
        let counter = Counter()
        let stream = counter.changes(of: \.title)
        counter.title = "a"
        counter.title = "b"
        var received: [String] = []
        for await change in stream {
            received.append("\(change.old)->\(change.new)")
            if received.count == 2 { break }
        }
        #expect(received == ["untitled->a", "a->b"])
    }

    @Test func observationTrackingFiresOnlyForPropertiesRead() {
        let counter = Counter()
        let fired = Atomic<Int>(0)
        withObservationTracking {
            _ = counter.title
        } onChange: {
            fired.add(1, ordering: .relaxed)
        }
        counter.count = 3
        #expect(fired.load(ordering: .relaxed) == 0)
        counter.title = "seen"
        #expect(fired.load(ordering: .relaxed) == 1)
    }

    /// A model on no node passes the versions applied to it: a write made right after a remote
    /// one wins, also when that one's version is ahead of this clock's millisecond and from a
    /// writer whose id sorts after the standalone clock's ("local"). Before, the local write was
    /// dropped as superseded (the every-kind observer test below missed its last change when its
    /// two writes fell in one millisecond).
    @Test func aLocalWriteAfterARemoteOneWinsOnAModelOnNoNode() throws {
        let model = Everything()
        let ahead = Version(
            milliseconds: ModelRegistrar.standaloneClock.wallMilliseconds() + 20, counter: 0, node: "zz")
        let result = model._$registrar.applyRemote(
            model, writes: [PropertyWrite(name: "optional", value: .string("remote"))], version: ahead)
        #expect(result.rejected.isEmpty && model.optional == "remote")
        model.optional = "local"
        #expect(model.optional == "local")
        #expect(model._$registrar.supersededWriteCount == 0)
    }

    /// An `Everything` with every property set away from its default (`string` and `date` as given).
    static func everythingSet(string: String, date: Date) -> Everything {
        let source = Everything()
        source.int = 42
        source.double = 2.5
        source.bool = true
        source.string = string
        source.data = Data([0, 1, 255])
        source.date = date
        source.optional = "set"
        source.array = [1, 2, 3]
        source.dictionary = ["a": 1]
        source.point = Point(x: 1, y: -2)
        source.mood = .busy
        source.shape = .square(side: 3)
        return source
    }

    /// A write of every tracked property of `source`, with its current value.
    static func writesOfEveryProperty(of source: Everything) throws -> [PropertyWrite] {
        try Everything._$schema.properties.map { property in
            PropertyWrite(name: property.name, value: try property.encodeCurrent(source))
        }
    }

    @Test func everyCodableKindRoundTripsThroughValues() throws {
        let source = Self.everythingSet(string: "héllo", date: Date(timeIntervalSinceReferenceDate: 1234.5))
        let target = Everything()
        let writes = try Self.writesOfEveryProperty(of: source)
        let version = HybridLogicalClock(node: "n1").next()
        let result = target._$registrar.applyRemote(target, writes: writes, version: version)
        #expect(result.rejected.isEmpty)
        #expect(target.int == 42 && target.double == 2.5 && target.bool && target.string == "héllo")
        #expect(target.data == Data([0, 1, 255]) && target.date == source.date && target.optional == "set")
        #expect(target.array == [1, 2, 3] && target.dictionary == ["a": 1] && target.point == Point(x: 1, y: -2))
        #expect(target.mood == .busy && target.shape == .square(side: 3))
    }

    /// Observers of every kind of property get their exact old and new values back from the
    /// registrar's type-erased queue (taken by type, not cast), remote and local.
    @Test func observersOfEveryKindGetTheirExactValues() throws {
        let source = Self.everythingSet(
            string: "héllo, a string longer than fifteen bytes", date: Date(timeIntervalSinceReferenceDate: 1234))
        let target = Everything()
        let seen = Mutex<[String]>([])
        func record<T: Sendable>(_ keyPath: KeyPath<Everything, T>) -> ObservationToken {
            target.observe(keyPath) { change in seen.withLock { $0.append("\(change.old) -> \(change.new)") } }
        }
        let tokens = [
            record(\.int), record(\.double), record(\.bool), record(\.string), record(\.data), record(\.date),
            record(\.optional), record(\.array), record(\.dictionary), record(\.point), record(\.mood),
            record(\.shape),
        ]
        let result = target._$registrar.applyRemote(
            target, writes: try Self.writesOfEveryProperty(of: source), version: HybridLogicalClock(node: "n1").next())
        #expect(result.rejected.isEmpty)
        target.optional = nil
        #expect(
            seen.withLock { $0 } == [
                "0 -> 42", "0.5 -> 2.5", "false -> true", " -> héllo, a string longer than fifteen bytes",
                "0 bytes -> 3 bytes", "2001-01-01 00:00:00 +0000 -> 2001-01-01 00:20:34 +0000",
                "nil -> Optional(\"set\")", "[] -> [1, 2, 3]", "[:] -> [\"a\": 1]",
                "Point(x: 0.0, y: 0.0) -> Point(x: 1.0, y: -2.0)", "calm -> busy",
                "circle(radius: 1.0) -> square(side: 3.0)", "Optional(\"set\") -> nil",
            ])
        _ = tokens
    }

    /// A box that holds another type than the one asked for (a subclass; a value asked for as an
    /// optional, which must be converted, not reinterpreted) still gives the value, by the
    /// runtime's cast.
    @Test func anErasedChangeOfAnotherTypeGivesItByTheRuntimesCast() {
        class Base: @unchecked Sendable {}  // Safe: no stored state.
        final class Derived: Base, @unchecked Sendable {}  // Safe: no stored state.
        let old = Derived()
        let new = Derived()
        let change = ErasedChange(property: "p", old: old, new: new, version: .zero, isRemote: false)
        let typed = change.typed(as: Base.self)
        #expect(typed.old === old && typed.new === new)
        #expect(change.typed(as: Derived.self).new === new)
        let number = ErasedChange(property: "p", old: 1, new: 2, version: .zero, isRemote: false)
        let optional = number.typed(as: Int?.self)
        #expect(optional.old == 1 && optional.new == 2)
    }

    /// A peer's delta usually lists properties in declaration order, and the registrar looks for
    /// each one first where the last one ended; any other order, and names this model does not
    /// have, still reach the right properties.
    @Test func remoteWritesInAnyOrderReachTheirOwnProperties() throws {
        let source = Everything()
        source.int = 7
        source.string = "seven"
        source.mood = .busy
        source.point = Point(x: 7, y: 7)
        let target = Everything()
        let seen = Shared<[String]>([])
        target.observe(\.int) { change in seen.withLock { $0.append("int \(change.old)->\(change.new)") } }
        target.observe(\.mood) { change in seen.withLock { $0.append("mood \(change.old)->\(change.new)") } }
        let schema = Everything._$schema
        var writes: [PropertyWrite] = []
        for property in schema.properties.reversed() {
            writes.append(PropertyWrite(name: property.name, value: try property.encodeCurrent(source)))
            if property.name == "string" { writes.append(PropertyWrite(name: "notAProperty", value: 1)) }
        }
        let version = HybridLogicalClock(node: "n1").next()
        let result = target._$registrar.applyRemote(target, writes: writes, version: version)
        #expect(result.unknownProperties == ["notAProperty"])
        #expect(result.rejected.isEmpty)
        #expect(target.int == 7 && target.string == "seven")
        #expect(target.mood == .busy && target.point == Point(x: 7, y: 7))
        #expect(Set(seen.value) == ["int 0->7", "mood calm->busy"])
        #expect(target.propertyVersions.count == schema.properties.count)
        #expect(target.propertyVersions.values.allSatisfy { $0 == version })
    }

    /// Observers kept by schema index: one registered before the model ever changed, on the last
    /// property, sees the changes; once cancelled, none; another property's observer is unaffected.
    @Test func anObserverOfAModelThatNeverChangedSeesItsChangesUntilCancelled() {
        let target = Everything()
        let shapes = Shared<[Shape]>([])
        let token = target.observe(\.shape) { change in shapes.withLock { $0.append(change.new) } }
        let ints = Shared<[Int]>([])
        target.observe(\.int) { change in ints.withLock { $0.append(change.new) } }
        target.shape = .square(side: 2)
        target.int = 1
        token.cancel()
        target.shape = .circle(radius: 3)
        target.int = 2
        #expect(shapes.value == [.square(side: 2)])
        #expect(ints.value == [1, 2])
    }

    @Test func remoteValueOfWrongTypeIsRejectedAndChangesNothing() {
        let counter = Counter()
        let version = HybridLogicalClock(node: "n1").next()
        let result = counter._$registrar.applyRemote(
            counter,
            writes: [PropertyWrite(name: "count", value: "not a number"), PropertyWrite(name: "nope", value: 1)],
            version: version)
        #expect(result.rejected.map(\.property) == ["count"])
        #expect(result.unknownProperties == ["nope"])
        #expect(counter.count == 0)
    }

    @Test func staleRemoteWriteLosesAndFiresNothing() {
        let counter = Counter()
        let fired = Atomic<Int>(0)
        counter.observe(\.count) { _ in fired.add(1, ordering: .relaxed) }
        let newer = Version(milliseconds: 200, counter: 0, node: "b")
        let older = Version(milliseconds: 100, counter: 0, node: "a")
        _ = counter._$registrar.applyRemote(counter, writes: [PropertyWrite(name: "count", value: 2)], version: newer)
        let result = counter._$registrar.applyRemote(
            counter, writes: [PropertyWrite(name: "count", value: 1)], version: older)
        #expect(result.stale == 1)
        #expect(counter.count == 2)
        #expect(fired.load(ordering: .relaxed) == 1)
    }

    /// A DELTA batch is applied in one transition, but observers still see every write, in
    /// order, each with the exact value it replaced; a stale write in the middle fires nothing.
    @Test func aBatchOfWriteSetsFiresOneChangePerWriteInOrder() {
        let counter = Counter()
        let seen = Shared<[Change<Int>]>([])
        counter.observe(\.count) { change in seen.withLock { $0.append(change) } }
        func set(_ value: Int64, at milliseconds: UInt64) -> ModelRegistrar.RemoteWriteSet {
            ModelRegistrar.RemoteWriteSet(
                writes: [PropertyWrite(name: "count", value: .int(value))],
                version: Version(milliseconds: milliseconds, counter: 0, node: "b"))
        }
        let result = counter._$registrar.applyRemote(
            counter, [set(1, at: 100), set(2, at: 200), set(7, at: 150), set(3, at: 300)])
        #expect(result.applied == 3)
        #expect(result.stale == 1)
        #expect(counter.count == 3)
        #expect(seen.value.map { [$0.old, $0.new] } == [[0, 1], [1, 2], [2, 3]])
        #expect(seen.value.map(\.version.milliseconds) == [100, 200, 300])
        #expect(seen.value.allSatisfy { $0.isRemote })
    }
}

@Suite("Replicated models: edge cases")
struct ReplicatedModelEdgeTests {
    @Test func aLocalWriteUnderAFutureVersionIsSupersededAndFiresNothing() {
        let counter = Counter()
        let future = Version(
            milliseconds: HybridLogicalClock.systemMilliseconds() + 3_600_000, counter: 0, node: "zeta")
        _ = counter._$registrar.applyRemote(counter, writes: [PropertyWrite(name: "count", value: 9)], version: future)
        let fired = Shared<Int>(0)
        counter.observe(\.count) { _ in fired.withLock { $0 += 1 } }
        counter.count = 1
        counter.transaction { $0.count = 2 }
        #expect(counter.count == 9, "last-writer-wins keeps the newer version")
        #expect(fired.value == 0)
        #expect(counter._$registrar.supersededWriteCount == 2)
    }

    @Test func aNestedTransactionThatThrowsIsUndoneAndTheOuterOneGoesOn() {
        struct Abort: Error {}
        let counter = Counter()
        counter.count = 5
        let before = counter.propertyVersions
        #expect(Array(before.keys) == ["count"])
        counter.transaction { model in
            model.count = 1
            do {
                try model.transaction { (inner) throws(Abort) in
                    inner.count = 50
                    inner.title = "inner"
                    throw Abort()
                }
            } catch {}
            model.title = "outer"
            // Reading versions inside a transaction must not deadlock; they are those before it.
            #expect(model.propertyVersions == before)
        }
        #expect(counter.count == 1 && counter.title == "outer")
        let after = counter.propertyVersions
        #expect(Set(after.keys) == ["count", "title"] && after["count"] == after["title"])
        #expect(after["count"]! > before["count"]!)
        let whileReading = counter._$registrar.consistentRead(counter) { $0.propertyVersions }
        #expect(whileReading == after, "also while reading consistently")
    }

    /// The registrar's transaction path unboxes erased values of the property's own type without a
    /// cast (ErasedPropertyAccess): values with storage (strings, arrays, dictionaries, data,
    /// optionals, enums with payloads) must come out exact, and a throw must restore each.
    @Test func aTransactionOverValuesWithStorageReportsExactValuesAndRollsBackEach() {
        struct Abort: Error {}
        let model = Everything()
        let seen = Shared<[String]>([])
        model.observe(\.string) { c in seen.withLock { $0.append("string \(c.old)->\(c.new)") } }
        model.observe(\.array) { c in seen.withLock { $0.append("array \(c.old)->\(c.new)") } }
        model.observe(\.optional) { c in
            seen.withLock { $0.append("optional \(String(describing: c.old))->\(String(describing: c.new))") }
        }
        model.observe(\.dictionary) { c in seen.withLock { $0.append("dictionary \(c.old.count)->\(c.new.count)") } }
        model.observe(\.shape) { c in seen.withLock { $0.append("shape \(c.old)->\(c.new)") } }
        let long = String(repeating: "long enough to be stored out of line ", count: 4)
        for round in 0..<3 {
            model.transaction { m in
                m.string = long + "\(round)"
                m.array = Array(0...round)
                m.optional = round == 1 ? nil : "r\(round)"
                m.dictionary = Dictionary(uniqueKeysWithValues: (0...round).map { ("k\($0)", $0) })
                m.shape = .square(side: Double(round))
                m.data = Data(repeating: UInt8(round), count: 64)
            }
        }
        let before = (model.string, model.array, model.optional, model.dictionary, model.shape, model.data)
        #expect(throws: Abort.self) {
            try model.transaction { (m) throws(Abort) in
                m.string = "gone"
                m.array = []
                m.optional = "gone"
                m.dictionary = [:]
                m.shape = .circle(radius: 9)
                m.data = Data()
                throw Abort()
            }
        }
        #expect(model.string == before.0 && model.array == before.1 && model.optional == before.2)
        #expect(model.dictionary == before.3 && model.shape == before.4 && model.data == before.5)
        #expect(
            seen.value == [
                "string ->\(long)0", "array []->[0]", "optional nil->Optional(\"r0\")", "dictionary 0->1",
                "shape circle(radius: 1.0)->square(side: 0.0)",
                "string \(long)0->\(long)1", "array [0]->[0, 1]", "optional Optional(\"r0\")->nil",
                "dictionary 1->2", "shape square(side: 0.0)->square(side: 1.0)",
                "string \(long)1->\(long)2", "array [0, 1]->[0, 1, 2]", "optional nil->Optional(\"r2\")",
                "dictionary 2->3", "shape square(side: 1.0)->square(side: 2.0)",
            ])
    }

    /// A property that is not the macro's ``ReplicatedProperty`` reaches the registrar's hot
    /// paths through its existential.
    @Test func aSchemaOfAnotherConformerGivesTheSameAccess() throws {
        struct Wrapped: AnyReplicatedProperty {
            let inner: ReplicatedProperty<Counter, Int>
            var name: String { inner.name }
            var index: Int { inner.index }
            var anyKeyPath: any AnyKeyPath & Sendable { inner.anyKeyPath }
            func encodeCurrent(_ model: Counter) throws -> Value { try inner.encodeCurrent(model) }
            func currentValue(_ model: Counter) -> any Sendable { inner.currentValue(model) }
            func assign(_ model: Counter, from value: Value) throws -> (old: any Sendable, new: any Sendable)? {
                try inner.assign(model, from: value)
            }
            func restore(_ model: Counter, _ value: any Sendable) { inner.restore(model, value) }
            func sameErased(_ a: any Sendable, _ b: any Sendable) -> Bool { inner.sameErased(a, b) }
            func encodeErased(_ value: any Sendable) throws -> Value { try inner.encodeErased(value) }
            func notifyObservation(_ model: Counter, registrar: ObservationRegistrar) {
                inner.notifyObservation(model, registrar: registrar)
            }
        }
        let inner: ReplicatedProperty<Counter, Int> = Counter._$schema.property(at: 0)
        let schema = ModelSchema<Counter>([Wrapped(inner: inner)])
        let access = try #require(schema.access.first)
        #expect(!(access is ReplicatedProperty<Counter, Int>))
        let counter = Counter()
        counter.count = 3
        let old = access.currentValue(of: counter)
        #expect(old as? Int == 3 && !access.differs(counter, from: old))
        counter.count = 4
        #expect(access.differs(counter, from: old))
        #expect(try access.encodeCurrent(of: counter) == .int(4))
        access.restore(counter, to: old)
        #expect(counter.count == 3)
        #expect(try access.assign(counter, from: .int(5)) && counter.count == 5)
        #expect(try !access.assign(counter, from: .int(5)), "an equal value is not stored again")
        let reported = try access.assignReporting(counter, from: .int(6))
        #expect(reported?.old as? Int == 5 && reported?.new as? Int == 6 && counter.count == 6)
        #expect(throws: (any Error).self) { try access.assign(counter, from: .string("six")) }
        #expect(counter.count == 6)
    }

    @Test func namesMustBeNFC() {
        #expect(throws: StateSyncError.self) { try Names.validateProperty("e\u{301}") }
        #expect(throws: Never.self) { try Names.validateProperty("\u{e9}") }
    }

    /// Each rule of a name, with the reason the error gives, in the order they are checked.
    @Test func namesAreCheckedRuleByRule() {
        func reason(_ check: () throws -> Void) -> String? {
            do {
                try check()
                return nil
            } catch let error as StateSyncError {
                #expect(error.code == .invalidName)
                return error.message
            } catch {
                Issue.record("not a StateSyncError: \(error)")
                return "\(error)"
            }
        }
        #expect(reason { try Names.validateChannel("") } == "channel is empty")
        #expect(reason { try Names.validateModel(String(repeating: "m", count: 255)) } == nil)
        #expect(
            reason { try Names.validateModel(String(repeating: "m", count: 256)) }?.hasSuffix("longer than 255 bytes")
                == true)
        #expect(reason { try Names.validateProperty("a\u{0}b") } == "property name contains a NUL byte")
        #expect(reason { try Names.validateChannel("a/b") } == "channel 'a/b' contains '/'")
        #expect(reason { try Names.validateModel("a/b") } == nil, "a model id may hold '/'")
        #expect(reason { try Names.validateChannel("a\u{0}/") } == "channel contains a NUL byte", "NUL is told first")
        #expect(reason { try Names.validateModel("caf\u{e9} \u{1F600}") } == nil, "composed non-ASCII passes")
        #expect(reason { try Names.validateModel("cafe\u{301}") }?.contains("NFC") == true)
    }
}
