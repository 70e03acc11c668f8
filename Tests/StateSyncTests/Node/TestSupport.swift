import Foundation
import StateSyncZeroMQ
import Synchronization
import Testing

@testable import StateSync

#if canImport(Glibc)
    import Glibc
#endif

func freePort() -> Int {
    // The tests share the tools' port picker.
    try! LoopbackPorts.free()
}

/// A fresh temporary directory, removed when the test process exits (tests that inspect it
/// after a node stopped need it to outlive their node; the suite leaves nothing behind).
func temporaryDirectory(_ label: String) -> String {
    _ = removeTemporaryDirectoriesAtExit
    let path = NSTemporaryDirectory() + "statesync-\(label)-\(UUID().uuidString)"
    try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    temporaryDirectories.withLock { $0.append(path) }
    return path
}

private let temporaryDirectories = Mutex<[String]>([])
private let removeTemporaryDirectoriesAtExit: Void = {
    atexit {
        for path in temporaryDirectories.withLock({ $0 }) { try? FileManager.default.removeItem(atPath: path) }
    }
}()

/// Waits for `condition` with a deadline, checking every 5 ms: never a fixed sleep.
func waitUntil(
    _ what: String, timeout: Duration = .seconds(30), sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: () async throws -> Bool
) async throws {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return }
        try await Task.sleep(for: .milliseconds(5))
    }
    // Once more after the deadline: a waiter that was itself not scheduled for a while (a busy
    // 2-core machine) judges the state as it is, not the last one it happened to see.
    if try await condition() { return }
    Issue.record("timed out after \(timeout) waiting for \(what)", sourceLocation: sourceLocation)
    throw CancellationError()
}

/// Configurations for `count` nodes that all peer with each other on free loopback ports.
func meshConfigurations(_ count: Int, label: String, api: Bool = false) -> [NodeConfiguration] {
    let ports = (0..<count).map { _ in freePort() }
    return (0..<count).map { index in
        NodeConfiguration(
            nodeID: "node\(index + 1)", dataDirectory: temporaryDirectory("\(label)-\(index + 1)"),
            publishEndpoint: "tcp://127.0.0.1:\(ports[index])",
            peers: ports.enumerated().filter { $0.offset != index }.map { "tcp://127.0.0.1:\($0.element)" },
            apiEndpoint: api ? "tcp://127.0.0.1:\(freePort())" : nil, heartbeatIntervalMilliseconds: 50)
    }
}

/// Waits until every node sees every peer connected (heartbeats flowing both ways).
func waitUntilMeshed(_ nodes: [StateSyncNode]) async throws {
    try await waitUntil("all peers connected") {
        nodes.allSatisfy { node in node.status.peers.allSatisfy(\.meshed) }
    }
}
