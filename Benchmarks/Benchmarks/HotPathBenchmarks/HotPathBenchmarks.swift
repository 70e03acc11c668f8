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

    Benchmark("merge: apply a delta to the replica store") { benchmark in
        var store = ReplicaStore()
        var delta = sampleDelta
        for i in benchmark.scaledIterations {
            delta.version = Version(milliseconds: 1_795_000_000_000 + UInt64(i), counter: 0, node: "node1")
            blackHole(store.apply(delta))
        }
    }

    Benchmark("notify: a property set with one observer (exact old/new)") { benchmark in
        let item = Item()
        item.observe(\.count) { change in blackHole(change.new) }
        for i in benchmark.scaledIterations {
            item.count = i
        }
    }

    Benchmark("transaction: two properties, one version") { benchmark in
        let item = Item()
        for i in benchmark.scaledIterations {
            item.transaction {
                $0.count = i
                $0.title = "t"
            }
        }
    }
}
