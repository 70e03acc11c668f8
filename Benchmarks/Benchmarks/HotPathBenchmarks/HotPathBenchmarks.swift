import Benchmark
import StateSync

/// A model like an app's: a counter and a title.
@Replicated
final class Item {
    var count = 0
    var title = "untitled"
}

let sampleDelta = Delta(
    channel: "bench", model: "item-1", version: Version(milliseconds: 1_795_000_000_000, counter: 1, node: "node1"),
    sequence: 42, properties: [PropertyWrite(name: "count", value: .int(12_345)), PropertyWrite(name: "title", value: "hello")])

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration.metrics = [.wallClock, .throughput, .mallocCountTotal]
    Benchmark.defaultConfiguration.maxDuration = .seconds(2)

    Benchmark("encode: a two-property DELTA") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(PeerMessage.delta(sampleDelta).encode())
        }
    }

    let frames = PeerMessage.delta(sampleDelta).encode()
    Benchmark("decode: a two-property DELTA") { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(try? PeerMessage.decode(frames))
        }
    }

    // The hot-path benchmarks below measure steady state: their set-up (a store holding the
    // model, a model with its observer) is outside the measurement, and one sample is 1,000
    // operations, reported per operation. (Until 2026-11-24 each sample was one operation
    // including the set-up, so "merge" measured the first write of a model into an empty store.)
    let steady = Benchmark.Configuration(scalingFactor: .kilo)

    Benchmark("merge: apply a delta to the replica store", configuration: steady) { benchmark in
        var store = ReplicaStore()
        var delta = sampleDelta
        blackHole(store.apply(delta))
        benchmark.startMeasurement()
        for i in benchmark.scaledIterations {
            delta.version = Version(milliseconds: 1_795_000_000_001 + UInt64(i), counter: 0, node: "node1")
            blackHole(store.apply(delta))
        }
    }

    Benchmark("merge: the first write of a model into an empty store") { benchmark in
        for _ in benchmark.scaledIterations {
            var store = ReplicaStore()
            blackHole(store.apply(sampleDelta))
        }
    }

    Benchmark("notify: a property set with one observer (exact old/new)", configuration: steady) { benchmark in
        let item = Item()
        item.observe(\.count) { change in blackHole(change.new) }
        benchmark.startMeasurement()
        for i in benchmark.scaledIterations {
            item.count = i + 1
        }
    }

    Benchmark("transaction: two properties, one version", configuration: steady) { benchmark in
        let item = Item()
        benchmark.startMeasurement()
        for i in benchmark.scaledIterations {
            item.transaction {
                $0.count = i + 1
                $0.title = i & 1 == 0 ? "t" : "u"
            }
        }
    }
}
