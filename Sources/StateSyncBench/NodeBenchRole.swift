import Foundation
import Logging
public import StateSync
import StateSyncZeroMQ
import Synchronization

/// One side of a two-process node benchmark (`statesync bench-node`, started by `statesync
/// bench`): an embedded node with a ``BenchModel``, writing or observing.
public enum NodeBenchRole {
    public enum Mode: String, Sendable, CaseIterable {
        /// Single-property sets as fast as possible.
        case single
        /// Eight-property transactions as fast as possible.
        case tx
        /// Timestamped sets at a fixed rate: one-way latency to the remote observer.
        case latency
        /// Single-property sets to ``Options/models`` distinct models, round-robin, as fast as
        /// possible: the per-model look-ups, not the wire, dominate. The reader attaches none of
        /// them; it is timed until its node holds every change.
        case models
    }

    public struct Options: Sendable {
        public var reader: Bool
        public var mode: Mode
        public var id: String
        public var publish: String
        /// The publish endpoints of the other nodes (one for a reader; every reader for the
        /// writer of a fan-out run).
        public var peers: [String]
        public var dataDirectory: String
        public var seconds: Double
        public var rate: Int
        /// With CurveZMQ: the directory holding `reader.key` and `writer.key` (and their `.pub`).
        public var keyDirectory: String?
        /// `storage.fsync` of the node.
        public var fsync: NodeConfiguration.FsyncPolicy = .always
        /// `storage.publish: written` (with `always`: published while the sync runs).
        public var publishBeforeSync = false
        /// How many models the writer writes round-robin in ``Mode/models``.
        public var models = 100_000

        public init(
            reader: Bool, mode: Mode, id: String, publish: String, peers: [String], dataDirectory: String,
            seconds: Double, rate: Int
        ) {
            self.reader = reader
            self.mode = mode
            self.id = id
            self.publish = publish
            self.peers = peers
            self.dataDirectory = dataDirectory
            self.seconds = seconds
            self.rate = rate
        }
    }

    /// Runs the role; the reader prints one JSON line with its measurements.
    public static func run(_ options: Options) async throws {
        var logger = Logger(label: "bench")
        logger.logLevel = .error
        var configuration = NodeConfiguration(
            nodeID: options.id, dataDirectory: options.dataDirectory, publishEndpoint: options.publish,
            peers: options.peers, heartbeatIntervalMilliseconds: 50)
        configuration.fsync = options.fsync
        configuration.publishBeforeSync = options.publishBeforeSync
        if let keys = options.keyDirectory, let peer = options.peers.first {
            let other = options.id == "reader" ? "writer" : "reader"
            configuration.peerNodeIDs = [peer: other]
            configuration.security = SecurityConfiguration(
                secretKeyFile: "\(keys)/\(options.id).key", peerKeys: [other: ["\(keys)/\(other).key.pub"]])
        }
        let node = try await StateSyncNode.start(configuration: configuration, logger: logger)
        let model = try await node.model(BenchModel.self, channel: "bench", id: "m")
        let deadline = Date().addingTimeInterval(20)
        while !node.status.peers.allSatisfy(\.meshed) {
            guard Date() < deadline else { throw StateSyncError(.timeout, "bench: the peer never connected") }
            try await Task.sleep(for: .milliseconds(10))
        }
        if options.reader {
            try await read(options, model: model, node: node)
        } else {
            if options.mode == .latency {
                // One write first, published before the run: the first write after a start runs
                // every path cold and, with `storage.publish: written`, waits for the node's first
                // sequence reservation (a durable file write). The run measures the writes after
                // it; the reader counts it out (``read(_:model:node:)``).
                model.value = -1
                let published = Date().addingTimeInterval(20)
                while node.status.publishedSequence < 1 {
                    guard Date() < published else {
                        throw StateSyncError(.timeout, "bench: the warm-up write was never published")
                    }
                    try await Task.sleep(for: .milliseconds(1))
                }
            }
            say("READY")
            _ = readLine()  // GO
            try await write(options, model: model, node: node, cpuAtStart: processCPUSeconds())
        }
        await node.stop()
    }

    final class Tally: @unchecked Sendable {
        // Safe: `latencies` and `written` are read and written only under `lock`; the counters are
        // atomics (the count observer runs per change: it must cost little next to what it
        // measures).
        let lock = NSLock()
        let count = Atomic<Int>(0)
        let first = Atomic<UInt64>(0)
        let last = Atomic<UInt64>(0)
        /// How many changes were seen when `last` was read.
        let countAtLast = Atomic<Int>(0)
        var latencies: [UInt64] = []
        /// How many changes the writer made (it says so once it is done), 0 before.
        var written = 0
        /// Whether every change the writer made was seen.
        func complete(mode: Mode) -> Bool {
            written > 0 && (mode == .latency ? latencies.count : count.load(ordering: .relaxed)) >= written
        }
    }

    private static func read(_ options: Options, model: BenchModel, node: StateSyncNode) async throws {
        let tally = Tally()
        tally.latencies.reserveCapacity(Int(Double(options.rate) * options.seconds) + 16)
        // The clock is read at the first change and at every 64th after it, and the rate counts
        // the changes between the first reading and the last: read at every change, it was a fifth
        // of the observer thread's samples, some 1.5 % of the run's CPU (2026-11-28), work of the
        // instrument, not of the node. A run of millions of changes misses at most 63 at its end.
        let count: @Sendable () -> Void = {
            let seen = tally.count.add(1, ordering: .relaxed).newValue
            guard seen & 63 == 1 else { return }
            let now = monotonicNanoseconds()
            if seen == 1 { tally.first.store(now, ordering: .relaxed) }
            tally.last.store(now, ordering: .relaxed)
            tally.countAtLast.store(seen, ordering: .relaxed)
        }
        switch options.mode {
        case .single: model.observe(\.value) { _ in count() }
        case .tx: model.observe(\.f7) { _ in count() }
        case .models: break  // counted from the node's applied deltas below
        case .latency:
            model.observe(\.stamp) { change in
                let now = monotonicNanoseconds()
                tally.lock.withLock { tally.latencies.append(now &- change.new) }
            }
        }
        // The writer says how many changes it made; the reader waits until it saw every one of
        // them, or its node applied every one (a change dropped at a high-water mark arrives
        // later, by repair, and then notifies nothing when a later value of the property was
        // applied meanwhile): a run counts whole.
        model.observe(\.done) { change in tally.lock.withLock { tally.written = change.new } }
        say("READY")
        let cpuAtStart = processCPUSeconds()
        // The node's status is read only when its I/O thread lets go of it (``statusIfIdle``):
        // waiting for it would spin a core away from the run measured. The run's times come from
        // the observers, not from these reads.
        func finished() -> Bool {
            let (seen, written) = tally.lock.withLock { (tally.complete(mode: options.mode), tally.written) }
            guard !seen, written > 0 else { return seen }
            guard let status = node.statusIfIdle else { return false }
            // Applied: every change, and the `done` write (with live models), and in a latency
            // run the writer's warm-up write.
            let extra = options.mode == .latency ? 1 : 0
            if options.mode != .models, status.counters["deltas_applied"] ?? 0 > written + extra { return true }
            // Or held: once the `done` write (the writer's last) is applied and nothing below it
            // is missing, the node holds every change, though its observers may not have seen
            // them all. A reader whose subscription dropped messages at the high-water mark gets
            // them by repair, and a change repaired after a later value of its property was
            // applied wins nothing (`deltas_applied` does not count it, no observer sees it); one
            // that fell further behind than the writer's history took a snapshot, which brought
            // the latest values without the changes between. (Waiting for the count waited out
            // the minute below and called such runs incomplete: the fan-out's readers, two
            // processes sharing two cores with the writer, fall that far behind. Requiring a
            // snapshot, as this did until 2026-11-29, missed the repaired ones: once, under the
            // whole suite's load.)
            return status.missingDeltas == 0
        }
        // Without live models (Mode.models), the node's counter dates the first change (read
        // every millisecond), and the end is when the node holds every change.
        let baseline = node.status.counters["deltas_applied"] ?? 0
        // A reader gives up once it has made no progress for a minute (or after ten minutes in
        // all): one that shares its cores with other work falls behind the writer by minutes, yet
        // sees every change in the end (a fixed minute past the run called such runs incomplete).
        let limit = Date().addingTimeInterval(options.seconds + 600)
        // Progress: deltas applied or received, snapshots merged, or the count of missing ones
        // (`nil` while the I/O thread holds the node's state).
        func signature() -> [Int]? {
            guard let status = node.statusIfIdle else { return nil }
            return [
                status.counters["deltas_applied"] ?? 0, status.counters["deltas_received"] ?? 0,
                status.counters["snapshots_applied"] ?? 0, status.missingDeltas,
            ]
        }
        var progress = (signature: signature() ?? [], at: Date())
        // Asked once per turn and kept: asked again, it could say no only because the I/O thread
        // held the node's state at that instant (``statusIfIdle``), and a finished run would be
        // reported incomplete (once, under the whole suite's load: applied 0 of 39,680 written).
        var done = finished()
        while !done && Date() < limit && Date().timeIntervalSince(progress.at) < 60 {
            if let now = signature(), now != progress.signature { progress = (now, Date()) }
            if options.mode == .models, tally.first.load(ordering: .relaxed) == 0,
                node.status.counters["deltas_applied"] ?? 0 > baseline
            {
                tally.first.store(monotonicNanoseconds(), ordering: .relaxed)
            }
            try await Task.sleep(for: .milliseconds(options.mode == .models ? 1 : 5))
            done = finished()
        }
        if options.mode == .models, done {
            // Counted, not assumed: the deltas the node applied (fewer than written when a
            // snapshot brought the latest values instead of every delta).
            tally.last.store(monotonicNanoseconds(), ordering: .relaxed)
            tally.count.store((node.status.counters["deltas_applied"] ?? 0) - baseline, ordering: .relaxed)
            tally.countAtLast.store(tally.count.load(ordering: .relaxed), ordering: .relaxed)
        }
        let result = tally.lock.withLock { () -> Value in
            let count = tally.count.load(ordering: .relaxed)
            let seconds = Double(tally.last.load(ordering: .relaxed) &- tally.first.load(ordering: .relaxed)) / 1e9
            let latency = LatencySummary(nanoseconds: tally.latencies)
            // Mode.models: every change is held at the end, so the rate counts what was written.
            let changes = options.mode == .models ? tally.written : tally.countAtLast.load(ordering: .relaxed) - 1
            return [
                "count": .int(Int64(count)), "seconds": .double(seconds),
                "per_second": .double(
                    seconds > 0 && changes > 0 && (done || options.mode != .models) ? Double(changes) / seconds : 0),
                "snapshots_applied": .int(Int64(node.status.counters["snapshots_applied"] ?? 0)),
                "p50_us": .double(latency.p50.isNaN ? 0 : latency.p50),
                "p99_us": .double(latency.p99.isNaN ? 0 : latency.p99),
                "p999_us": .double(latency.p999.isNaN ? 0 : latency.p999), "samples": .int(Int64(latency.samples)),
                "done": .bool(done),
                "written": .int(Int64(tally.written)),
                // This process's CPU from READY to here (the run, with the wait for its end).
                "cpu_s": .double(processCPUSeconds() - cpuAtStart),
            ]
        }
        say(result.jsonText())
    }

    private static func write(
        _ options: Options, model: BenchModel, node: StateSyncNode, cpuAtStart: Double
    ) async throws {
        let end = monotonicNanoseconds() + UInt64(options.seconds * 1e9)
        var written = 0
        switch options.mode {
        case .single:
            while monotonicNanoseconds() < end {
                for _ in 0..<256 {
                    written += 1
                    model.value = written
                }
            }
        case .tx:
            while monotonicNanoseconds() < end {
                for _ in 0..<64 {
                    written += 1
                    model.writeAllFields(written)
                }
            }
        case .models:
            var models: [BenchModel] = []
            models.reserveCapacity(options.models)
            for index in 0..<options.models {
                models.append(try await node.model(BenchModel.self, channel: "bench", id: "r\(index)"))
            }
            let start = monotonicNanoseconds()
            let end = start + UInt64(options.seconds * 1e9)
            var next = 0
            while monotonicNanoseconds() < end {
                for _ in 0..<256 {
                    written += 1
                    models[next].value = written
                    next = next + 1 == models.count ? 0 : next + 1
                }
            }
        case .latency:
            let interval = UInt64(1_000_000_000 / max(options.rate, 1))
            var next = monotonicNanoseconds()
            while next < end {
                waitUntilNanoseconds(next)
                model.stamp = monotonicNanoseconds()
                written += 1
                next += interval
            }
        }
        // Let the queue drain, then tell the reader we are done (repeat: a publish can be lost).
        while node.status.counters["deltas_published"] ?? 0 < written {
            try await Task.sleep(for: .milliseconds(5))
        }
        model.done = written
        // And this process's CPU from GO to here (the writes, until every one was published).
        say("WROTE \(written) CPU \(processCPUSeconds() - cpuAtStart)")
        _ = readLine()  // STOP
    }
}

/// Writes one line to stdout at once (the parent reads it through a pipe).
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}
