import ChildProcesses
import Foundation
import StateSyncClient
import StateSyncZeroMQ
import Testing

/// A data directory on a small tmpfs that fills up (issue #13): the node refuses writes with a
/// clear error, keeps serving reads and watches, and takes writes again once space returns.
@Suite("A full disk, for real")
struct DiskFullTests {
    static var canMount: Bool { getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/mount") }

    static func run(_ arguments: [String]) -> Int32 {
        let ran = try? SpawnedProcess.run(
            arguments[0], Array(arguments.dropFirst()), environment: ProcessInfo.processInfo.environment)
        return ran?.status ?? -1
    }

    /// A node whose data directory is on a tmpfs of `size` (mount's form: `8m`), with
    /// `reserveBytes`, and a client of it, given to `body`; everything is undone after.
    static func onTmpfs(
        size: String, reserveBytes: Int,
        _ body: (_ node: StateSyncNode, _ client: StateSyncClient, _ mountPoint: String) async throws -> Void
    ) async throws {
        let mountPoint = temporaryDirectory("tmpfs")
        try #require(Self.run(["/usr/bin/mount", "-t", "tmpfs", "-o", "size=\(size)", "tmpfs", mountPoint]) == 0)
        defer {
            _ = Self.run(["/usr/bin/umount", mountPoint])
            try? FileManager.default.removeItem(atPath: mountPoint)
        }
        var configuration = NodeConfiguration(
            nodeID: "node1", dataDirectory: "\(mountPoint)/data", publishEndpoint: "tcp://127.0.0.1:\(freePort())",
            peers: [], apiEndpoint: "tcp://127.0.0.1:\(freePort())", heartbeatIntervalMilliseconds: 50)
        configuration.reserveBytes = reserveBytes
        let node = try await StateSyncNode.start(configuration: configuration)
        do {
            let client = try StateSyncClient(endpoint: try #require(node.apiEndpoint), requestTimeout: .seconds(5))
            defer { client.close() }
            try await body(node, client, mountPoint)
        } catch {
            Issue.record(error)
        }
        await node.stop()
    }

    @Test(.enabled(if: canMount, "needs root to mount a tmpfs"))
    func writesAreRefusedWhileTheDiskIsFullAndTakenAgainAfter() async throws {
        try await Self.onTmpfs(size: "8m", reserveBytes: 4 << 20) { node, client, mountPoint in
            let address = ModelAddress(channel: "c", model: "m")
            _ = try await client.set(address, [PropertyWrite(name: "x", value: 1)])
            // Fill the file system past the reserve.
            let filler = "\(mountPoint)/filler"
            #expect(FileManager.default.createFile(atPath: filler, contents: Data(count: 5 << 20)))
            try await waitUntil("the node notices the full disk") { node.status.diskFull }
            await #expect {
                _ = try await client.set(address, [PropertyWrite(name: "x", value: 2)])
            } throws: { error in
                "\(error)".contains("disk of node node1 is full")
            }
            #expect(try await client.get(address)["x"]?.value == 1, "reads go on, the refused write changed nothing")
            // Space returns: writes are taken again, by themselves.
            try FileManager.default.removeItem(atPath: filler)
            try await waitUntil("the node takes writes again") { !node.status.diskFull }
            _ = try await client.set(address, [PropertyWrite(name: "x", value: 3)])
            #expect(try await client.get(address)["x"]?.value == 3)
            #expect(node.status.counters["disk_full_episodes"] == 1)
        }
    }

    /// A write the disk cannot hold above its reserve is refused (ERROR 9) even while the disk
    /// is not yet under the reserve, and so is a burst that would fill it between two
    /// measurements of the free space; the node runs on and takes writes that fit. Before, such
    /// a write's append failed and stopped the node (an own write that cannot be logged must
    /// not be acknowledged): a helper's trial, a 2 MB SET with 1.2 MB free, a 1 MiB reserve.
    @Test(.enabled(if: canMount, "needs root to mount a tmpfs"))
    func aWriteLargerThanTheFreeSpaceIsRefusedAndTheNodeRunsOn() async throws {
        try await Self.onTmpfs(size: "6m", reserveBytes: 1 << 20) { node, client, _ in
            let address = ModelAddress(channel: "c", model: "m")
            _ = try await client.set(address, [PropertyWrite(name: "x", value: 1)])
            let big = Value.bytes([UInt8](repeating: 7, count: 8 << 20))
            await #expect {
                _ = try await client.set(address, [PropertyWrite(name: "big", value: big)])
            } throws: { error in
                "\(error)".contains("too few for this write")
            }
            #expect(!node.status.diskFull, "not under the reserve: only too small for that write")
            // A burst of writes that fit one by one: those past the free space are refused.
            let chunk = Value.bytes([UInt8](repeating: 9, count: 512 << 10))
            var refused = 0
            for index in 0..<12 {
                do {
                    _ = try await client.set(address, [PropertyWrite(name: "p\(index)", value: chunk)])
                } catch {
                    #expect("\(error)".contains("disk of node node1"), "\(error)")
                    refused += 1
                }
            }
            #expect(refused > 0, "12 × 512 KiB do not fit in 6 MiB with a 1 MiB reserve")
            #expect(refused < 12, "the first ones fit")
            #expect(try await client.get(address)["x"]?.value == 1, "the node runs on: reads go on")
            #expect(try await client.status().node == "node1")
        }
    }
}
