import ChildProcesses
import Foundation
import Testing

/// What an operator runs around the daemon: `statesyncd --check-config` and the systemd unit in
/// `Config/`.
@Suite("Running statesyncd as a service")
struct DaemonOperationsTests {
    @Test func checkConfigSaysOkOrGivesTheOneLineErrorAndExit2() async throws {
        let good = try ChildProcess("statesyncd", ["--check-config", "Config/node1.yaml"])
        #expect(await good.wait() == 0)
        #expect(good.stdout.contains("Config/node1.yaml: ok — node node1"), "\(good.stdout)")
        #expect(good.stdout.contains("storage always (publish synced)"), "\(good.stdout)")

        let directory = temporaryDirectory("check-config")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = "\(directory)/bad.yaml"
        try String(contentsOfFile: "Config/node1.yaml", encoding: .utf8)
            .replacingOccurrences(of: "heartbeat_ms: 500", with: "heartbeat_ms: 5")
            .write(toFile: path, atomically: true, encoding: .utf8)
        let bad = try ChildProcess("statesyncd", ["--check-config", path])
        #expect(await bad.wait() == 2)
        let lines = bad.stderr.split(separator: "\n")
        #expect(lines.count == 1 && lines[0].contains("bad.yaml: network.heartbeat_ms"), "\(bad.stderr)")
        // Keys are checked too: the secured example names key files that do not exist here.
        let keys = try ChildProcess("statesyncd", ["--check-config", "Config/node1-secure.yaml"])
        #expect(await keys.wait() == 2)
        #expect(keys.stderr.contains("security.secret_key"), "\(keys.stderr)")
    }

    /// `statesyncd` on `Config/node1.yaml`, its data in `data`, on free loopback ports, with
    /// `environment` on top.
    static func node1(data: String, _ environment: [String: String]) throws -> ChildProcess {
        try ChildProcess(
            "statesyncd", ["--config", "Config/node1.yaml"],
            environment: [
                "STATESYNC_NODE_DATA_DIR": data, "STATESYNC_NETWORK_PUBLISH": "tcp://127.0.0.1:\(freePort())",
                "STATESYNC_NETWORK_API": "tcp://127.0.0.1:\(freePort())",
            ].merging(environment) { _, given in given })
    }

    /// An HTTP port in use is said before the node starts: exit 1, one line naming
    /// `http.listen` and the address, the data directory not touched. Before, the node started,
    /// stopped again, and the HTTP server's error named neither.
    @Test func anHTTPPortInUseIsSaidBeforeTheNodeStarts() async throws {
        let holder = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #expect(holder >= 0)
        defer { close(holder) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(holder, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        #expect(bound == 0 && listen(holder, 1) == 0)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(holder, $0, &length) }
        }
        let port = Int(UInt16(bigEndian: address.sin_port))
        let directory = temporaryPath("http-in-use")
        let daemon = try Self.node1(
            data: directory, ["STATESYNC_HTTP_LISTEN": "127.0.0.1:\(port)", "STATESYNC_NETWORK_PEERS": ""])
        #expect(await daemon.wait(timeout: .seconds(20)) == 1)
        #expect(
            daemon.stderr.contains("node node1: cannot bind http.listen 127.0.0.1:\(port): Address already in use"),
            "\(daemon.stderr)")
        #expect(!FileManager.default.fileExists(atPath: directory), "the node never started")
    }

    /// A data directory the daemon's user may not write is a configuration it must not run with:
    /// `--check-config` says so, and the daemon exits 2 (no restart loop under the unit's
    /// `RestartPreventExitStatus=2`) with one line naming the directory and the user. Before,
    /// `--check-config` said ok and the daemon exited 1 with "You don't have permission." (an
    /// operator trial). Run as `nobody` (the tests run as root, which may write anything).
    @Test(.enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv")))
    func aDataDirectoryItsUserMayNotWriteIsExit2() async throws {
        let directory = temporaryDirectory("unwritable")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        chmod(directory, 0o755)
        let config = "\(directory)/node.yaml"
        try """
        node:
          id: nobodys
          data_dir: \(directory)/data
        network:
          publish: tcp://127.0.0.1:\(freePort())
          api: tcp://127.0.0.1:\(freePort())
        """.write(toFile: config, atomically: true, encoding: .utf8)
        chmod(config, 0o644)
        let asNobody = [
            "--reuid=65534", "--regid=65534", "--clear-groups", binaries.appendingPathComponent("statesyncd").path,
        ]
        for arguments in [["--check-config", config], ["--config", config]] {
            let run = try ChildProcess("/usr/bin/setpriv", asNobody + arguments)
            #expect(await run.wait() == 2, "\(arguments): \(run.stderr)")
            #expect(
                run.stderr.contains(
                    "node.data_dir \(directory)/data: its parent \(directory) is not writable by this user (uid 65534)"),
                "\(run.stderr)")
        }
        #expect(!FileManager.default.fileExists(atPath: "\(directory)/data"))
    }

    /// A configured peer whose host name does not resolve is said at start (libzmq dials it
    /// silently, and `status` shows only a peer never seen); the node runs on and dials it.
    @Test func aPeerHostThatDoesNotResolveIsSaid() async throws {
        let directory = temporaryPath("unresolved-peer")
        let daemon = try Self.node1(data: directory, ["STATESYNC_NETWORK_PEERS": "tcp://no-such-host.invalid:7002"])
        try await waitUntil("the warning is logged") {
            daemon.stderr.contains("a configured peer's host name does not resolve")
        }
        #expect(daemon.stderr.contains("tcp://no-such-host.invalid:7002"), "\(daemon.stderr)")
        #expect(daemon.isRunning)
        #expect(await daemon.stop() == 0)
        try? FileManager.default.removeItem(atPath: directory)
    }

    static let systemdAnalyze = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].first(
        where: FileManager.default.isExecutableFile)

    @Test(.enabled(if: systemdAnalyze != nil, "needs systemd-analyze"))
    func theUnitFilePassesSystemdAnalyzeVerify() throws {
        let directory = temporaryDirectory("unit")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // The unit names /usr/local/bin/statesyncd; verify checks it exists, so point it at the build.
        let unit = try String(contentsOfFile: "Config/statesyncd.service", encoding: .utf8)
            .replacingOccurrences(
                of: "/usr/local/bin/statesyncd", with: binaries.appendingPathComponent("statesyncd").path)
        try unit.write(toFile: "\(directory)/statesyncd.service", atomically: true, encoding: .utf8)
        let (status, output) = try SpawnedProcess.run(
            Self.systemdAnalyze!, ["verify", "\(directory)/statesyncd.service"],
            environment: ProcessInfo.processInfo.environment)
        #expect(status == 0, "\(output)")
        #expect(output.isEmpty, "systemd-analyze verify warned: \(output)")
    }

    /// `--stop-when-stdin-closes`: when the supervisor's end of the pipe on the daemon's
    /// standard input closes (the supervisor died, however), the node stops cleanly, as on
    /// SIGTERM: exit 0, its snapshot written. What the supervisor writes is ignored.
    @Test func aDaemonStopsCleanlyWhenItsStandardInputEnds() async throws {
        let directory = temporaryDirectory("stdin-stop")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let api = "tcp://127.0.0.1:\(freePort())"
        let environment = [
            "STATESYNC_NODE_DATA_DIR": "\(directory)/data",
            "STATESYNC_NETWORK_PUBLISH": "tcp://127.0.0.1:\(freePort())",
            "STATESYNC_NETWORK_API": api, "STATESYNC_NETWORK_PEERS": "",
        ]
        let supervisor = try closeOnExecPipe()
        let daemon = try ChildProcess(
            "statesyncd", ["--stop-when-stdin-closes"], environment: environment, standardInput: supervisor.read)
        try supervisor.read.close()
        try await waitUntil("the daemon logs that it started") { daemon.stderr.contains("node started") }
        #expect(daemon.isRunning)
        // Its I/O thread is named for `top -H`, `perf` and core dumps.
        let threads = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(daemon.pid)/task")) ?? []
        let names = threads.map {
            (try? String(contentsOfFile: "/proc/\(daemon.pid)/task/\($0)/comm", encoding: .utf8)) ?? ""
        }
        #expect(names.contains("statesync-io\n"), "\(names)")
        // (A daemon gone by now must fail this test, not kill the runner with SIGPIPE.)
        try writeWithoutSIGPIPE(Array("anything\n".utf8), to: supervisor.write)
        // A request round trip later it still answers: a line on standard input does not stop it.
        #expect(try await cli(["status", "--daemon", api]).status == 0)
        #expect(daemon.isRunning)
        try supervisor.write.close()
        #expect(await daemon.wait() == 0, "\(daemon.stderr)")
        #expect(daemon.stderr.contains("standard input reached its end"), "\(daemon.stderr)")
        #expect(daemon.stderr.contains("node stopped; snapshot written"), "\(daemon.stderr)")
    }

    /// A daemon a test starts stops when the test runner is gone (the runner's end of the pipe
    /// on its standard input closes, as the kernel closes it when the runner dies), so a crashed
    /// run leaves no daemon behind.
    @Test func aTestsDaemonStopsWhenTheRunnerIsGone() async throws {
        let directory = temporaryDirectory("runner-gone")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let daemon = try ChildProcess(
            "statesyncd", [],
            environment: [
                "STATESYNC_NODE_DATA_DIR": "\(directory)/data",
                "STATESYNC_NETWORK_PUBLISH": "tcp://127.0.0.1:\(freePort())",
                "STATESYNC_NETWORK_API": "tcp://127.0.0.1:\(freePort())", "STATESYNC_NETWORK_PEERS": "",
            ])
        try await waitUntil("the daemon logs that it started") { daemon.stderr.contains("node started") }
        #expect(daemon.isRunning)
        try daemon.dropLifeline()
        #expect(await daemon.wait() == 0, "\(daemon.stderr)")
        #expect(daemon.stderr.contains("standard input reached its end"), "\(daemon.stderr)")
    }

    /// A daemon whose standard output and error are a pipe nobody reads any more (a log shipper
    /// that restarted, a supervisor that died) keeps running: its log lines fail to write, it
    /// is not killed by SIGPIPE at the first one. In both log formats.
    @Test(arguments: ["text", "json"])
    func aDaemonWhoseLogReaderIsGoneKeepsRunning(format: String) async throws {
        let directory = temporaryDirectory("log-reader-gone")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let api = "tcp://127.0.0.1:\(freePort())"
        let environment = [
            "STATESYNC_NODE_DATA_DIR": "\(directory)/data", "STATESYNC_LOG_FORMAT": format,
            "STATESYNC_NETWORK_PUBLISH": "tcp://127.0.0.1:\(freePort())",
            "STATESYNC_NETWORK_API": api, "STATESYNC_NETWORK_PEERS": "",
        ]
        let output = try closeOnExecPipe()
        try output.read.close()  // gone before the daemon writes its first line
        let daemon = try SpawnedProcess(
            executable: binaries.appendingPathComponent("statesyncd").path, arguments: [],
            environment: ProcessInfo.processInfo.environment.merging(environment) { $1 },
            currentDirectory: packageRoot.path, standardInput: .null,
            standardOutput: .descriptor(output.write.fileDescriptor),
            standardError: .descriptor(output.write.fileDescriptor))
        try output.write.close()
        defer {
            daemon.signal(SIGKILL)
            _ = daemon.waitUntilExit()
        }
        // By the time it answers it has logged that it started (and more), each line an EPIPE.
        try await waitUntil("the daemon answers") {
            guard daemon.isRunning else { return true }  // dead: judged below
            return try await cli(["status", "--ready", "--daemon", api, "--timeout", "1"]).status == 0
        }
        #expect(daemon.isRunning, "the daemon died (signal \(daemon.exitStatus() ?? -1))")
        #expect(try await cli(["set", "demo/m", "x=1", "--daemon", api]).status == 0)
        daemon.signal(SIGTERM)
        try await waitUntil("the daemon stops on SIGTERM") { daemon.exitStatus() != nil }
        #expect(daemon.exitStatus() == 0)
    }

    /// `log.format: json`: every line the daemon writes is one JSON object with `ts`, `level`,
    /// `message` and the metadata; an unknown format is a configuration error.
    @Test func jsonLogsAreOneObjectPerLine() async throws {
        let directory = temporaryDirectory("json-log")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let environment = [
            "STATESYNC_LOG_FORMAT": "json", "STATESYNC_NODE_DATA_DIR": "\(directory)/data",
            "STATESYNC_NETWORK_PUBLISH": "tcp://127.0.0.1:\(freePort())",
            "STATESYNC_NETWORK_API": "tcp://127.0.0.1:\(freePort())", "STATESYNC_NETWORK_PEERS": "",
        ]
        let daemon = try ChildProcess("statesyncd", [], environment: environment)
        try await waitUntil("the daemon logs that it started") { daemon.stderr.contains("node started") }
        #expect(await daemon.stop() == 0)
        let lines = daemon.stderr.split(separator: "\n")
        #expect(lines.count >= 2)
        for line in lines {
            let object = jsonObject(line)
            #expect(object?["ts"] is String && object?["level"] is String && object?["message"] is String, "\(line)")
        }
        #expect(
            lines.contains {
                jsonObject($0)?["message"] as? String == "node started" && jsonObject($0)?["node.id"] != nil
            })

        let wrong = try ChildProcess(
            "statesyncd", ["--check-config", "Config/node1.yaml"], environment: ["STATESYNC_LOG_FORMAT": "xml"])
        #expect(await wrong.wait() == 2)
        #expect(
            wrong.stderr.contains("STATESYNC_LOG_FORMAT") && wrong.stderr.contains("not text or json"),
            "\(wrong.stderr)")
    }
}
