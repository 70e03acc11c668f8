import Synchronization

/// A lock-protected value that closures can capture (Mutex itself is non-copyable).
final class Shared<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: Value) { mutex = Mutex(value) }
    func withLock<R>(_ body: (inout Value) -> R) -> R { mutex.withLock { body(&$0) } }
    var value: Value { mutex.withLock { $0 } }
}
