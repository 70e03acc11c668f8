/// A deterministic random source (SplitMix64): the same seed gives the same numbers, on every
/// machine, in every run.
///
/// A simulation draws one top-level seed and gives each subsystem (network, disk, clocks,
/// workload, fault schedule) its own ``fork(_:)``, so changing how one subsystem draws does not
/// reshuffle the others.
public struct SeededRandom: RandomNumberGenerator, Sendable {
    private var state: UInt64
    /// The seed this source was created with: forks derive from it.
    private let origin: UInt64

    /// A source starting from `seed`.
    public init(seed: UInt64) {
        state = seed
        origin = seed
    }

    /// The next 64 random bits.
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// An independent source for the subsystem called `label`, derived from this one's seed
    /// (not from how far it has been drawn).
    public func fork(_ label: String) -> SeededRandom {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in label.utf8 {
            hash ^= UInt64(byte)
            hash &*= 0x100_0000_01b3
        }
        var mixer = SeededRandom(seed: origin ^ hash)
        return SeededRandom(seed: mixer.next())
    }

    /// A number in `0..<bound` (`bound` > 0).
    public mutating func below(_ bound: Int) -> Int {
        Int(next() % UInt64(bound))
    }

    /// A number in `range`.
    public mutating func inRange(_ range: ClosedRange<Int>) -> Int {
        range.lowerBound + below(range.count)
    }

    /// `true` with probability `p`.
    public mutating func chance(_ p: Double) -> Bool {
        p > 0 && Double(next() >> 11) / Double(1 << 53) < p
    }

    /// A number in `0..<1`.
    public mutating func unit() -> Double {
        Double(next() >> 11) / Double(1 << 53)
    }
}
