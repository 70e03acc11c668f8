#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Nanoseconds of CLOCK_MONOTONIC: one clock for every process of the machine, so a value
/// stamped by the writer process can be compared by the reader process.
func monotonicNanoseconds() -> UInt64 {
    var spec = timespec()
    clock_gettime(CLOCK_MONOTONIC, &spec)
    return UInt64(spec.tv_sec) * 1_000_000_000 + UInt64(spec.tv_nsec)
}

/// CPU seconds (user + system) this process has used so far, all threads: what a measured
/// phase cost is the difference of two readings (steadier on a shared machine than a rate).
func processCPUSeconds() -> Double {
    var usage = rusage()
    #if canImport(Glibc)
        getrusage(RUSAGE_SELF.rawValue, &usage)  // an enum in Glibc's import
    #else
        getrusage(RUSAGE_SELF, &usage)
    #endif
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
        + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

/// Waits until `deadline` (monotonic ns) asleep: a fixed-rate sender must not spin, or on a
/// 2-core machine it takes a core from the threads whose latency is being measured. The send
/// time is stamped after waking, so wake-up jitter (timer slack, 50 µs by default) shifts the
/// rate a little, not the measured latency.
func waitUntilNanoseconds(_ deadline: UInt64) {
    #if canImport(Glibc)
        var target = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
        while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &target, nil) == EINTR {}
    #else
        while case let now = monotonicNanoseconds(), now < deadline { usleep(UInt32((deadline - now) / 1000)) }
    #endif
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
