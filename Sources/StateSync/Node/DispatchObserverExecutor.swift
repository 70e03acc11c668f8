import Dispatch
import Synchronization

/// Where a node runs the observers of changes its I/O thread applied: one serial queue per node.
/// (A typed model mirrored by a client runs its remote changes' observers on one of its own.)
///
/// The I/O thread applies a peer's writes to the store and to the live models (under each
/// model's lock, so reads see them at once) and hands the notifications here: an observer that
/// is slow, or waits, delays other observers, never the node's receiving, publishing, repairs
/// or heartbeats. One queue keeps each model's notifications in apply order (the model's
/// registrar delivers its own queue in order, one delivering thread at a time).
package final class DispatchObserverExecutor: ObserverExecutor {
    private let queue: DispatchQueue
    private let weights = Atomic<Int>(0)

    package init(label: String) {
        queue = DispatchQueue(label: label)
    }

    package func run(weight: Int, _ job: @escaping @Sendable () -> Void) {
        let weight = max(weight, 1)
        weights.add(weight, ordering: .relaxed)
        queue.async { [self] in
            job()
            weights.subtract(weight, ordering: .relaxed)
        }
    }

    package var backlog: Int { weights.load(ordering: .relaxed) }

    package func flush() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            queue.async { continuation.resume() }
        }
    }
}
