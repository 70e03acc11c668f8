import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// What one node process used, read from `/proc` (Linux) just before the harness stops it.
public struct ProcessResources: Sendable, Equatable {
    /// User and system CPU time of the process, in seconds.
    public var cpuSeconds: Double
    /// Its peak resident set size (`VmHWM`), in KiB.
    public var peakResidentKilobytes: Int
    /// How long it has been running, in seconds.
    public var uptimeSeconds: Double

    /// Reads the figures of process `pid`; `nil` when `/proc` does not have them.
    public static func read(pid: Int32) -> ProcessResources? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
            let uptime = try? String(contentsOfFile: "/proc/uptime", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return nil }
        // Fields after "pid (comm)": state is field 3; utime 14, stime 15, starttime 22.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 19, let user = Double(fields[11]), let system = Double(fields[12]),
            let start = Double(fields[19]), let since = Double(uptime.split(separator: " ").first ?? "")
        else { return nil }
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        let peak =
            status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }
            .flatMap { Int($0.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") } ?? 0
        return ProcessResources(
            cpuSeconds: (user + system) / ticks, peakResidentKilobytes: peak, uptimeSeconds: since - start / ticks)
    }
}
