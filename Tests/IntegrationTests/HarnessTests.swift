import ChildProcesses
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `statesync harness` as CI runs it: a small cluster with kill and partition must pass, and the
/// same run with a planted bug must fail and name the node.
@Suite("Harness", .serialized)
struct HarnessTests {
    /// Runs `statesync harness ARGUMENTS --json` and returns the run and its JSON report.
    static func harness(_ arguments: [String]) async throws -> (
        run: (status: Int32, stdout: String, stderr: String), report: [String: Any]
    ) {
        let run = try await cli(["harness"] + arguments + ["--json"], timeout: .seconds(240))
        let report = try #require(
            jsonObject(Substring(run.stdout)),
            "exit status \(run.status) (a signal's number when killed by one)\nstdout: \(run.stdout)\nstderr: \(run.stderr)"
        )
        return (run, report)
    }

    /// A harness of three nodes and a million operations, its TMPDIR `temporary`, once its three
    /// nodes run (with --netns a node is `ip netns exec`'s child, which execs statesyncd in
    /// place): the harness and the nodes' pids. Nodes found before a failure are killed.
    static func harnessWithItsNodesRunning(
        seed: Int, under temporary: String, _ options: [String] = []
    ) async throws -> (ChildProcess, [pid_t]) {
        let harness = try ChildProcess(
            "statesync", ["harness", "--nodes", "3", "--ops", "1000000", "--seed", "\(seed)", "--json"] + options,
            environment: ["TMPDIR": temporary + "/"])
        var nodes: [pid_t] = []
        do {
            try await waitUntil("the harness to start its three nodes", timeout: .seconds(60)) {
                nodes = childProcesses(of: harness.pid, named: "statesyncd")
                return nodes.count == 3
            }
        } catch {
            for node in nodes where isAlive(node) { kill(node, SIGKILL) }
            throw error
        }
        return (harness, nodes)
    }

    /// A harness that dies, even by SIGKILL, leaves no node running: each node's standard input
    /// is a pipe the harness holds, and a node stops when it ends.
    @Test func theNodesOfAKilledHarnessStop() async throws {
        // The killed harness cannot remove its directory (its nodes' data and logs): it makes it
        // under a TMPDIR of this test's, which the test removes.
        let temporary = temporaryDirectory("killed-harness")
        defer { try? FileManager.default.removeItem(atPath: temporary) }
        let (harness, nodes) = try await Self.harnessWithItsNodesRunning(seed: 2, under: temporary)
        defer { for node in nodes where isAlive(node) { kill(node, SIGKILL) } }
        #expect(await harness.stop(SIGKILL) == SIGKILL)
        try await waitUntil("the orphaned nodes to stop", timeout: .seconds(30)) { !nodes.contains(where: isAlive) }
        // What the harness left is under the test's directory, and goes with it.
        let left = (try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? []
        #expect(left.contains { $0.hasPrefix("statesync-harness-2-") }, "\(left)")
    }

    /// SIGTERM (or Ctrl-C) ends a harness as the end of its run does: its nodes stopped, its
    /// work directory removed, and with --netns its namespaces and link (a trial's: all were
    /// left behind).
    @Test(arguments: canCreateNamespaces ? [false, true] : [false])
    func aHarnessStoppedBySIGTERMUndoesItsRun(netns: Bool) async throws {
        let temporary = temporaryDirectory("stopped-harness")
        defer { try? FileManager.default.removeItem(atPath: temporary) }
        let (harness, nodes) = try await Self.harnessWithItsNodesRunning(
            seed: 4, under: temporary, netns ? ["--netns"] : [])
        defer { for node in nodes where isAlive(node) { kill(node, SIGKILL) } }
        let tag = "ss\(String(harness.pid % 10000, radix: 36))-"
        #expect(await harness.stop(SIGTERM) == 128 + SIGTERM, "\(harness.stderr)")
        #expect(harness.stderr.contains("interrupted; its nodes are stopped and its work directory removed"))
        #expect(!nodes.contains(where: isAlive))
        let left = (try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? []
        #expect(!left.contains { $0.hasPrefix("statesync-harness-4-") }, "\(left)")
        if netns {
            let (_, namespaces) = try SpawnedProcess.run("/usr/sbin/ip", ["netns", "list"], environment: [:])
            #expect(!namespaces.contains(tag), "\(namespaces)")
            // What a failure left is removed here, not left to the machine.
            for line in namespaces.split(separator: "\n") where line.hasPrefix(tag) {
                let name = String(line.prefix { $0 != " " })
                _ = try? SpawnedProcess.run("/usr/sbin/ip", ["netns", "del", name], environment: [:])
            }
            _ = try? SpawnedProcess.run("/usr/sbin/ip", ["link", "del", tag.dropLast() + "h"], environment: [:])
        }
    }

    @Test func smallClusterWithKillAndPartitionPasses() async throws {
        let page = temporaryPath("harness-report") + ".html"
        defer { try? FileManager.default.removeItem(atPath: page) }
        let (run, report) = try await Self.harness(
            [
                "--nodes", "3", "--ops", "3000", "--seed", "1", "--faults",
                "kill,partition,pause,loss,clock", "--report", page,
            ])
        #expect(run.status == 0, "\(run.stdout)")
        #expect(report["converged"] as? Bool == true)
        #expect(report["lost_writes"] as? Int == 0)
        #expect(report["chain_violations"] as? Int == 0)
        #expect(report["ops"] as? Int == 3000)
        // The workload deletes and expires too, and the checks above held with them.
        #expect((report["deletions"] as? Int ?? 0) > 100 && (report["expiring_writes"] as? Int ?? 0) > 100, "\(report)")
        #expect((report["convergence_ms"] as? Int) != nil)
        let kinds = Set((report["faults"] as? [[String: Any]] ?? []).compactMap { $0["kind"] as? String })
        #expect(kinds.isSuperset(of: ["kill", "partition", "pause", "loss", "clock"]), "\(kinds)")
        #expect((report["notifications"] as? Int ?? 0) > 0)

        // --report: one self-contained page with the faults as bands, each node's lag, the
        // heal and convergence markers, and the verdict.
        let html = try String(contentsOfFile: page, encoding: .utf8)
        #expect(html.contains("class=\"verdict pass\">PASSED<"))
        #expect(html.components(separatedBy: "<svg ").count == 3, "two charts")
        for fault in report["faults"] as? [[String: Any]] ?? [] where fault["heal_ms"] is Int {
            let label = "\(fault["kind"] as? String ?? "?") \(fault["target"] as? String ?? "?")"
            #expect(html.contains(">\(label)</text>"), "the fault \(label) is a band")
        }
        #expect(html.contains(">healed</text>") && html.contains(">converged</text>"))
        for node in ["n1", "n2", "n3"] { #expect(html.contains(">\(node)</text>"), "\(node)'s lag line") }
        #expect(html.contains("<polyline"))
        #expect(!html.contains("http://") || !html.contains("<script"), "nothing fetched, no script")
        // And in a real browser: it renders, and a screenshot is kept.
        if let chromium = HTTPListenerTests.chromium {
            let artifacts = packageRoot.appendingPathComponent(".build/test-artifacts").path
            try FileManager.default.createDirectory(atPath: artifacts, withIntermediateDirectories: true)
            let dom = try ChildProcess(
                chromium, ["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", "file://\(page)"])
            #expect(await dom.wait(timeout: .seconds(60)) == 0)
            #expect(dom.stdout.contains("converged") && dom.stdout.contains("<polyline"), "\(dom.stderr)")
            let shot = try ChildProcess(
                chromium,
                [
                    "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1000,900",
                    "--screenshot=\(artifacts)/harness-report.png", "file://\(page)",
                ])
            #expect(await shot.wait(timeout: .seconds(60)) == 0)
            #expect(FileManager.default.fileExists(atPath: "\(artifacts)/harness-report.png"))
        }
        try? FileManager.default.removeItem(atPath: page)
    }

    /// Root, iproute2, and a kernel that lets this sandbox create a namespace (probed).
    static let canCreateNamespaces: Bool = {
        guard getuid() == 0,
            let ip = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip"].first(where: FileManager.default.isExecutableFile)
        else { return false }
        func run(_ arguments: [String]) -> Bool {
            (try? SpawnedProcess.run(ip, arguments, environment: ProcessInfo.processInfo.environment))?.status == 0
        }
        let probe = "ssprobe\(getpid())"
        defer { _ = run(["netns", "del", probe]) }
        return run(["netns", "add", probe])
    }()

    /// Every node a host of its own in a network namespace: partitions are blackhole routes,
    /// loss is a link going down. Needs root (CI runs as root).
    /// `--secure`: every node and client keyed; the faults still heal, and every node refuses a
    /// stranger's key and a client without CURVE.
    @Test func secureModePassesAndRefusesStrangers() async throws {
        let (run, report) = try await Self.harness(
            [
                "--secure", "--nodes", "3", "--ops", "1500", "--seed", "5", "--faults",
                "kill,partition,pause,loss,clock",
            ])
        #expect(run.status == 0, "\(run.stdout)")
        #expect(report["secure"] as? Bool == true && report["strangers_refused"] as? Bool == true)
        #expect(report["converged"] as? Bool == true && report["lost_writes"] as? Int == 0)
    }

    /// `--faults join,leave` (docs/PROTOCOL.md 7.5): a fourth node that only n1 is configured
    /// for joins mid-run and ends with everything; nodes stop cleanly and come back; keyed.
    @Test func membershipFaultsPassKeyed() async throws {
        let (run, report) = try await Self.harness(
            [
                "--secure", "--nodes", "4", "--ops", "1500", "--seed", "5", "--faults",
                "join,leave,kill,partition",
            ])
        #expect(run.status == 0, "\(run.stdout)")
        #expect(report["converged"] as? Bool == true && report["lost_writes"] as? Int == 0)
        let faults = report["faults"] as? [[String: Any]] ?? []
        #expect(
            faults.contains { $0["kind"] as? String == "join" && ($0["detail"] as? String ?? "").hasPrefix("started") })
        #expect(faults.contains { $0["kind"] as? String == "leave" })
    }

    @Test(.enabled(if: canCreateNamespaces, "needs root and iproute2"))
    func netnsModeWithRealLinkFaultsPasses() async throws {
        let (run, report) = try await Self.harness(
            [
                "--netns", "--nodes", "4", "--ops", "1500", "--seed", "3", "--faults",
                "kill,partition,loss,join,leave",
            ])
        #expect(run.status == 0, "\(run.stdout)")
        #expect(report["converged"] as? Bool == true && report["lost_writes"] as? Int == 0)
        let details = (report["faults"] as? [[String: Any]] ?? []).compactMap { $0["detail"] as? String }
        #expect(details.contains { $0.hasPrefix("blackhole routes") }, "\(details)")
        #expect(details.contains { $0.hasPrefix("link down") }, "\(details)")
    }

    /// `drop-deltas`: n3 diverges at once; `never-expire`: once the first value it holds expires.
    @Test(arguments: ["drop-deltas", "never-expire"])
    func aPlantedBugFailsTheVerdictAndNamesTheNode(bug: String) async throws {
        let (run, report) = try await Self.harness(
            ["--nodes", "3", "--ops", "1500", "--seed", "7", "--faults", "kill", "--plant-bug", bug])
        #expect(run.status == 1)
        #expect(report["converged"] as? Bool == false)
        #expect(report["diverged_nodes"] as? [String] == ["n3"])
        // A restart would undo the drop-deltas plant (its marks are in memory only): never n3.
        let restarted = (report["faults"] as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "kill" }
            .compactMap { $0["target"] as? String }
        #expect(!restarted.isEmpty)
        if bug == "drop-deltas" { #expect(!restarted.contains("n3"), "\(restarted)") }
        let kept = try #require(report["work_dir"] as? String)
        #expect(FileManager.default.fileExists(atPath: kept + "/n3.log"), "logs are kept on failure")
        try? FileManager.default.removeItem(atPath: kept)
    }
}
