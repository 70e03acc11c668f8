import ChildProcesses
import Foundation
import Logging
public import StateSync
import StateSyncClient
import StateSyncHarness
import StateSyncZeroMQ
import ZeroMQ

#if canImport(Glibc)
    import Glibc
#endif

/// `statesync bench`: the whole path measured against raw libzmq, in one run on one machine.
public enum Bench {
    public struct Options: Sendable {
        public var quick = false
        /// The `statesync` executable, to start the two node processes.
        public var executable: String
        public init(executable: String, quick: Bool = false) {
            self.executable = executable
            self.quick = quick
        }
    }

    public struct Report: Sendable {
        public var figures: [(key: String, value: Double)] = []
        public var notes: [String] = []

        subscript(key: String) -> Double? { figures.first { $0.key == key }?.value }

        /// The limits every latency is bounded by — raw one-way latency for a path that does
        /// not wait for the disk, raw one-way + fdatasync for a durable one — and the ratios of
        /// each figure to its limit, so that runs on different days compare.
        mutating func addLimitsAndRatios() {
            func add(_ key: String, _ value: Double?) {
                guard let value, value.isFinite else { return }
                figures.append((key, value))
            }
            func divide(_ a: String, by b: String) -> Double? {
                guard let x = self[a], let y = self[b], y > 0 else { return nil }
                return x / y
            }
            // The disk's floor: the faster of an append and a write into preallocated space.
            func floor(_ a: String, _ b: String) -> Double? {
                [self[a], self[b]].compactMap { $0 }.min()
            }
            // At 10k/s and at 1k/s ("lone"): raw one-way at that rate + the disk at that rate: a
            // stream of writes at that rate, group-committed (since 2026-12-02). Without it (a
            // report from before), the syncs timed one by one: at 10k/s back to back, at 1k/s
            // paced; those leave out the wait for a sync in progress and for a stall.
            for rate in ["", "_lone"] {
                for percentile in ["p50", "p99"] {
                    guard let raw = self["raw_latency\(rate)_\(percentile)_us"] else { continue }
                    let disk =
                        self["fsync_stream\(rate)_\(percentile)_us"]
                        ?? (rate.isEmpty
                            ? floor("fsync_\(percentile)_us", "fsync_preallocated_\(percentile)_us")
                            : self["fsync_lone_\(percentile)_us"])
                    add("limit_durable\(rate)_\(percentile)_us", disk.map { raw + $0 })
                }
            }
            add("deltas_per_s_ratio_raw", divide("deltas_per_s", by: "raw_msgs_per_s"))
            add("properties_per_s_tx_ratio_raw", divide("properties_per_s_tx", by: "raw_msgs_per_s"))
            add("latency_p50_ratio_limit", divide("latency_p50_us", by: "limit_durable_p50_us"))
            add("latency_p99_ratio_limit", divide("latency_p99_us", by: "limit_durable_p99_us"))
            add("latency_lone_p50_ratio_limit", divide("latency_lone_p50_us", by: "limit_durable_lone_p50_us"))
            add("latency_lone_p99_ratio_limit", divide("latency_lone_p99_us", by: "limit_durable_lone_p99_us"))
            for rate in ["", "_lone"] {
                for percentile in ["p50", "p99"] {
                    add(
                        "latency\(rate)_\(percentile)_written_ratio_limit",
                        divide("latency\(rate)_\(percentile)_us_written", by: "limit_durable\(rate)_\(percentile)_us"))
                }
            }
            add("latency_p50_interval_ratio_raw", divide("latency_p50_us_interval", by: "raw_latency_p50_us"))
            add("latency_p99_interval_ratio_raw", divide("latency_p99_us_interval", by: "raw_latency_p99_us"))
        }

        public var value: Value {
            var map: [String: Value] = [:]
            for (key, value) in figures {
                // Ratios keep three decimals; the rest one.
                let scale = key.contains("_ratio_") ? 1000.0 : 10.0
                map[key] = value.isFinite ? .double((value * scale).rounded() / scale) : .null
            }
            map["notes"] = .array(notes.map(Value.string))
            return .map(map)
        }

        public var humanText: String {
            let raw = self["raw_msgs_per_s"] ?? .nan
            func ratio(_ value: Double?, to base: Double, inverse: Bool = false) -> String {
                guard let value, base.isFinite, base > 0, value.isFinite, value > 0 else { return "" }
                return inverse
                    ? String(format: "  (%.1f× raw)", value / base)
                    : String(format: "  (%.0f%% of raw)", 100 * value / base)
            }
            var lines = ["StateSync bench (\(ProcessInfo.processInfo.processorCount) cores)"]
            func line(_ label: String, _ key: String, _ unit: String, _ suffix: String = "") {
                guard let value = self[key] else { return }
                // A longer label is kept whole (padding would cut it), its figure out of line.
                let padded = label.count < 46 ? label.padding(toLength: 46, withPad: " ", startingAt: 0) : label + " "
                lines.append("  \(padded)\(String(format: "%14.1f", value)) \(unit)\(suffix)")
            }
            line("raw libzmq PUB→SUB, delta-sized messages", "raw_msgs_per_s", "msg/s")
            line("raw one-way latency p50 at 10k/s", "raw_latency_p50_us", "µs")
            line("raw one-way latency p99 at 10k/s", "raw_latency_p99_us", "µs")
            line("raw one-way latency p50 at 1k/s", "raw_latency_lone_p50_us", "µs")
            line("raw one-way latency p99 at 1k/s", "raw_latency_lone_p99_us", "µs")
            line("the same at 10k/s, one context, p50", "raw_latency_shared_context_p50_us", "µs")
            line("the same at 1k/s, one context, p50", "raw_latency_lone_shared_context_p50_us", "µs")
            line("fdatasync of a small append, p50", "fsync_p50_us", "µs")
            line("fdatasync of a small append, p99", "fsync_p99_us", "µs")
            line("fdatasync into preallocated space, p50", "fsync_preallocated_p50_us", "µs")
            line("fdatasync into preallocated space, p99", "fsync_preallocated_p99_us", "µs")
            line("the same, one write every millisecond, p50", "fsync_lone_p50_us", "µs")
            line("the same, one write every millisecond, p99", "fsync_lone_p99_us", "µs")
            for (rate, label) in [("", "10k/s"), ("_lone", "1k/s")] {
                for percentile in ["p50", "p99"] {
                    line(
                        "durable writes at \(label), disk alone, \(percentile)", "fsync_stream\(rate)_\(percentile)_us",
                        "µs")
                }
            }
            line("deltas/s at the reader, single sets", "deltas_per_s", "/s", ratio(self["deltas_per_s"], to: raw))
            line(
                "deltas/s at the reader, 8-property tx", "deltas_per_s_tx", "/s",
                ratio(self["deltas_per_s_tx"], to: raw))
            line(
                "properties/s at the reader, 8-property tx", "properties_per_s_tx", "/s",
                ratio(self["properties_per_s_tx"], to: raw))
            line("CPU per single set (both processes)", "cpu_us_per_delta", "µs")
            line("CPU per 8-property tx (both processes)", "cpu_us_per_tx", "µs")
            /// A latency's line, with the limit it is bounded by.
            func limited(_ label: String, _ key: String, _ limitKey: String, _ name: String) {
                guard let value = self[key], let limit = self[limitKey], limit > 0 else {
                    return line(label, key, "µs")
                }
                line(
                    label, key, "µs",
                    String(format: "  (limit %.0f µs: %.2f×, %+.0f µs)", limit, value / limit, value - limit)
                        + " \(name)")
            }
            limited(
                "set → remote observer p50 at 10k/s, durable", "latency_p50_us", "limit_durable_p50_us", "raw+disk")
            limited(
                "set → remote observer p99 at 10k/s, durable", "latency_p99_us", "limit_durable_p99_us", "raw+disk")
            line("set → remote observer p99.9 at 10k/s", "latency_p999_us", "µs")
            for percentile in ["p50", "p99"] {
                limited(
                    "set → remote observer \(percentile) at 1k/s, durable", "latency_lone_\(percentile)_us",
                    "limit_durable_lone_\(percentile)_us", "raw+disk at 1k/s")
            }
            for (rate, label) in [("", "10k/s"), ("_lone", "1k/s")] {
                for percentile in ["p50", "p99"] {
                    limited(
                        "set → remote observer \(percentile) at \(label), durable, publish: written",
                        "latency\(rate)_\(percentile)_us_written", "limit_durable\(rate)_\(percentile)_us",
                        rate.isEmpty ? "raw+disk" : "raw+disk at 1k/s")
                }
            }
            for percentile in ["p50", "p99"] {
                limited(
                    "set → remote observer \(percentile), fsync: interval", "latency_\(percentile)_us_interval",
                    "raw_latency_\(percentile)_us", "raw")
            }
            func ofPlain(_ key: String, _ plainKey: String) -> String {
                guard let value = self[key], let plain = self[plainKey], plain > 0 else { return "" }
                return String(format: "  (%.0f%% of plain)", 100 * value / plain)
            }
            line(
                "with CURVE: deltas/s, single sets", "deltas_per_s_curve", "/s",
                ofPlain("deltas_per_s_curve", "deltas_per_s"))
            line(
                "with CURVE: set → remote observer p50", "latency_p50_us_curve", "µs",
                ofPlain("latency_p50_us_curve", "latency_p50_us"))
            line(
                "with CURVE: set → remote observer p99", "latency_p99_us_curve", "µs",
                ofPlain("latency_p99_us_curve", "latency_p99_us"))
            line("late join: snapshot of 1M properties", "snapshot_1m_s", "s")
            line("memory per replicated property", "bytes_per_property", "B")
            lines.append(contentsOf: notes.map { "  note: \($0)" })
            return lines.joined(separator: "\n")
        }
    }

    public static func run(_ options: Options, progress: @Sendable (String) -> Void) async throws -> Report {
        var report = Report()
        let seconds = options.quick ? 1.0 : 2.5

        // libzmq's own rate swings by up to 3x between runs on 2 cores (how its I/O thread and
        // the two application threads happen to be scheduled): the ceiling is the best of a few
        // runs, which makes every ratio to it conservative.
        var rawRuns: [Double] = []
        for run in 1...(options.quick ? 2 : 3) {
            progress("raw libzmq throughput (run \(run))")
            rawRuns.append(try RawBench.throughput(messages: options.quick ? 300_000 : 2_000_000))
        }
        report.figures.append(("raw_msgs_per_s", rawRuns.max() ?? .nan))
        report.notes.append(
            "raw_msgs_per_s is the best of \(rawRuns.count) runs: "
                + rawRuns.map { String(format: "%.0f", $0) }.joined(separator: ", "))
        progress("raw libzmq latency at 10k/s")
        let rawLatency = try RawBench.latency(rate: 10_000, seconds: seconds)
        report.figures.append(("raw_latency_p50_us", rawLatency.p50))
        report.figures.append(("raw_latency_p99_us", rawLatency.p99))
        // At 10k/s a durable write often arrives while the previous one's fdatasync runs and waits
        // for it (the disk is busy most of the time): the same paths at 1k/s show what a write
        // that finds the disk idle costs, against the same kind of limit.
        progress("raw libzmq latency at 1k/s")
        let rawLone = try RawBench.latency(rate: 1_000, seconds: seconds)
        report.figures.append(("raw_latency_lone_p50_us", rawLone.p50))
        report.figures.append(("raw_latency_lone_p99_us", rawLone.p99))
        // The reference: both sides on one libzmq context (one I/O thread between them), as the
        // limits were measured until 2026-11-27 (RawBench says why they are not the limit).
        for (rate, infix) in [(10_000, ""), (1_000, "_lone")] {
            progress("raw libzmq latency at \(rate / 1000)k/s, one context")
            let shared = try RawBench.latency(rate: rate, seconds: seconds, sharedContext: true)
            report.figures.append(("raw_latency\(infix)_shared_context_p50_us", shared.p50))
            report.figures.append(("raw_latency\(infix)_shared_context_p99_us", shared.p99))
        }
        report.notes.append(
            "raw_*: PUB and SUB each on a libzmq context of its own (an I/O thread each), as two nodes are; raw_latency*_shared_context_*: both on one context, one I/O thread between them (the limits' raw figure until 2026-11-27), for reference"
        )
        // The disk's limit, where the nodes keep their data (the same temporary directory).
        progress("fdatasync latency of small appends")
        let diskDirectory = NSTemporaryDirectory() + "statesync-bench-disk-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: diskDirectory) }
        let disk = try DiskBench.fdatasyncLatency(directory: diskDirectory, samples: options.quick ? 200 : 1000)
        report.figures.append(("fsync_p50_us", disk.p50))
        report.figures.append(("fsync_p99_us", disk.p99))
        let preallocated = try DiskBench.fdatasyncLatency(
            directory: diskDirectory, samples: options.quick ? 200 : 1000, preallocated: true)
        report.figures.append(("fsync_preallocated_p50_us", preallocated.p50))
        report.figures.append(("fsync_preallocated_p99_us", preallocated.p99))
        progress("fdatasync latency of small writes at 1k/s")
        let paced = try DiskBench.fdatasyncLatency(
            directory: diskDirectory, samples: options.quick ? 200 : 1000, preallocated: true, rate: 1_000)
        report.figures.append(("fsync_lone_p50_us", paced.p50))
        report.figures.append(("fsync_lone_p99_us", paced.p99))
        // The limits: what the disk alone gives a stream of durable writes at each latency
        // phase's rate and for as long (open loop, group-committed: DiskBench.fdatasyncStream).
        for (rate, infix) in [(10_000, ""), (1_000, "_lone")] {
            progress("a stream of durable writes at \(rate / 1000)k/s, the disk alone")
            let stream = try DiskBench.fdatasyncStream(directory: diskDirectory, rate: rate, seconds: seconds)
            report.figures.append(("fsync_stream\(infix)_p50_us", stream.p50))
            report.figures.append(("fsync_stream\(infix)_p99_us", stream.p99))
        }
        report.notes.append(
            "fsync_p50_us/fsync_p99_us: \(disk.samples) appends of 64 B each followed by fdatasync in \(NSTemporaryDirectory()), where the nodes keep their data; fsync_preallocated_*: the same writes into a preallocated file (as the log writes); fsync_lone_*: those into preallocated space, one every millisecond (a sync that finds the disk idle), each timed from its own start; fsync_stream_* (10k/s) and fsync_stream_lone_* (1k/s): writes arriving at that rate for as long as a latency phase, group-committed one fdatasync at a time, each timed from its arrival to the end of the sync that covered it (the wait for the sync in progress, and for a stall of the disk, included, as a node's writes get them); limit_durable_* = raw one-way at 10k/s + fsync_stream_*; limit_durable_lone_* = raw one-way at 1k/s + fsync_stream_lone_*"
        )

        for mode in [NodeBenchRole.Mode.single, .tx, .latency] {
            progress("two node processes: \(mode)")
            let result = try await twoProcesses(options, mode: mode, seconds: seconds)
            switch mode {
            case .single:
                report.figures.append(("deltas_per_s", result.perSecond))
                if result.cpuMicrosecondsPerChange.isFinite {
                    report.figures.append(("cpu_us_per_delta", result.cpuMicrosecondsPerChange))
                }
            case .tx:
                report.figures.append(("deltas_per_s_tx", result.perSecond))
                report.figures.append(("properties_per_s_tx", result.perSecond * 8))
                if result.cpuMicrosecondsPerChange.isFinite {
                    report.figures.append(("cpu_us_per_tx", result.cpuMicrosecondsPerChange))
                }
            case .latency:
                report.figures.append(("latency_p50_us", result.p50))
                report.figures.append(("latency_p99_us", result.p99))
                report.figures.append(("latency_p999_us", result.p999))
            case .models:
                break  // not in this loop: `statesync bench --models` runs it alone
            }
            if result.written > 0, mode != .latency {
                report.notes.append(
                    "\(mode): the writer made \(result.written) writes; the reader's observers fired \(result.count) times"
                )
            }
        }

        progress("two node processes: latency at 1k/s")
        let lone = try await twoProcesses(options, mode: .latency, seconds: seconds, rate: 1_000)
        report.figures.append(("latency_lone_p50_us", lone.p50))
        report.figures.append(("latency_lone_p99_us", lone.p99))

        // Durable writes published while their sync runs (`storage.publish: written`): still
        // acknowledged once durable, but the remote observer no longer waits for the sync.
        for (suffix, rate) in [("", 10_000), ("_lone", 1_000)] {
            progress("two node processes: latency at \(rate / 1000)k/s with publish written")
            let written = try await twoProcesses(
                options, mode: .latency, seconds: seconds, publishWritten: true, rate: rate)
            report.figures.append(("latency\(suffix)_p50_us_written", written.p50))
            report.figures.append(("latency\(suffix)_p99_us_written", written.p99))
        }

        // Latency with `storage.fsync: interval`: bounded by the network alone, not the disk.
        progress("two node processes: latency with fsync interval")
        let interval = try await twoProcesses(options, mode: .latency, seconds: seconds, fsync: .interval)
        report.figures.append(("latency_p50_us_interval", interval.p50))
        report.figures.append(("latency_p99_us_interval", interval.p99))

        // The cost of CurveZMQ: the same single sets and latency with both nodes keyed.
        for mode in [NodeBenchRole.Mode.single, .latency] {
            progress("two node processes with CURVE: \(mode)")
            let result = try await twoProcesses(options, mode: mode, seconds: seconds, secure: true)
            if mode == .single {
                report.figures.append(("deltas_per_s_curve", result.perSecond))
                report.notes.append(
                    "curve: the writer made \(result.written) writes; the reader's observers fired \(result.count) times"
                )
            } else {
                report.figures.append(("latency_p50_us_curve", result.p50))
                report.figures.append(("latency_p99_us_curve", result.p99))
            }
        }

        let properties = options.quick ? 100_000 : 1_000_000
        progress("late join and memory with \(properties) properties")
        let (snapshotSeconds, bytes) = try await lateJoin(properties: properties)
        report.figures.append(("snapshot_1m_s", snapshotSeconds * 1_000_000 / Double(properties)))
        report.figures.append(("bytes_per_property", bytes))
        if options.quick {
            report.notes.append("--quick: late join measured with \(properties) properties and scaled linearly to 1M")
        }
        report.addLimitsAndRatios()
        report.notes.append(
            "storage.fsync is 'always' (the default) on both nodes except for the *_interval figures, and storage.publish 'synced' (the default) except for the *_written ones (published while the sync runs, acknowledged once it ended: the sync is then no longer on the way to the remote observer, so these can be under the durable limit); build: \(isDebugBuild ? "DEBUG (use swift build -c release for real numbers)" : "release")"
        )
        return report
    }

    static var isDebugBuild: Bool {
        #if DEBUG
            return true
        #else
            return false
        #endif
    }

    struct TwoProcessResult {
        var perSecond = 0.0
        var count = 0
        var written = 0
        var p50 = 0.0, p99 = 0.0, p999 = 0.0
        /// The reader saw, or applied, every change the writer made.
        var complete = false
        /// Peers' snapshots the reader's node merged (a repair that brought latest values).
        var snapshotsApplied = 0
        /// CPU seconds of each process over the run (NaN when not reported).
        var readerCPUSeconds = Double.nan
        var writerCPUSeconds = Double.nan

        /// Microseconds of CPU per change, both processes together.
        var cpuMicrosecondsPerChange: Double {
            written > 0 ? (readerCPUSeconds + writerCPUSeconds) * 1e6 / Double(written) : .nan
        }
    }

    /// Starts a reader and a writer node process, lets the writer run, and reads the reader's
    /// measurements.
    static func twoProcesses(
        _ options: Options, mode: NodeBenchRole.Mode, seconds: Double, secure: Bool = false,
        fsync: NodeConfiguration.FsyncPolicy = .always, publishWritten: Bool = false, models: Int? = nil,
        rate: Int = 10_000
    ) async throws -> TwoProcessResult {
        let work = NSTemporaryDirectory() + "statesync-bench-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: work) }
        if secure {
            try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
            for name in ["reader", "writer"] { try CurveKeyFile.generate(at: "\(work)/\(name).key") }
        }
        let ports = [try port(), try port()]
        func start(_ reader: Bool) throws -> NodeProcess {
            let me = reader ? 0 : 1
            return try NodeProcess(
                executable: options.executable,
                arguments: [
                    "bench-node", "--role", reader ? "reader" : "writer", "--mode", mode.rawValue, "--id",
                    reader ? "reader" : "writer",
                    "--publish", "tcp://127.0.0.1:\(ports[me])", "--peer", "tcp://127.0.0.1:\(ports[1 - me])",
                    "--data", "\(work)/\(reader ? "reader" : "writer")", "--seconds", "\(seconds)", "--rate", "\(rate)",
                    "--fsync", fsync.rawValue, "--publish-when", publishWritten ? "written" : "synced",
                ] + (secure ? ["--keys", work] : []) + (models.map { ["--models", "\($0)"] } ?? []))
        }
        let reader = try start(true)
        defer { reader.kill() }
        let writer = try start(false)
        defer { writer.kill() }
        guard reader.lines.next() == "READY", writer.lines.next() == "READY" else {
            throw StateSyncError(.timeout, "bench: a node process did not start")
        }
        writer.say("GO")
        var result = try reader.readerReport()
        (result.written, result.writerCPUSeconds) = writer.wrote()
        writer.say("STOP")
        _ = reader.process.waitUntilExit()
        _ = writer.process.waitUntilExit()
        return result
    }

    /// Single sets to `models` distinct models written round-robin (`statesync bench --models`):
    /// changes per second until the reader node, which attaches none of them, holds every one.
    public static func manyModels(executable: String, models: Int, seconds: Double) async throws -> ManyModelsFigures {
        let result = try await twoProcesses(
            .init(executable: executable), mode: .models, seconds: seconds, models: models)
        return ManyModelsFigures(
            perSecond: result.perSecond, written: result.written, applied: result.count, complete: result.complete,
            snapshotsApplied: result.snapshotsApplied)
    }

    /// What ``manyModels(executable:models:seconds:)`` measured.
    public struct ManyModelsFigures: Sendable {
        /// Changes written per second, timed from the reader node's first applied delta until
        /// it holds every change (0 when it did not within the run's limit).
        public var perSecond: Double
        /// Changes the writer made, and the deltas the reader's node applied (with the writer's
        /// closing `done` write; fewer when a snapshot brought latest values instead).
        public var written: Int
        public var applied: Int
        /// The reader's node ended holding every change.
        public var complete: Bool
        /// Snapshots the reader's node merged to catch up (the writer's history no longer
        /// reached back to deltas dropped at the high-water mark).
        public var snapshotsApplied: Int
    }

    /// A `statesync bench-node` process: its output read line by line, its input written to.
    final class NodeProcess {
        let process: SpawnedProcess
        let lines: LineReader
        private let input: FileHandle

        init(executable: String, arguments: [String]) throws {
            let output = Pipe()
            let input = Pipe()
            process = try SpawnedProcess(
                executable: executable, arguments: arguments, environment: ProcessInfo.processInfo.environment,
                standardInput: .descriptor(input.fileHandleForReading.fileDescriptor),
                standardOutput: .descriptor(output.fileHandleForWriting.fileDescriptor), standardError: .null)
            // The child has its own ends: close ours, so its exit ends our reads.
            try? output.fileHandleForWriting.close()
            try? input.fileHandleForReading.close()
            lines = LineReader(output.fileHandleForReading)
            self.input = input.fileHandleForWriting
        }

        func say(_ line: String) { input.write(Data((line + "\n").utf8)) }

        /// Stops it if it still runs (a run that failed half-way).
        func kill() {
            process.signal(SIGKILL)
            _ = process.waitUntilExit()
        }

        /// The writer's count of changes made and its CPU seconds over them (its `WROTE n CPU s`
        /// line).
        func wrote() -> (count: Int, cpuSeconds: Double) {
            guard let line = lines.next(), line.hasPrefix("WROTE ") else { return (0, .nan) }
            let words = line.split(separator: " ")
            return (
                words.count > 1 ? Int(words[1]) ?? 0 : 0, words.count > 3 ? Double(words[3]) ?? .nan : .nan
            )
        }

        /// A reader's measurements (its one JSON line).
        func readerReport() throws -> TwoProcessResult {
            guard let line = lines.next(), case .map(let map)? = try? Value(json: line) else {
                throw StateSyncError(.protocolError, "bench: a reader reported nothing")
            }
            func number(_ key: String) -> Double {
                switch map[key] {
                case .double(let d)?: d
                case .int(let i)?: Double(i)
                default: .nan
                }
            }
            var result = TwoProcessResult()
            result.perSecond = number("per_second")
            result.count = Int(number("count"))
            result.p50 = number("p50_us")
            result.p99 = number("p99_us")
            result.p999 = number("p999_us")
            result.complete = map["done"] == .bool(true)
            result.readerCPUSeconds = number("cpu_s")
            if case .int(let snapshots)? = map["snapshots_applied"] { result.snapshotsApplied = Int(snapshots) }
            return result
        }
    }

    /// A node holding `properties` properties; a new node joins and takes them by snapshot.
    /// Returns the join time and the holder's resident bytes per property.
    /// What a late join cost (``join(properties:)``).
    public struct JoinFigures: Sendable {
        /// From the joiner's start until it holds the holder's state.
        public var seconds: Double
        /// The process's resident memory: before the holder, with the holder's state, after the
        /// join (both nodes' states), and its peak (`VmHWM`), in bytes.
        public var residentBefore: Int
        public var residentHeld: Int
        public var residentJoined: Int
        public var residentPeak: Int
        /// Snapshot pages the holder served.
        public var pages: Int
    }

    /// A node holding `properties` properties (1,000 per model); a new node joins and takes them
    /// by a streamed snapshot; both in this process.
    public static func join(properties: Int) async throws -> JoinFigures {
        try await lateJoinFigures(properties: properties)
    }

    static func lateJoin(properties: Int) async throws -> (seconds: Double, bytesPerProperty: Double) {
        let figures = try await lateJoinFigures(properties: properties)
        return (figures.seconds, Double(figures.residentHeld - figures.residentBefore) / Double(properties))
    }

    static func lateJoinFigures(properties: Int) async throws -> JoinFigures {
        var logger = Logger(label: "bench")
        logger.logLevel = .error
        let work = NSTemporaryDirectory() + "statesync-bench-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: work) }
        let publish = [try port(), try port()]
        let api = [try port(), try port()]
        var holderConfig = NodeConfiguration(
            nodeID: "holder", dataDirectory: "\(work)/holder", publishEndpoint: "tcp://127.0.0.1:\(publish[0])",
            peers: ["tcp://127.0.0.1:\(publish[1])"], apiEndpoint: "tcp://127.0.0.1:\(api[0])",
            heartbeatIntervalMilliseconds: 50)
        holderConfig.historyDeltas = 0  // a late joiner must take a snapshot
        holderConfig.compactBytes = 1 << 40
        let before = residentBytes()
        let holder = try await StateSyncNode.start(configuration: holderConfig, logger: logger)
        var joiner: StateSyncNode?
        do {
            return try await measureJoin(
                holder: holder, joiner: &joiner, properties: properties, before: before, work: work, publish: publish,
                api: api, logger: logger)
        } catch {
            await joiner?.stop()
            await holder.stop()
            throw error
        }
    }

    private static func measureJoin(
        holder: StateSyncNode, joiner joinerOut: inout StateSyncNode?, properties: Int, before: Int, work: String,
        publish: [Int], api: [Int], logger: Logger
    ) async throws -> JoinFigures {
        let client = try StateSyncClient(endpoint: "tcp://127.0.0.1:\(api[0])", requestTimeout: .seconds(60))
        defer { client.close() }
        let perModel = 1000
        for model in 0..<(properties / perModel) {
            let writes = (0..<perModel).map { PropertyWrite(name: "p\($0)", value: .int(Int64($0))) }
            try await client.set(ModelAddress(channel: "bench", model: "m\(model)"), writes)
        }
        let held = residentBytes()
        let joinerConfig = NodeConfiguration(
            nodeID: "joiner", dataDirectory: "\(work)/joiner", publishEndpoint: "tcp://127.0.0.1:\(publish[1])",
            peers: ["tcp://127.0.0.1:\(publish[0])"], apiEndpoint: "tcp://127.0.0.1:\(api[1])",
            heartbeatIntervalMilliseconds: 50)
        let started = monotonicNanoseconds()
        let joiner = try await StateSyncNode.start(configuration: joinerConfig, logger: logger)
        joinerOut = joiner
        let deadline = Date().addingTimeInterval(300)
        // Cheap checks while waiting (a digest walks the whole state): the snapshot applied and
        // nothing missing; then confirm with the digests once. Only when the joiner's I/O thread
        // lets go of its state: waiting for it would spin a core away from the nodes measured.
        while true {
            if let status = joiner.statusIfIdle, status.counters["snapshots_applied"] ?? 0 >= 1,
                status.missingDeltas == 0, status.peers.allSatisfy(\.meshed)
            {
                break
            }
            guard Date() < deadline else {
                throw StateSyncError(.timeout, "bench: the late joiner did not catch up in 300 s")
            }
            try await Task.sleep(for: .milliseconds(2))
        }
        let seconds = Double(monotonicNanoseconds() - started) / 1e9
        guard joiner.status.stateDigest == holder.status.stateDigest else {
            throw StateSyncError(.protocolError, "bench: the late joiner's state differs from the holder's")
        }
        let figures = JoinFigures(
            seconds: seconds, residentBefore: before, residentHeld: held, residentJoined: residentBytes(),
            residentPeak: (ProcessResources.read(pid: getpid())?.peakResidentKilobytes ?? 0) * 1024,
            pages: holder.status.counters["snapshot_pages_served"] ?? 0)
        await joiner.stop()
        await holder.stop()
        return figures
    }

    static func port() throws -> Int {
        try LoopbackPorts.free()
    }
}

/// Reads lines from a child's stdout (blocking).
final class LineReader {
    private let handle: FileHandle
    private var buffer: [UInt8] = []

    init(_ handle: FileHandle) { self.handle = handle }

    func next() -> String? {
        while true {
            if let newline = buffer.firstIndex(of: 10) {
                let line = String(decoding: buffer[..<newline], as: UTF8.self)
                buffer.removeSubrange(...newline)
                return line
            }
            let data = handle.availableData
            if data.isEmpty { return nil }
            buffer.append(contentsOf: data)
        }
    }
}
