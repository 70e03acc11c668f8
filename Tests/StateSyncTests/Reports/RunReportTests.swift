import Testing

@testable import StateSyncHarness
@testable import StateSyncTesting

/// The pictures of runs (`--report FILE`): the simulator's timeline, and the charts it becomes.
@Suite("Run reports")
struct RunReportTests {
    /// Sampling the timeline reads the nodes between steps and adds no event: the run, trace and
    /// all, is the one without it; the samples add up to the run's writes.
    @Test func recordingTheTimelineDoesNotChangeTheRun() throws {
        var options = SimulatorTests.options(seed: 7, ops: 400)
        let plain = try ClusterSimulator.run(options)
        options.recordTimeline = true
        let recorded = try ClusterSimulator.run(options)
        #expect(plain.traceDigest == recorded.traceDigest && plain.steps == recorded.steps)
        #expect(plain.timeline == nil)
        let timeline = try #require(recorded.timeline)
        #expect(timeline.lag.count == options.nodes, "a lag line per node")
        // The report's count leaves out the writes set aside (a power loss may have taken them, a
        // forget gave them up); the timeline counts every acknowledgement.
        let setAside = recorded.mayBeLostToPowerLoss + recorded.mayBeLostToForget
        #expect(timeline.writes.reduce(0) { $0 + $1.acknowledged } == recorded.acknowledged + setAside)
        #expect(timeline.writes.reduce(0) { $0 + $1.attempted } >= recorded.acknowledged)
        let converged = try #require(timeline.convergedMilliseconds)
        #expect(converged >= timeline.healedMilliseconds)
        #expect(timeline.lag.values.allSatisfy { $0.last?.missing == 0 }, "nothing missing once converged")

        let html = recorded.html
        #expect(html.contains(">PASSED<") && html.components(separatedBy: "<svg ").count == 3)
        for fault in recorded.faults where fault.healMilliseconds != nil {
            #expect(html.contains(">\(fault.kind) \(fault.target)</text>"))
        }
        #expect(html.contains(">converged</text>"))
    }

    /// A missing sample breaks a line rather than drawing it through zero; bands and markers land
    /// inside the plot.
    @Test func aGapBreaksTheLineAndBandsAndMarkersAreDrawn() {
        var chart = SVGChart(
            title: "t", xLabel: "x", yLabel: "y",
            series: [.init(name: "n1", color: "#000", points: [(0, 1), (1, 2), (2, nil), (3, 4), (4, 5)])])
        chart.bands = [.init(from: 1, to: 2, label: "kill n1", color: "#f00")]
        chart.markers = [.init(x: 3.5, label: "converged", color: "#0f0")]
        let svg = chart.svg
        #expect(svg.components(separatedBy: "<polyline").count == 3, "two runs around the gap")
        #expect(svg.contains(">kill n1</text>") && svg.contains("<rect x=\""))
        #expect(svg.contains(">converged</text>"))
        #expect(!svg.contains("NaN") && !svg.contains("inf"))
    }

    @Test func countedWritesGoIntoTheBinsOfTheirTime() {
        let recorder = TimelineRecorder(binMilliseconds: 100)
        recorder.counted(at: 50, attempted: 3, acknowledged: 2)
        recorder.counted(at: 150, attempted: 3, acknowledged: 3)
        recorder.counted(at: 420, attempted: 10, acknowledged: 9)
        let timeline = recorder.timeline(healed: 300, converged: 400, end: 500)
        #expect(timeline.writes.map(\.attempted) == [3, 0, 0, 0, 7, 0])
        #expect(timeline.writes.map(\.acknowledged) == [2, 1, 0, 0, 6, 0])
    }
}
