import Foundation
import StateSync
import StateSyncClient
import StateSyncHarness
import StateSyncZeroMQ
import Synchronization

/// `statesync bench --join N --daemons`: a `statesyncd` holding N properties, and a second one
/// joining it while a client keeps writing to the first — real processes, so each side's memory
/// is its own.
public enum DaemonJoin {
    /// What the join cost.
    public struct Figures: Sendable {
        /// From the joiner's start until its snapshot was merged, and until it held exactly the
        /// holder's state (the writes made meanwhile included).
        public var snapshotSeconds: Double
        public var convergedSeconds: Double
        /// Peak resident memory (`VmHWM`) of each daemon, in bytes.
        public var holderPeakBytes: Int
        public var joinerPeakBytes: Int
        /// Snapshot pages the holder served.
        public var pages: Int
        /// Writes the client made to the holder during the join, and how long filling took.
        public var writesDuringJoin: Int
        public var fillSeconds: Double
        /// The slowest of the joiner's answers to a client of its own asking its status one
        /// request after another, from the joiner's first answer until two seconds after it
        /// merged the snapshot: the longest the joiner's I/O thread was busy with one thing (a
        /// slice of a page's merge, or a page's checksum, since 2026-11-29; a whole page's merge,
        /// and the compaction of the merged state when it was written on that thread, before).
        public var slowestAnswerSeconds: Double
        /// How many answers that client got: a joiner that answers between slices of its merge
        /// answers more often, and serving it takes CPU from the merge (the client's too, on a
        /// machine of few cores).
        public var answers: Int
    }

    /// Runs the measurement with the daemon at `daemonPath`.
    public static func run(
        properties: Int, daemonPath: String, progress: @Sendable (String) -> Void
    ) async throws -> Figures {
        let work = NSTemporaryDirectory() + "statesync-join-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: work) }
        let publish = [try LoopbackPorts.free(), try LoopbackPorts.free()]
        let api = [try LoopbackPorts.free(), try LoopbackPorts.free()]
        func environment(_ index: Int) -> [String: String] {
            [
                "STATESYNC_NODE_ID": ["holder", "joiner"][index],
                "STATESYNC_NODE_DATA_DIR": "\(work)/\(["holder", "joiner"][index])",
                "STATESYNC_NETWORK_PUBLISH": "tcp://127.0.0.1:\(publish[index])",
                "STATESYNC_NETWORK_API": "tcp://127.0.0.1:\(api[index])",
                "STATESYNC_NETWORK_PEERS": "tcp://127.0.0.1:\(publish[1 - index])",
                "STATESYNC_NETWORK_HEARTBEAT_MS": "100",
                // No history: the joiner must take a snapshot; no compaction while filling.
                "STATESYNC_HISTORY_DELTAS_PER_ORIGIN": "0",
                "STATESYNC_STORAGE_COMPACT_BYTES": "\(Int64(1) << 40)",
                "STATESYNC_STORAGE_FSYNC": "interval",
                "STATESYNC_LOG_LEVEL": "warning",
            ]
        }
        func daemon(_ index: Int) -> NodeProcess {
            let name = ["holder", "joiner"][index]
            return NodeProcess(
                name: name, api: "tcp://127.0.0.1:\(api[index])", publishPort: publish[index],
                environment: environment(index), daemonPath: daemonPath, logPath: "\(work)-\(name).log")
        }
        let holder = daemon(0)
        try holder.start()
        defer { _ = holder.stop(timeout: 60) }
        let holderClient = try StateSyncClient(endpoint: "tcp://127.0.0.1:\(api[0])", requestTimeout: .seconds(60))
        defer { holderClient.close() }
        try await Harness.waitFor("the holder to answer", seconds: 30) { (try? await holderClient.status()) != nil }

        progress("filling the holder with \(properties) properties")
        let fillStarted = Date()
        let perModel = 1000
        for model in 0..<(properties / perModel) {
            let writes = (0..<perModel).map { PropertyWrite(name: "p\($0)", value: .int(Int64($0))) }
            _ = try await holderClient.set(ModelAddress(channel: "bench", model: "m\(model)"), writes)
        }
        let fillSeconds = Date().timeIntervalSince(fillStarted)

        progress("joining")
        let joinStarted = Date()
        let joiner = daemon(1)
        try joiner.start()
        defer { _ = joiner.stop(timeout: 60) }
        let joinerClient = try StateSyncClient(endpoint: "tcp://127.0.0.1:\(api[1])", requestTimeout: .seconds(60))
        defer { joinerClient.close() }
        // A client keeps writing to the holder (about 200 sets a second) until the snapshot is in.
        let snapshotIn = Flag()
        let probeEnds = Flag()
        let probe = Task {
            let client = try StateSyncClient(endpoint: "tcp://127.0.0.1:\(api[1])", requestTimeout: .seconds(60))
            defer { client.close() }
            try await Harness.waitFor("the joiner to answer", seconds: 30) { (try? await client.status()) != nil }
            var slowest = 0.0
            var answers = 0
            while !probeEnds.isSet {
                let asked = ContinuousClock.now
                _ = try await client.status()
                slowest = max(slowest, (ContinuousClock.now - asked) / .seconds(1))
                answers += 1
            }
            return (slowest, answers)
        }
        let writer = Task {
            let client = try StateSyncClient(endpoint: "tcp://127.0.0.1:\(api[0])", requestTimeout: .seconds(10))
            defer { client.close() }
            var count = 0
            while !snapshotIn.isSet {
                _ = try await client.set(
                    ModelAddress(channel: "live", model: "m\(count % 100)"), ["n": .int(Int64(count))])
                count += 1
                try await Task.sleep(for: .milliseconds(5))
            }
            return count
        }
        try await Harness.waitFor("the joiner to merge the snapshot", seconds: 600) {
            ((try? await joinerClient.status())?.counters["snapshots_applied"] ?? 0) >= 1
        }
        let snapshotSeconds = Date().timeIntervalSince(joinStarted)
        snapshotIn.set()
        try await Task.sleep(for: .seconds(2))  // the probe's time after the merge (a measurement, not a wait)
        probeEnds.set()
        let (slowestAnswer, answers) = try await probe.value
        let writes = try await writer.value
        try await Harness.waitFor("the joiner to hold the holder's state", seconds: 600) {
            guard let a = try? await holderClient.status(), let b = try? await joinerClient.status() else {
                return false
            }
            return a.stateDigest == b.stateDigest && b.missingDeltas == 0
        }
        let convergedSeconds = Date().timeIntervalSince(joinStarted)
        let pages = (try? await holderClient.status())?.counters["snapshot_pages_served"] ?? 0
        return Figures(
            snapshotSeconds: snapshotSeconds, convergedSeconds: convergedSeconds,
            holderPeakBytes: peak(holder), joinerPeakBytes: peak(joiner),
            pages: pages, writesDuringJoin: writes, fillSeconds: fillSeconds,
            slowestAnswerSeconds: slowestAnswer, answers: answers)
    }

    /// A daemon's peak resident memory, in bytes (0 when `/proc` does not say).
    private static func peak(_ daemon: NodeProcess) -> Int {
        daemon.pid.flatMap(ProcessResources.read(pid:)).map { $0.peakResidentKilobytes * 1024 } ?? 0
    }

    /// A flag tasks share.
    private final class Flag: Sendable {
        private let value = Mutex(false)
        func set() { value.withLock { $0 = true } }
        var isSet: Bool { value.withLock { $0 } }
    }
}
