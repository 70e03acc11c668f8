import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// The disk's own limit on a durable write: the latency of `fdatasync` after a small write, in
/// the directory the nodes keep their data in (docs/PROTOCOL.md 11.2: a durable acknowledgement
/// waits for one). Measured two ways: appending (each sync also commits the file's new size) and
/// writing into preallocated space (as the node's log does, Appendix B), which is the floor.
enum DiskBench {
    struct Latency {
        var p50: Double
        var p99: Double
        var samples: Int
    }

    /// Writes `samples` records of `size` octets one after another to a new file in `directory`,
    /// each followed by `fdatasync`, and returns the latency percentiles of write + sync, in
    /// microseconds. `preallocated`: the file is first grown (zeros written and synced) to hold them all.
    /// `rate`: one write every 1/`rate` seconds (on a steady schedule) instead of back to back:
    /// a sync that finds the disk idle can cost more than one that follows another (on this
    /// project's VM, p50 ~130 µs at 1k/s against ~85 µs back to back).
    static func fdatasyncLatency(
        directory: String, samples: Int, size: Int = 64, preallocated: Bool = false, rate: Int? = nil
    ) throws -> Latency {
        try withProbe(in: directory, named: "fdatasync-probe", preallocating: preallocated ? samples * size : nil) {
            fd, fail in
            try fdatasyncLatency(of: fd, samples: samples, size: size, rate: rate, fail: fail)
        }
    }

    private static func fdatasyncLatency(
        of fd: Int32, samples: Int, size: Int, rate: Int?, fail: () -> CocoaError
    ) throws -> Latency {
        let record = [UInt8](repeating: 0x5A, count: size)
        var timings: [Double] = []
        timings.reserveCapacity(samples)
        var due = timespec()
        clock_gettime(CLOCK_MONOTONIC, &due)
        for _ in 0..<samples {
            if let rate {
                due.tv_nsec += 1_000_000_000 / max(rate, 1)
                while due.tv_nsec >= 1_000_000_000 {
                    due.tv_nsec -= 1_000_000_000
                    due.tv_sec += 1
                }
                while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, nil) == EINTR {}
            }
            let start = DispatchTime.now().uptimeNanoseconds
            let written = record.withUnsafeBytes { write(fd, $0.baseAddress, size) }
            guard written == size, fdatasync(fd) == 0 else { throw fail() }
            timings.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1000)
        }
        return Latency(timings)
    }

    /// The disk's limit on a stream of durable writes: writes of `size` octets arriving `rate`
    /// times a second for `seconds`, on a steady schedule, made durable as a node's log makes
    /// them (group commit): one `fdatasync` at a time, each covering every write that arrived
    /// before it started. A write's latency runs from its arrival to the end of the sync that
    /// covered it, so it includes the wait for the sync in progress when it arrived, and a write
    /// that arrives while the disk stalls is counted with the whole wait, as a node's writes are
    /// (they keep coming). ``fdatasyncLatency(directory:samples:size:preallocated:rate:)`` times
    /// each sync from its own start instead: it leaves out the writes a stall delays (coordinated
    /// omission), so its p99 misses the stalls that set a node's. Into preallocated space, as
    /// the log writes. The write the loop slept for counts from when it woke (as a node's writer
    /// stamps a change when it runs, not when its timer was due). `sync` is `fdatasync` but in
    /// tests (a stall planted).
    static func fdatasyncStream(
        directory: String, rate: Int, seconds: Double, size: Int = 64, sync: (Int32) -> Int32 = { fdatasync($0) }
    ) throws -> Latency {
        let count = max(1, Int(Double(rate) * seconds))
        return try withProbe(in: directory, named: "fdatasync-stream", preallocating: count * size) { fd, fail in
            try fdatasyncStream(of: fd, rate: rate, count: count, size: size, sync: sync, fail: fail)
        }
    }

    private static func fdatasyncStream(
        of fd: Int32, rate: Int, count: Int, size: Int, sync: (Int32) -> Int32, fail: () -> CocoaError
    ) throws -> Latency {
        let interval = 1_000_000_000 / UInt64(max(rate, 1))
        let records = [UInt8](repeating: 0x5A, count: count * size)
        var timings: [Double] = []
        timings.reserveCapacity(count)
        let start = monotonicNanoseconds() + 1_000_000
        var next = 0  // the first write not yet made durable
        while next < count {
            var now = monotonicNanoseconds()
            var sleptFor: Int?
            let due = start + UInt64(next) * interval
            if due > now {
                var until = timespec(tv_sec: Int(due / 1_000_000_000), tv_nsec: Int(due % 1_000_000_000))
                while clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, nil) == EINTR {}
                now = monotonicNanoseconds()
                sleptFor = next
            }
            // Every write due by now goes in this sync.
            let end = min(count, Int((now - start) / interval) + 1)
            let written = records.withUnsafeBytes {
                pwrite(fd, $0.baseAddress! + next * size, (end - next) * size, off_t(next * size))
            }
            guard written == (end - next) * size, sync(fd) == 0 else { throw fail() }
            let synced = monotonicNanoseconds()
            for index in next..<end {
                let arrived = index == sleptFor ? now : start + UInt64(index) * interval
                timings.append(Double(synced - arrived) / 1000)
            }
            next = end
        }
        return Latency(timings)
    }

    /// Runs `body` on a new file `named` in `directory`, removed after it, with the error to throw
    /// for a failed call on it. `preallocating`: the file is first grown by that many zeros,
    /// written and synced, as the node's log grows (DeltaLog: not fallocated, whose unwritten
    /// extents cost the sync of each new block a metadata write), and written from its start;
    /// without, each write appends.
    private static func withProbe<Result>(
        in directory: String, named name: String, preallocating octets: Int?,
        _ body: (Int32, () -> CocoaError) throws -> Result
    ) throws -> Result {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let path = "\(directory)/\(name)-\(getpid())"
        func fail() -> CocoaError {
            CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path, "errno": errno])
        }
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | (octets == nil ? O_APPEND : 0), 0o600)
        guard fd >= 0 else { throw fail() }
        defer {
            close(fd)
            unlink(path)
        }
        if let octets {
            let zeros = [UInt8](repeating: 0, count: octets)
            let written = zeros.withUnsafeBytes { write(fd, $0.baseAddress, zeros.count) }
            guard written == zeros.count, lseek(fd, 0, SEEK_SET) == 0, fsync(fd) == 0 else { throw fail() }
        }
        return try body(fd, fail)
    }
}

extension DiskBench.Latency {
    /// The percentiles of `timings` (microseconds, in any order; at least one).
    init(_ timings: [Double]) {
        let sorted = timings.sorted()
        func percentile(_ p: Double) -> Double { sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))] }
        self.init(p50: percentile(0.50), p99: percentile(0.99), samples: sorted.count)
    }
}
