import Foundation
import StateSyncHarness

extension Bench.Report {
    /// The bench as one self-contained HTML page: throughput and latency percentiles next to raw
    /// libzmq's, measured in the same run.
    public var html: String {
        let raw = "#7f7f7f"
        let ours = "#1f77b4"
        let curve = "#9467bd"
        func figure(_ key: String) -> Double { self[key] ?? .nan }
        let throughput = SVGBars(
            title: "Throughput (higher is better)", unit: "/s",
            bars: [
                ("raw libzmq PUB→SUB, delta-sized msgs", figure("raw_msgs_per_s"), raw),
                ("deltas at the reader, single sets", figure("deltas_per_s"), ours),
                ("deltas at the reader, 8-property tx", figure("deltas_per_s_tx"), ours),
                ("properties at the reader, 8-property tx", figure("properties_per_s_tx"), ours),
                ("with CURVE: deltas, single sets", figure("deltas_per_s_curve"), curve),
            ])
        let latency = SVGBars(
            title: "Latency at 10,000/s (lower is better)", unit: "µs",
            bars: [
                ("raw libzmq one-way p50", figure("raw_latency_p50_us"), raw),
                ("raw libzmq one-way p99", figure("raw_latency_p99_us"), raw),
                ("set → remote observer p50", figure("latency_p50_us"), ours),
                ("set → remote observer p99", figure("latency_p99_us"), ours),
                ("set → remote observer p99.9", figure("latency_p999_us"), ours),
                ("with CURVE: p50", figure("latency_p50_us_curve"), curve),
                ("with CURVE: p99", figure("latency_p99_us_curve"), curve),
            ])
        return ReportPage.html(
            title: "StateSync bench (\(ProcessInfo.processInfo.processorCount) cores)", verdict: nil,
            summary: [
                ("1M-property snapshot", self["snapshot_1m_s"].map { String(format: "%.2f s", $0) } ?? "-"),
                ("resident bytes per property", self["bytes_per_property"].map { String(format: "%.0f", $0) } ?? "-"),
            ], charts: [throughput.svg, latency.svg], details: humanText)
    }
}
