import CProcessSpawn
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A child process started with `posix_spawn`, and reaped by whoever asks for its exit first.
///
/// Why not Foundation's `Process`: on this platform its `run()` has an intermittent SIGSEGV
/// (swift-corelibs-foundation PR #5472, an over-read in the code that finds the descriptors to
/// close), seen in our own test runs. `posix_spawn` has the kernel do the work: the child gets
/// exactly the descriptors handed to it (every other one is closed), an empty signal mask, and
/// default signal dispositions, whatever the spawning thread had blocked or ignored.
///
/// The exit status is the exit code, or the number of the signal that ended the process
/// (as Foundation's `terminationStatus`); ``terminatedBySignal`` tells them apart.
package final class SpawnedProcess: Sendable {
    /// Where one of the child's standard streams goes.
    package enum Stream: Sendable {
        /// The parent's own descriptor.
        case inherit
        /// `/dev/null`.
        case null
        /// This descriptor of the parent (which keeps it, and closes it when it likes).
        case descriptor(Int32)
        /// This file, created when missing; appended to when `append`, else truncated.
        case file(String, append: Bool)
    }

    package let pid: Int32
    package let executable: String
    private let exit = Mutex<(status: Int32, bySignal: Bool)?>(nil)

    /// Starts `executable` (a path; not searched for in `PATH`) with `arguments` (not counting
    /// the program's name) and exactly `environment`.
    package init(
        executable: String, arguments: [String], environment: [String: String],
        currentDirectory: String? = nil, standardInput: Stream = .null, standardOutput: Stream = .inherit,
        standardError: Stream = .inherit
    ) throws(SpawnError) {
        self.executable = executable
        var actions = posix_spawn_file_actions_t()
        var attributes = posix_spawnattr_t()
        guard posix_spawn_file_actions_init(&actions) == 0 else { throw SpawnError(executable, "file actions", errno) }
        defer { posix_spawn_file_actions_destroy(&actions) }
        guard posix_spawnattr_init(&attributes) == 0 else { throw SpawnError(executable, "attributes", errno) }
        defer { posix_spawnattr_destroy(&attributes) }

        for (target, stream) in [(Int32(0), standardInput), (1, standardOutput), (2, standardError)] {
            let result: Int32 =
                switch stream {
                case .inherit: 0
                case .null:
                    posix_spawn_file_actions_addopen(
                        &actions, target, "/dev/null", target == 0 ? O_RDONLY : O_WRONLY, 0)
                case .descriptor(let descriptor):
                    posix_spawn_file_actions_adddup2(&actions, descriptor, target)
                case .file(let path, let append):
                    posix_spawn_file_actions_addopen(
                        &actions, target, path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0o644)
                }
            guard result == 0 else { throw SpawnError(executable, "standard stream \(target)", result) }
        }
        // Only 0, 1 and 2 go to the child: a pipe end or socket the parent forgot to mark
        // close-on-exec must not keep a pipe open in a long-lived daemon.
        var result = cprocessspawn_addclosefrom(&actions, 3)
        guard result == 0 || result == ENOSYS else { throw SpawnError(executable, "close descriptors", result) }
        if let currentDirectory {
            result = cprocessspawn_addchdir(&actions, currentDirectory)
            guard result == 0 else { throw SpawnError(executable, "change directory", result) }
        }

        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD, SIGUSR1, SIGUSR2] {
            sigaddset(&defaults, signal)
        }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        result = posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        guard result == 0 else { throw SpawnError(executable, "attributes", result) }

        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in envp { free(pointer) }
        }
        var pid = pid_t()
        result = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        guard result == 0 else { throw SpawnError(executable, "spawn", result) }
        self.pid = pid
    }

    /// Whether it has not exited yet (reaping it when it has).
    package var isRunning: Bool { exitStatus() == nil }

    /// The exit status once it has exited, without blocking; `nil` while it runs.
    package func exitStatus() -> Int32? {
        exit.withLock { exit in
            if exit == nil { exit = reap(options: WNOHANG) }
            return exit?.status
        }
    }

    /// Whether the exit status is a signal's number (nil while it runs).
    package var terminatedBySignal: Bool? {
        _ = exitStatus()
        return exit.withLock { $0?.bySignal }
    }

    /// Blocks until it has exited and returns the exit status.
    package func waitUntilExit() -> Int32 {
        // Wait without reaping (so no other caller of `exitStatus` can find the child gone),
        // then reap under the lock.
        var info = siginfo_t()
        while waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR {}
        return exit.withLock { exit in
            if exit == nil { exit = reap(options: 0) }
            return exit?.status ?? -1
        }
    }

    /// Sends `signal` unless it has exited already (its pid may then belong to another process).
    package func signal(_ signal: Int32) {
        exit.withLock { exit in
            if exit == nil { exit = reap(options: WNOHANG) }
            if exit == nil { _ = kill(pid, signal) }
        }
    }

    private func reap(options: Int32) -> (status: Int32, bySignal: Bool)? {
        var status: Int32 = 0
        var reaped: pid_t
        repeat { reaped = waitpid(pid, &status, options) } while reaped < 0 && errno == EINTR
        guard reaped == pid else {
            // ECHILD: someone else reaped it (a process-wide SIGCHLD reaper); the status is lost.
            return reaped < 0 && errno == ECHILD ? (-1, false) : nil
        }
        // WIFEXITED / WTERMSIG, spelled out: the C macros are not imported.
        let signal = status & 0x7f
        return signal == 0 ? ((status >> 8) & 0xff, false) : (signal, true)
    }
}

/// Why a child process could not be started: which program, which step, and the error.
package struct SpawnError: Error, CustomStringConvertible {
    package let executable: String
    package let step: String
    package let code: Int32

    init(_ executable: String, _ step: String, _ code: Int32) {
        self.executable = executable
        self.step = step
        self.code = code
    }

    package var description: String {
        "cannot start \(executable) (\(step)): \(String(cString: strerror(code)))"
    }
}
