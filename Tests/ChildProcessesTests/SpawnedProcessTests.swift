import ChildProcesses
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The launcher the harness, the bench and the tests start their children with.
@Suite("A spawned child process")
struct SpawnedProcessTests {
    let environment = ProcessInfo.processInfo.environment

    @Test func itsExitCodeAndTheSignalThatKilledItAreToldApart() throws {
        let exited = try SpawnedProcess(executable: "/bin/sh", arguments: ["-c", "exit 7"], environment: environment)
        #expect(exited.waitUntilExit() == 7)
        #expect(exited.terminatedBySignal == false)
        #expect(!exited.isRunning)

        let killed = try SpawnedProcess(executable: "/bin/sleep", arguments: ["30"], environment: environment)
        #expect(killed.isRunning)
        killed.signal(SIGKILL)
        #expect(killed.waitUntilExit() == SIGKILL)
        #expect(killed.terminatedBySignal == true)
        killed.signal(SIGKILL)  // gone and reaped: nothing is sent, nothing traps
        #expect(killed.exitStatus() == SIGKILL)
    }

    /// A descriptor the parent left open across exec (no close-on-exec flag) does not reach
    /// the child: a daemon must not hold a pipe end that some other child's EOF depends on.
    @Test func theChildGetsOnlyItsThreeStandardDescriptors() throws {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        defer {
            close(ends[0])
            close(ends[1])
        }
        let child = try SpawnedProcess(executable: "/bin/sleep", arguments: ["30"], environment: environment)
        defer {
            child.signal(SIGKILL)
            _ = child.waitUntilExit()
        }
        // The child's own start-up opens descriptors for a moment (the dynamic loader reads its
        // libraries as descriptor 3): seen once under a loaded CI. An inherited descriptor stays
        // open for the child's life, so the listing is read until it shows only 0, 1 and 2, for
        // at most 10 seconds.
        let deadline = ContinuousClock.now + .seconds(10)
        var descriptors = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(child.pid)/fd").sorted()
        while descriptors != ["0", "1", "2"], ContinuousClock.now < deadline {
            usleep(10_000)
            descriptors = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(child.pid)/fd").sorted()
        }
        #expect(descriptors == ["0", "1", "2"], "the child inherited \(descriptors)")
    }

    /// The spawning thread's blocked signals are not the child's: a test runner's worker thread
    /// may block SIGTERM, and a daemon started from it must still stop on SIGTERM.
    @Test func theChildStartsWithNoSignalBlocked() throws {
        var terminate = sigset_t()
        sigemptyset(&terminate)
        sigaddset(&terminate, SIGTERM)
        var previous = sigset_t()
        pthread_sigmask(SIG_BLOCK, &terminate, &previous)
        let child: SpawnedProcess
        do {
            defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
            child = try SpawnedProcess(executable: "/bin/sleep", arguments: ["30"], environment: environment)
        }
        child.signal(SIGTERM)
        #expect(child.waitUntilExit() == SIGTERM)
    }

    @Test func itRunsInTheDirectoryAndWritesWhereItIsTold() throws {
        let directory = NSTemporaryDirectory() + "statesync-spawn-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let output = "\(directory)/out"
        let child = try SpawnedProcess(
            executable: "/bin/sh", arguments: ["-c", "pwd; echo \"$GREETING\"; cat"], environment: ["GREETING": "hi"],
            currentDirectory: directory, standardInput: .null, standardOutput: .file(output, append: false))
        #expect(child.waitUntilExit() == 0)
        let resolved = URL(fileURLWithPath: directory).resolvingSymlinksInPath().path
        #expect(try String(contentsOfFile: output, encoding: .utf8) == "\(resolved)\nhi\n")
    }

    @Test func runCollectsStandardOutputAndErrorInOrder() throws {
        let ran = try SpawnedProcess.run("/bin/sh", ["-c", "echo one; echo two >&2; exit 3"], environment: environment)
        #expect(ran.status == 3)
        #expect(ran.output == "one\ntwo\n")
    }

    @Test func aMissingProgramIsAnErrorThatNamesIt() {
        do {
            _ = try SpawnedProcess(executable: "/nonexistent/statesyncd", arguments: [], environment: environment)
            Issue.record("a missing program started")
        } catch {
            #expect(error.code == ENOENT)
            #expect("\(error)" == "cannot start /nonexistent/statesyncd (spawn): No such file or directory")
        }
    }
}
