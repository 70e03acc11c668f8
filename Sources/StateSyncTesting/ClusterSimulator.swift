public import Logging
public import StateSync

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// What `statesync simulate` runs: a whole cluster in one process, driven by one seed.
public struct SimulationOptions: Sendable {
    /// The faults the simulator can inject.
    public enum Fault: String, Sendable, CaseIterable {
        /// A node crashes (what it had not synced is lost, a torn write is possible) and restarts
        /// on its disk.
        case crash
        /// Every link between two groups of nodes is cut, both ways, then healed.
        case partition
        /// A node's inbound peer links lose messages.
        case loss
        /// Peer links deliver some messages twice.
        case dup
        /// Peer links hold some messages back so that later ones overtake them.
        case reorder
        /// A node's wall clock jumps (forwards or backwards).
        case clock
        /// A node's inbound link from one peer breaks for good, as libzmq leaves a connection
        /// after a frame over its maximum message size: only the node replacing the link (after
        /// the peer was silent for long) or a restart mends it.
        case brokenLink = "broken-link"
        /// A heartbeat forged in a node's name reaches one peer, announcing sequence numbers the
        /// node never wrote: the peer must stop waiting for them (once every peer, the node
        /// included, says it never held them), not forever fetch them.
        case phantom
        /// A DELTA in another node's name arrives on a node's live link (a peer forging an
        /// origin): a node bound to its peers' identities (PROTOCOL.md 14) drops it.
        case forge
        /// The last node is not in the cluster at the start: no one knows it, and it knows only
        /// the first node (its seed). The first join starts it, and it must learn every member,
        /// be learned by them (PROTOCOL.md 7.5) and end with everything; later joins restart it,
        /// so it learns the members again.
        case join
        /// A node stops cleanly (it says it leaves: every peer drops its links to it and stops
        /// awaiting its deltas; it writes its snapshot) and comes back later with its data,
        /// alive again.
        case leave
        /// A node is cut off from every other, both ways; once they stop hearing it an operator
        /// forgets it on another node (FORGET, asked again while refused), and the cut heals.
        /// Hearing of the forget, the node must drop its state and take the others' (PROTOCOL.md
        /// 7.5): its writes no other node held by then are given up by design, and not held
        /// against it (``SimulationReport/mayBeLostToForget``).
        case forget
    }

    /// Bugs planted in one node on purpose, to prove the verdict catches them.
    public enum PlantedBug: String, Sendable, CaseIterable {
        /// The node silently drops 30 % of the remote deltas it should apply, and never repairs
        /// them.
        case dropDeltas = "drop-deltas"
        /// The node breaks last-writer-wins ties (equal timestamps) the wrong way round.
        case wrongTieBreak = "wrong-tie-break"
        /// The node never sends repair requests.
        case skipRepair = "skip-repair"
        /// After a power loss the node numbers writes at once, without settling (PROTOCOL.md
        /// 11.2): it reuses the numbers of deltas it published before the loss and its peers
        /// hold. The run uses `storage.fsync: interval` (1 s) and gives the node power losses.
        case skipSettling = "skip-settling"
        /// After settling the node declares no number void (PROTOCOL.md 10.8): deltas it
        /// published that every peer missed, then lost in a power loss, stay gaps on the peers
        /// that hold later ones. Like `skip-settling`, with `interval` (1 s), power losses of the
        /// node, each after a moment when every peer missed what it published.
        case skipVoid = "skip-void"
        /// The node's compactions keep none of the peers' deltas it holds above a gap
        /// (PROTOCOL.md 11.5 item 6): after a restart it no longer knows it holds them, and an
        /// origin settling after a power loss does not get them back. The run uses
        /// `storage.fsync: interval` (1 s) and gives the other nodes power losses, each after a
        /// moment when only the node hears what they publish above a gap, and the node
        /// compacts and restarts just before each.
        case forgetHeldAboveGaps = "forget-held-above-gaps"
        /// The node sends its watchers every live delta twice.
        case duplicateWatchEvents = "duplicate-watch-events"
        /// The node never lets a deletion win: what others delete it keeps.
        case ignoreDeletions = "ignore-deletions"
        /// The node never deletes an expired value.
        case neverExpire = "never-expire"
        /// The node collects deletions at its own floor, without waiting for the others.
        case collectEarly = "collect-early"
        /// The node answers every write with a plain OK, also those that asked for an OKS
        /// message (PROTOCOL.md 10.1.1).
        case ignoreRequestFlags = "ignore-request-flags"
        /// The node never drops its state when it learns it was forgotten (PROTOCOL.md 7.5): it
        /// says it is alive with what it held. The run's forgets all take the node.
        case skipReset = "skip-reset"

        /// Whether the run plants it with `storage.fsync: interval` (1 s) whatever was asked:
        /// the bugs of settling after a power loss.
        public var runsWithIntervalSync: Bool { [.skipSettling, .skipVoid, .forgetHeldAboveGaps].contains(self) }
    }

    /// How many nodes (2–256).
    public var nodes = 5
    /// How many writes the workload makes.
    public var operations = 10_000
    /// The seed of the whole run.
    public var seed: UInt64 = 1
    /// The faults to inject.
    public var faults: [Fault] = []
    /// A bug to plant in the last node, if any.
    public var plantedBug: PlantedBug?
    /// Concurrent writers (besides two that make concurrent writes of one property).
    public var writers = 4
    /// Distinct models written (in channel `sim`).
    public var models = 16
    /// Which nodes take channel batches (PROTOCOL.md 7.6) and packed batches (7.7): all; a mix of
    /// three versions (odd nodes older than both, every fourth from the third older than packed
    /// batches alone); that mix at the start, where a restarted node comes back as another
    /// version (rolling); or none; `nil`: drawn by the seed.
    public var channelBatches: ChannelBatches?
    /// Every node with `storage.fsync: interval` at this period (milliseconds); `nil`: drawn.
    public var intervalSyncMilliseconds: Int?
    /// Every node with `storage.fsync: always`, publishing its writes while their sync runs
    /// (`storage.publish: written`) or after it; `nil`: drawn by the seed (for nodes drawn
    /// `always`).
    public var publishBeforeSync: Bool?
    /// How long a sync of a node's log takes (simulated milliseconds; 0: at once); `nil`: drawn.
    public var diskSyncMilliseconds: Int?

    /// Which nodes of a simulated cluster take channel batches.
    public enum ChannelBatches: String, Sendable, CaseIterable {
        case all, mixed, rolling, none
    }
    /// How long (simulated) the cluster may take to converge after the last fault heals.
    public var convergenceTimeoutMilliseconds: UInt64 = 120_000
    /// Where the nodes log (nothing by default: a simulation makes many lines).
    public var logger: Logger?
    /// Sample writes and each node's lag every 100 simulated ms for the report's pictures
    /// (``SimulationReport/timeline``). Reading the nodes' status between steps adds no event, so
    /// the run is the same with or without it.
    public var recordTimeline = false

    /// The defaults: 5 nodes, 10,000 operations, seed 1, no faults.
    public init() {}

    /// The command that replays this run.
    public var replayCommand: String {
        var parts = ["statesync simulate --nodes \(nodes) --ops \(operations) --seed \(seed)"]
        // Always named: the command's default is every fault.
        parts.append("--faults \(faults.isEmpty ? "none" : faults.map(\.rawValue).joined(separator: ","))")
        if let plantedBug { parts.append("--plant-bug \(plantedBug.rawValue)") }
        if writers != 4 { parts.append("--writers \(writers)") }
        if let channelBatches { parts.append("--channel-batches \(channelBatches.rawValue)") }
        if let intervalSyncMilliseconds { parts.append("--interval-sync-ms \(intervalSyncMilliseconds)") }
        if let publishBeforeSync { parts.append("--publish \(publishBeforeSync ? "written" : "synced")") }
        if let diskSyncMilliseconds { parts.append("--disk-sync-ms \(diskSyncMilliseconds)") }
        return parts.joined(separator: " ")
    }
}

/// The simulator's verdict: the harness's checks on a simulated run, and its trace digest.
public struct SimulationReport: Sendable {
    /// One fault the run injected.
    public struct FaultEvent: Sendable, Equatable {
        /// Its kind (`crash`, `partition`, …).
        public var kind: String
        /// The node (or the sides) it hit.
        public var target: String
        /// What happened, for people.
        public var detail: String
        /// When it started (simulated milliseconds).
        public var startMilliseconds: UInt64
        /// When it healed.
        public var healMilliseconds: UInt64?
    }

    /// What was run.
    public var options: SimulationOptions
    /// What the seed drew for this run (swarm testing: every seed its own mix).
    public var parameters: [String: String]
    /// Writes the nodes acknowledged (not counting those a power loss may have taken, or a forget
    /// gave up).
    public var acknowledged: Int
    /// Acknowledged writes a power loss of a node with `storage.fsync: interval` may have taken
    /// (acknowledged within one sync interval before it): not held against the node.
    public var mayBeLostToPowerLoss = 0
    /// Acknowledged writes of a forgotten node that no other node held when it dropped its
    /// state, or held only below writes given up themselves (PROTOCOL.md 7.5): given up by
    /// design, so not checked for loss.
    public var mayBeLostToForget = 0
    /// How many times a forgotten node was seen dropping its state (the `forget` fault's reset).
    public var forgottenNodeResets = 0
    /// The checker's findings.
    public var findings: ConvergenceChecker.Findings
    /// Whether every node settled with the same state.
    public var converged: Bool
    /// Simulated milliseconds from the last heal until every node held the same state.
    public var convergenceMilliseconds: UInt64?
    /// The faults injected.
    public var faults: [FaultEvent]
    /// A digest of everything that happened, in order: the same seed and build always give the
    /// same digest.
    public var traceDigest: UInt64
    /// How much simulated time the run took.
    public var simulatedMilliseconds: UInt64
    /// Node inputs processed.
    public var steps: Int
    /// Deltas the nodes applied (their own and their peers').
    public var deltasApplied: Int
    /// Changes the watchers were told of.
    public var notifications: Int
    /// CPU time of the run (of the simulating thread).
    public var cpuSeconds: Double
    /// The node the planted bug was planted in.
    public var culprit: String?
    /// Messages of peers' live streams delivered (HEARTBEATs and DELTA messages), all nodes.
    public var peerMessages = 0
    /// Their frames' octets.
    public var peerBytes = 0
    /// Values that expired, deletions collected, and deletions still held at the end, over all
    /// nodes (PROTOCOL.md 8.3, 8.4).
    public var valuesExpired = 0
    public var tombstonesCollected = 0
    public var tombstonesHeld = 0
    /// Channel batches published, over all nodes (PROTOCOL.md 7.6; none while a node linked to
    /// the sender does not take them).
    public var channelBatchesPublished = 0
    /// Packed batches published, over all nodes (PROTOCOL.md 7.7; none while a node linked to the
    /// sender does not take them).
    public var packedBatchesPublished = 0
    /// Messages the nodes dropped as malformed, over all nodes (a forged or mangled message, or a
    /// channel batch reaching a node that does not take them, in a rolling upgrade).
    public var malformedMessages = 0
    /// State digests compared at equal progress, and divergences found so (PROTOCOL.md 11.4),
    /// over all nodes; and which nodes still reported one at the end.
    public var digestComparisons = 0
    public var stateDivergences = 0
    public var divergedAtEnd: [String] = []
    /// Own deltas the nodes took back from their peers when settling after a power loss, over
    /// all nodes and runs: published before their sync (`storage.fsync: interval`, or
    /// `storage.publish: written`) and lost from their node's log (PROTOCOL.md 11.2).
    public var ownDeltasTakenBack = 0
    /// Writes and each node's lag over simulated time (with ``SimulationOptions/recordTimeline``).
    public var timeline: RunTimeline?

    /// Whether every check passed.
    public var passed: Bool { converged && findings.passed && stateDivergences == 0 && divergedAtEnd.isEmpty }

    /// The report as a value (`--json`).
    public var value: Value {
        var map: [String: Value] = [
            "passed": .bool(passed), "converged": .bool(converged), "seed": .int(Int64(bitPattern: options.seed)),
            "nodes": .int(Int64(options.nodes)), "ops": .int(Int64(options.operations)),
            "acknowledged": .int(Int64(acknowledged)), "lost_writes": .int(Int64(findings.lostWrites.count)),
            "may_be_lost_to_power_loss": .int(Int64(mayBeLostToPowerLoss)),
            "may_be_lost_to_forget": .int(Int64(mayBeLostToForget)),
            "chain_violations": .int(Int64(findings.chainViolations.count)),
            "list_violations": .int(Int64(findings.listViolations.count)),
            "reply_violations": .int(Int64(findings.replyViolations.count)),
            "reset_violations": .int(Int64(findings.resetViolations.count)),
            "forgotten_node_resets": .int(Int64(forgottenNodeResets)),
            "lww_violations": .int(Int64(findings.lwwViolations.count)),
            "diverged_nodes": .array(findings.divergedNodes.map(Value.string)),
            "notifications": .int(Int64(notifications)),
            "duration_s": .double((cpuSeconds * 1000).rounded() / 1000),
            "cpu_s": .double((cpuSeconds * 1000).rounded() / 1000),
            "trace_digest": .string(String(traceDigest, radix: 16)),
            "simulated_ms": .int(Int64(simulatedMilliseconds)), "steps": .int(Int64(steps)),
            "deltas_applied": .int(Int64(deltasApplied)),
            "deltas_applied_per_s": .int(cpuSeconds > 0 ? Int64(Double(deltasApplied) / cpuSeconds) : 0),
            "peer_messages": .int(Int64(peerMessages)),
            "peer_messages_per_node_per_s": .double(peerMessagesPerNodePerSecond),
            "peer_bytes": .int(Int64(peerBytes)),
            "values_expired": .int(Int64(valuesExpired)), "tombstones_collected": .int(Int64(tombstonesCollected)),
            "tombstones_held": .int(Int64(tombstonesHeld)),
            "channel_batches_published": .int(Int64(channelBatchesPublished)),
            "packed_batches_published": .int(Int64(packedBatchesPublished)),
            "malformed_messages": .int(Int64(malformedMessages)),
            "digest_comparisons": .int(Int64(digestComparisons)),
            "state_divergences": .int(Int64(stateDivergences)),
            "diverged_at_end": .array(divergedAtEnd.map(Value.string)),
            "own_deltas_taken_back": .int(Int64(ownDeltasTakenBack)),
            "parameters": .map(parameters.mapValues(Value.string)),
            "faults": .array(
                faults.map { fault in
                    .map([
                        "kind": .string(fault.kind), "target": .string(fault.target), "detail": .string(fault.detail),
                        "start_ms": .int(Int64(fault.startMilliseconds)),
                        "heal_ms": fault.healMilliseconds.map { .int(Int64($0)) } ?? .null,
                    ])
                }),
            "details": .array(details.map(Value.string)),
            "replay": .string(options.replayCommand),
            "work_dir": .null,
        ]
        map["convergence_ms"] = convergenceMilliseconds.map { .int(Int64($0)) } ?? .null
        map["planted_bug"] = options.plantedBug.map { .string($0.rawValue) } ?? .null
        map["culprit"] = culprit.map(Value.string) ?? .null
        return .map(map)
    }

    /// Live-stream messages each node received per simulated second, on average.
    public var peerMessagesPerNodePerSecond: Double {
        guard simulatedMilliseconds > 0 else { return 0 }
        let perNode = Double(peerMessages) / Double(options.nodes) / (Double(simulatedMilliseconds) / 1000)
        return (perNode * 10).rounded() / 10
    }

    var details: [String] {
        Array(
            findings.lostWrites.prefix(5) + findings.lwwViolations.prefix(5) + findings.chainViolations.prefix(5)
                + findings.listViolations.prefix(5) + findings.replyViolations.prefix(5)
                + findings.resetViolations.prefix(5))
    }

    /// The report for people.
    public var humanText: String {
        var lines: [String] = []
        lines.append(
            "StateSync simulator: \(options.nodes) nodes, \(options.operations) ops (\(acknowledged) acknowledged), seed \(options.seed)"
                + (mayBeLostToPowerLoss > 0
                    ? "; \(mayBeLostToPowerLoss) more acknowledged within one sync interval (plus two syncs) before a power loss of their node (fsync: interval), not checked for loss"
                    : "")
                + (mayBeLostToForget > 0
                    ? "; \(mayBeLostToForget) more acknowledged by a forgotten node that no other node held when it dropped its state, not checked for loss"
                    : "")
        )
        lines.append(
            "simulated \(simulatedMilliseconds) ms in \(String(format: "%.2f", cpuSeconds)) s of CPU: \(steps) node steps, \(deltasApplied) deltas applied, \(peerMessages) peer messages (\(peerMessagesPerNodePerSecond) per node per simulated second); \(channelBatchesPublished) channel batches and \(packedBatchesPublished) packed batches published"
        )
        lines.append("drawn: " + parameters.keys.sorted().map { "\($0)=\(parameters[$0]!)" }.joined(separator: " "))
        lines.append(
            "deletions: \(valuesExpired) values expired, \(tombstonesCollected) deletions collected, \(tombstonesHeld) still held at the end (all nodes)"
        )
        if let plantedBug = options.plantedBug, let culprit {
            lines.append("planted bug: \(plantedBug.rawValue) in \(culprit)")
        }
        lines.append("faults (\(faults.count)):")
        for fault in faults.prefix(40) {
            lines.append("  \(fault.startMilliseconds) ms  \(fault.kind) \(fault.target): \(fault.detail)")
        }
        if faults.count > 40 { lines.append("  … \(faults.count - 40) more") }
        func mark(_ ok: Bool) -> String { ok ? "ok  " : "FAIL" }
        lines.append("verdict:")
        lines.append(
            "  [\(mark(converged))] replicas converged (equal state digests)"
                + (convergenceMilliseconds.map { " in \($0) simulated ms after the last heal" } ?? ""))
        if !findings.divergedNodes.isEmpty {
            lines.append("         diverged: \(findings.divergedNodes.joined(separator: ", "))")
        }
        lines.append(
            "  [\(mark(findings.lwwViolations.isEmpty))] final values are the last-writer-wins winners (\(findings.lwwViolations.count) violations)"
        )
        lines.append(
            "  [\(mark(findings.lostWrites.isEmpty))] no acknowledged write lost (\(findings.lostWrites.count) lost)")
        lines.append(
            "  [\(mark(findings.chainViolations.isEmpty))] watchers' old/new chains unbroken, nothing sent twice, final copies equal (\(notifications) notifications, \(findings.chainViolations.count) violations)"
        )
        lines.append(
            "  [\(mark(findings.listViolations.isEmpty))] every node's LIST pages are its models, once each, in order (\(findings.listViolations.count) violations)"
        )
        lines.append(
            "  [\(mark(findings.replyViolations.isEmpty))] every write answered in the form its writer asked for (\(findings.replyViolations.count) violations)"
        )
        lines.append(
            "  [\(mark(findings.resetViolations.isEmpty))] every node forgotten while cut off dropped its state when it came back (\(forgottenNodeResets) resets seen, \(findings.resetViolations.count) violations)"
        )
        lines.append(
            "  [\(mark(stateDivergences == 0 && divergedAtEnd.isEmpty))] no node found its state differing from a peer's at equal progress (\(digestComparisons) digests compared, \(stateDivergences) divergences)"
        )
        if !divergedAtEnd.isEmpty { lines.append("         at the end: \(divergedAtEnd.joined(separator: "; "))") }
        for detail in details { lines.append("         \(detail)") }
        lines.append("trace digest: \(String(traceDigest, radix: 16))")
        lines.append(passed ? "PASSED" : "FAILED — replay: \(options.replayCommand)")
        return lines.joined(separator: "\n")
    }
}

/// Runs a whole cluster of real node machines in one process from one seed: writers set
/// properties (single sets and multi-property writes, and concurrent writes of one property on
/// two nodes) on random nodes, a watcher on every node records every change, faults follow a
/// schedule drawn from the seed; then everything heals and the harness's checker gives the
/// verdict.
public enum ClusterSimulator {
    static let channel = "sim"

    /// Runs one simulation. Throws only for options out of range.
    public static func run(_ options: SimulationOptions) throws -> SimulationReport {
        guard (2...256).contains(options.nodes) else {
            throw StateSyncError(.invalidConfiguration, "--nodes must be 2…256")
        }
        guard options.operations > 0 else { throw StateSyncError(.invalidConfiguration, "--ops must be positive") }
        let started = threadCPUSeconds()
        let root = SeededRandom(seed: options.seed)
        var swarm = root.fork("swarm")
        var parameters: [String: String] = [:]
        func draw<T>(_ name: String, _ choices: [T]) -> T {
            let value = choices[swarm.below(choices.count)]
            parameters[name] = "\(value)"
            return value
        }

        // Swarm testing: each seed draws its own cluster and fault parameters.
        var clusterRandom = root.fork("cluster")
        var configuration = SimulatedCluster.Configuration(nodes: options.nodes, seed: clusterRandom.next())
        configuration.heartbeatMilliseconds = draw("heartbeat_ms", [50, 100, 200])
        configuration.historyDeltas = draw("history", [40, 400, 5000, 100_000])
        if options.plantedBug == .dropDeltas {
            // Snapshot repairs would mask dropped deltas: keep the history long enough to fetch.
            configuration.historyDeltas = 100_000
            parameters["history"] = "100000"
        }
        configuration.compactBytes = draw("compact_bytes", [4096, 65536, 64 << 20])
        configuration.clientHighWaterMark = draw("client_hwm", [64, 1000, 10_000])
        configuration.batchMaximumDeltas = draw("batch", [1, 8, 256, 4096])
        configuration.snapshotPageOctets = draw("snapshot_page", [1024, 4096, 4 << 20])
        // Drawn apart, so that every other draw of a seed is what it was before slices existed.
        var sliceDraw = root.fork("merge_slice")
        let slices = [2, 16, 4096]
        configuration.snapshotMergeSliceRegisters = slices[sliceDraw.below(slices.count)]
        parameters["merge_slice"] = "\(configuration.snapshotMergeSliceRegisters)"
        // Above what the faults can keep a writer unknown to the cluster (a node that joins cut
        // off from its seed): the grace covers such writers (PROTOCOL.md 8.4).
        configuration.tombstoneGraceMilliseconds = draw("tombstone_grace_ms", [10_000, 20_000])
        configuration.fsync = draw("fsync", [NodeConfiguration.FsyncPolicy.always, .always, .interval])
        configuration.fsyncIntervalMilliseconds = draw("fsync_interval_ms", [5, 20, 50])
        // Drawn apart, so that every other draw of a seed is what it was before this choice.
        var publishDraw = root.fork("publish")
        let drawnPublish = publishDraw.below(2) == 1
        if let publishBeforeSync = options.publishBeforeSync {
            configuration.fsync = .always
            parameters["fsync"] = "always"
            configuration.publishBeforeSync = publishBeforeSync
        } else {
            configuration.publishBeforeSync = configuration.fsync == .always && drawnPublish
        }
        parameters["publish"] =
            configuration.fsync == .interval || configuration.publishBeforeSync ? "written" : "synced"
        let baseDelay = UInt64(draw("delay_ms", [1, 2, 5]))
        let jitter = UInt64(draw("jitter_ms", [0, 3, 10]))
        let baseLinks = SimulatedNetwork<SimulatedCluster.Packet>.LinkConditions(
            delay: baseDelay...(baseDelay + jitter))
        configuration.peerLinks = baseLinks
        let lossRate = draw("loss", [0.02, 0.1, 0.3])
        let duplicateRate = draw("dup", [0.02, 0.1])
        let reorderRate = draw("reorder", [0.05, 0.3])
        let conflictRate = options.plantedBug == .wrongTieBreak ? 0.3 : draw("conflicts", [0.0, 0.02, 0.1])
        let slowWatcher = draw("slow_watcher_ms", [0, 0, 1])
        if let period = options.intervalSyncMilliseconds
            ?? (options.plantedBug?.runsWithIntervalSync == true ? 1000 : nil)
        {
            configuration.fsync = .interval
            configuration.fsyncIntervalMilliseconds = period
            configuration.publishBeforeSync = false
            parameters["fsync"] = "interval"
            parameters["publish"] = "written"
            parameters["fsync_interval_ms"] = "\(period)"
        }
        // A cluster in the middle of an upgrade: some nodes older than channel batches (PROTOCOL.md
        // 7.6), which neither take nor send them nor packed batches (7.7), and some older than
        // packed batches alone.
        let drawnMix = draw("channel_batches", [SimulationOptions.ChannelBatches.all, .mixed, .rolling, .none])
        let mix = options.channelBatches ?? drawnMix
        parameters["channel_batches"] = mix.rawValue
        switch mix {
        case .mixed, .rolling:
            // Three versions: odd nodes by index (n2, n4, …) older than channel batches, every
            // fourth from index 2 (n3, n7, …) with channel batches but older than packed batches,
            // the others the newest.
            configuration.withoutChannelBatches = Set((0..<options.nodes).filter { $0 % 2 == 1 })
            configuration.withoutPackedBatches = Set((0..<options.nodes).filter { $0 % 4 == 2 })
            configuration.flipChannelBatchesOnRestart = mix == .rolling
        case .none: configuration.withoutChannelBatches = Set(0..<options.nodes)
        case .all: break
        }
        // A disk whose sync takes time: writes taken while it runs share the next one (group
        // commit), and a crash in the middle loses what it was syncing.
        let drawnSync = draw("disk_sync_ms", [0, 0, 1, 4])
        let diskSync = options.diskSyncMilliseconds ?? drawnSync
        parameters["disk_sync_ms"] = "\(diskSync)"
        configuration.diskSyncMilliseconds = UInt64(diskSync)
        // A wrong tie-break shows only on ties (equal timestamps, two nodes): keep the clocks in
        // step so that concurrent writes on two nodes tie.
        let clocksInStep = options.plantedBug == .wrongTieBreak
        let faults = Set(options.faults.filter { !(clocksInStep && $0 == .clock) })
        var clockRandom = root.fork("clocks")
        if faults.contains(.clock) {
            for index in 0..<options.nodes {
                configuration.clockSkew[index] = Int64(clockRandom.inRange(-3000...3000))
            }
        }
        let culprit = options.plantedBug == nil ? nil : options.nodes - 1
        if let culprit, let bug = options.plantedBug {
            switch bug {
            case .dropDeltas: configuration.faults[culprit] = NodeFaults(dropRemoteDeltasShare: 0.3)
            case .wrongTieBreak: configuration.faults[culprit] = NodeFaults(wrongTieBreak: true)
            case .skipRepair: configuration.faults[culprit] = NodeFaults(skipRepair: true)
            case .skipSettling: configuration.faults[culprit] = NodeFaults(skipSettling: true)
            case .skipVoid: configuration.faults[culprit] = NodeFaults(skipVoid: true)
            case .forgetHeldAboveGaps: configuration.faults[culprit] = NodeFaults(forgetHeldAboveGaps: true)
            case .duplicateWatchEvents: configuration.faults[culprit] = NodeFaults(duplicateWatchEvents: true)
            case .ignoreDeletions: configuration.faults[culprit] = NodeFaults(ignoreDeletions: true)
            case .neverExpire: configuration.faults[culprit] = NodeFaults(neverExpire: true)
            case .collectEarly: configuration.faults[culprit] = NodeFaults(collectEarly: true)
            case .ignoreRequestFlags: configuration.faults[culprit] = NodeFaults(ignoreRequestFlags: true)
            case .skipReset: configuration.faults[culprit] = NodeFaults(skipReset: true)
            }
        }
        if let logger = options.logger { configuration.logger = logger }
        configuration.lateJoiner = faults.contains(.join)
        let cluster = try SimulatedCluster(configuration)
        cluster.run(for: UInt64(3 * configuration.heartbeatMilliseconds))  // links up

        // Watchers: one per node; those of odd-numbered nodes take batched events (PROTOCOL.md
        // 10.5.1), the others one event per message. The slow one (node 0's, 1 ms per message)
        // is not batched: 32 events a message would rarely let it lag, and lag must be met.
        var watchers = (0..<options.nodes).map { index in
            let watcher = SimulatedWatcher(
                node: index, channel: channel, name: "watch-\(cluster.nodes[index].id)",
                capacity: configuration.clientHighWaterMark, batchedEvents: index % 2 == 1)
            if index == 0 { watcher.client.processingDelay = UInt64(slowWatcher) }
            return watcher
        }
        // And a filtered watch (PROTOCOL.md 10.5.1) on the last node: models m1*, properties p0
        // and p2 only; its copy must end equal to that part of the converged state.
        watchers.append(
            SimulatedWatcher(
                node: options.nodes - 1, channel: channel, name: "watch-filtered",
                capacity: configuration.clientHighWaterMark,
                filter: .init(prefix: "m1", properties: ["p0", "p2"]), batchedEvents: true))
        // And `statesync watch --state FILE` on the second node, stopped as by a crash every 0.5
        // to 2.5 simulated seconds while the workload runs, and started again from its file.
        let stateFileWatcher = SimulatedWatcher(
            node: 1 % options.nodes, channel: channel, name: "watch-state-file",
            capacity: configuration.clientHighWaterMark, batchedEvents: true, stateFile: true,
            random: root.fork("state-file watcher's printing"))
        watchers.append(stateFileWatcher)
        for watcher in watchers { watcher.start(in: cluster) }

        // The workload: writers issue one write at a time until the operations are used up.
        // The writes are spread over the fault schedule (about 1.2 simulated seconds per fault
        // kind), as the harness does: faults must meet writes.
        let workload = Workload(
            options: options, random: root.fork("workload"), conflictRate: conflictRate, channel: channel,
            duration: UInt64(max(2000, 1200 * options.faults.count)))
        workload.start(in: cluster)

        // Faults: one after another until the workload is done (each kind at least once).
        let schedule = FaultSchedule(
            kinds: options.faults.filter { faults.contains($0) }, random: root.fork("faults"), base: baseLinks,
            lossRate: lossRate,
            duplicateRate: duplicateRate, reorderRate: reorderRate, culprit: culprit,
            forceLoss: options.plantedBug == .skipRepair,
            forcePowerLoss: [.skipSettling, .skipVoid].contains(options.plantedBug),
            forceBlackout: options.plantedBug == .skipVoid,
            forceCompaction: options.plantedBug == .forgetHeldAboveGaps, forceForget: options.plantedBug == .skipReset)
        // A client writes to a node back from a power loss at once: before its peers' first
        // HEARTBEATs, the moment a node that does not settle would reuse a published number.
        schedule.models = options.models
        schedule.onPowerLossRestart = { node, cluster in workload.writeOnce(to: node, in: cluster) }
        schedule.onBlackoutWrite = { node, cluster in workload.writeOnce(to: node, in: cluster) }
        schedule.start(in: cluster, until: { workload.isDone })
        var restarts = root.fork("state-file watcher")
        func restartStateFileWatcher(_ cluster: SimulatedCluster) {
            guard !workload.isDone else { return }
            stateFileWatcher.restartFromStateFile(in: cluster)
            cluster.schedule(at: cluster.now + UInt64(restarts.inRange(500...2500)), restartStateFileWatcher)
        }
        cluster.schedule(at: cluster.now + UInt64(restarts.inRange(500...2500)), restartStateFileWatcher)
        let recorder = options.recordTimeline ? TimelineRecorder(binMilliseconds: 100) : nil
        var nextSample: UInt64 = 0
        func sample(_ cluster: SimulatedCluster, force: Bool = false) {
            guard let recorder, force || cluster.now >= nextSample else { return }
            nextSample = cluster.now + 100
            let writes = workload.writes
            recorder.counted(
                at: Int(cluster.now), attempted: writes.count,
                acknowledged: writes.reduce(0) { $0 + ($1.acknowledged == nil ? 0 : 1) })
            for node in cluster.nodes {
                recorder.lag(of: node.id, at: Int(cluster.now), missing: node.host?.status.missingDeltas)
            }
        }
        let workloadLimit = cluster.now + 600_000 + UInt64(options.operations) * 20
        cluster.run(
            until: workloadLimit,
            stoppingWhen: { cluster in
                sample(cluster)
                return workload.isDone && schedule.isDone
            })
        let workloadFinished = workload.isDone
        if options.plantedBug == .wrongTieBreak {
            // Ties for certain: after a quiet moment two nodes' clocks issue the same timestamp.
            for probe in 0..<4 {
                cluster.run(for: 200)
                workload.writeTie(probe: probe, nodes: (probe % (options.nodes - 1), options.nodes - 1), in: cluster)
            }
            cluster.run(for: 200)
        }

        // Heal everything, then wait for quiet: every node up, nothing missing, equal digests.
        schedule.healAll(in: cluster)
        let healed = cluster.now
        var convergedAt: UInt64?
        while cluster.now < healed + options.convergenceTimeoutMilliseconds {
            cluster.run(for: 20)
            sample(cluster)
            if isQuiet(cluster) {
                sample(cluster, force: true)  // the picture shows the moment of convergence
                convergedAt = cluster.now
                break
            }
        }
        // Every value written with a time to live expires on every node (whatever its clock),
        // and the cluster is quiet again: the verdict compares states that no expiry will change.
        if convergedAt != nil, workload.latestExpiry > cluster.now {
            cluster.run(for: workload.latestExpiry - cluster.now)
            let expired = cluster.now
            while !isQuiet(cluster), cluster.now < expired + options.convergenceTimeoutMilliseconds {
                cluster.run(for: 20)
            }
            if !isQuiet(cluster) { convergedAt = nil }
        }
        // Let the watchers take what is on their way: each must get a caught-up marker sent once
        // its node held the converged state (its newest version, nothing missing). A slow
        // watcher may need a while; one that never gets there is named by the verdict.
        let newest = cluster.nodes.compactMap { $0.host?.status.latestVersion }.max()
        cluster.run(for: 60_000) { _ in
            watchers.allSatisfy { (watcher: SimulatedWatcher) -> Bool in
                guard watcher.isWatching, let marker = watcher.lastCaughtUp else { return false }
                return marker.nodeMissing == 0 && marker.latest == newest
            }
        }

        // The verdict.
        var states: [ConvergenceChecker.NodeState] = []
        for node in cluster.nodes {
            guard let host = node.host else { continue }
            var models: [String: [String: ReplicaStore.Register]] = [:]
            for model in 0..<options.models {
                let registers = host.properties(of: ModelAddress(channel: channel, model: "m\(model)"))
                if !registers.isEmpty { models["m\(model)"] = registers }
            }
            states.append(ConvergenceChecker.NodeState(node: node.id, digest: host.status.stateDigest, models: models))
        }
        let (afterPowerLosses, mayBeLost) = Self.withoutWritesAPowerLossMayTake(
            workload.writes, losses: schedule.intervalPowerLosses, configuration: configuration)
        let (writes, givenUpByForgets) = Self.withoutWritesAForgetGaveUp(
            afterPowerLosses, resyncs: schedule.forgetResyncs, slack: configuration.clientDelay + 1)
        var findings = ConvergenceChecker().check(
            writes: writes, nodes: states,
            watches: watchers.map { watcher in
                ConvergenceChecker.WatchHistory(
                    node: cluster.nodes[watcher.nodeIndex].id, sessions: watcher.sessions.changes,
                    finalState: watcher.finalState(), filter: watcher.filter, resetStarts: watcher.sessions.resetStarts)
            }, expiredThrough: cluster.nodes.indices.map { cluster.wallMilliseconds(of: $0) }.max() ?? 0)
        findings.chainViolations += watchers.flatMap { $0.violations }
        findings.replyViolations = workload.replyViolations
        findings.resetViolations = schedule.resetViolations(in: cluster)
        // Every node's channel listed page by page (LIST) must be what the node holds.
        let listers = states.map { state in
            SimulatedLister(
                node: cluster.nodes.firstIndex { $0.id == state.node }!, channel: channel, name: "list-\(state.node)")
        }
        for lister in listers { lister.start(in: cluster) }
        cluster.run(for: 10_000) { _ in listers.allSatisfy(\.done) }
        for (lister, state) in zip(listers, states) {
            findings.listViolations += lister.violations(node: state.node, models: state.models)
            if !lister.done { findings.listViolations.append("\(state.node): LIST got no answer") }
        }
        if convergedAt == nil {
            // Not quiet: name what never settled.
            for node in cluster.nodes {
                guard let status = node.host?.status else {
                    findings.divergedNodes.append(node.id)
                    continue
                }
                let disconnected = status.peers.filter { !$0.connected }.map(\.endpoint)
                if status.missingDeltas > 0 || !disconnected.isEmpty {
                    if !findings.divergedNodes.contains(node.id) { findings.divergedNodes.append(node.id) }
                    findings.lostWrites.append(
                        "\(node.id) never settled: \(status.missingDeltas) deltas still missing (first gaps: \(node.host?.firstGaps.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" } ?? [])), disconnected from \(disconnected)"
                    )
                }
            }
        }
        if !workloadFinished {
            findings.lostWrites.append(
                "the workload did not finish within \(workloadLimit) simulated ms: writes stopped being answered")
        }
        let cpu = threadCPUSeconds() - started
        var report = SimulationReport(
            options: options, parameters: parameters, acknowledged: writes.filter { $0.acknowledged != nil }.count,
            findings: findings, converged: convergedAt != nil && findings.converged,
            convergenceMilliseconds: convergedAt.map { $0 - healed }, faults: schedule.events,
            traceDigest: cluster.trace.hash, simulatedMilliseconds: cluster.now, steps: cluster.steps,
            deltasApplied: schedule.deltasAppliedBeforeCrashes
                + cluster.nodes.reduce(0) { total, node in
                    let counters = node.host?.status.counters ?? [:]
                    return total + (counters["deltas_applied"] ?? 0) + (counters["deltas_published"] ?? 0)
                }, notifications: watchers.reduce(0) { $0 + $1.changes.count }, cpuSeconds: cpu,
            culprit: culprit.map { cluster.nodes[$0].id }, peerMessages: cluster.peerMessagesDelivered,
            peerBytes: cluster.peerBytesDelivered)
        report.mayBeLostToPowerLoss = mayBeLost
        report.mayBeLostToForget = givenUpByForgets
        report.forgottenNodeResets = schedule.forgetResyncs.count
        for node in cluster.nodes {
            guard let status = node.host?.status else { continue }
            report.valuesExpired += status.counters["values_expired"] ?? 0
            report.tombstonesCollected += status.counters["tombstones_collected"] ?? 0
            report.channelBatchesPublished += status.counters["channel_batches_published"] ?? 0
            report.packedBatchesPublished += status.counters["packed_batches_published"] ?? 0
            report.malformedMessages += status.counters["malformed_messages"] ?? 0
            report.tombstonesHeld += status.tombstones
            if !status.divergedPeers.isEmpty {
                report.divergedAtEnd.append("\(node.id) differs from \(status.divergedPeers.joined(separator: ", "))")
            }
        }
        report.digestComparisons = cluster.nodes.reduce(0) { $0 + $1.digestComparisons }
        report.stateDivergences = cluster.nodes.reduce(0) { $0 + $1.stateDivergences }
        report.ownDeltasTakenBack = cluster.nodes.reduce(0) { $0 + $1.counter("own_deltas_taken_back") }
        sample(cluster, force: true)  // the last acknowledgements, whatever the sampling gate
        report.timeline = recorder?.timeline(
            healed: Int(healed), converged: convergedAt.map(Int.init), end: Int(cluster.now))
        return report
    }

    /// The writes, with those a power loss may have taken counted as not acknowledged, and how
    /// many those are: with
    /// `storage.fsync: interval` a node acknowledges a write once the OS has it and syncs within
    /// `storage.fsync_interval_ms` (plus the sync's own time, twice: one may be running), so a
    /// power loss may take what it acknowledged that long before (PROTOCOL.md 11.1). Anything
    /// acknowledged earlier, or by another node, must survive as before; and whatever was taken,
    /// the replicas must still agree.
    static func withoutWritesAPowerLossMayTake(
        _ writes: [ConvergenceChecker.Write], losses: [(node: String, at: UInt64)],
        configuration: SimulatedCluster.Configuration
    ) -> (writes: [ConvergenceChecker.Write], setAside: Int) {
        guard !losses.isEmpty else { return (writes, 0) }
        let window =
            UInt64(configuration.fsyncIntervalMilliseconds) + 2 * configuration.diskSyncMilliseconds + 2
        let slack = configuration.clientDelay + 1  // an acknowledgement on its way to the client
        var setAside = 0
        let checked = writes.map { write in
            guard write.acknowledged != nil, let at = write.acknowledgedAt,
                losses.contains(where: { $0.node == write.node && at + window > $0.at && at <= $0.at + slack })
            else { return write }
            setAside += 1
            var unknown = write
            unknown.acknowledged = nil
            return unknown
        }
        return (checked, setAside)
    }

    /// The writes acknowledged by a forgotten node before it dropped its state that no other
    /// node held then (PROTOCOL.md 7.5 gives them up) made writes of unknown outcome: for each,
    /// some property it wrote or deleted had no version at least the write's on any other node,
    /// but for versions of writes given up themselves. (Forgets chain: n1's write is not held
    /// by n2, which holds a newer write of its own instead; n2 is forgotten in turn and gives that
    /// one up, and the property falls back below n1's write.) Returns the writes and how many were
    /// set aside.
    static func withoutWritesAForgetGaveUp(
        _ writes: [ConvergenceChecker.Write], resyncs: [FaultSchedule.ForgetResync], slack: UInt64
    ) -> (writes: [ConvergenceChecker.Write], setAside: Int) {
        guard !resyncs.isEmpty else { return (writes, 0) }
        var givenUp = Set<Version>()
        // Until nothing more is given up: each pass may uncover writes the last one's gave up.
        var settled = false
        while !settled {
            settled = true
            for write in writes {
                guard let version = write.acknowledged, let at = write.acknowledgedAt, !givenUp.contains(version)
                else { continue }
                let lost = resyncs.contains { resync in
                    guard resync.node == write.node, at <= resync.at + slack else { return false }
                    let held = resync.held[write.model] ?? [:]
                    func covered(_ versions: [Version]?) -> Bool {
                        versions?.contains { $0 >= version && !givenUp.contains($0) } ?? false
                    }
                    if write.deletesModel { return held.isEmpty || held.values.contains { !covered($0) } }
                    return (Array(write.properties.keys) + write.deleted).contains { !covered(held[$0]) }
                }
                if lost {
                    givenUp.insert(version)
                    settled = false
                }
            }
        }
        var setAside = 0
        let checked = writes.map { write in
            guard let version = write.acknowledged, givenUp.contains(version) else { return write }
            setAside += 1
            var unknown = write
            unknown.acknowledged = nil
            return unknown
        }
        return (checked, setAside)
    }

    /// Every node up, connected to every peer, missing nothing, and all with one digest.
    static func isQuiet(_ cluster: SimulatedCluster) -> Bool {
        var digests = Set<UInt64>()
        for node in cluster.nodes {
            guard let status = node.host?.status else { return false }
            guard status.missingDeltas == 0, !status.settling, status.peers.allSatisfy(\.connected) else {
                return false
            }
            digests.insert(status.stateDigest)
        }
        return digests.count == 1
    }

    /// CPU seconds of the calling thread.
    static func threadCPUSeconds() -> Double {
        var spec = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &spec)
        return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
    }
}

/// The writers of a simulation and what they wrote.
final class Workload {
    let options: SimulationOptions
    var random: SeededRandom
    let conflictRate: Double
    let channel: String
    private var issued = 0
    private var writers: [SimulatedWriter] = []
    /// Two writers that set one property on two nodes at the same instant.
    private var conflictPair: [SimulatedWriter] = []

    /// The simulated milliseconds the writes are spread over, and when they started.
    let duration: UInt64
    private var start: UInt64 = 0
    /// A simulated time by which every value written with a time to live has expired on every
    /// node's clock (what a write may wait for its answer, plus the furthest clock skew).
    private(set) var latestExpiry: UInt64 = 0
    static let settleBound = SimulatedWriter.timeout + 3_000

    init(options: SimulationOptions, random: SeededRandom, conflictRate: Double, channel: String, duration: UInt64) {
        self.options = options
        self.random = random
        self.conflictRate = conflictRate
        self.channel = channel
        self.duration = duration
    }

    var isDone: Bool {
        issued >= options.operations && !writers.contains(where: \.isBusy) && !conflictPair.contains(where: \.isBusy)
            && !restartWriters.contains(where: \.isBusy)
    }

    var writes: [ConvergenceChecker.Write] {
        (writers + conflictPair + restartWriters).flatMap(\.writes)
    }

    /// What the writers were answered in a form they did not ask for.
    var replyViolations: [String] {
        (writers + conflictPair + restartWriters).flatMap(\.violations)
    }

    /// Writers of one write each, to a node back from a power loss.
    private var restartWriters: [SimulatedWriter] = []

    /// Writes at once to `node` (just restarted after a power loss, or about to lose power), on
    /// top of the workload's operations, a property no other write touches: a write its peers
    /// dropped would stay missing from them, not be overwritten by a later one.
    func writeOnce(to node: Int, in cluster: SimulatedCluster) {
        let writer = SimulatedWriter(
            name: "restart-\(restartWriters.count)", batchedReplies: restartWriters.count % 2 == 1)
        restartWriters.append(writer)
        let model = "m\(random.below(options.models))"
        _ = writer.write(
            channel: channel, model: model, properties: ["\(writer.name)": .string(writer.name)], to: node,
            in: cluster)
    }

    func start(in cluster: SimulatedCluster) {
        start = cluster.now
        // Every other writer asks for its OKs in OKS messages, as StateSyncClient does
        // (PROTOCOL.md 10.1.1); the others as a client of the first version.
        writers = (0..<max(1, options.writers)).map {
            SimulatedWriter(name: "writer-\($0)", batchedReplies: $0 % 2 == 1)
        }
        conflictPair = [SimulatedWriter(name: "conflict-a"), SimulatedWriter(name: "conflict-b", batchedReplies: true)]
        for writer in writers {
            writer.onSettled = { [unowned self, unowned writer] cluster in self.next(writer, in: cluster) }
            next(writer, in: cluster)
        }
    }

    /// Writes one property on two nodes at the same instant (two values): with their clocks in
    /// step and nothing else written meanwhile, both versions have the same timestamp.
    func writeTie(probe: Int, nodes: (Int, Int), in cluster: SimulatedCluster) {
        let model = "m\(probe % options.models)"
        conflictPair[0].write(
            channel: channel, model: model, properties: ["tie": .string("probe-\(probe)-a")], to: nodes.0, in: cluster)
        conflictPair[1].write(
            channel: channel, model: model, properties: ["tie": .string("probe-\(probe)-b")], to: nodes.1, in: cluster)
    }

    private func next(_ writer: SimulatedWriter, in cluster: SimulatedCluster) {
        guard issued < options.operations else { return }
        issued += 1
        let index = issued
        // A few milliseconds of thought, and never ahead of the schedule the writes are paced by.
        let due = start + duration * UInt64(index) / UInt64(options.operations)
        let think = max(UInt64(random.below(4)), due > cluster.now ? due - cluster.now : 0)
        let node = random.below(options.nodes)
        let model = "m\(random.below(options.models))"
        var properties: [String: Value] = [:]
        let count = random.chance(0.3) ? 2 + random.below(2) : 1
        for _ in 0..<count { properties["p\(random.below(4))"] = .string("\(writer.name)-\(index)") }
        // Some writes delete (a property or two, or the whole model) and some values expire
        // (PROTOCOL.md 8.2, 8.3): deletions meet concurrent sets, expiries meet faults.
        var write = ConvergenceChecker.Write(model: model, properties: properties, node: "", acknowledged: nil)
        let kind = random.below(100)
        if kind < 4 {
            write.properties = [:]
            write.deletesModel = true
        } else if kind < 12 {
            write.properties = [:]
            write.deleted = Array(Set((0..<(1 + random.below(2))).map { _ in "p\(random.below(4))" })).sorted()
        } else if kind < 22 {
            write.timeToLive = UInt64(50 + random.below(2000))
            latestExpiry = max(latestExpiry, cluster.now + think + Self.settleBound + write.timeToLive)
        }
        let conflict = random.chance(conflictRate) && options.nodes > 1
        var other = random.below(options.nodes - 1)
        if other >= node { other += 1 }
        let property = "p\(random.below(4))"
        cluster.schedule(at: cluster.now + think) { [unowned self] cluster in
            writer.write(channel: channel, write, to: node, in: cluster)
            guard conflict, self.issued + 2 <= options.operations, !self.conflictPair.contains(where: \.isBusy) else {
                return
            }
            // The same property, two values, two nodes, one instant: a last-writer-wins tie is
            // likely, decided by node id.
            self.issued += 2
            self.conflictPair[0].write(
                channel: channel, model: model, properties: [property: .string("tie-a-\(index)")], to: node,
                in: cluster)
            self.conflictPair[1].write(
                channel: channel, model: model, properties: [property: .string("tie-b-\(index)")], to: other,
                in: cluster)
        }
    }
}

/// Injects the requested faults one after another, on a schedule drawn from the seed, until the
/// workload is done (and each kind at least once).
final class FaultSchedule {
    let kinds: [SimulationOptions.Fault]
    var random: SeededRandom
    let base: SimulatedNetwork<SimulatedCluster.Packet>.LinkConditions
    let lossRate: Double
    let duplicateRate: Double
    let reorderRate: Double
    let culprit: Int?
    let forceLoss: Bool
    /// Every crash is a power loss of the culprit (a planted skip-settling bug).
    let forcePowerLoss: Bool
    /// Every power loss under `interval` follows a moment when every peer missed what the node
    /// published (a planted skip-void bug).
    let forceBlackout: Bool
    /// Every crash is a power loss of another node than the culprit, after such a moment, with
    /// the culprit alone hearing what it publishes after it, and compacting and restarting
    /// just before the power loss (a planted forget-held-above-gaps bug).
    let forceCompaction: Bool
    /// Every forget takes the culprit (a planted skip-reset bug), and there is one.
    let forceForget: Bool
    /// Draws of the moments before a power loss when the peers miss what the node publishes.
    var blackoutRandom: SeededRandom
    /// Draws of a peer's compaction and restart just before such a power loss.
    var compactionRandom: SeededRandom
    /// Called when a node that lost power is back.
    var onPowerLossRestart: ((Int, SimulatedCluster) -> Void)?
    /// Called when every peer starts missing what a node publishes before its power loss, and
    /// when they see it again: a write to that node each time, so the moment meets writes.
    var onBlackoutWrite: ((Int, SimulatedCluster) -> Void)?
    private(set) var events: [SimulationReport.FaultEvent] = []
    private(set) var isDone = false
    private(set) var deltasAppliedBeforeCrashes = 0
    /// Power losses of nodes with `storage.fsync: interval`: which node, when.
    private(set) var intervalPowerLosses: [(node: String, at: UInt64)] = []
    /// A forgotten node dropping its state: which node, when (seen within a few ms), and what
    /// every other node held then.
    struct ForgetResync {
        let node: String
        let at: UInt64
        /// Per model, per property, the version each other node held.
        let held: [String: [String: [Version]]]
    }
    private(set) var forgetResyncs: [ForgetResync] = []
    /// Every forget the operator's FORGET was accepted for, and how many resets its node had
    /// made before it came back: it must make one more (``resetViolations(in:)``).
    private(set) var forgets: [Forget] = []

    struct Forget {
        var node: Int
        var on: Int
        var acceptedAt: UInt64
        var resetsBefore: Int
    }

    /// A forgotten node that runs at the end but never dropped its state after its forget
    /// (PROTOCOL.md 7.5): it told the others it was alive, overriding the forget, before it
    /// learned of it (the reference node once did, announcing itself before a peer's member
    /// list reached it), and may bring back data deleted since.
    func resetViolations(in cluster: SimulatedCluster) -> [String] {
        forgets.compactMap { forget in
            let node = cluster.nodes[forget.node]
            guard node.isUp, node.resets <= forget.resetsBefore else { return nil }
            return
                "\(node.id) was forgotten on \(cluster.nodes[forget.on].id) at \(forget.acceptedAt) ms and runs again without having dropped its state"
        }
    }
    /// How many models the workload writes (`m0`…), in ``ClusterSimulator/channel``.
    var models = 0
    private var round = 0
    private var position = 0

    init(
        kinds: [SimulationOptions.Fault], random: SeededRandom,
        base: SimulatedNetwork<SimulatedCluster.Packet>.LinkConditions, lossRate: Double, duplicateRate: Double,
        reorderRate: Double, culprit: Int?, forceLoss: Bool, forcePowerLoss: Bool = false,
        forceBlackout: Bool = false, forceCompaction: Bool = false, forceForget: Bool = false
    ) {
        self.kinds = kinds
        self.random = random
        self.base = base
        self.lossRate = lossRate
        self.duplicateRate = duplicateRate
        self.reorderRate = reorderRate
        self.culprit = culprit
        self.forceLoss = forceLoss
        self.forcePowerLoss = forcePowerLoss
        self.forceBlackout = forceBlackout
        self.forceCompaction = forceCompaction
        self.forceForget = forceForget
        self.blackoutRandom = random.fork("blackout")
        self.compactionRandom = random.fork("compaction")
    }

    private var schedule: [SimulationOptions.Fault] {
        var kinds = self.kinds
        if forceLoss && !kinds.contains(.loss) { kinds.append(.loss) }
        if forceForget && !kinds.contains(.forget) { kinds.append(.forget) }
        // Twice per round: a power loss must meet published writes not yet synced.
        if forcePowerLoss || forceCompaction { kinds.append(.crash) }
        return kinds
    }

    func start(in cluster: SimulatedCluster, until done: @escaping () -> Bool) {
        guard !schedule.isEmpty else {
            isDone = true
            return
        }
        scheduleNext(in: cluster, until: done)
    }

    private func scheduleNext(in cluster: SimulatedCluster, until done: @escaping () -> Bool) {
        if position == schedule.count {
            position = 0
            round += 1
        }
        if round > 0 && done() {
            isDone = true
            return
        }
        let kind = schedule[position]
        position += 1
        let wait = UInt64(random.inRange(100...400))
        let hold = UInt64(random.inRange(200...1500))
        cluster.schedule(at: cluster.now + wait) { [unowned self] cluster in
            self.inject(kind, hold: hold, in: cluster) { cluster in self.scheduleNext(in: cluster, until: done) }
        }
    }

    private func inject(
        _ kind: SimulationOptions.Fault, hold: UInt64, in cluster: SimulatedCluster,
        then next: @escaping (SimulatedCluster) -> Void
    ) {
        var hold = hold
        let nodes = cluster.nodes
        let start = cluster.now
        // A planted skip-repair bug is exposed by loss on the culprit's links.
        let forced = (kind == .loss && forceLoss) || (kind == .crash && forcePowerLoss)
        var target = forced ? (culprit ?? 0) : random.below(nodes.count)
        let forcedCompaction = kind == .crash && forceCompaction
        if forcedCompaction, let culprit, target == culprit { target = (culprit + 1) % nodes.count }
        var detail = ""
        var heal: (SimulatedCluster) -> Void = { _ in }
        switch kind {
        case .crash:
            // A power loss loses what was not synced (a torn part may remain); a process crash
            // loses nothing the node had written to the OS. `storage.fsync: interval` promises
            // durability only against process crashes: its power losses are noted, and the
            // writes they may take (acknowledged, not yet synced) are not held against it.
            let powerLoss = random.chance(0.5) || forcePowerLoss || forcedCompaction
            if powerLoss, cluster.configuration.fsync == .interval || cluster.configuration.publishBeforeSync,
                forceBlackout || forcedCompaction || blackoutRandom.chance(0.5)
            {
                // Under `interval` the node publishes before it syncs: first every peer misses
                // what it publishes for a moment, then it publishes more (the peers see a gap),
                // then the power goes before they repaired it. The missed deltas are then lost
                // everywhere below ones the peers hold: after settling, the node declares them
                // void (PROTOCOL.md 10.8), or the peers wait for them for good. (Its own draws
                // come from a stream of their own.)
                let dark = UInt64(blackoutRandom.inRange(2...20))
                var after = UInt64(blackoutRandom.inRange(1...10))
                // Sometimes one peer alone sees what the node publishes after the dark moment
                // (above the gap of what it missed), and the peers' requests to the node are
                // lost, so nothing repairs the gap; that peer stops cleanly, compacting its log,
                // and comes back 1 ms before the power loss. Its restart must still know it
                // holds those deltas: the node's settling asks for them, and no one else has
                // them (PROTOCOL.md 11.5 item 6). (Drawn from a stream of its own: the other
                // draws stay as they were.)
                let compacting =
                    forcedCompaction
                    ? culprit
                    : compactionRandom.chance(0.5)
                        ? (target + 1 + compactionRandom.below(nodes.count - 1)) % nodes.count : nil
                // Long enough for a write after the dark moment to cross the slowest link.
                if compacting != nil {
                    let slowest = Int(base.delay.upperBound)
                    after = UInt64(compactionRandom.inRange((slowest + 2)...(slowest + 15)))
                }
                var lost = base
                lost.loss = 1
                let peers = nodes.filter { $0.index != target }
                for peer in peers { cluster.network.setConditions(lost, from: nodes[target].id, to: peer.id) }
                onBlackoutWrite?(target, cluster)
                cluster.schedule(at: cluster.now + dark) { [unowned self] cluster in
                    for peer in peers {
                        if compacting == nil || compacting == peer.index {
                            cluster.network.setConditions(nil, from: nodes[target].id, to: peer.id)
                        }
                        if compacting != nil {
                            cluster.network.setConditions(lost, from: peer.id, to: nodes[target].id)
                        }
                    }
                    onBlackoutWrite?(target, cluster)
                }
                if let compacting {
                    cluster.schedule(at: cluster.now + dark + after - 1) { cluster in
                        // (A late joiner not yet started stays out.)
                        guard cluster.nodes[compacting].isUp else { return }
                        cluster.stopCleanly(compacting)
                        try? cluster.restart(compacting)
                    }
                }
                cluster.schedule(at: cluster.now + dark + after) { [unowned self] cluster in
                    let unsynced = nodes[target].disk.unsyncedBytes
                    let torn = unsynced > 0 && blackoutRandom.chance(0.5) ? blackoutRandom.below(unsynced + 1) : 0
                    loseAt(target, tornBytes: torn, powerLoss: true, in: cluster)
                    if compacting != nil {
                        for peer in peers {
                            cluster.network.setConditions(nil, from: peer.id, to: nodes[target].id)
                            cluster.network.setConditions(nil, from: nodes[target].id, to: peer.id)
                        }
                    }
                }
                detail =
                    "every peer misses what it publishes for \(dark) ms, then a power loss \(after) ms later, restarted \(hold) ms after the first"
                if let compacting {
                    detail +=
                        "; after it, \(nodes[compacting].id) alone hears it and no peer's request reaches it; \(nodes[compacting].id) stopped cleanly (compacting) and restarted 1 ms before the power loss"
                }
            } else {
                let unsynced = nodes[target].disk.unsyncedBytes
                let torn = powerLoss ? (unsynced > 0 && random.chance(0.5) ? random.below(unsynced + 1) : 0) : unsynced
                loseAt(target, tornBytes: torn, powerLoss: powerLoss, in: cluster)
                detail =
                    powerLoss
                    ? "power loss (\(unsynced) bytes unsynced, \(torn) of them torn onto disk), restarted after \(hold) ms"
                    : "process crash (\(unsynced) bytes written to the OS survive), restarted after \(hold) ms"
            }
            heal = { [unowned self] cluster in
                try? cluster.restart(target)
                if powerLoss, cluster.nodes[target].isUp { self.onPowerLossRestart?(target, cluster) }
            }
        case .join:
            // Always the last node: the fault is told as its (the drawn target named another).
            let joiner = nodes.count - 1
            target = joiner
            if !nodes[joiner].isUp && nodes[joiner].generation == 0 {
                try? cluster.join(joiner)
                detail = "\(nodes[joiner].id) joined, knowing only \(nodes[0].id); no one knew it"
            } else {
                // A process restart: what it wrote to the OS survives (fsync: interval included).
                cluster.crash(joiner, tornBytes: nodes[joiner].disk.unsyncedBytes)
                detail = "\(nodes[joiner].id) restarted after \(hold) ms, knowing only \(nodes[0].id) again"
                heal = { cluster in try? cluster.restart(joiner) }
            }
        case .forget:
            // Not a planted bug's node (taking the others' state would hide the bug; but for
            // skip-reset, whose node is the one to forget), and one that runs, with another
            // running to forget it on.
            let candidates = nodes.indices.filter { ($0 != culprit) != forceForget && nodes[$0].isUp }
            let up = nodes.indices.filter { nodes[$0].isUp }
            guard let victim = candidates.isEmpty ? nil : candidates[target % candidates.count], up.count > 1 else {
                detail = "no node to forget (none running but a planted bug's)"
                break
            }
            // An operator forgets a node on one that still hears from another member: one that
            // hears from none could be the one cut off itself (in a cluster of two, the other
            // is all there is).
            let others = up.filter { $0 != victim }
            let hearing = others.filter { index in
                let own = nodes[index].id
                let members = nodes[index].host?.status.members ?? []
                return members.contains { $0.id != own && $0.id != nodes[victim].id && $0.connected }
            }
            let choices = nodes.count == 2 ? others : hearing
            guard !choices.isEmpty else {
                detail = "no forget of \(nodes[victim].id): no other node hears from a third member"
                break
            }
            let operatorNode = choices[random.below(choices.count)]
            // Half the time the node also stops cleanly while cut off and starts again as the
            // cut heals: its new start's entry is newer than the forget, and it must still learn
            // it was forgotten before it says it is alive (PROTOCOL.md 7.5, "ANNOUNCE").
            let restarts = random.below(2) == 0
            cluster.partition([victim], cut: true)
            if restarts {
                cluster.schedule(at: cluster.now + 200) { cluster in cluster.stopCleanly(victim) }
            }
            let forgetter = SimulatedForgetter(
                node: operatorNode, forgetting: nodes[victim].id, name: "forget-\(events.count)")
            // Peers count a member connected for three heartbeat intervals after they last heard
            // it; the operator asks from then on, and the cut lasts a second beyond.
            cluster.schedule(at: cluster.now + 400) { cluster in forgetter.start(in: cluster) }
            hold += 1000
            heal = { [unowned self] cluster in
                forgetter.stop()
                // Cut off all along, it cannot have learned of this forget yet.
                let resetsBefore = cluster.nodes[victim].resets
                cluster.partition([victim], cut: false)
                if restarts { try? cluster.restart(victim) }
                guard let acceptedAt = forgetter.acceptedAt else { return }
                self.forgets.append(
                    Forget(node: victim, on: operatorNode, acceptedAt: acceptedAt, resetsBefore: resetsBefore))
                self.awaitResync(of: victim, after: resetsBefore, until: cluster.now + 10_000, in: cluster)
            }
            target = victim
            detail =
                "\(nodes[victim].id) cut off from every other node for \(hold) ms\(restarts ? ", stopped cleanly 200 ms in and started again as the cut heals" : ""); forgotten on \(nodes[operatorNode].id) (statesync forget) once they stop hearing it"
        case .leave:
            cluster.stopCleanly(target)
            detail = "\(nodes[target].id) stopped cleanly (left), back after \(hold) ms"
            heal = { cluster in try? cluster.restart(target) }
        case .partition:
            var group = Set([target])
            let extra = nodes.count > 3 ? random.below(nodes.count / 2) : 0
            for _ in 0..<extra { group.insert(random.below(nodes.count)) }
            if group.count == nodes.count { group.remove(target == 0 ? 1 : 0) }
            cluster.partition(group, cut: true)
            let side = group.sorted().map { nodes[$0].id }.joined(separator: ",")
            let others = nodes.indices.filter { !group.contains($0) }.map { nodes[$0].id }.joined(separator: ",")
            detail = "\(side) | \(others) cut both ways for \(hold) ms"
            heal = { cluster in cluster.partition(group, cut: false) }
        case .loss:
            var lossy = base
            lossy.loss = lossRate
            for peer in nodes where peer.index != target {
                cluster.network.setConditions(lossy, from: peer.id, to: nodes[target].id)
            }
            detail = "inbound peer links lose \(Int(lossRate * 100)) % for \(hold) ms"
            heal = { cluster in
                for peer in nodes where peer.index != target {
                    cluster.network.setConditions(nil, from: peer.id, to: nodes[target].id)
                }
            }
        case .dup:
            cluster.network.defaultConditions.duplicate = duplicateRate
            detail = "every peer link duplicates \(Int(duplicateRate * 100)) % for \(hold) ms"
            heal = { cluster in cluster.network.defaultConditions.duplicate = 0 }
        case .reorder:
            cluster.network.defaultConditions.reorder = reorderRate
            cluster.network.defaultConditions.reorderDelay = 60
            detail = "every peer link holds back \(Int(reorderRate * 100)) % by up to 60 ms for \(hold) ms"
            heal = { cluster in cluster.network.defaultConditions.reorder = 0 }
        case .forge:
            let victim = (target + 1 + random.below(nodes.count - 1)) % nodes.count
            let origin = (0..<nodes.count).first { $0 != target && $0 != victim } ?? victim
            let model = "m0"
            cluster.forgeDelta(
                from: target, to: victim, origin: origin, channel: ClusterSimulator.channel, model: model,
                property: "p0")
            detail =
                "\(nodes[target].id) sends \(nodes[victim].id) a write of \(model).p0 in \(nodes[origin].id)'s name"
        case .phantom:
            let victim = (target + 1 + random.below(nodes.count - 1)) % nodes.count
            let latest = nodes[target].host?.status.latestSequence ?? 0
            let claim = latest + 1 + UInt64(random.below(2000))
            cluster.forgeHeartbeat(of: target, to: victim, latestSequence: claim)
            detail =
                "a heartbeat forged as \(nodes[target].id)'s reaches \(nodes[victim].id): latest \(claim), it wrote \(latest)"
        case .brokenLink:
            let peer = (target + 1 + random.below(nodes.count - 1)) % nodes.count
            cluster.breakLink(from: peer, to: target)
            detail = "the link from \(nodes[peer].id) breaks for good (until \(nodes[target].id) replaces it)"
        case .clock:
            let jump = Int64(random.inRange(-5000...5000))
            let before = nodes[target].clockSkew
            cluster.setClockSkew(target, before + jump)
            detail = "wall clock jumps \(jump) ms (skew now \(before + jump) ms)"
        }
        cluster.record("fault", "\(kind.rawValue) \(nodes[target].id)", [Array(detail.utf8)])
        let index = events.count
        events.append(.init(kind: kind.rawValue, target: nodes[target].id, detail: detail, startMilliseconds: start))
        cluster.schedule(at: cluster.now + hold) { [unowned self] cluster in
            heal(cluster)
            self.events[index].healMilliseconds = cluster.now
            next(cluster)
        }
    }

    /// Watches a forgotten node until it drops its state (its `resyncs` counter passes
    /// `before`), then notes what every other node held at that moment: the writes it took that
    /// none of them held are given up (PROTOCOL.md 7.5). Gives up at `until` (a node that
    /// crashed meanwhile, or never heard of the forget: nothing is set aside for it).
    private func awaitResync(of node: Int, after before: Int, until: UInt64, in cluster: SimulatedCluster) {
        guard cluster.nodes[node].resets <= before else {
            var held: [String: [String: [Version]]] = [:]
            for other in cluster.nodes where other.index != node {
                guard let host = other.host else { continue }
                for model in 0..<models {
                    let name = "m\(model)"
                    let registers = host.properties(of: ModelAddress(channel: ClusterSimulator.channel, model: name))
                    for (property, register) in registers {
                        held[name, default: [:]][property, default: []].append(register.version)
                    }
                }
            }
            forgetResyncs.append(ForgetResync(node: cluster.nodes[node].id, at: cluster.now, held: held))
            return
        }
        guard cluster.now < until else { return }
        cluster.schedule(at: cluster.now + 2) { [unowned self] cluster in
            self.awaitResync(of: node, after: before, until: until, in: cluster)
        }
    }

    /// Crashes node `target` now (a power loss or a process crash), noting what it had applied.
    private func loseAt(_ target: Int, tornBytes: Int, powerLoss: Bool, in cluster: SimulatedCluster) {
        let node = cluster.nodes[target]
        let counters = node.host?.status.counters ?? [:]
        deltasAppliedBeforeCrashes += (counters["deltas_applied"] ?? 0) + (counters["deltas_published"] ?? 0)
        if powerLoss, cluster.configuration.fsync == .interval, node.isUp {
            intervalPowerLosses.append((node.id, cluster.now))
        }
        cluster.crash(target, tornBytes: tornBytes, powerLoss: powerLoss)
    }

    /// Restarts every crashed node and restores every link.
    func healAll(in cluster: SimulatedCluster) {
        cluster.network.healAll()
        cluster.network.defaultConditions = base
        for node in cluster.nodes {
            for peer in cluster.nodes { cluster.network.setConditions(nil, from: peer.id, to: node.id) }
            if !node.isUp { try? cluster.restart(node.index) }
        }
    }
}
