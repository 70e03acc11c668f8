import Dispatch

/// Where a node runs the observers of changes its I/O thread applied: one serial queue per node.
///
/// The I/O thread applies a peer's writes to the store and to the live models (under each
/// model's lock, so reads see them at once) and hands the notifications here: an observer that
/// is slow, or waits, delays other observers, never the node's receiving, publishing, repairs
/// or heartbeats. One queue keeps each model's notifications in apply order (the model's
/// registrar delivers its own queue in order, one delivering thread at a time).
final class ObserverExecutor: Sendable {
    private let queue: DispatchQueue

    init(label: String) {
        queue = DispatchQueue(label: label)
    }

    /// Runs `job` after every job submitted before it.
    func run(_ job: @escaping @Sendable () -> Void) {
        queue.async(execute: job)
    }

    /// Returns once every job submitted before the call has run.
    func flush() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            queue.async { continuation.resume() }
        }
    }
}
