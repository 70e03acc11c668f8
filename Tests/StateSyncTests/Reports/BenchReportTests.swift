import Foundation
import Synchronization
import Testing

@testable import StateSyncBench

/// `statesync bench --report`: the figures as bars next to raw libzmq's.
@Suite("Bench report")
struct BenchReportTests {
    @Test func everyFigureIsABarWithItsValueAndMissingOnesAreLeftOut() {
        var report = Bench.Report()
        report.figures = [
            ("raw_msgs_per_s", 2_500_000), ("raw_latency_p50_us", 33), ("raw_latency_p99_us", 80),
            ("deltas_per_s", 480_000), ("latency_p50_us", 400), ("latency_p99_us", 900), ("snapshot_1m_s", 1.5),
        ]
        let html = report.html
        #expect(html.components(separatedBy: "<svg ").count == 3, "a throughput and a latency chart")
        #expect(html.contains(">raw libzmq PUB→SUB, delta-sized msgs</text>") && html.contains(">2500.0k /s</text>"))
        #expect(html.contains(">deltas at the reader, single sets</text>") && html.contains(">480.0k /s</text>"))
        #expect(html.contains(">set → remote observer p99</text>") && html.contains(">900 µs</text>"))
        #expect(!html.contains("with CURVE"), "a figure the run did not measure is not drawn")
        #expect(html.contains("1.50 s"))
    }

    /// Every latency gets the limit it is bounded by (raw one-way, plus fdatasync when durable)
    /// and every figure its ratio, in the JSON, so runs on different days compare.
    @Test func limitsAndRatiosFollowFromTheRawAndDiskFigures() throws {
        var report = Bench.Report()
        report.figures = [
            ("raw_msgs_per_s", 2_000_000), ("raw_latency_p50_us", 30), ("raw_latency_p99_us", 70),
            ("fsync_p50_us", 170), ("fsync_p99_us", 330), ("deltas_per_s", 500_000),
            ("properties_per_s_tx", 1_200_000), ("latency_p50_us", 250), ("latency_p99_us", 800),
            ("latency_p50_us_interval", 45_000), ("latency_p99_us_interval", 60_000),
        ]
        report.addLimitsAndRatios()
        #expect(report["limit_durable_p50_us"] == 200 && report["limit_durable_p99_us"] == 400)
        #expect(report["deltas_per_s_ratio_raw"] == 0.25 && report["properties_per_s_tx_ratio_raw"] == 0.6)
        #expect(report["latency_p50_ratio_limit"] == 1.25 && report["latency_p99_ratio_limit"] == 2)
        #expect(report["latency_p50_interval_ratio_raw"] == 1500)
        guard case .map(let json) = report.value else { throw CancellationError() }
        #expect(json["latency_p50_ratio_limit"] == .double(1.25))
        #expect(report.humanText.contains("(limit 200 µs: 1.25×, +50 µs) raw+disk"))
        // The one-context raw latency is a reference beside the limit, not part of it.
        var reference = Bench.Report()
        reference.figures =
            report.figures.filter { !$0.key.hasPrefix("limit_") && !$0.key.contains("_ratio_") } + [
                ("raw_latency_shared_context_p50_us", 20)
            ]
        reference.addLimitsAndRatios()
        #expect(reference["limit_durable_p50_us"] == 200)
        #expect(reference.humanText.contains("the same at 10k/s, one context, p50"))
        // A write into preallocated space syncs faster than an append: the limit is the floor.
        var preallocated = Bench.Report()
        preallocated.figures = report.figures.filter { !$0.key.hasPrefix("limit_") && !$0.key.contains("_ratio_") }
        preallocated.figures += [("fsync_preallocated_p50_us", 90), ("fsync_preallocated_p99_us", 400)]
        preallocated.addLimitsAndRatios()
        #expect(preallocated["limit_durable_p50_us"] == 120 && preallocated["limit_durable_p99_us"] == 400)
        #expect(preallocated.humanText.contains("fdatasync into preallocated space, p50"), "a label printed whole")
        // Lone writes (1k/s) are held to the raw latency at the same rate plus the disk at the
        // same rate (a sync that finds the disk idle), not the back-to-back one.
        var lone = Bench.Report()
        lone.figures = report.figures.filter { !$0.key.hasPrefix("limit_") && !$0.key.contains("_ratio_") }
        lone.figures += [
            ("raw_latency_lone_p50_us", 40), ("raw_latency_lone_p99_us", 90), ("latency_lone_p50_us", 315),
            ("latency_lone_p99_us", 840),
        ]
        var withoutPacedDisk = lone
        withoutPacedDisk.addLimitsAndRatios()
        #expect(withoutPacedDisk["limit_durable_lone_p50_us"] == nil, "no lone limit without the paced fdatasync")
        lone.figures += [("fsync_lone_p50_us", 170), ("fsync_lone_p99_us", 330)]
        lone.addLimitsAndRatios()
        #expect(lone["limit_durable_lone_p50_us"] == 210 && lone["limit_durable_lone_p99_us"] == 420)
        #expect(lone["latency_lone_p50_ratio_limit"] == 1.5 && lone["latency_lone_p99_ratio_limit"] == 2)
        #expect(lone["limit_durable_p50_us"] == 200, "the 10k/s limit stays on the 10k/s raw latency")
        #expect(lone.humanText.contains("(limit 210 µs: 1.50×, +105 µs) raw+disk at 1k/s"))
        #expect(report["limit_durable_lone_p50_us"] == nil, "no lone limit without the 1k/s raw latency")
        // The disk's part of a limit is, when measured, a stream of writes at the phase's rate
        // (group-committed, open loop): it takes the place of the syncs timed one by one.
        var stream = lone
        stream.figures = lone.figures.filter { !$0.key.hasPrefix("limit_") && !$0.key.contains("_ratio_") }
        stream.figures += [
            ("fsync_stream_p50_us", 250), ("fsync_stream_p99_us", 2_000), ("fsync_stream_lone_p50_us", 180),
            ("fsync_stream_lone_p99_us", 1_000),
        ]
        stream.addLimitsAndRatios()
        #expect(stream["limit_durable_p50_us"] == 280 && stream["limit_durable_p99_us"] == 2_070)
        #expect(stream["limit_durable_lone_p50_us"] == 220 && stream["limit_durable_lone_p99_us"] == 1_090)
        #expect(stream["latency_p99_ratio_limit"] == 800.0 / 2_070)
        #expect(stream.humanText.contains("durable writes at 10k/s, disk alone, p99"))
        // Without the disk figure, no durable limit is made up.
        var partial = Bench.Report()
        partial.figures = [("raw_latency_p50_us", 30), ("raw_latency_p99_us", 70), ("latency_p50_us", 250)]
        partial.addLimitsAndRatios()
        #expect(partial["limit_durable_p50_us"] == nil && partial["latency_p50_ratio_limit"] == nil)
    }

    /// The disk's limit on a stream of durable writes is open loop: writes keep arriving while a
    /// sync stalls, and each counts from its arrival (a loop that timed each sync from its own
    /// start would count the stall once). A real file and real writes; the stall is planted.
    @Test func aStallOfTheDiskCountsForEveryWriteThatArrivesDuringIt() throws {
        let directory = NSTemporaryDirectory() + "statesync-disk-stream-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let syncs = Mutex(0)
        // 200 writes at 1k/s; the first sync takes 50 ms: the ~50 writes due meanwhile wait for it.
        let latency = try DiskBench.fdatasyncStream(directory: directory, rate: 1_000, seconds: 0.2) { fd in
            if syncs.withLock({
                $0 += 1
                return $0
            }) == 1 {
                usleep(50_000)
            }
            return fdatasync(fd)
        }
        #expect(latency.samples == 200, "every write is counted once")
        #expect(latency.p99 >= 40_000, "the writes that arrived during the stall waited for it: p99 \(latency.p99) µs")
        #expect(syncs.withLock { $0 } < 200, "writes that arrived during a sync share the next one")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).isEmpty, "the probe file is removed")
    }

    /// The CPU per change both node processes report (`cpu_us_per_delta`, `cpu_us_per_tx`): their
    /// seconds together over the writer's count of changes; none when a process did not say.
    @Test func cpuPerChangeIsBothProcessesOverTheChangesWritten() {
        var result = Bench.TwoProcessResult()
        result.written = 1_000
        result.readerCPUSeconds = 0.0012
        result.writerCPUSeconds = 0.0018
        #expect(abs(result.cpuMicrosecondsPerChange - 3.0) < 1e-9)
        result.writerCPUSeconds = .nan  // an older writer's `WROTE n` line, without its CPU
        #expect(!result.cpuMicrosecondsPerChange.isFinite)
        result.writerCPUSeconds = 0.0018
        result.written = 0
        #expect(!result.cpuMicrosecondsPerChange.isFinite)

        var report = Bench.Report()
        report.figures = [("deltas_per_s", 600_000), ("cpu_us_per_delta", 3.04), ("cpu_us_per_tx", 9.46)]
        #expect(report.humanText.contains("CPU per single set (both processes)"))
        #expect(report.humanText.contains("9.5 µs"))
        guard case .map(let json) = report.value else {
            Issue.record("the report is not a JSON object")
            return
        }
        #expect(json["cpu_us_per_delta"] == .double(3.0))

        // What a process has spent only grows, and burning CPU shows in it.
        let before = processCPUSeconds()
        var sum = 0.0
        for step in 0..<3_000_000 { sum += Double(step).squareRoot() }
        #expect(sum > 0 && processCPUSeconds() > before)
    }
}
