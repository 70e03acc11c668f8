import Synchronization
import Testing

@testable import StateSync

/// Property-based convergence: N in-process replicas, random concurrent writes on random replicas
/// (single sets and transactions), deliveries shuffled, duplicated and delayed. Every replica
/// must end with the same state digest, the same model values, and observer chains in which
/// each old equals the previous new.
@Suite("Convergence under reordering, duplication and delay")
struct ConvergenceTests {
    final class Replica {
        let id: String
        let clock: HybridLogicalClock
        var store = ReplicaStore()
        let model = Counter()
        let chains = Shared<[String: [(old: String, new: String, version: Version)]]>([:])
        let wall: Shared<UInt64>

        init(id: String, skew: UInt64) {
            self.id = id
            let wall = Shared<UInt64>(1_000_000 + skew)
            self.wall = wall
            self.clock = HybridLogicalClock(node: id, wallClock: { wall.value })
            let chains = self.chains
            model.observe(\.count) { c in
                chains.withLock { $0["count", default: []].append(("\(c.old)", "\(c.new)", c.version)) }
            }
            model.observe(\.title) { c in chains.withLock { $0["title", default: []].append((c.old, c.new, c.version)) }
            }
        }

        func write(_ properties: [PropertyWrite], sequence: UInt64) -> Delta {
            let delta = Delta(
                channel: "c", model: "m", version: clock.next(), sequence: sequence, properties: properties)
            receive(delta, remote: false)
            return delta
        }

        func receive(_ delta: Delta, remote: Bool) {
            if remote { clock.observe(delta.version) }
            let changes = store.apply(delta)
            if !changes.isEmpty {
                let writes = changes.map { PropertyWrite(name: $0.property, value: $0.new) }
                let result = model._$registrar.applyRemote(
                    model, writes: writes, version: delta.version, isRemote: remote)
                #expect(result.rejected.isEmpty)
            }
        }
    }

    @Test(arguments: 1...40)
    func replicasConverge(seed: UInt64) {
        var rng = SplitMix64(seed: seed)
        let replicaCount = 3 + Int(rng.next() % 3)
        let replicas = (0..<replicaCount).map { Replica(id: "r\($0)", skew: rng.next() % 50) }
        var inFlight: [(to: Int, delta: Delta)] = []
        var sequences = [UInt64](repeating: 0, count: replicaCount)
        let operations = 300

        for _ in 0..<operations {
            for replica in replicas { replica.wall.withLock { $0 += rng.next() % 3 } }
            let action = rng.next() % 10
            if action < 4 || inFlight.isEmpty {
                let writer = Int(rng.next() % UInt64(replicaCount))
                var writes: [PropertyWrite] = []
                if rng.next() % 3 == 0 {  // a transaction of both properties
                    writes = [
                        PropertyWrite(name: "count", value: .int(Int64(rng.next() % 20))),
                        PropertyWrite(name: "title", value: .string("t\(rng.next() % 20)")),
                    ]
                } else if rng.next() % 2 == 0 {
                    writes = [PropertyWrite(name: "count", value: .int(Int64(rng.next() % 20)))]
                } else {
                    writes = [PropertyWrite(name: "title", value: .string("t\(rng.next() % 20)"))]
                }
                sequences[writer] += 1
                let delta = replicas[writer].write(writes, sequence: sequences[writer])
                for target in 0..<replicaCount where target != writer { inFlight.append((target, delta)) }
            } else {
                let index = Int(rng.next() % UInt64(inFlight.count))
                let message = inFlight[index]
                if rng.next() % 5 != 0 { inFlight.remove(at: index) }  // else: delivered again later
                replicas[message.to].receive(message.delta, remote: true)
            }
        }
        // Heal: everything still in flight arrives, in a shuffled order.
        inFlight.shuffle(using: &rng)
        for message in inFlight { replicas[message.to].receive(message.delta, remote: true) }

        let digests = Set(replicas.map(\.store.digest))
        #expect(digests.count == 1, "seed \(seed): digests differ")
        let values = Set(replicas.map { "\($0.model.count)|\($0.model.title)" })
        #expect(values.count == 1, "seed \(seed): model values differ: \(values)")
        for replica in replicas {
            let stored = replica.store.properties(of: ModelAddress(channel: "c", model: "m"))
            if let count = stored["count"] { #expect(count.value == .int(Int64(replica.model.count)), "seed \(seed)") }
            for (property, chain) in replica.chains.withLock({ $0 }) {
                for index in chain.indices.dropFirst() {
                    #expect(
                        chain[index].old == chain[index - 1].new,
                        "seed \(seed): \(replica.id).\(property) chain broken at \(index)")
                    #expect(
                        chain[index].version > chain[index - 1].version,
                        "seed \(seed): \(replica.id).\(property) went back")
                }
            }
        }
    }
}
