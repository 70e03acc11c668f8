import Foundation
import StateSync
import Testing

/// `statesync bench --fanout` and `--models`: one writer node process and reader node
/// processes, for real; and `--path`, two nodes in one process.
@Suite("statesync bench --fanout, --models and --path")
struct BenchCommandTests {
    /// The last line the command printed, a JSON object (the command must have succeeded).
    static func lastObject(of run: (status: Int32, stdout: String, stderr: String)) throws -> (
        figures: [String: Value], line: String
    ) {
        try #require(run.status == 0, "\(run.stderr)")
        let line = try #require(run.stdout.split(separator: "\n").last.map(String.init))
        var figures: [String: Value]?
        if case .map(let map) = try Value(json: line) { figures = map }
        return (try #require(figures, "not a JSON object: \(line)"), line)
    }

    static func integer(_ value: Value?) -> Int64? {
        if case .int(let n)? = value { n } else { nil }
    }

    /// A figure as a number (one that rounds to a whole number reads back as an integer).
    static func number(_ value: Value?) -> Double? {
        switch value {
        case .double(let d)?: d
        case .int(let i)?: Double(i)
        default: nil
        }
    }

    @Test func everyReaderSeesEveryChangeOfTheWriter() async throws {
        // Under the whole suite's load the readers fall minutes behind (they wait while they
        // progress): the timeout leaves them that.
        let run = try await cli(["bench", "--fanout", "2", "--quick"], timeout: .seconds(600))
        let (figures, line) = try Self.lastObject(of: run)
        #expect(figures["readers"] == .int(2))
        let written = try #require(Self.integer(figures["written"]))
        #expect(written > 0)
        #expect(figures["every_reader_complete"] == .bool(true), "a reader's node missed changes: \(line)")
        let seen = try #require(Self.integer(figures["fewest_seen"]))
        #expect(seen > 0 && seen <= written, "\(line)")
        for key in ["slowest_reader_deltas_per_s", "latency_p50_us_median_reader", "latency_p99_us_worst_reader"] {
            let value = try #require(Self.number(figures[key]), "\(key) missing: \(line)")
            #expect(value > 0, "\(key)")
        }
    }

    /// `--models`: one writer process writes 1,000 models round-robin; the reader's node ends
    /// holding every change (the `done` write included), and the rate is measured.
    @Test func manyModelsRoundRobinReachTheReaderWhole() async throws {
        let run = try await cli(["bench", "--models", "1000", "--quick"], timeout: .seconds(120))
        let (figures, line) = try Self.lastObject(of: run)
        #expect(figures["models"] == .int(1000))
        #expect(figures["complete"] == .bool(true), "the reader's node did not end holding every change: \(line)")
        let written = try #require(Self.integer(figures["written"]))
        #expect(written >= 1000, "fewer writes than models: \(line)")
        // Counted by the reader's node: at most every change and the `done` write (fewer when a
        // repaired delta lost to a later write of its model, or a snapshot brought latest values).
        let applied = try #require(Self.integer(figures["applied"]))
        #expect(applied > 0 && applied <= written + 1, "\(line)")
        #expect(Self.integer(figures["snapshots_applied"]) != nil, "snapshots_applied missing: \(line)")
        let rate = try #require(Self.number(figures["deltas_per_s"]), "deltas_per_s missing: \(line)")
        #expect(rate > 0)
    }

    /// `--path`: two nodes in one process, every change counted at the far end (the command
    /// fails otherwise): single sets reach the reader's observer; a client's SETs are each
    /// answered OK and reach the watcher on the peer.
    @Test(arguments: ["single", "client"])
    func thePathBenchCountsEveryChange(mode: String) async throws {
        let run = try await cli(["bench", "--path", mode, "--changes", "5000"], timeout: .seconds(120))
        let (figures, line) = try Self.lastObject(of: run)
        #expect(figures["mode"] == .string(mode))
        #expect(Self.integer(figures["changes"]) == 5000, "\(line)")
        for key in ["writer_ns_per_change", "reader_ns_per_change", "total_ns_per_change"] {
            let value = try #require(Self.number(figures[key]), "\(key) missing: \(line)")
            #expect(value > 0, "\(key)")
        }
        // The writer's syncs (storage.fsync: always: one a turn) are counted apart, and are part
        // of its figure; the reader, which writes nothing of its own, syncs nothing.
        let writer = try #require(Self.number(figures["writer_ns_per_change"]))
        let synced = try #require(Self.number(figures["writer_sync_ns_per_change"]), "\(line)")
        let without = try #require(Self.number(figures["writer_ns_per_change_without_sync"]), "\(line)")
        #expect(synced > 0 && without > 0 && abs(without + synced - writer) < 1, "\(line)")
        // A node syncs for its own writes and the replies waiting on them (PROTOCOL.md 11.2).
        #expect(Self.number(figures["reader_sync_ns_per_change"]) == 0, "\(line)")
        #expect(Self.number(figures["reader_ns_per_change_without_sync"]) != nil, "\(line)")
    }

    @Test(arguments: [
        (["--path", "nope"], "--path takes single, tx or client"),
        (["--path", "single", "--changes", "0"], "--changes takes 1…100000000"),
        (["--changes", "5000"], "--changes goes with --path"),
    ])
    func aBadPathRunIsRefusedClearly(arguments: [String], message: String) async throws {
        let run = try await cli(["bench"] + arguments)
        #expect(run.status != 0)
        #expect(run.stderr.contains(message), "\(run.stderr)")
    }

    @Test func aBadReaderCountIsRefusedClearly() async throws {
        let run = try await cli(["bench", "--fanout", "2,zero"])
        #expect(run.status != 0)
        #expect(run.stderr.contains("--fanout takes reader counts of 1…32"), "\(run.stderr)")
    }
}
