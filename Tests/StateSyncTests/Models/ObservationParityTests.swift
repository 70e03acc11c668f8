import Foundation
import StateSyncZeroMQ
import Synchronization
import Testing

@testable import StateSync

@Replicated
final class Box<T: Codable & Sendable & Equatable> {
    var value: T? = nil
    var label = "box"
}

/// Conformances a user writes by hand next to the macro's.
@Replicated
final class DeclaredConformances: Observable, Sendable, Codable {
    var count = 0
    var tags: [String] = []
    @Local var scratch = 7
    let kind = "declared"
}

/// `withObservationTracking` on `@Replicated` models behaves like `@Observable`, without its
/// surprises: Swift's own Observation scenarios, restated.
@Suite("Observation parity")
struct ObservationParityTests {
    @Test func anEqualWriteFiresNoObservation() {
        let counter = Counter()
        counter.count = 1
        let fired = Atomic<Int>(0)
        withObservationTracking {
            _ = counter.count
        } onChange: {
            fired.add(1, ordering: .relaxed)
        }
        counter.count = 1
        #expect(fired.load(ordering: .relaxed) == 0, "an equal value is no change")
        counter.transaction { $0.count = 1 }
        #expect(fired.load(ordering: .relaxed) == 0, "nor in a transaction")
        counter.count = 2
        #expect(fired.load(ordering: .relaxed) == 1)
    }

    /// Writes tell Observation nothing until something reads the model (no tracking can watch it
    /// before); a tracking that starts later, by a read or through the registrar itself, still
    /// sees the next change, local or remote.
    @Test func aTrackingThatStartsAfterUnreadWritesSeesTheNextChange() {
        let counter = Counter()
        for value in 1...50 { counter.count = value }
        _ = counter._$registrar.applyRemote(
            counter, writes: [PropertyWrite(name: "count", value: 51)],
            version: Version(milliseconds: 4_000_000_000_000, counter: 0, node: "peer"))
        let fired = Atomic<Int>(0)
        withObservationTracking {
            _ = counter.count
        } onChange: {
            fired.add(1, ordering: .relaxed)
        }
        _ = counter._$registrar.applyRemote(
            counter, writes: [PropertyWrite(name: "count", value: 52)],
            version: Version(milliseconds: 4_000_000_000_000, counter: 1, node: "peer"))
        #expect(fired.load(ordering: .relaxed) == 1)

        let other = Counter()
        other.count = 1
        let direct = Atomic<Int>(0)
        withObservationTracking {
            other._$registrar.observationRegistrar.access(other, keyPath: \.count)
        } onChange: {
            direct.add(1, ordering: .relaxed)
        }
        other.count = 2
        #expect(direct.load(ordering: .relaxed) == 1, "an access told to the registrar directly")
    }

    /// The SwiftUI/UIKit pattern: `onChange` re-arms the tracking and writes back what the model
    /// holds. An equal write notifies nothing, so this ends after the one real change (it used to
    /// recurse until the stack overflowed).
    @Test func aSelfRearmingTrackingThatWritesWhatItHoldsEndsAfterOneChange() {
        let counter = Counter()
        let fired = Atomic<Int>(0)
        @Sendable func arm() {
            withObservationTracking {
                _ = counter.count
            } onChange: {
                // Bounded, so a regression fails this test instead of crashing the run.
                guard fired.add(1, ordering: .relaxed).newValue < 100 else { return }
                arm()
                counter.count = counter.count
            }
        }
        arm()
        counter.count = 5
        #expect(fired.load(ordering: .relaxed) == 1)
        #expect(counter.count == 5)
    }

    /// Timing, chosen on purpose: `onChange` runs after the change is applied, so a read inside
    /// it sees the new value — for local and remote writes alike.
    @Test func onChangeRunsAfterTheChangeIsAppliedForLocalAndRemoteWrites() async {
        let counter = Counter()
        let seen = Shared<[Int]>([])
        @Sendable func arm() {
            withObservationTracking {
                _ = counter.count
            } onChange: {
                seen.withLock { $0.append(counter.count) }
            }
        }
        arm()
        counter.count = 1
        arm()
        let version = Version(milliseconds: HybridLogicalClock.systemMilliseconds() + 10, counter: 0, node: "peer")
        _ = counter._$registrar.applyRemote(counter, writes: [PropertyWrite(name: "count", value: 2)], version: version)
        arm()
        // Remote changes a node applies notify on its observer queue, after the values are set.
        let executor = DispatchObserverExecutor(label: "test-observers")
        _ = counter._$registrar.applyRemote(
            counter,
            [
                ModelRegistrar.RemoteWriteSet(
                    writes: [PropertyWrite(name: "count", value: 3)],
                    version: Version(milliseconds: version.milliseconds + 1, counter: 0, node: "peer"))
            ], notifyingOn: executor)
        await executor.flush()
        #expect(seen.value == [1, 2, 3])
    }

    /// One `onChange` per tracking, however many threads write: 8 threads × 10,000 writes, with
    /// self-re-arming trackings re-armed in `onChange` by whichever writer thread is delivering.
    /// Each tracking fires exactly once. (With notifications sent from several threads at once,
    /// two of them could both reach a tracking before either cancelled it.)
    @Test func concurrentWritersFireEachSelfRearmingTrackingExactlyOnce() async {
        let threads = 8
        let perThread = 10_000
        let counter = Counter()
        let fired = Shared<[Int: Int]>([:])
        let nextID = Atomic<Int>(0)
        @Sendable func arm() {
            let id = nextID.add(1, ordering: .relaxed).newValue
            withObservationTracking {
                _ = counter.count
            } onChange: {
                fired.withLock { $0[id, default: 0] += 1 }
                arm()
            }
        }
        for _ in 0..<threads { arm() }  // one chain per writer, armed before any write
        await ConcurrentObserverTests.onThreads(threads) { thread in
            for step in 0..<perThread { counter.count = thread * perThread + step + 1 }  // all distinct
        }
        let counts = fired.value
        let armed = nextID.load(ordering: .relaxed)
        #expect(
            counts.values.allSatisfy { $0 == 1 }, "fired more than once: \(counts.filter { $0.value > 1 }.prefix(10))")
        #expect(counts.count == armed - threads, "every tracking but the last of each chain fired")
        #expect(counts.count >= threads, "each chain fired at least once")
    }

    /// Trackings armed before the writers start, one per model on 200 models that 8 threads all
    /// write: each fires exactly once.
    @Test func concurrentWritersFireEachPreArmedTrackingExactlyOnce() async {
        let models = (0..<200).map { _ in Counter() }
        let fired = Shared<[Int]>(Array(repeating: 0, count: models.count))
        for (index, model) in models.enumerated() {
            withObservationTracking {
                _ = model.count
            } onChange: {
                fired.withLock { $0[index] += 1 }
            }
        }
        await ConcurrentObserverTests.onThreads(8) { thread in
            for round in 1...50 {
                for model in models { model.count = thread * 1000 + round }
            }
        }
        #expect(fired.value.allSatisfy { $0 == 1 }, "\(fired.value.enumerated().filter { $0.element != 1 }.prefix(10))")
    }

    @Test func anObserverIsReleasedWithItsModelEvenWhileItsTokenIsHeld() {
        final class Captured: Sendable {}
        weak var captured: Captured?
        var token: ObservationToken?
        do {
            let model = Counter()
            let object = Captured()
            captured = object
            token = model.observe(\.count) { _ in _ = object }
            model.count = 1
        }
        #expect(captured == nil, "the callback and what it captured go with the model")
        token?.cancel()  // still safe
        #expect(token?.isCancelled == true)
    }

    @Test func aCancelledObserverIsReleasedWhileItsModelAndTokenLive() {
        final class Captured: Sendable {}
        weak var captured: Captured?
        let model = Counter()
        let fired = Shared(0)
        var token: ObservationToken?
        do {
            let object = Captured()
            captured = object
            token = model.observe(\.count) { _ in
                _ = object
                fired.withLock { $0 += 1 }
            }
        }
        model.count = 1
        token?.cancel()
        #expect(captured == nil, "a cancelled observer's callback goes, though its token and model are kept")
        model.count = 2
        #expect(fired.value == 1)
        #expect(token?.isCancelled == true)
    }

    @Test func aChangeStreamFinishesWhenItsModelIsReleased() async {
        var model: Counter? = Counter()
        let stream = model!.changes(of: \.count)
        model!.count = 1
        model = nil
        var received: [Int] = []
        for await change in stream { received.append(change.new) }  // ends: the model is gone
        #expect(received == [1])
    }
}

@Suite("Declarations users write")
struct ModelDeclarationTests {
    @Test func aGenericModelWorksForEachSpecialisation() {
        let ints = Box<Int>()
        let strings = Box<String>()
        let seen = Shared<[String]>([])
        ints.observe(\.value) { change in seen.withLock { $0.append("int \(String(describing: change.new))") } }
        strings.observe(\.value) { change in seen.withLock { $0.append("string \(String(describing: change.new))") } }
        ints.value = 3
        ints.value = 3  // equal: no change
        strings.value = "x"
        strings.transaction { $0.label = "named" }
        #expect(seen.value == ["int Optional(3)", "string Optional(\"x\")"])
        #expect(Box<Int>._$schema.properties.map(\.name) == ["value", "label"])
        #expect(strings.label == "named" && ints.label == "box")
        #expect(ints.propertyVersions.keys.sorted() == ["value"])
    }

    @Test func handWrittenConformancesAreAccepted() throws {
        let model = DeclaredConformances()
        let asSendable: any Sendable = model
        let asObservable: any Observable = model
        #expect(asSendable is DeclaredConformances && asObservable is DeclaredConformances)
        model.count = 3
        model.tags = ["a", "b"]
        model.scratch = 9
        let json = try JSONEncoder().encode(model)
        let object = try JSONSerialization.jsonObject(with: json) as? [String: Any]
        #expect(object?["count"] as? Int == 3 && object?["scratch"] as? Int == 9 && object?["kind"] == nil)
        let decoded = try JSONDecoder().decode(DeclaredConformances.self, from: json)
        #expect(decoded.count == 3 && decoded.tags == ["a", "b"] && decoded.scratch == 9)
        #expect(decoded.propertyVersions.isEmpty, "a decoded model is fresh: no versions")
        // Keys a newer or older encoding lacks keep the initial values.
        let partial = try JSONDecoder().decode(DeclaredConformances.self, from: Data(#"{"count": 5}"#.utf8))
        #expect(partial.count == 5 && partial.tags == [] && partial.scratch == 7)
    }
}
