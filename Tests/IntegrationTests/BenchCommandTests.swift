import Foundation
import StateSync
import Testing

/// `statesync bench --fanout` and `--models`: one writer node process and reader node
/// processes, for real.
@Suite("statesync bench --fanout and --models")
struct BenchCommandTests {
    @Test func everyReaderSeesEveryChangeOfTheWriter() async throws {
        let run = try await cli(["bench", "--fanout", "2", "--quick"], timeout: .seconds(120))
        try #require(run.status == 0, "\(run.stderr)")
        let line = try #require(run.stdout.split(separator: "\n").last.map(String.init))
        guard case .map(let figures) = try Value(json: line) else {
            Issue.record("not a JSON object: \(line)")
            return
        }
        #expect(figures["readers"] == .int(2))
        let written = try #require(figures["written"].flatMap { if case .int(let n) = $0 { n } else { nil } })
        #expect(written > 0)
        #expect(figures["every_reader_complete"] == .bool(true), "a reader's node missed changes: \(line)")
        let seen = try #require(figures["fewest_seen"].flatMap { if case .int(let n) = $0 { n } else { nil } })
        #expect(seen > 0 && seen <= written, "\(line)")
        for key in ["slowest_reader_deltas_per_s", "latency_p50_us_median_reader", "latency_p99_us_worst_reader"] {
            // A figure that rounds to a whole number reads back as an integer.
            switch figures[key] {
            case .double(let value)?: #expect(value > 0, "\(key)")
            case .int(let value)?: #expect(value > 0, "\(key)")
            default: Issue.record("\(key) missing: \(line)")
            }
        }
    }

    /// `--models`: one writer process writes 1,000 models round-robin; the reader's node ends
    /// holding every change (the `done` write included), and the rate is measured.
    @Test func manyModelsRoundRobinReachTheReaderWhole() async throws {
        let run = try await cli(["bench", "--models", "1000", "--quick"], timeout: .seconds(120))
        try #require(run.status == 0, "\(run.stderr)")
        let line = try #require(run.stdout.split(separator: "\n").last.map(String.init))
        guard case .map(let figures) = try Value(json: line) else {
            Issue.record("not a JSON object: \(line)")
            return
        }
        #expect(figures["models"] == .int(1000))
        #expect(figures["complete"] == .bool(true), "the reader's node did not end holding every change: \(line)")
        let written = try #require(figures["written"].flatMap { if case .int(let n) = $0 { n } else { nil } })
        #expect(written >= 1000, "fewer writes than models: \(line)")
        // Counted by the reader's node: at most every change and the `done` write (fewer when a
        // repaired delta lost to a later write of its model, or a snapshot brought latest values).
        let applied = try #require(figures["applied"].flatMap { if case .int(let n) = $0 { n } else { nil } })
        #expect(applied > 0 && applied <= written + 1, "\(line)")
        #expect(figures["snapshots_applied"].flatMap { if case .int(let n) = $0 { n >= 0 } else { nil } } == true)
        switch figures["deltas_per_s"] {
        case .double(let value)?: #expect(value > 0)
        case .int(let value)?: #expect(value > 0)
        default: Issue.record("deltas_per_s missing: \(line)")
        }
    }

    @Test func aBadReaderCountIsRefusedClearly() async throws {
        let run = try await cli(["bench", "--fanout", "2,zero"])
        #expect(run.status != 0)
        #expect(run.stderr.contains("--fanout takes reader counts of 1…32"), "\(run.stderr)")
    }
}
