import Foundation
import Testing

@testable import StateSync

/// `statesyncd --check-config` and a daemon's start check `node.data_dir` before anything runs:
/// a directory the node cannot create is a configuration error (exit 2), said with its reason.
@Suite("Data directory checks")
struct DataDirectoryTests {
    private func problem(_ path: String) -> String? {
        do {
            try DataDirectory.checkWritable(path)
            return nil
        } catch {
            #expect(error.code == .invalidConfiguration)
            #expect(!error.message.contains("NSCocoaErrorDomain"), "\(error.message)")
            return error.message
        }
    }

    /// A path through a regular file was passed as ok (its `stat` fails with ENOTDIR, not ENOENT),
    /// and the daemon then exited 1 with "NSCocoaErrorDomain error 512" (a new user's trial).
    @Test func aPathThroughAFileIsRefused() throws {
        let directory = temporaryDirectory("data-dir-file")
        let file = directory + "/afile"
        #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        for path in [file + "/sub", file + "/sub/deeper"] {
            let message = try #require(problem(path), "\(path) was passed")
            #expect(message == "node.data_dir \(path): \(file) is in its path and is not a directory")
        }
        #expect(problem(file) == "node.data_dir \(file) is not a directory")
    }

    /// A parent that passes `access(2)` but takes no new directory (`/proc`; as root `access`
    /// passes anywhere): the check tries to create one, and says what the kernel said.
    @Test func aParentThatTakesNoDirectoryIsRefusedWithTheKernelsReason() throws {
        let message = try #require(problem("/proc/statesync-data"), "/proc/statesync-data was passed")
        #expect(message.hasPrefix("node.data_dir /proc/statesync-data: cannot create a directory in /proc: "))
        #expect(!FileManager.default.fileExists(atPath: "/proc/statesync-data"))
    }

    /// What may be created is passed, and the check leaves nothing behind; so is an existing
    /// directory, and the daemon's own creation makes every missing level.
    @Test func aCreatableDirectoryPassesAndNothingIsLeftBehind() throws {
        let directory = temporaryDirectory("data-dir-ok")
        #expect(problem(directory + "/a/b/c") == nil)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).isEmpty)
        #expect(problem(directory) == nil)
        let storage = try DataDirectory(path: directory + "/a/b/c")
        storage.close()
        var isDirectory: ObjCBool = false
        #expect(FileManager.default.fileExists(atPath: directory + "/a/b/c", isDirectory: &isDirectory))
        #expect(isDirectory.boolValue)
    }

    /// The daemon's creation says the kernel's reason, not Foundation's error number.
    @Test func creationThatFailsSaysWhy() throws {
        let directory = temporaryDirectory("data-dir-create")
        let file = directory + "/afile"
        #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        let error = try #require(throws: StateSyncError.self) { try DataDirectory(path: file + "/sub") }
        #expect(error.message == "cannot create data directory \(file)/sub: \(file): Not a directory")
    }
}
