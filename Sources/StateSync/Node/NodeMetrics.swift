public import CoreMetrics

/// The latency histograms a node records through swift-metrics (its counters and gauges are in
/// ``NodeStatus`` and exported from there, at scrape time).
///
/// Each is a swift-metrics `Timer`: with a Prometheus backend (`statesyncd`'s `http.listen`),
/// a histogram in seconds. Without a backend (``isRecording`` is false) the node measures
/// nothing. No label carries a model, a property or a value.
public struct NodeMetrics: Sendable {
    /// `fdatasync` of the write-ahead log, each call.
    public let fsync: CoreMetrics.Timer
    /// From the node taking a batch of its own writes (their log append) to the log being
    /// durable through them.
    public let writeDurable: CoreMetrics.Timer
    /// From the node taking a batch of its own writes to their DELTA messages handed to the PUB
    /// socket.
    public let writePublished: CoreMetrics.Timer
    /// From a remote write's version (its origin's clock, milliseconds) to this node applying it,
    /// per received DELTA message, on the peers' live streams (repairs are not counted). Includes
    /// the clock difference of the two hosts.
    public let remoteApplyLag: CoreMetrics.Timer
    /// From a write's version to its event being handed to a watching client, per batch of
    /// watch events (milliseconds resolution, as versions).
    public let watchLag: CoreMetrics.Timer

    /// The metric names (Prometheus adds `_bucket`, `_sum` and `_count`).
    public enum Name {
        public static let fsync = "statesync_fsync_seconds"
        public static let writeDurable = "statesync_write_durable_seconds"
        public static let writePublished = "statesync_write_published_seconds"
        public static let remoteApplyLag = "statesync_remote_apply_lag_seconds"
        public static let watchLag = "statesync_watch_lag_seconds"
    }

    /// Whether a backend takes the samples: without one (swift-metrics' no-op factory) the node
    /// measures nothing, and its hot paths pay nothing for metrics.
    public let isRecording: Bool

    /// Histograms made by `factory` (by default the process's bootstrapped swift-metrics backend).
    public init(factory: any MetricsFactory = MetricsSystem.factory) {
        isRecording = !(factory is NOOPMetricsHandler)
        fsync = Timer(label: Name.fsync, factory: factory)
        writeDurable = Timer(label: Name.writeDurable, factory: factory)
        writePublished = Timer(label: Name.writePublished, factory: factory)
        remoteApplyLag = Timer(label: Name.remoteApplyLag, factory: factory)
        watchLag = Timer(label: Name.watchLag, factory: factory)
    }
}

/// Latencies the node machine measured while handling an input, in milliseconds of the wall
/// clock (a version's clock): its host drains them into ``NodeMetrics`` after each input. At
/// most ``limit`` of each are kept between drains; the rest are not sampled.
package struct LatencySamples: Sendable {
    package var remoteApplyMilliseconds: [UInt64] = []
    package var watchMilliseconds: [UInt64] = []
    /// Off (the default) the machine samples nothing: its host records no metrics.
    package var enabled = false
    static let limit = 4096

    package init(enabled: Bool = false) {
        self.enabled = enabled
    }

    mutating func remoteApplied(version: Version, wallNow: UInt64) {
        if remoteApplyMilliseconds.count < Self.limit {
            remoteApplyMilliseconds.append(wallNow &- min(wallNow, version.milliseconds))
        }
    }

    mutating func watchSent(version: Version, wallNow: UInt64) {
        if watchMilliseconds.count < Self.limit {
            watchMilliseconds.append(wallNow &- min(wallNow, version.milliseconds))
        }
    }

    package var isEmpty: Bool { remoteApplyMilliseconds.isEmpty && watchMilliseconds.isEmpty }
}

extension CoreMetrics.Timer {
    /// Records a `Duration` (swift-metrics takes integers of a unit).
    func record(_ duration: Duration) {
        let (seconds, attoseconds) = duration.components
        recordNanoseconds(seconds &* 1_000_000_000 &+ attoseconds / 1_000_000_000)
    }
}
