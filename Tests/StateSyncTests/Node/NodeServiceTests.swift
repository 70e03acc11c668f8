import Logging
import ServiceLifecycle
import StateSyncZeroMQ
import Testing

@testable import StateSync

/// A node is a swift-service-lifecycle `Service`: it stops on graceful shutdown and when its task
/// is cancelled.
@Suite("Node as a service")
struct NodeServiceTests {
    /// Runs `body`, failing if it takes longer than 30 s (a hung stop).
    static func withDeadline(_ what: String, _ body: @escaping @Sendable () async throws -> Void) async throws {
        try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask {
                try await body()
                return true
            }
            group.addTask {
                try await Task.sleep(for: .seconds(30))
                return false
            }
            let finished = try await group.next() ?? false
            group.cancelAll()
            if !finished { Issue.record("\(what) did not return within 30 s") }
        }
    }

    static func group(_ node: StateSyncNode) -> ServiceGroup {
        ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: [.init(service: node)],
                logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })))
    }

    @Test func runReturnsWhenItsTaskIsCancelled() async throws {
        let node = try await StateSyncNode.start(configuration: meshConfigurations(1, label: "service-cancel")[0])
        let group = Self.group(node)
        let running = Task { try await group.run() }
        try await waitUntil("the node serves") { node.status.node == "node1" }
        running.cancel()
        try await Self.withDeadline("the group after cancellation") { _ = try? await running.value }
        #expect(!node.isRunning)
        await node.stop()  // idempotent
    }

    @Test func runReturnsOnGracefulShutdown() async throws {
        let node = try await StateSyncNode.start(configuration: meshConfigurations(1, label: "service-graceful")[0])
        let group = Self.group(node)
        let running = Task { try await group.run() }
        try await waitUntil("the node serves") { node.status.node == "node1" }
        await group.triggerGracefulShutdown()
        try await Self.withDeadline("the group after graceful shutdown") { try await running.value }
        #expect(!node.isRunning)
    }
}
