/// The state a node shares between its I/O thread and its API callers, kept behind one lock.
/// Pure data and transitions: no sockets, no threads.
struct NodeCore: Sendable {
    var store = ReplicaStore()
    var instances: [ModelAddress: InstanceReference] = [:]
    var origins: [String: OriginProgress] = [:]
    var peers: [String: PeerProgress] = [:]
    var counters = NodeCounters()

    /// What this node has seen of one origin's sequence numbers.
    struct OriginProgress: Sendable {
        var highestSequence: UInt64 = 0
        var incarnation: UInt64 = 0
    }

    /// What this node has seen from one configured peer endpoint.
    struct PeerProgress: Sendable {
        var node: String?
        var lastMessageAt: UInt64?
        var deltasReceived = 0
    }

    /// Records `delta`'s sequence number. Gaps and repeats are counted, never acted on here:
    /// applying is idempotent, so a repeat is harmless, and repair is the job of issue #5.
    mutating func track(_ delta: Delta) {
        var progress = origins[delta.origin, default: OriginProgress()]
        if delta.sequence <= progress.highestSequence {
            counters.duplicateDeltas += 1
        } else {
            if progress.highestSequence > 0, delta.sequence > progress.highestSequence + 1 {
                counters.sequenceGaps += Int(delta.sequence - progress.highestSequence - 1)
            }
            progress.highestSequence = delta.sequence
        }
        origins[delta.origin] = progress
    }

    /// The live model instance at `address`, dropping the entry when it was deallocated.
    mutating func liveInstance(at address: ModelAddress) -> (any ReplicatedModel)? {
        guard let reference = instances[address] else { return nil }
        if let model = reference.model { return model }
        instances[address] = nil
        return nil
    }
}

/// A weak reference to a model instance attached to a node: the node does not keep models alive.
final class InstanceReference: Sendable {
    // Written once at init; `weak` reads are atomic in Swift.
    nonisolated(unsafe) weak var model: (any ReplicatedModel)?

    init(_ model: any ReplicatedModel) {
        self.model = model
    }
}

/// Local writes waiting for the I/O thread, in sequence order.
struct Outbox: Sendable {
    var nextSequence: UInt64 = 1
    var pending: [Delta] = []

    /// Gives `delta` the next sequence number and queues it.
    mutating func enqueue(address: ModelAddress, version: Version, writes: [PropertyWrite]) {
        pending.append(
            Delta(channel: address.channel, model: address.model, version: version, sequence: nextSequence, properties: writes))
        nextSequence += 1
    }

    var latestSequence: UInt64 { nextSequence - 1 }
}
