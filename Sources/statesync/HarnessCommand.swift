import ArgumentParser
import Foundation
import StateSync
import StateSyncHarness

extension StateSyncCLI {
    struct Harness: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Run a local multi-node convergence test with real daemons and real faults.",
            discussion: """
                Starts N statesyncd processes on loopback (temporary data directories, free ports), \
                runs concurrent writers (sets, some with a time to live, and deletions of properties \
                and models) and a watcher on every node, injects faults on a schedule drawn from \
                --seed, heals, waits for quiet and for every value written with a time to live to \
                expire, and checks: equal state on every node, \
                last-writer-wins winners, no acknowledged write lost, unbroken old/new chains. \
                Exits 0 only when every check passes; on failure the nodes' logs and data are kept \
                and their directory printed.

                Faults: kill (kill -9 and restart), pause (SIGSTOP/SIGCONT), partition (every link \
                between two groups cut both ways), loss, clock (one node runs with a skewed wall \
                clock, through the test-only STATESYNC_TEST_CLOCK_OFFSET_MS), join (the last node \
                starts late knowing only n1, and no node knows it: it joins through membership; \
                later joins stop and restart it), leave (SIGTERM a node: it leaves, then it is \
                started again). On loopback the links \
                run through the harness's TCP relays: a partition closes and refuses connections, \
                loss is added delay plus connection resets. With --netns (root) every node is a \
                host in its own network namespace on a private bridge (10.231.x.0/24): a partition \
                is blackhole routes both ways, loss is the node's link going down in bursts.
                """)

        @Option(help: "How many nodes (2–32).")
        var nodes = 3

        @Option(help: "How many write operations (sets and multi-property sets).")
        var ops = 2000

        @Option(help: "The seed of the workload and the fault schedule.")
        var seed: UInt64 = 1

        @Option(
            help: ArgumentHelp(
                "Faults to inject, comma-separated: kill,pause,partition,loss,clock,join,leave.", valueName: "LIST")
        )
        var faults: String = ""

        @Option(help: ArgumentHelp("Concurrent writer clients.", valueName: "N"))
        var clients = 4

        @Option(
            help: ArgumentHelp("Plant a bug to prove the checker fails: drop-deltas, never-expire.", valueName: "BUG"))
        var plantBug: String?

        @Flag(help: "Run every node in its own network namespace with its own address (root only).")
        var netns = false

        @Flag(help: "Key every node and client: CurveZMQ on every socket, only the run's keys admitted.")
        var secure = false

        @Flag(help: "Print the report as one JSON object.")
        var json = false

        @Flag(help: "Keep the nodes' logs and data even when every check passes.")
        var keep = false

        @Option(
            help: ArgumentHelp(
                "Also write the run as one self-contained HTML page: writes and acknowledgements over time, the faults as bands, each node's lag, the convergence and the verdict.",
                valueName: "FILE"))
        var report: String?

        @Option(help: ArgumentHelp("The statesyncd executable (default: next to this statesync).", valueName: "PATH"))
        var statesyncd: String?

        func validate() throws {
            for name in faults.split(separator: ",") where HarnessOptions.Fault(rawValue: String(name)) == nil {
                throw ValidationError(
                    "unknown fault '\(name)'; use \(HarnessOptions.Fault.allCases.map(\.rawValue).joined(separator: ", "))"
                )
            }
            if let plantBug, HarnessOptions.PlantedBug(rawValue: plantBug) == nil {
                throw ValidationError(
                    "unknown bug '\(plantBug)'; the harness can plant: \(HarnessOptions.PlantedBug.allCases.map(\.rawValue).joined(separator: ", "))"
                )
            }
            guard (2...32).contains(nodes) else { throw ValidationError("--nodes must be between 2 and 32") }
            guard ops > 0 else { throw ValidationError("--ops must be positive") }
            guard (1...64).contains(clients) else { throw ValidationError("--clients must be between 1 and 64") }
        }

        func run() async throws {
            var options = HarnessOptions(daemonPath: statesyncd ?? siblingDaemon())
            options.nodes = nodes
            options.operations = ops
            options.seed = seed
            options.faults = faults.split(separator: ",").compactMap { HarnessOptions.Fault(rawValue: String($0)) }
            options.plantedBug = plantBug.flatMap(HarnessOptions.PlantedBug.init)
            options.clients = clients
            options.keep = keep
            options.netns = netns
            options.secure = secure
            // SIGINT or SIGTERM: the run's nodes, relays, namespaces and (without --keep) work
            // directory are undone before the process ends, as at the end of a run.
            var signals: [any DispatchSourceSignal] = []
            for number in [SIGINT, SIGTERM] {
                signal(number, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
                let kept = options.keep
                source.setEventHandler {
                    HarnessInterruption.undoRunsInProgress()
                    FileHandle.standardError.write(
                        Data(
                            "statesync harness: interrupted; its nodes are stopped and its work directory \(kept ? "kept" : "removed")\n"
                                .utf8))
                    _exit(128 + number)
                }
                source.resume()
                signals.append(source)
            }
            defer { for source in signals { source.cancel() } }
            let interactive = isatty(STDERR_FILENO) == 1
            let result: HarnessReport
            do {
                result = try await StateSyncHarness.Harness.run(options) { progress in
                    guard interactive else { return }
                    let width = 30
                    let filled = min(width, width * progress.operations / max(progress.total, 1))
                    let bar = String(repeating: "=", count: filled) + String(repeating: " ", count: width - filled)
                    let line =
                        "\r[\(bar)] \(min(progress.operations, progress.total))/\(progress.total) ops  faults: \(progress.faults)  now: \(progress.active)\u{1B}[K"
                    FileHandle.standardError.write(Data(line.utf8))
                }
            } catch {
                FileHandle.standardError.write(Data("\nstatesync: harness: \(error)\n".utf8))
                throw ExitCode(2)
            }
            if interactive { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
            emit(json ? result.value.jsonText() : result.humanText)
            if let report { try writeReport(result.html, to: report) }
            if !result.passed { throw ExitCode(1) }
        }
    }
}
