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
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let path = "\(directory)/fdatasync-probe-\(getpid())"
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0o600)
        guard fd >= 0 else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path, "errno": errno])
        }
        defer {
            close(fd)
            unlink(path)
        }
        if preallocated {
            // O_APPEND would write past the preallocated length: write from the start instead.
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_APPEND)
            // Zeros written, as the node's log grows (DeltaLog: not fallocated, whose unwritten
            // extents cost the sync of each new block a metadata write).
            let zeros = [UInt8](repeating: 0, count: samples * size)
            let written = zeros.withUnsafeBytes { write(fd, $0.baseAddress, zeros.count) }
            guard written == zeros.count, lseek(fd, 0, SEEK_SET) == 0, fsync(fd) == 0 else {
                throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path, "errno": errno])
            }
        }
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
            guard written == size, fdatasync(fd) == 0 else {
                throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path, "errno": errno])
            }
            timings.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1000)
        }
        timings.sort()
        func percentile(_ p: Double) -> Double { timings[min(timings.count - 1, Int(Double(timings.count) * p))] }
        return Latency(p50: percentile(0.50), p99: percentile(0.99), samples: samples)
    }
}
