import Foundation
public import StateSyncTesting

/// One self-contained HTML page (inline SVG and CSS, nothing fetched) around charts: the
/// harness's, the simulator's and the bench's `--report FILE`.
package enum ReportPage {
    package static func html(
        title: String, verdict: (passed: Bool, text: String)?, summary: [(String, String)], charts: [String],
        details: String
    ) -> String {
        func escape(_ s: String) -> String {
            s.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
                .replacingOccurrences(of: ">", with: "&gt;")
        }
        var out = """
            <!doctype html>
            <html lang="en"><head><meta charset="utf-8"><title>\(escape(title))</title>
            <style>
            body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; color: #1d1d1f; }
            h1 { font-size: 1.3rem; margin: 0 0 .5rem; }
            .verdict { display: inline-block; padding: .2rem .7rem; border-radius: 4px; color: #fff; font-weight: 700; }
            .pass { background: #137333; } .fail { background: #b3261e; }
            table { border-collapse: collapse; margin: .6rem 0 1rem; }
            td, th { padding: .15rem .8rem .15rem 0; text-align: left; }
            th { color: #555; font-weight: 600; }
            figure { margin: 1rem 0; }
            pre { background: #f5f5f7; padding: .8rem; overflow-x: auto; font-size: 12px; }
            </style></head><body>
            <h1>\(escape(title))</h1>

            """
        if let verdict {
            out +=
                "<p><span id=\"verdict\" class=\"verdict \(verdict.passed ? "pass" : "fail")\">\(escape(verdict.text))</span></p>\n"
        }
        out += "<table>\n"
        for (key, value) in summary { out += "<tr><th>\(escape(key))</th><td>\(escape(value))</td></tr>\n" }
        out += "</table>\n"
        for chart in charts { out += "<figure>\(chart)</figure>\n" }
        out += "<pre>\(escape(details))</pre>\n</body></html>\n"
        return out
    }
}

extension ReportPage {
    /// One fault as a band on the charts.
    package struct Fault: Sendable {
        package var kind: String
        package var target: String
        package var start: Int
        package var heal: Int?
    }

    static let faultColors = [
        "kill": "#d62728", "crash": "#d62728", "partition": "#9467bd", "pause": "#ff7f0e", "delay": "#8c564b",
        "leave": "#7f7f7f", "join": "#2ca02c", "clock": "#17becf", "loss": "#bcbd22", "dup": "#e377c2",
        "reorder": "#8c564b", "broken-link": "#393b79", "phantom": "#637939", "forge": "#843c39",
    ]

    /// The charts of a run: writes and acknowledgements over time, and each node's lag, with
    /// the faults as bands and the heal and convergence as markers.
    package static func charts(of timeline: RunTimeline, faults: [Fault], clock: String) -> [String] {
        let seconds = { (ms: Int) in Double(ms) / 1000 }
        let perSecond = 1000 / Double(timeline.binMilliseconds)
        // A fault without a heal holds for the whole run (a skewed clock, a planted bug): it is
        // in the summary, not a band over everything.
        let bands = faults.filter { $0.heal != nil }.map { fault in
            SVGChart.Band(
                from: seconds(fault.start), to: seconds(fault.heal ?? timeline.healedMilliseconds),
                label: "\(fault.kind) \(fault.target)", color: faultColors[fault.kind] ?? "#555")
        }
        var markers = [SVGChart.Marker(x: seconds(timeline.healedMilliseconds), label: "healed", color: "#555")]
        if let converged = timeline.convergedMilliseconds {
            markers.append(
                SVGChart.Marker(x: seconds(converged), label: "converged", color: "#137333", row: 1))
        }
        var writes = SVGChart(
            title: "Writes and acknowledgements", xLabel: clock, yLabel: "per second",
            series: [
                .init(
                    name: "attempted", color: "#1f77b4",
                    points: timeline.writes.map { (seconds($0.startMilliseconds), Double($0.attempted) * perSecond) },
                    dashed: true),
                .init(
                    name: "acknowledged", color: "#2ca02c",
                    points: timeline.writes.map {
                        (seconds($0.startMilliseconds), Double($0.acknowledged) * perSecond)
                    }),
            ])
        writes.bands = bands
        writes.markers = markers
        var lag = SVGChart(
            title: "Lag: deltas each node knows of but has not received (a gap: the node did not answer)",
            xLabel: clock, yLabel: "missing deltas",
            series: timeline.lag.keys.sorted().enumerated().map { index, node in
                SVGChart.Series(
                    name: node, color: SVGChart.palette[index % SVGChart.palette.count],
                    points: timeline.lag[node]!.map { (seconds($0.milliseconds), $0.missing.map(Double.init)) })
            })
        lag.bands = bands
        lag.markers = markers
        return [writes.svg, lag.svg]
    }
}

extension HarnessReport {
    /// The run as one self-contained HTML page: writes and acknowledgements over time, the fault
    /// schedule as bands, each node's lag over time, the heal and the moment of convergence, and
    /// the verdict.
    public var html: String {
        let charts =
            timeline.map {
                ReportPage.charts(
                    of: $0,
                    faults: faults.map {
                        .init(kind: $0.kind, target: $0.target, start: $0.startMilliseconds, heal: $0.healMilliseconds)
                    }, clock: "seconds since the workload started")
            } ?? []
        return ReportPage.html(
            title: "StateSync harness: \(nodes) nodes, \(operations) ops, seed \(seed)",
            verdict: (passed, passed ? "PASSED" : "FAILED"),
            summary: [
                ("acknowledged writes", "\(acknowledged) of \(operations)"),
                ("faults", faults.map(\.kind).joined(separator: ", ")),
                ("converged", convergenceMilliseconds.map { "\($0) ms after the heal" } ?? "no"),
                ("watch notifications", "\(notifications)"),
                ("duration", String(format: "%.1f s", durationSeconds)),
            ], charts: charts, details: humanText)
    }
}

extension SimulationReport {
    /// The simulated run as one self-contained HTML page, like ``HarnessReport/html`` (simulated
    /// time; needs ``SimulationOptions/recordTimeline``).
    public var html: String {
        let charts =
            timeline.map {
                ReportPage.charts(
                    of: $0,
                    faults: faults.map {
                        .init(
                            kind: $0.kind, target: $0.target, start: Int($0.startMilliseconds),
                            heal: $0.healMilliseconds.map(Int.init))
                    }, clock: "simulated seconds")
            } ?? []
        return ReportPage.html(
            title:
                "StateSync simulator: \(options.nodes) nodes, \(options.operations) ops, seed \(options.seed)",
            verdict: (passed, passed ? "PASSED" : "FAILED"),
            summary: [
                ("replay", options.replayCommand),
                ("acknowledged writes", "\(acknowledged) of \(options.operations)"),
                ("faults", faults.map(\.kind).joined(separator: ", ")),
                ("converged", convergenceMilliseconds.map { "\($0) simulated ms after the heal" } ?? "no"),
                ("trace digest", String(traceDigest, radix: 16)),
            ], charts: charts, details: humanText)
    }
}
