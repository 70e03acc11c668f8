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
}
