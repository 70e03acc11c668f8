import Foundation
import Testing

/// `statesync simulate` as a user runs it: separate processes, so the digest's independence of
/// anything but the seed (hash seeds, addresses, time) is really tested.
@Suite("statesync simulate")
struct SimulateCommandTests {
    static let faults = ["--faults", "crash,partition,loss,dup,reorder,clock"]

    static func simulate(_ arguments: [String]) async throws -> (status: Int32, report: [String: Any]) {
        let run = try await cli(["simulate", "--json"] + arguments, timeout: .seconds(120))
        let report = try #require(jsonObject(Substring(run.stdout)), "stdout: \(run.stdout)\nstderr: \(run.stderr)")
        return (run.status, report)
    }

    @Test func theSameSeedGivesTheSameDigestInEveryProcess() async throws {
        let arguments = ["--nodes", "5", "--ops", "1000", "--seed", "42"] + Self.faults
        let first = try await Self.simulate(arguments)
        let second = try await Self.simulate(arguments)
        let other = try await Self.simulate(["--nodes", "5", "--ops", "1000", "--seed", "43"] + Self.faults)
        #expect(first.status == 0 && second.status == 0 && other.status == 0)
        for key in ["converged", "lost_writes", "chain_violations", "lww_violations", "diverged_nodes", "trace_digest"]
        {
            #expect(first.report[key] != nil, "the report has \(key)")
        }
        let digest = try #require(first.report["trace_digest"] as? String)
        #expect(second.report["trace_digest"] as? String == digest)
        #expect(other.report["trace_digest"] as? String != digest)
    }

    @Test(arguments: ["drop-deltas", "wrong-tie-break", "skip-repair", "duplicate-watch-events"])
    func aPlantedBugExitsNonZeroAndNamesTheCulprit(bug: String) async throws {
        let (status, report) = try await Self.simulate(
            ["--nodes", "4", "--ops", "1500", "--seed", "3", "--plant-bug", bug] + Self.faults)
        #expect(status == 1)
        #expect(report["passed"] as? Bool == false)
        let diverged = report["diverged_nodes"] as? [String] ?? []
        let details = report["details"] as? [String] ?? []
        #expect(
            diverged.contains("n4") || details.contains { $0.hasPrefix("n4's watcher") },
            "\(bug): \(diverged) \(details)")
        #expect((report["replay"] as? String)?.contains("--plant-bug \(bug)") == true)
    }

    /// The command runs "with faults" (its abstract): every kind unless `--faults` names some;
    /// `--faults none` runs without. The replay line names the faults either way, so it replays
    /// the same run whatever the default.
    @Test func everyFaultUnlessTold() async throws {
        let drawn = try await Self.simulate(["--nodes", "3", "--ops", "300", "--seed", "5"])
        #expect(drawn.status == 0)
        let kinds = Set((drawn.report["faults"] as? [[String: Any]] ?? []).compactMap { $0["kind"] as? String })
        #expect(kinds.count > 1, "faults injected by default: \(kinds)")
        #expect((drawn.report["replay"] as? String)?.contains("--faults crash,partition,") == true)
        let quiet = try await Self.simulate(["--nodes", "3", "--ops", "300", "--seed", "5", "--faults", "none"])
        #expect(quiet.status == 0)
        #expect((quiet.report["faults"] as? [Any])?.isEmpty == true)
        #expect((quiet.report["replay"] as? String)?.contains("--faults none") == true)
    }

    @Test func badArgumentsAreOneClearLine() async throws {
        let run = try await cli(["simulate", "--faults", "meteor"])
        #expect(run.status != 0)
        #expect(run.stderr.contains("unknown fault 'meteor'"), "\(run.stderr)")
        // A trial's: these ran, or said something that contradicted itself.
        for (arguments, expected) in [
            (["--faults", "all,crash"], "--faults all stands alone, not in a list of faults"),
            (
                ["--log-level", "chatty"],
                "--log-level takes trace, debug, info, notice, warning, error, critical, not 'chatty'"
            ),
            (["--seeds", "1..3", "--seed", "4"], "--seed draws one run and --seeds a sweep: give one"),
        ] {
            let bad = try await cli(["simulate"] + arguments)
            #expect(bad.status == 64, "\(arguments): \(bad.stderr)")
            #expect(bad.stderr.contains(expected), "\(arguments): \(bad.stderr)")
        }
    }
}
