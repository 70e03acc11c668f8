import ChildProcesses
import Foundation
import StateSync
import StateSyncZeroMQ
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The directory holding the built executables (next to the test bundle on Linux).
let binaries: URL = {
    let testBinary = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    var directory = testBinary.deletingLastPathComponent()
    if directory.lastPathComponent == "MacOS" {  // macOS: .../X.xctest/Contents/MacOS
        directory = directory.deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    }
    return directory
}()

let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

/// A child process whose output goes to files (a full pipe can never block it), stopped by
/// the test that started it.
final class ChildProcess: Sendable {
    let process: SpawnedProcess
    let name: String
    let stdoutPath: String
    let stderrPath: String
    /// For a `statesyncd` the test gave no standard input: the write end of a pipe on it, with
    /// `--stop-when-stdin-closes`. Held as long as the test holds the process; if the test runner
    /// dies instead (a crash, a kill, a failed `precondition`), the kernel closes it and the
    /// daemon stops, rather than running on orphaned beside the next runs (as eight did after a
    /// runner crashed on 2026-11-28, under that afternoon's benchmarks).
    private let lifeline: FileHandle?

    /// Starts `executable`; its standard input is `standardInput` (default: `/dev/null`, or for
    /// a daemon a pipe whose end the test runner holds: see ``lifeline``).
    init(
        _ executable: String, _ arguments: [String], environment: [String: String] = [:], name: String? = nil,
        standardInput: FileHandle? = nil
    ) throws {
        self.name = name ?? executable
        let base = NSTemporaryDirectory() + "statesync-proc-\(UUID().uuidString)"
        stdoutPath = base + ".out"
        stderrPath = base + ".err"
        var arguments = arguments
        var input = standardInput
        var lifeline: FileHandle?
        // (A one-shot command, `--check-config` or `--print-default-config`, exits before it would
        // watch its input: the flag changes nothing there.)
        if executable == "statesyncd", standardInput == nil {
            let pipe = try closeOnExecPipe()
            arguments.append("--stop-when-stdin-closes")
            input = pipe.read
            lifeline = pipe.write
        }
        self.lifeline = lifeline
        // A bare name is one of the package's built executables; an absolute path is a system tool.
        process = try SpawnedProcess(
            executable: executable.hasPrefix("/") ? executable : binaries.appendingPathComponent(executable).path,
            arguments: arguments, environment: ProcessInfo.processInfo.environment.merging(environment) { $1 },
            currentDirectory: packageRoot.path,
            standardInput: input.map { .descriptor($0.fileDescriptor) } ?? .null,
            standardOutput: .file(stdoutPath, append: false), standardError: .file(stderrPath, append: false))
        // The child has its copy of the read end (posix_spawn dup2'd it); ours goes with `input`.
    }

    /// What the daemon sees when the test runner dies: the end of its standard input (tests of
    /// that path).
    func dropLifeline() throws { try lifeline?.close() }

    var stdout: String { (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? "" }
    var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }
    var isRunning: Bool { process.isRunning }
    var pid: pid_t { process.pid }

    /// Sends `signal` while it runs (never to a pid reused after it was reaped).
    func signal(_ signal: Int32) { process.signal(signal) }

    /// Waits for the process to exit, with a deadline; kills it if the deadline passes.
    func wait(timeout: Duration = .seconds(20)) async -> Int32 {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let status = process.exitStatus() { return status }
            try? await Task.sleep(for: .milliseconds(5))
        }
        if let status = process.exitStatus() { return status }
        Issue.record(
            "\(name) did not exit within \(timeout); killing it. stderr:\n\(stderr)\nstdout:\n\(String(stdout.suffix(2000)))\n\(whereItIs(pid))"
        )
        process.signal(SIGKILL)
        for _ in 0..<2000 {  // 10 s
            if let status = process.exitStatus() { return status }
            try? await Task.sleep(for: .milliseconds(5))
        }
        // Still there (uninterruptible sleep?): waiting on would hang the test runner.
        Issue.record("\(name) still runs 10 s after SIGKILL")
        return -1
    }

    /// Sends `signal` and waits for the exit status.
    func stop(_ signal: Int32 = SIGTERM, timeout: Duration = .seconds(20)) async -> Int32 {
        process.signal(signal)
        return await wait(timeout: timeout)
    }

    /// Its output files go with it (the tests read them, for their failure messages too,
    /// while they hold it).
    deinit {
        // Stopped and reaped (no zombie left for the rest of the run), within a bound: a child
        // stuck in the kernel is left to the runner's exit.
        process.signal(SIGKILL)
        for _ in 0..<200 where process.exitStatus() == nil { usleep(5_000) }
        try? FileManager.default.removeItem(atPath: stdoutPath)
        try? FileManager.default.removeItem(atPath: stderrPath)
    }
}

/// Where the threads of a process that missed its deadline are: each thread's state and kernel
/// wait channel (and kernel stack, readable as root) from /proc, then a user-space backtrace of
/// every thread when gdb is installed. A hang in CI is then a report, not a guess.
func whereItIs(_ pid: pid_t) -> String {
    var report = "threads of \(pid):\n"
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
    for task in tasks.sorted() {
        let base = "/proc/\(pid)/task/\(task)/"
        func read(_ name: String) -> String {
            ((try? String(contentsOfFile: base + name, encoding: .utf8)) ?? "?")
                .trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let status = read("status").split(separator: "\n")
        let state = status.first { $0.hasPrefix("State:") } ?? "State: ?"
        let signals = status.filter { ["SigPnd:", "ShdPnd:", "SigBlk:", "SigIgn:"].contains($0.prefix(7)) }
        report += "  \(task) \(read("comm")) \(state) wchan=\(read("wchan")) \(signals.joined(separator: " "))\n"
        let stack = read("stack")
        if stack != "?" && !stack.isEmpty { report += stack.split(separator: "\n").map { "      \($0)\n" }.joined() }
    }
    let gdb = "/usr/bin/gdb"
    guard FileManager.default.isExecutableFile(atPath: gdb) else {
        return report + "(no gdb for a user-space backtrace)"
    }
    guard
        let text = try? SpawnedProcess.run(
            "/usr/bin/timeout", ["30", gdb, "-batch", "-p", "\(pid)", "-ex", "thread apply all bt 30"],
            environment: ProcessInfo.processInfo.environment
        ).output
    else { return report + "(gdb did not start)" }
    let frames = text.split(separator: "\n").filter { $0.hasPrefix("#") || $0.hasPrefix("Thread ") }
    return report + "gdb backtrace:\n" + frames.prefix(400).joined(separator: "\n")
}

/// A pipe whose ends both close on exec (no other child the tests start inherits them): for a
/// child's standard input, the test keeping the write end.
func closeOnExecPipe() throws -> (read: FileHandle, write: FileHandle) {
    var ends: [Int32] = [0, 0]
    // (Glibc's pipe2 is not imported into Swift, so the flag is set right after.)
    guard pipe(&ends) == 0, fcntl(ends[0], F_SETFD, FD_CLOEXEC) == 0, fcntl(ends[1], F_SETFD, FD_CLOEXEC) == 0
    else { throw POSIXError(.EMFILE) }
    return (
        FileHandle(fileDescriptor: ends[0], closeOnDealloc: true),
        FileHandle(fileDescriptor: ends[1], closeOnDealloc: true)
    )
}

/// Writes `bytes` to a pipe whose reader may be gone: then it throws EPIPE instead of killing the
/// test runner. SIGPIPE is blocked in the calling thread for the write only (a pending one is
/// taken), not ignored process-wide: children started meanwhile would inherit that.
func writeWithoutSIGPIPE(_ bytes: [UInt8], to handle: FileHandle) throws {
    var pipeSignal = sigset_t()
    sigemptyset(&pipeSignal)
    sigaddset(&pipeSignal, SIGPIPE)
    var previous = sigset_t()
    pthread_sigmask(SIG_BLOCK, &pipeSignal, &previous)
    defer {
        var pending = sigset_t()
        sigpending(&pending)
        if sigismember(&pending, SIGPIPE) == 1 {
            var now = timespec()
            _ = sigtimedwait(&pipeSignal, nil, &now)
        }
        pthread_sigmask(SIG_SETMASK, &previous, nil)
    }
    let written = bytes.withUnsafeBytes { write(handle.fileDescriptor, $0.baseAddress, $0.count) }
    guard written == bytes.count else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
}

/// The processes whose parent is `parent` and whose name (`comm`) is `name`, from /proc.
func childProcesses(of parent: pid_t, named name: String) -> [pid_t] {
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
    return entries.compactMap { entry -> pid_t? in
        guard let pid = pid_t(entry), let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
            let open = stat.firstIndex(of: "("), let close = stat.lastIndex(of: ")")
        else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard stat[stat.index(after: open)..<close] == name, fields.count > 1, pid_t(fields[1]) == parent else {
            return nil
        }
        return pid
    }
}

/// Whether `pid` is a live process (not gone, not a zombie waiting to be reaped).
func isAlive(_ pid: pid_t) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = stat.lastIndex(of: ")")
    else { return false }
    return stat[stat.index(after: close)...].split(separator: " ").first != "Z"
}

/// Runs a `statesync` CLI command to completion.
func cli(_ arguments: [String], timeout: Duration = .seconds(20)) async throws -> (
    status: Int32, stdout: String, stderr: String
) {
    let child = try ChildProcess("statesync", arguments)
    let status = await child.wait(timeout: timeout)
    return (status, child.stdout, child.stderr)
}

/// Waits for `condition` with a deadline, checking every 10 ms: never a fixed sleep.
func waitUntil(
    _ what: String, timeout: Duration = .seconds(20), sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: () async throws -> Bool
) async throws {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return }
        try await Task.sleep(for: .milliseconds(10))
    }
    // Once more after the deadline: a waiter that was itself not scheduled for a while (a busy
    // 2-core machine) judges the state as it is, not the last one it happened to see.
    if try await condition() { return }
    Issue.record("timed out after \(timeout) waiting for \(what)", sourceLocation: sourceLocation)
    throw CancellationError()
}

/// Writes a CurveZMQ key pair `DIRECTORY/NAME.key` (and `.pub`) per name with `statesync keygen`.
func keygen(_ names: [String], in directory: String, sourceLocation: SourceLocation = #_sourceLocation)
    async throws
{
    for name in names {
        let made = try await cli(["keygen", "--out", "\(directory)/\(name).key"])
        #expect(made.status == 0, "\(made.stderr)", sourceLocation: sourceLocation)
    }
}

func temporaryDirectory(_ label: String) -> String {
    let path = temporaryPath(label)
    try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

/// A fresh path under the temporary directory, not created: a daemon's data directory (the
/// daemon makes it), so that one a test never starts leaves nothing behind.
func temporaryPath(_ label: String) -> String {
    NSTemporaryDirectory() + "statesync-it-\(label)-\(UUID().uuidString)"
}

func freePort() -> Int {
    // The tests share the tools' port picker.
    try! LoopbackPorts.free()
}

/// Parses one line of JSON into a dictionary.
func jsonObject(_ line: Substring) -> [String: Any]? {
    (try? JSONSerialization.jsonObject(with: Data(line.utf8), options: [.fragmentsAllowed])) as? [String: Any]
}

/// The report a hung child gets names its threads and where they wait.
@Suite("Test support: a hung child's report")
struct HungChildReportTests {
    @Test func namesEachThreadItsStateAndItsBacktrace() async throws {
        let child = try ChildProcess("/bin/sleep", ["30"])
        let pid = child.pid
        do {
            try await waitUntil("sleep has started") {
                (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8)) == "sleep\n"
            }
        } catch {
            // CI once saw a child make no progress for 20 s: say what state it is in.
            Issue.record(
                "/proc/\(pid)/stat: \((try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? "?")")
            throw error
        }
        let report = whereItIs(pid)
        #expect(report.contains("\(pid) sleep State:"), "\(report)")
        // gdb attaches to a sibling process as root, or where Yama's ptrace_scope allows it.
        let scope = (try? String(contentsOfFile: "/proc/sys/kernel/yama/ptrace_scope", encoding: .utf8)) ?? "0\n"
        if FileManager.default.isExecutableFile(atPath: "/usr/bin/gdb"), geteuid() == 0 || scope.hasPrefix("0") {
            #expect(report.contains("#0 "), "\(report)")
        }
        #expect(await child.stop(SIGKILL) == SIGKILL)
    }
}
