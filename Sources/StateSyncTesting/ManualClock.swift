import Synchronization

/// A clock that moves only when told: the simulator's time, in milliseconds. Nodes read it as
/// their monotonic clock and (with their skew) as their wall clock.
///
/// Thread safety: may be read from any thread; the simulator moves it from one.
public final class ManualClock: Sendable {
    private let milliseconds: Atomic<UInt64>

    /// A clock at `start` milliseconds.
    public init(start: UInt64 = 0) {
        milliseconds = Atomic(start)
    }

    /// The current time, in milliseconds.
    public var now: UInt64 { milliseconds.load(ordering: .relaxed) }

    /// Moves the clock to `time` (never backwards).
    public func advance(to time: UInt64) {
        _ = milliseconds.max(time, ordering: .relaxed)
    }

    /// Moves the clock on by `delta` milliseconds.
    public func advance(by delta: UInt64) {
        milliseconds.add(delta, ordering: .relaxed)
    }
}
