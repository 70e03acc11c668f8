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
    private let state = Mutex<UInt64>(0)  // the last timestamp issued or observed
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
        let stamp = state.withLock { last in
            last = max(last + 1, physical)
            return last
        }
        return Version(timestamp: stamp, node: node)
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
        let stamp = remote.timestamp
        state.withLock { last in last = max(last, stamp) }
        return true
    }

    /// Moves the clock past `version` unconditionally: for this node's own earlier writes (from
    /// its snapshot), which it must never issue a version below, whatever the wall clock says.
    public func advance(past version: Version) {
        let stamp = version.timestamp
        state.withLock { last in last = max(last, stamp) }
    }

    /// The last timestamp issued or followed: every version this clock issues from now on is
    /// above it.
    public var lastTimestamp: UInt64 { state.withLock { $0 } }

    /// How many peer timestamps were too far ahead to follow.
    public var driftRejectionCount: Int { driftRejections.load(ordering: .relaxed) }
}

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
