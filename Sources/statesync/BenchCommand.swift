import ArgumentParser
import Foundation
import StateSync
import StateSyncBench

extension StateSyncCLI {
    struct Bench: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Measure the whole path against raw libzmq, in one run on this machine.",
            discussion: """
                Measures raw libzmq PUB→SUB with delta-sized messages (best of 3 runs) and its \
                one-way latency at 10,000 and 1,000 msg/s, each side on a libzmq context of its own as two \
                nodes are (the one-context latency is printed beside it, for reference), and fdatasync after a small append and after a small \
                write into preallocated space in the data directory, and what the disk alone gives a stream of durable writes \
                at 10,000 and 1,000 a second (group-committed, each write timed from its arrival); then two node processes on \
                loopback: deltas/s at the reader (single sets \
                and 8-property transactions, observers fired) with the CPU both processes spent per \
                change, and set → remote observer latency at \
                10,000 changes/s (storage.fsync always and interval) and at 1,000 changes/s (always: \
                a write that finds the disk idle), also with storage.publish: written (published \
                while its sync runs), each next to its limit (raw \
                one-way at the same rate, plus the disk's stream at that rate when durable); then a late joiner taking a snapshot \
                of 1,000,000 properties, and resident bytes per property held. Build with \
                -c release for real numbers.
                """)

        @Flag(help: "Print one JSON object.")
        var json = false

        @Flag(help: "A shorter run (under a minute): 1 s phases, 100,000 properties scaled to 1M.")
        var quick = false

        @Option(
            help: ArgumentHelp(
                "Also write the results as one self-contained HTML page (throughput and latency next to raw libzmq).",
                valueName: "FILE"))
        var report: String?

        @Option(
            help: ArgumentHelp(
                "Only measure a late join: a node holding N properties, a new node taking them by a streamed snapshot (both in this process).",
                valueName: "N"))
        var join: Int?

        @Flag(
            help:
                "With --join: two statesyncd processes (next to this statesync), and a client writing to the holder during the join."
        )
        var daemons = false

        @Option(
            help: ArgumentHelp(
                "Only measure fan-out: one writer node process and each listed number of reader node processes on loopback (single sets: deltas/s at the slowest reader; set → remote observer latency at 1,000 changes/s).",
                valueName: "N,N,..."))
        var fanout: String?

        @Option(
            help: ArgumentHelp(
                "Only measure many models: single sets to N distinct models written round-robin by one node process, changes/s until a reader node process holds every one.",
                valueName: "N"))
        var models: Int?

        @Option(
            help: ArgumentHelp(
                "Only measure the CPU one change costs along the delta path (single sets, 8-property tx, or a client's SETs on a node with a client API and a watch on its peer), in one thread: a writer and a reader node in this process, no sockets between them. Steadier than a rate: compare builds by it (the log syncs' CPU, which moves with the disk, is also given apart).",
                valueName: "single|tx|client"))
        var path: String?

        @Option(
            help: ArgumentHelp(
                "With --path: how many changes to measure, after a warm-up (about a tenth more; default 1,000,000, 200,000 with --quick).",
                valueName: "N"))
        var changes: Int?

        func run() async throws {
            if changes != nil, path == nil { throw ValidationError("--changes goes with --path") }
            if let path {
                guard let mode = PathBench.Mode(rawValue: path) else {
                    throw ValidationError("--path takes single, tx or client")
                }
                if let changes, changes < 1 || changes > 100_000_000 {
                    throw ValidationError("--changes takes 1…100000000")
                }
                let figures = try await PathBench.run(mode: mode, changes: changes ?? (quick ? 200_000 : 1_000_000))
                emit(figures.value.jsonText())
                return
            }
            if let models {
                // A live model costs the writer several KB (about 640 MB for 100,000 here).
                guard models >= 1, models <= 200_000 else { throw ValidationError("--models takes 1…200000") }
                let result = try await StateSyncBench.Bench.manyModels(
                    executable: currentExecutable(), models: models, seconds: quick ? 1 : 3)
                let value: Value = [
                    "models": .int(Int64(models)),
                    "deltas_per_s": .double(result.perSecond.isFinite ? result.perSecond.rounded() : 0),
                    "written": .int(Int64(result.written)), "applied": .int(Int64(result.applied)),
                    "snapshots_applied": .int(Int64(result.snapshotsApplied)),
                    "complete": .bool(result.complete),
                ]
                emit(value.jsonText())
                return
            }
            if let fanout {
                let counts = fanout.split(separator: ",").map { Int($0.trimmingCharacters(in: .whitespaces)) }
                guard !counts.isEmpty, counts.allSatisfy({ ($0 ?? 0) >= 1 && ($0 ?? 0) <= 32 }) else {
                    throw ValidationError("--fanout takes reader counts of 1…32, separated by commas: --fanout 2,4,8")
                }
                let executable = currentExecutable()
                for readers in counts.compactMap({ $0 }) {
                    let figures = try await StateSyncBench.Bench.fanOut(
                        executable: executable, readers: readers, seconds: quick ? 1 : 3)
                    let rounded = { (value: Double) in Value.double(value.isFinite ? (value * 10).rounded() / 10 : 0) }
                    let value: Value = [
                        "readers": .int(Int64(readers)),
                        "slowest_reader_deltas_per_s": rounded(figures.slowestPerSecond),
                        "fastest_reader_deltas_per_s": rounded(figures.fastestPerSecond),
                        "written": .int(Int64(figures.written)), "fewest_seen": .int(Int64(figures.fewestSeen)),
                        "every_reader_complete": .bool(figures.everyReaderComplete),
                        "latency_p50_us_median_reader": rounded(figures.latencyP50),
                        "latency_p99_us_worst_reader": rounded(figures.latencyP99),
                    ]
                    emit(value.jsonText())
                }
                return
            }
            if let join, daemons {
                guard join >= 1000 else { throw ValidationError("--join needs at least 1000 properties") }
                let daemon = siblingDaemon()
                let interactive = isatty(STDERR_FILENO) == 1
                let figures = try await StateSyncBench.DaemonJoin.run(properties: join, daemonPath: daemon) { phase in
                    if interactive { FileHandle.standardError.write(Data("\r\u{1B}[Kbench: \(phase)…".utf8)) }
                }
                if interactive { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
                let mib = { (bytes: Int) in (Double(bytes) / 1_048_576 * 10).rounded() / 10 }
                let value: Value = [
                    "properties": .int(Int64(join)), "fill_s": .double((figures.fillSeconds * 10).rounded() / 10),
                    "snapshot_s": .double((figures.snapshotSeconds * 100).rounded() / 100),
                    "converged_s": .double((figures.convergedSeconds * 100).rounded() / 100),
                    "joiner_slowest_answer_ms": .double((figures.slowestAnswerSeconds * 10_000).rounded() / 10),
                    "joiner_answers": .int(Int64(figures.answers)),
                    "pages": .int(Int64(figures.pages)), "writes_during_join": .int(Int64(figures.writesDuringJoin)),
                    "holder_peak_rss_mib": .double(mib(figures.holderPeakBytes)),
                    "joiner_peak_rss_mib": .double(mib(figures.joinerPeakBytes)),
                ]
                emit(value.jsonText())
                return
            }
            if daemons { throw ValidationError("--daemons goes with --join N") }
            if let join {
                guard join >= 1000 else { throw ValidationError("--join needs at least 1000 properties") }
                let figures = try await StateSyncBench.Bench.join(properties: join)
                let mib = { (bytes: Int) in (Double(bytes) / 1_048_576 * 10).rounded() / 10 }
                let value: Value = [
                    "properties": .int(Int64(join)), "seconds": .double((figures.seconds * 100).rounded() / 100),
                    "pages": .int(Int64(figures.pages)), "rss_before_mib": .double(mib(figures.residentBefore)),
                    "rss_holder_mib": .double(mib(figures.residentHeld)),
                    "rss_both_mib": .double(mib(figures.residentJoined)),
                    "rss_peak_mib": .double(mib(figures.residentPeak)),
                ]
                emit(value.jsonText())
                return
            }
            let executable = currentExecutable()
            let interactive = isatty(STDERR_FILENO) == 1
            let result = try await StateSyncBench.Bench.run(.init(executable: executable, quick: quick)) { phase in
                if interactive { FileHandle.standardError.write(Data("\r\u{1B}[Kbench: \(phase)…".utf8)) }
            }
            if interactive { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
            emit(json ? result.value.jsonText() : result.humanText)
            if let report { try writeReport(result.html, to: report) }
        }
    }

    /// One node process of the benchmark (started by `statesync bench`).
    struct BenchNode: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "bench-node", shouldDisplay: false)

        @Option var role: String
        @Option var mode: String
        @Option var id: String
        @Option var publish: String
        @Option var peer: [String]
        @Option var data: String
        @Option var seconds: Double
        @Option var rate: Int
        @Option var keys: String?
        @Option var fsync: String = "always"
        @Option var publishWhen: String = "synced"
        @Option var models: Int = 100_000

        func run() async throws {
            guard let mode = NodeBenchRole.Mode(rawValue: mode) else { throw ValidationError("unknown mode \(mode)") }
            guard let policy = NodeConfiguration.FsyncPolicy(rawValue: fsync) else {
                throw ValidationError("unknown fsync policy \(fsync)")
            }
            var options = NodeBenchRole.Options(
                reader: role == "reader", mode: mode, id: id, publish: publish, peers: peer, dataDirectory: data,
                seconds: seconds, rate: rate)
            options.keyDirectory = keys
            guard ["synced", "written"].contains(publishWhen) else {
                throw ValidationError("--publish-when takes synced or written")
            }
            options.fsync = policy
            options.publishBeforeSync = publishWhen == "written"
            options.models = models
            try await NodeBenchRole.run(options)
        }
    }
}
