import Foundation

/// A line chart as inline SVG, for the self-contained HTML reports of the harness, the simulator
/// and the bench: series of points (a `nil` value breaks the line), shaded bands (faults) and
/// vertical markers (heal, convergence). No script, no external file.
package struct SVGChart: Sendable {
    package struct Series: Sendable {
        package var name: String
        package var color: String
        package var points: [(x: Double, y: Double?)]
        /// Drawn wide and dashed: a line another one may cover (attempted under acknowledged).
        package var dashed: Bool
        package init(name: String, color: String, points: [(x: Double, y: Double?)], dashed: Bool = false) {
            self.name = name
            self.color = color
            self.points = points
            self.dashed = dashed
        }
    }

    package struct Band: Sendable {
        package var from: Double
        package var to: Double
        package var label: String
        package var color: String
        package init(from: Double, to: Double, label: String, color: String) {
            self.from = from
            self.to = to
            self.label = label
            self.color = color
        }
    }

    package struct Marker: Sendable {
        package var x: Double
        package var label: String
        package var color: String
        /// The label's line above the x axis (0: lowest), so close markers stay readable.
        package var row: Int
        package init(x: Double, label: String, color: String, row: Int = 0) {
            self.x = x
            self.label = label
            self.color = color
            self.row = row
        }
    }

    package var title: String
    package var xLabel: String
    package var yLabel: String
    package var series: [Series]
    package var bands: [Band] = []
    package var markers: [Marker] = []
    package var width = 960.0
    package var height = 300.0

    package init(title: String, xLabel: String, yLabel: String, series: [Series]) {
        self.title = title
        self.xLabel = xLabel
        self.yLabel = yLabel
        self.series = series
    }

    /// A palette that stays readable for up to a dozen series.
    package static let palette = [
        "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
        "#393b79", "#637939",
    ]

    package var svg: String {
        let left = 64.0
        let right = 16.0
        let top = 28.0
        let bottom = 40.0
        let plotWidth = width - left - right
        let plotHeight = height - top - bottom
        let xs = (series.flatMap { $0.points.map(\.x) } + bands.flatMap { [$0.from, $0.to] } + markers.map(\.x))
            .filter(\.isFinite)
        let xMin = xs.min() ?? 0
        let xMax = max((xs.max() ?? 1), xMin + 1)
        let yMax = max(series.flatMap { $0.points.compactMap(\.y).filter(\.isFinite) }.max() ?? 1, 1) * 1.1
        func px(_ x: Double) -> Double { left + (x - xMin) / (xMax - xMin) * plotWidth }
        func py(_ y: Double) -> Double { top + plotHeight - y / yMax * plotHeight }
        func format(_ v: Double) -> String { String(format: "%.1f", v) }
        func escape(_ s: String) -> String {
            s.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
                .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
        }
        var out = """
            <svg xmlns="http://www.w3.org/2000/svg" width="\(Int(width))" height="\(Int(height))" \
            viewBox="0 0 \(Int(width)) \(Int(height))" font-family="sans-serif" font-size="11">
            <text x="\(format(left))" y="16" font-size="13" font-weight="bold">\(escape(title))</text>

            """
        // Bands behind everything, labelled at the top in turn so neighbours do not overlap.
        for (index, band) in bands.enumerated() {
            let x0 = px(band.from)
            let x1 = max(px(band.to), x0 + 2)
            out +=
                "<rect x=\"\(format(x0))\" y=\"\(format(top))\" width=\"\(format(x1 - x0))\" height=\"\(format(plotHeight))\" fill=\"\(band.color)\" fill-opacity=\"0.18\"><title>\(escape(band.label))</title></rect>\n"
            out +=
                "<text x=\"\(format(x0 + 2))\" y=\"\(format(top + 11 + Double(index % 4) * 11))\" fill=\"\(band.color)\">\(escape(band.label))</text>\n"
        }
        // Axes and ticks.
        out +=
            "<line x1=\"\(format(left))\" y1=\"\(format(top + plotHeight))\" x2=\"\(format(left + plotWidth))\" y2=\"\(format(top + plotHeight))\" stroke=\"#333\"/>\n"
        out +=
            "<line x1=\"\(format(left))\" y1=\"\(format(top))\" x2=\"\(format(left))\" y2=\"\(format(top + plotHeight))\" stroke=\"#333\"/>\n"
        for tick in 0...4 {
            let y = yMax / 1.1 * Double(tick) / 4
            out +=
                "<text x=\"\(format(left - 6))\" y=\"\(format(py(y) + 4))\" text-anchor=\"end\">\(Self.short(y))</text>\n"
            out +=
                "<line x1=\"\(format(left))\" y1=\"\(format(py(y)))\" x2=\"\(format(left + plotWidth))\" y2=\"\(format(py(y)))\" stroke=\"#eee\"/>\n"
        }
        for tick in 0...6 {
            let x = xMin + (xMax - xMin) * Double(tick) / 6
            out +=
                "<text x=\"\(format(px(x)))\" y=\"\(format(top + plotHeight + 14))\" text-anchor=\"middle\">\(Self.short(x))</text>\n"
        }
        out +=
            "<text x=\"\(format(left + plotWidth / 2))\" y=\"\(format(height - 6))\" text-anchor=\"middle\">\(escape(xLabel))</text>\n"
        out +=
            "<text x=\"12\" y=\"\(format(top + plotHeight / 2))\" transform=\"rotate(-90 12 \(format(top + plotHeight / 2)))\" text-anchor=\"middle\">\(escape(yLabel))</text>\n"
        // Series: one polyline per unbroken run.
        for line in series {
            var run: [String] = []
            func flush() {
                if run.count == 1 {
                    let xy = run[0].split(separator: ",")
                    out += "<circle cx=\"\(xy[0])\" cy=\"\(xy[1])\" r=\"2\" fill=\"\(line.color)\"/>\n"
                } else if run.count > 1 {
                    out +=
                        "<polyline fill=\"none\" stroke=\"\(line.color)\" stroke-width=\"\(line.dashed ? "3.2\" stroke-dasharray=\"6,4" : "1.6")\" points=\"\(run.joined(separator: " "))\"><title>\(escape(line.name))</title></polyline>\n"
                }
                run = []
            }
            for point in line.points {
                if let y = point.y, y.isFinite, point.x.isFinite {
                    run.append("\(format(px(point.x))),\(format(py(y)))")
                } else {
                    flush()
                }
            }
            flush()
        }
        for marker in markers {
            let x = px(marker.x)
            out +=
                "<line x1=\"\(format(x))\" y1=\"\(format(top))\" x2=\"\(format(x))\" y2=\"\(format(top + plotHeight))\" stroke=\"\(marker.color)\" stroke-width=\"2\" stroke-dasharray=\"5,3\"/>\n"
            out +=
                "<text x=\"\(format(x - 3))\" y=\"\(format(top + plotHeight - 6 - 14 * Double(marker.row)))\" text-anchor=\"end\" fill=\"\(marker.color)\" font-weight=\"bold\">\(escape(marker.label))</text>\n"
        }
        // Legend, top right.
        var legendX = width - right
        for line in series.reversed() {
            let w = Double(line.name.count) * 6.5 + 18
            legendX -= w
            out +=
                "<rect x=\"\(format(legendX))\" y=\"7\" width=\"10\" height=\"10\" fill=\"\(line.color)\"/><text x=\"\(format(legendX + 13))\" y=\"16\">\(escape(line.name))</text>\n"
        }
        return out + "</svg>"
    }

    /// 1234 → "1234", 12345 → "12.3k", 0.5 → "0.5".
    static func short(_ value: Double) -> String {
        guard value.isFinite else { return "-" }
        if abs(value) >= 10_000 { return String(format: "%.1fk", value / 1000) }
        if abs(value) >= 10 || value == value.rounded() { return String(Int(value.rounded())) }
        return String(format: "%.2f", value)
    }
}

/// Horizontal bars as inline SVG: one bar per figure, its value written next to it.
package struct SVGBars: Sendable {
    package var title: String
    package var unit: String
    package var bars: [(label: String, value: Double, color: String)]
    package var width = 960.0

    package init(title: String, unit: String, bars: [(label: String, value: Double, color: String)]) {
        self.title = title
        self.unit = unit
        self.bars = bars.filter { $0.value.isFinite }
    }

    package var svg: String {
        let labelWidth = 300.0
        let row = 24.0
        let height = 34 + row * Double(bars.count) + 8
        let maximum = max(bars.map(\.value).max() ?? 1, 1e-9)
        let barSpace = width - labelWidth - 150
        func escape(_ s: String) -> String {
            s.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
        }
        var out = """
            <svg xmlns="http://www.w3.org/2000/svg" width="\(Int(width))" height="\(Int(height))" \
            viewBox="0 0 \(Int(width)) \(Int(height))" font-family="sans-serif" font-size="12">
            <text x="0" y="16" font-size="13" font-weight="bold">\(escape(title))</text>

            """
        for (index, bar) in bars.enumerated() {
            let y = 30 + row * Double(index)
            let length = max(1, bar.value / maximum * barSpace)
            out += "<text x=\"\(labelWidth - 8)\" y=\"\(y + 15)\" text-anchor=\"end\">\(escape(bar.label))</text>\n"
            out +=
                "<rect x=\"\(labelWidth)\" y=\"\(y + 3)\" width=\(String(format: "\"%.1f\"", length)) height=\"16\" fill=\"\(bar.color)\"/>\n"
            out +=
                "<text x=\(String(format: "\"%.1f\"", labelWidth + length + 6)) y=\"\(y + 15)\">\(SVGChart.short(bar.value)) \(escape(unit))</text>\n"
        }
        return out + "</svg>"
    }
}
