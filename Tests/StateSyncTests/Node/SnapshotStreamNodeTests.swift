import Foundation
import StateSyncClient
import StateSyncZeroMQ
import Testing

@testable import StateSync

/// A streamed snapshot over real sockets (docs/PROTOCOL.md 10.9): a node that joins a peer whose
/// history is gone takes its state in many small pages and ends with the same state.
@Suite("Streamed snapshots between real nodes")
struct SnapshotStreamNodeTests {
    @Test func aLateJoinerTakesTheStateInPages() async throws {
        var configurations = meshConfigurations(2, label: "pages", api: true)
        configurations[0].historyDeltas = 0  // no history: the joiner must take a snapshot
        configurations[1].snapshotPageOctets = 1024
        let holder = try await StateSyncNode.start(configuration: configurations[0])
        var joiner: StateSyncNode?
        do {
            let client = try StateSyncClient(endpoint: configurations[0].apiEndpoint!, requestTimeout: .seconds(5))
            defer { client.close() }
            for model in 0..<20 {
                let writes = (0..<100).map { PropertyWrite(name: "p\($0)", value: .string("value-\(model)-\($0)")) }
                _ = try await client.set(ModelAddress(channel: "c", model: "m\(model)"), writes)
            }
            let started = try await StateSyncNode.start(configuration: configurations[1])
            joiner = started
            try await waitUntil("the joiner holds the holder's state") {
                started.status.counters["snapshots_applied"] ?? 0 >= 1
                    && started.status.stateDigest == holder.status.stateDigest
            }
            let pages = holder.status.counters["snapshot_pages_served"] ?? 0
            #expect(pages >= 10, "\(pages) pages")
        } catch {
            Issue.record("\(error)")
        }
        await joiner?.stop()
        await holder.stop()
    }
}
