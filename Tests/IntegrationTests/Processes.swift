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
final class ChildProcess: @unchecked Sendable {
    // Safe: `process` is only touched by the test task that owns this object; Foundation's
    // Process is itself thread-safe for terminate/waitUntilExit.
    let process = Process()
    let name: String
    let stdoutPath: String
    let stderrPath: String

    init(_ executable: String, _ arguments: [String], environment: [String: String] = [:], name: String? = nil) throws {
        self.name = name ?? executable
        let base = NSTemporaryDirectory() + "statesync-proc-\(UUID().uuidString)"
        stdoutPath = base + ".out"
        stderrPath = base + ".err"
        _ = FileManager.default.createFile(atPath: stdoutPath, contents: nil)
        _ = FileManager.default.createFile(atPath: stderrPath, contents: nil)
        // A bare name is one of the package's built executables; an absolute path is a system tool.
        process.executableURL =
            executable.hasPrefix("/") ? URL(fileURLWithPath: executable) : binaries.appendingPathComponent(executable)
        process.arguments = arguments
        process.currentDirectoryURL = packageRoot
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        process.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: stdoutPath))
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: stderrPath))
        process.standardInput = FileHandle.nullDevice
        try process.run()
    }

    var stdout: String { (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? "" }
    var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }
    var isRunning: Bool { process.isRunning }

    /// Waits for the process to exit, with a deadline; kills it if the deadline passes.
    func wait(timeout: Duration = .seconds(20)) async -> Int32 {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning && ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(5))
        }
        if process.isRunning {
            Issue.record("\(name) did not exit within \(timeout); killing it. stderr:\n\(stderr)")
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        return process.terminationStatus
    }

    /// Sends `signal` and waits for the exit status.
    func stop(_ signal: Int32 = SIGTERM, timeout: Duration = .seconds(20)) async -> Int32 {
        if process.isRunning { kill(process.processIdentifier, signal) }
        return await wait(timeout: timeout)
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
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
    let path = NSTemporaryDirectory() + "statesync-it-\(label)-\(UUID().uuidString)"
    try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

func freePort() -> Int {
    // The tests share the tools' port picker.
    try! LoopbackPorts.free()
}

/// Parses one line of JSON into a dictionary.
func jsonObject(_ line: Substring) -> [String: Any]? {
    (try? JSONSerialization.jsonObject(with: Data(line.utf8), options: [.fragmentsAllowed])) as? [String: Any]
}
