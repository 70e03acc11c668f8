#if canImport(Glibc)
    import Glibc
#endif

/// Nanoseconds of CLOCK_MONOTONIC: one clock for every process of the machine, so a value
/// stamped by the writer process can be compared by the reader process.
func monotonicNanoseconds() -> UInt64 {
    var spec = timespec()
    clock_gettime(CLOCK_MONOTONIC, &spec)
    return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
}

/// Waits until `deadline` (monotonic ns): sleeps while far, spins for the last 100 µs.
func waitUntilNanoseconds(_ deadline: UInt64) {
    while true {
        let now = monotonicNanoseconds()
        if now >= deadline { return }
        if deadline - now > 200_000 { usleep(UInt32((deadline - now - 150_000) / 1000)) }
    }
}

/// Percentiles of latency samples, in microseconds.
struct LatencySummary: Sendable {
    var p50: Double
    var p99: Double
    var p999: Double
    var samples: Int

    init(nanoseconds: [UInt64]) {
        let sorted = nanoseconds.sorted()
        func at(_ q: Double) -> Double {
            guard !sorted.isEmpty else { return .nan }
            return Double(sorted[min(sorted.count - 1, Int(Double(sorted.count) * q))]) / 1000
        }
        p50 = at(0.5)
        p99 = at(0.99)
        p999 = at(0.999)
        samples = sorted.count
    }
}

/// Resident set size of this process, in bytes (/proc/self/statm).
func residentBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let fields = text.split(separator: " ")
    guard fields.count > 1, let pages = Int(fields[1]) else { return 0 }
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}
