import Synchronization

/// A hybrid logical clock (Kulkarni et al., 2014): timestamps close to wall-clock time that never
/// go backwards on this node, even when the wall clock steps back, and that move past every
/// timestamp this node has seen from a peer (within ``maximumDrift``).
///
/// Thread safety: all methods may be called from any thread.
public final class HybridLogicalClock: Sendable {
    /// The node whose writes this clock stamps.
    public let node: String
    /// How far ahead of the local wall clock a peer's timestamp may pull this clock.
    public let maximumDrift: UInt64
    private let wallClock: @Sendable () -> UInt64
    /// The last timestamp issued or observed. An atomic, moved by compare-and-exchange: every
    /// local write takes a version, inside the outbox's lock, and a mutex here was a second lock
    /// (two atomic operations) on that path, where one exchange does.
    private let last = Atomic<UInt64>(0)
    private let driftRejections = Atomic<Int>(0)

    /// - Parameters:
    ///   - node: the id stamped into every version.
    ///   - maximumDriftMilliseconds: peers further ahead than this are not followed.
    ///   - wallClock: milliseconds since 1970; injectable for tests.
    public init(
        node: String,
        maximumDriftMilliseconds: UInt64 = 60_000,
        wallClock: @escaping @Sendable () -> UInt64 = HybridLogicalClock.systemMilliseconds
    ) {
        self.node = node
        self.maximumDrift = maximumDriftMilliseconds
        self.wallClock = wallClock
    }

    /// Milliseconds since 1970 from the system's real-time clock.
    @Sendable public static func systemMilliseconds() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return UInt64(spec.tv_sec) * 1000 + UInt64(spec.tv_nsec) / 1_000_000
    }

    /// The wall clock this clock reads, in milliseconds since 1970 (the injected one).
    public func wallMilliseconds() -> UInt64 { wallClock() }

    /// A new version for a local write, greater than every version issued or observed before.
    public func next() -> Version {
        let physical = wallClock() << 16
        var seen = last.load(ordering: .acquiring)
        while true {
            let stamp = max(seen + 1, physical)
            let (exchanged, current) = last.compareExchange(
                expected: seen, desired: stamp, ordering: .acquiringAndReleasing)
            if exchanged { return Version(timestamp: stamp, node: node) }
            seen = current
        }
    }

    /// Takes a peer's version into account. Returns `false` (and does not follow it) when it is
    /// further ahead of the local wall clock than ``maximumDrift``.
    @discardableResult
    public func observe(_ remote: Version) -> Bool {
        let now = wallClock()
        if remote.milliseconds > now + maximumDrift {
            driftRejections.add(1, ordering: .relaxed)
            return false
        }
        raise(to: remote.timestamp)
        return true
    }

    /// Moves the clock past `version` unconditionally: for this node's own earlier writes (from
    /// its snapshot), which it must never issue a version below, whatever the wall clock says.
    public func advance(past version: Version) {
        raise(to: version.timestamp)
    }

    /// Moves the last timestamp up to `stamp` if it is below.
    private func raise(to stamp: UInt64) {
        var seen = last.load(ordering: .acquiring)
        while seen < stamp {
            let (exchanged, current) = last.compareExchange(
                expected: seen, desired: stamp, ordering: .acquiringAndReleasing)
            if exchanged { return }
            seen = current
        }
    }

    /// The last timestamp issued or followed: every version this clock issues from now on is
    /// above it.
    public var lastTimestamp: UInt64 { last.load(ordering: .acquiring) }

    /// How many peer timestamps were too far ahead to follow.
    public var driftRejectionCount: Int { driftRejections.load(ordering: .relaxed) }
}

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
