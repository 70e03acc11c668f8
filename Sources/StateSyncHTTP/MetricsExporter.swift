public import Prometheus
public import StateSync
import Synchronization

/// A node's metrics in the Prometheus text format: every counter of `statesync status`, its
/// gauges (lag, watches, observer queue, disk), per-peer series, and the latency histograms the
/// node records through swift-metrics (``NodeMetrics``).
///
/// Counters and gauges are read from ``StateSyncNode/status`` at every scrape (the node keeps
/// them anyway); the histograms are filled as the node works. Labels are bounded: `peer` (a
/// member's node id) and `state` (a member state), never a channel, model, property or value.
public final class MetricsExporter: Sendable {
    /// The registry every series lives in.
    public let registry: PrometheusCollectorRegistry
    /// The swift-metrics factory over ``registry``, for ``NodeMetrics``: pass
    /// `NodeMetrics(factory: exporter.factory)` to the node's start.
    public let factory: PrometheusMetricsFactory

    private struct Mirrored: Sendable {
        var counters: [String: (counter: Prometheus.Counter, last: Int)] = [:]
        var gauges: [String: Prometheus.Gauge] = [:]
        var peerGauges: [String: [Prometheus.Gauge]] = [:]
    }

    private let mirrored = Mutex(Mirrored())

    /// Latency buckets from 50 µs (an fdatasync on a fast disk) to 10 s.
    static let durationBuckets: [Duration] = [
        .microseconds(50), .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1),
        .microseconds(2500), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
        .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .microseconds(2_500_000),
        .seconds(5), .seconds(10),
    ]

    /// Help lines for the series swift-metrics creates (it passes none).
    static let histogramHelp: [String: String] = [
        NodeMetrics.Name.fsync: "Duration of each fdatasync of the write-ahead log.",
        NodeMetrics.Name.writeDurable:
            "From a batch of this node's writes appended to the log to the log being durable through them.",
        NodeMetrics.Name.writePublished:
            "From a batch of this node's writes appended to the log to their DELTA messages handed to the PUB socket (recorded with storage.fsync always and storage.publish synced; otherwise writes are published as appended).",
        NodeMetrics.Name.remoteApplyLag:
            "From a remote write's version (its origin's clock) to this node applying it, per DELTA message received live.",
        NodeMetrics.Name.watchLag:
            "From a write's version to its event handed to a watching client, per batch of events.",
    ]

    public init() {
        registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = Self.durationBuckets
        self.factory = factory
    }

    /// The node's metrics now, in the Prometheus text exposition format (version 0.0.4).
    public func scrape(_ node: StateSyncNode) -> String {
        update(from: node.status, observerQueueDepth: node.observers.backlog)
        var buffer: [UInt8] = []
        buffer.reserveCapacity(16 << 10)
        registry.emit(into: &buffer)
        return Self.addingHelp(to: String(decoding: buffer, as: UTF8.self))
    }

    /// Brings every mirrored series to `status`.
    func update(from status: NodeStatus, observerQueueDepth: Int) {
        mirrored.withLock { mirrored in
            for (name, value) in status.counters {
                // Prometheus wants base units: a `_ms` counter is exported in seconds.
                let milliseconds = name.hasSuffix("_ms")
                let exported = milliseconds ? name.dropLast(3) + "_seconds" : name
                let entry =
                    mirrored.counters[name]
                    ?? (
                        registry.makeCounter(
                            descriptor: MetricNameDescriptor(
                                metricName: "statesync_\(exported)", unitName: "total",
                                helpText:
                                    "StateSync counter \(exported.replacingOccurrences(of: "_", with: " ")) (statesync status: \(name))."
                            )), 0
                    )
                if value > entry.last {
                    if milliseconds {
                        entry.counter.increment(by: Double(value - entry.last) / 1000)
                    } else {
                        entry.counter.increment(by: Int64(value - entry.last))
                    }
                }
                mirrored.counters[name] = (entry.counter, max(entry.last, value))
            }
            func gauge(_ name: String, _ help: String, _ value: Double) {
                let gauge =
                    mirrored.gauges[name]
                    ?? registry.makeGauge(
                        descriptor: MetricNameDescriptor(metricName: name, unitName: "", helpText: help))
                mirrored.gauges[name] = gauge
                gauge.set(value)
            }
            let reasons = status.notReadyReasons
            gauge(
                "statesync_ready", "1 when the node is ready (what /readyz and status --ready say), else 0.",
                reasons.isEmpty ? 1 : 0)
            gauge(
                "statesync_missing_deltas", "Sequence numbers known to exist but not yet received, over all origins.",
                Double(status.missingDeltas))
            gauge("statesync_watchers", "Active watches of clients.", Double(status.watchers))
            gauge(
                "statesync_lagging_watches", "Watches whose clients take events slower than they come.",
                Double(status.laggingWatches))
            gauge(
                "statesync_observer_queue_depth", "Changes waiting for this node's local observers.",
                Double(observerQueueDepth))
            gauge("statesync_models", "Models held, over all channels.", Double(status.channels.values.reduce(0, +)))
            gauge("statesync_channels", "Channels holding at least one model.", Double(status.channels.count))
            gauge("statesync_latest_sequence", "This node's latest sequence number.", Double(status.latestSequence))
            gauge(
                "statesync_published_sequence", "The highest of this node's sequence numbers published.",
                Double(status.publishedSequence))
            gauge(
                "statesync_ids_heard_twice",
                "Node ids this node hears two nodes run under (they number writes over each other's).",
                Double(status.duplicateNodeIDs.count))
            gauge(
                "statesync_diverged_peers",
                "Peers whose state differs from this node's although both hold the same deltas of every origin (PROTOCOL.md 11.4).",
                Double(status.divergedPeers.count))
            gauge(
                "statesync_disk_full", "1 while writes are refused because the disk is nearly full.",
                status.diskFull ? 1 : 0)
            gauge(
                "statesync_settling",
                "1 while the node settles its sequence numbers after a power loss (it holds writes until its peers answer).",
                status.settling ? 1 : 0)
            gauge(
                "statesync_writes_held", "Writes held while the node settles after a power loss.",
                Double(status.writesHeld))
            if let free = status.diskFreeBytes {
                gauge("statesync_disk_free_bytes", "Free bytes in the data directory's file system.", Double(free))
            }
            var states: [String: Int] = ["alive": 0, "suspect": 0, "down": 0, "left": 0, "forgotten": 0]
            for member in status.members { states[member.state, default: 0] += 1 }
            for (state, count) in states {
                let gauge =
                    mirrored.gauges["members.\(state)"]
                    ?? registry.makeGauge(
                        descriptor: MetricNameDescriptor(
                            metricName: "statesync_members", unitName: "",
                            helpText: "Members this node knows of, by state."),
                        labels: [("state", state)])
                mirrored.gauges["members.\(state)"] = gauge
                gauge.set(Double(count))
            }
            // Per peer: every member but this node, by id (bounded by the member list's limit),
            // and but those that left or were forgotten: they are not expected to be connected
            // (readiness does not wait for them either), and a `peer_connected` of 0 kept for
            // them would hold a peer-down alert for good. `statesync_members` counts them.
            var seen: Set<String> = []
            for member in status.members where member.id != status.node && member.isExpected {
                seen.insert(member.id)
                let gauges =
                    mirrored.peerGauges[member.id]
                    ?? [
                        registry.makeGauge(
                            descriptor: MetricNameDescriptor(
                                metricName: "statesync_peer_connected", unitName: "",
                                helpText: "1 when a message from the peer arrived within three heartbeat intervals."),
                            labels: [("peer", member.id)]),
                        registry.makeGauge(
                            descriptor: MetricNameDescriptor(
                                metricName: "statesync_peer_missing_deltas", unitName: "",
                                helpText:
                                    "The peer's deltas known to exist that this node has not received (replication lag)."
                            ),
                            labels: [("peer", member.id)]),
                        registry.makeGauge(
                            descriptor: MetricNameDescriptor(
                                metricName: "statesync_peer_last_heard_seconds", unitName: "",
                                helpText: "Seconds since this node last heard from the peer (-1: never)."),
                            labels: [("peer", member.id)]),
                    ]
                mirrored.peerGauges[member.id] = gauges
                gauges[0].set(member.connected ? 1.0 : 0.0)
                gauges[1].set(Double(member.missingDeltas))
                gauges[2].set(member.lastSeenMillisecondsAgo.map { Double($0) / 1000 } ?? -1)
            }
            for (peer, gauges) in mirrored.peerGauges where !seen.contains(peer) {
                for gauge in gauges { registry.unregisterGauge(gauge) }
                mirrored.peerGauges[peer] = nil
            }
        }
    }

    /// Adds a `# HELP` line to the families swift-metrics registered without one (promtool
    /// insists on help text).
    static func addingHelp(to text: String) -> String {
        var lines: [Substring] = []
        var previous: Substring = ""
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("# TYPE "), !previous.hasPrefix("# HELP ") {
                let name = line.dropFirst("# TYPE ".count).prefix { $0 != " " }
                if let help = histogramHelp[String(name)] { lines.append("# HELP \(name) \(help)") }
            }
            lines.append(line)
            previous = line
        }
        return lines.joined(separator: "\n")
    }
}
