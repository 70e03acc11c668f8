import ChildProcesses
package import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// One `statesyncd` process of the harness, restartable on the same data directory.
package final class NodeProcess: Sendable {
    let name: String
    let api: String
    let publishPort: Int
    let environment: [String: String]
    let daemonPath: String
    let logPath: String
    /// A command that runs the daemon (e.g. `ip netns exec NS statesyncd`), if not run directly.
    let launcher: (executable: String, arguments: [String])?
    private let state = Mutex<(process: SpawnedProcess?, paused: Bool, restarts: Int, stdin: FileHandle?)>(
        (nil, false, 0, nil))

    package init(
        name: String, api: String, publishPort: Int, environment: [String: String], daemonPath: String, logPath: String,
        launcher: (executable: String, arguments: [String])? = nil
    ) {
        self.launcher = launcher
        self.name = name
        self.api = api
        self.publishPort = publishPort
        self.environment = environment
        self.daemonPath = daemonPath
        self.logPath = logPath
    }

    package func start() throws {
        // The daemon stops when its standard input ends: the harness holds the pipe's other end,
        // so if the harness dies (even by SIGKILL) its nodes stop instead of running on orphaned.
        // Both ends close on exec: the node gets the read end as its standard input, and no
        // other child (a node started later) inherits the write end and keeps the pipe open.
        var ends: [Int32] = [0, 0]
        // (Glibc's pipe2 is not imported into Swift, so the flag is set right after.)
        guard pipe(&ends) == 0, fcntl(ends[0], F_SETFD, FD_CLOEXEC) == 0, fcntl(ends[1], F_SETFD, FD_CLOEXEC) == 0
        else {
            throw CocoaError(
                .fileWriteUnknown,
                userInfo: [NSLocalizedDescriptionKey: "pipe for a node's standard input: errno \(errno)"])
        }
        let readEnd = FileHandle(fileDescriptor: ends[0], closeOnDealloc: true)
        let writeEnd = FileHandle(fileDescriptor: ends[1], closeOnDealloc: true)
        defer { try? readEnd.close() }  // the node has its own
        let process = try SpawnedProcess(
            executable: launcher?.executable ?? daemonPath,
            arguments: (launcher?.arguments ?? []) + ["--stop-when-stdin-closes"],
            environment: ProcessInfo.processInfo.environment.merging(environment) { $1 },
            standardInput: .descriptor(ends[0]),
            standardOutput: .file(logPath, append: true), standardError: .file(logPath, append: true))
        state.withLock {
            $0.process = process
            $0.paused = false
            $0.stdin = writeEnd
        }
    }

    var isRunning: Bool { state.withLock { $0.process }?.isRunning ?? false }
    /// Whether it was ever started (a late joiner is not, until it joins).
    var wasStarted: Bool { state.withLock { $0.process != nil } }
    package var pid: Int32? { state.withLock { $0.process?.pid } }

    func signal(_ signal: Int32) {
        state.withLock { $0.process }?.signal(signal)
    }

    func killHard() {
        signal(SIGKILL)
        _ = state.withLock { $0.process }?.waitUntilExit()
    }

    func pause() {
        signal(SIGSTOP)
        state.withLock { $0.paused = true }
    }

    func resume() {
        signal(SIGCONT)
        state.withLock { $0.paused = false }
    }

    var isPaused: Bool { state.withLock { $0.paused } }

    /// SIGTERM (after SIGCONT if paused), waiting up to `timeout`; SIGKILL after that.
    package func stop(timeout: TimeInterval = 15) -> Int32? {
        guard let process = state.withLock({ $0.process }) else { return nil }
        if process.isRunning {
            process.signal(SIGCONT)
            process.signal(SIGTERM)
            let deadline = Date().addingTimeInterval(timeout)
            while process.isRunning && Date() < deadline { usleep(5000) }
            process.signal(SIGKILL)
        }
        return process.waitUntilExit()
    }
}
