import ArgumentParser
import Foundation
import Logging
import StateSync
import StateSyncHarness
import StateSyncTesting

extension StateSyncCLI {
    struct Simulate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Run a whole cluster in one process from one seed, with faults, and check it converges.",
            discussion: """
                Runs N real node machines (the same code as statesyncd) on a simulated network, \
                simulated disks and one simulated clock, all driven by --seed: writers set random \
                properties (single sets, multi-property writes, and concurrent writes of one \
                property on two nodes) on random nodes, a watcher on every node records every \
                change, and faults follow a schedule drawn from the seed. Each seed also draws the \
                cluster's parameters (history size, compaction, batching, fsync policy, link delays, \
                fault rates, which nodes take channel batches, how long a disk sync takes): different \
                seeds stress different mixes.

                Faults: crash (a node crashes — what it had not synced is lost, a torn write is \
                possible — and restarts on its disk), partition (links between two groups cut both \
                ways), loss, dup, reorder (on peer links), clock (a node's wall clock jumps), \
                broken-link (a link breaks for good until replaced), phantom (forged sequence \
                numbers), forge (a delta in another node's name), join (the last node starts late, \
                knowing only the first, and must join through membership), leave (a node stops cleanly \
                and comes back later), forget (a node is cut off, and sometimes stopped, and an \
                operator forgets it; back, it drops its state and takes the others': the writes it \
                took that no other node held are counted as may_be_lost_to_forget). --faults picks \
                them: all of them by default, none with --faults none.

                Then everything heals and the harness's verdict is given: equal state everywhere, \
                last-writer-wins winners, no acknowledged write lost (with storage.fsync: interval, \
                but for what a node acknowledged within one sync interval before a power loss, which \
                that policy may lose: counted as may_be_lost_to_power_loss), unbroken old/new chains, each \
                watcher's copy equal to the nodes', no delta sent twice on one watch, every write \
                answered in the form its writer asked for (PROTOCOL.md 10.1.1), every node forgotten \
                while cut off dropped its state when it came back (PROTOCOL.md 7.5). It prints a \
                digest of the whole trace: the same seed (and build) gives the same digest. Exits 0 \
                only when every check passes; a failure prints the command that replays it.

                --plant-bug plants a bug in the last node to prove the verdict catches it: \
                drop-deltas, wrong-tie-break, skip-repair, skip-settling, skip-void, forget-held-above-gaps, \
                duplicate-watch-events, ignore-deletions, never-expire, collect-early, ignore-request-flags, \
                skip-reset.
                """)

        @Option(help: "How many nodes (2–256).")
        var nodes = 5

        @Option(help: "How many write operations.")
        var ops = 10_000

        @Option(help: "The seed of the whole run (default 1).")
        var seed: UInt64?

        @Option(help: ArgumentHelp("Sweep seeds A..B (inclusive); report the first failure.", valueName: "A..B"))
        var seeds: String?

        @Option(
            help: ArgumentHelp(
                "Faults, comma-separated: crash,partition,loss,dup,reorder,clock,broken-link,phantom,forge,join,leave,forget; all (the default), or none.",
                valueName: "LIST"))
        var faults: String = "all"

        /// The faults `--faults` names (`all`: every one, `none`: none).
        var faultList: [SimulationOptions.Fault] {
            switch faults {
            case "all": SimulationOptions.Fault.allCases
            case "none": []
            default: faults.split(separator: ",").compactMap { SimulationOptions.Fault(rawValue: String($0)) }
            }
        }

        @Option(help: ArgumentHelp("Concurrent writers.", valueName: "N"))
        var writers = 4

        @Option(
            help: ArgumentHelp(
                "Which nodes take channel and packed batches (PROTOCOL.md 7.6, 7.7): all, mixed (nodes of three versions: n2, n4, n6, … older than both, n3, n7, n11, … older than packed batches alone, the others the newest), rolling (mixed, and a restarted node comes back as another version) or none; drawn by the seed by default.",
                valueName: "MIX"))
        var channelBatches: String?

        @Option(
            help: ArgumentHelp(
                "Every node with storage.fsync: interval at this period in ms (drawn by the seed by default).",
                valueName: "MS"))
        var intervalSyncMs: Int?

        @Option(
            help: ArgumentHelp(
                "Every node with storage.fsync: always, publishing its writes synced (after their sync) or written (while it runs: storage.publish: written); drawn by the seed by default.",
                valueName: "WHEN"))
        var publish: String?

        @Option(
            help: ArgumentHelp(
                "How long a sync of a node's log takes, in simulated ms (0: at once; drawn by the seed by default).",
                valueName: "MS"))
        var diskSyncMs: Int?

        @Option(
            help: ArgumentHelp(
                "Plant a bug in the last node: drop-deltas, wrong-tie-break, skip-repair, skip-settling, skip-void, forget-held-above-gaps, duplicate-watch-events, ignore-deletions, never-expire, collect-early, ignore-request-flags, skip-reset.",
                valueName: "BUG"))
        var plantBug: String?

        @Flag(help: "Print the report as one JSON object (a sweep: one per line, then a summary).")
        var json = false

        @Option(
            help: ArgumentHelp("Print the nodes' logs at this level to stderr (trace … critical).", valueName: "LEVEL"))
        var logLevel: String?

        @Option(
            help: ArgumentHelp(
                "Also write the run as one self-contained HTML page (writes, faults, each node's lag, convergence, verdict). One seed only.",
                valueName: "FILE"))
        var report: String?

        func validate() throws {
            if report != nil, seeds != nil { throw ValidationError("--report draws one run: use --seed, not --seeds") }
            if seed != nil, seeds != nil { throw ValidationError("--seed draws one run and --seeds a sweep: give one") }
            if let logLevel, Logger.Level(rawValue: logLevel) == nil {
                throw ValidationError(
                    "--log-level takes \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", ")), not '\(logLevel)'"
                )
            }
            if faults != "all", faults != "none" {
                for name in faults.split(separator: ",", omittingEmptySubsequences: false)
                where SimulationOptions.Fault(rawValue: String(name)) == nil {
                    if name == "all" || name == "none" {
                        throw ValidationError("--faults \(name) stands alone, not in a list of faults")
                    }
                    throw ValidationError(
                        "unknown fault '\(name)'; use \(SimulationOptions.Fault.allCases.map(\.rawValue).joined(separator: ", ")), or all, or none"
                    )
                }
            }
            if let plantBug, SimulationOptions.PlantedBug(rawValue: plantBug) == nil {
                throw ValidationError(
                    "unknown bug '\(plantBug)'; plant one of: \(SimulationOptions.PlantedBug.allCases.map(\.rawValue).joined(separator: ", "))"
                )
            }
            guard (2...256).contains(nodes) else { throw ValidationError("--nodes must be between 2 and 256") }
            guard ops > 0 else { throw ValidationError("--ops must be positive") }
            guard (1...64).contains(writers) else { throw ValidationError("--writers must be between 1 and 64") }
            if let channelBatches, SimulationOptions.ChannelBatches(rawValue: channelBatches) == nil {
                throw ValidationError("--channel-batches takes all, mixed, rolling or none")
            }
            if let intervalSyncMs, !(1...10_000).contains(intervalSyncMs) {
                throw ValidationError("--interval-sync-ms must be between 1 and 10000")
            }
            if let publish, !["synced", "written"].contains(publish) {
                throw ValidationError("--publish takes synced or written")
            }
            if publish != nil, let plantBug,
                SimulationOptions.PlantedBug(rawValue: plantBug)?.runsWithIntervalSync == true
            {
                throw ValidationError("--plant-bug \(plantBug) runs with storage.fsync: interval; leave out --publish")
            }
            if publish != nil, intervalSyncMs != nil {
                throw ValidationError(
                    "--publish sets storage.fsync: always; --interval-sync-ms sets interval: give one")
            }
            if let diskSyncMs, !(0...1000).contains(diskSyncMs) {
                throw ValidationError("--disk-sync-ms must be between 0 and 1000")
            }
            if let seeds, Self.range(seeds) == nil {
                throw ValidationError("--seeds takes A..B with A ≤ B, e.g. --seeds 1..200")
            }
        }

        static func range(_ text: String) -> ClosedRange<UInt64>? {
            let parts = text.components(separatedBy: "..")
            guard parts.count == 2, let low = UInt64(parts[0]), let high = UInt64(parts[1]), low <= high else {
                return nil
            }
            return low...high
        }

        func options(seed: UInt64) -> SimulationOptions {
            var options = SimulationOptions()
            options.nodes = nodes
            options.operations = ops
            options.seed = seed
            options.faults = faultList
            options.plantedBug = plantBug.flatMap(SimulationOptions.PlantedBug.init)
            options.writers = writers
            options.channelBatches = channelBatches.flatMap(SimulationOptions.ChannelBatches.init)
            options.intervalSyncMilliseconds = intervalSyncMs
            options.publishBeforeSync = publish.map { $0 == "written" }
            options.diskSyncMilliseconds = diskSyncMs
            options.recordTimeline = report != nil
            if let logLevel, let level = Logger.Level(rawValue: logLevel) {
                options.logger = Logger(label: "sim") { label in
                    var handler = StreamLogHandler.standardError(label: label)
                    handler.logLevel = level
                    return handler
                }
            }
            return options
        }

        func run() throws {
            guard let seeds, let range = Self.range(seeds) else {
                let result = try simulate(seed: seed ?? 1)
                emit(json ? result.value.jsonText() : result.humanText)
                if let report { try writeReport(result.html, to: report) }
                if !result.passed { throw ExitCode(1) }
                return
            }
            var passed = 0
            var cpu = 0.0
            for seed in range {
                let report = try simulate(seed: seed)
                cpu += report.cpuSeconds
                if json { emit(report.value.jsonText()) }
                guard report.passed else {
                    if !json { emit(report.humanText) }
                    emit(
                        "seed \(seed) FAILED after \(passed) passing seeds; replay: \(report.options.replayCommand)")
                    throw ExitCode(1)
                }
                passed += 1
                if !json {
                    FileHandle.standardError.write(
                        Data(
                            "seed \(seed): passed (\(report.simulatedMilliseconds) simulated ms, \(String(format: "%.2f", report.cpuSeconds)) s CPU, digest \(String(report.traceDigest, radix: 16)))\n"
                                .utf8))
                }
            }
            emit(
                "\(passed) seeds passed (\(range.lowerBound)...\(range.upperBound)) in \(String(format: "%.1f", cpu)) s of CPU"
            )
        }

        func simulate(seed: UInt64) throws -> SimulationReport {
            do {
                return try ClusterSimulator.run(options(seed: seed))
            } catch {
                FileHandle.standardError.write(Data("statesync: simulate: \(error)\n".utf8))
                throw ExitCode(2)
            }
        }
    }
}
