import Foundation
import StateSync

/// One writer node process and N reader node processes on loopback (`statesync bench --fanout`):
/// every reader subscribes to the writer, the writer to every reader. What the slowest reader
/// sees is the figure: a write is replicated once every reader has it.
extension Bench {
    /// What N readers saw of one writer.
    public struct FanOutFigures: Sendable {
        public var readers: Int
        /// Single-property sets as fast as the writer makes them: deltas/s at the slowest
        /// reader, and at the fastest.
        public var slowestPerSecond: Double
        public var fastestPerSecond: Double
        /// Changes the writer made, and the fewest any reader's observers saw (a change repaired
        /// after a later one of its property was applied notifies nothing).
        public var written: Int
        public var fewestSeen: Int
        /// Every reader's node held every change at the end (in both runs): applied it, or took
        /// a snapshot that covers it (a reader further behind than the writer's history).
        public var everyReaderComplete: Bool
        /// Set → remote observer at 1,000 changes/s (storage.fsync always): the median of the
        /// readers' p50s and the worst reader's p99, in microseconds.
        public var latencyP50: Double
        public var latencyP99: Double
    }

    /// Runs single sets, then latency, with one writer and `readers` readers.
    public static func fanOut(executable: String, readers: Int, seconds: Double) async throws -> FanOutFigures {
        let single = try await fanOutRun(executable: executable, readers: readers, mode: .single, seconds: seconds)
        let latency = try await fanOutRun(executable: executable, readers: readers, mode: .latency, seconds: seconds)
        let rates = single.results.map(\.perSecond)
        let p50s = latency.results.map(\.p50).sorted()
        return FanOutFigures(
            readers: readers, slowestPerSecond: rates.min() ?? 0, fastestPerSecond: rates.max() ?? 0,
            written: single.written, fewestSeen: single.results.map(\.count).min() ?? 0,
            everyReaderComplete: (single.results + latency.results).allSatisfy(\.complete),
            latencyP50: p50s.isEmpty ? .nan : p50s[p50s.count / 2],
            latencyP99: latency.results.map(\.p99).max() ?? .nan)
    }

    private static func fanOutRun(
        executable: String, readers count: Int, mode: NodeBenchRole.Mode, seconds: Double
    ) async throws -> (written: Int, results: [TwoProcessResult]) {
        let work = NSTemporaryDirectory() + "statesync-bench-\(UUID().uuidString.prefix(8))"
        defer { try? FileManager.default.removeItem(atPath: work) }
        let ports = try (0...count).map { _ in try port() }
        let endpoint = { (index: Int) in "tcp://127.0.0.1:\(ports[index])" }
        var started: [NodeProcess] = []
        defer { for node in started { node.kill() } }
        // Index 0 is the writer; 1...count the readers.
        for index in 0...count {
            let name = index == 0 ? "writer" : "reader\(index)"
            let peers = index == 0 ? (1...count).map(endpoint) : [endpoint(0)]
            started.append(
                try NodeProcess(
                    executable: executable,
                    arguments: [
                        "bench-node", "--role", index == 0 ? "writer" : "reader", "--mode", mode.rawValue, "--id", name,
                        "--publish", endpoint(index), "--data", "\(work)/\(name)", "--seconds", "\(seconds)",
                        "--rate", mode == .latency ? "1000" : "10000",
                    ] + peers.flatMap { ["--peer", $0] }))
        }
        for node in started where node.lines.next() != "READY" {
            throw StateSyncError(.timeout, "bench: a node process of the fan-out did not start")
        }
        started[0].say("GO")
        let written = started[0].wrote().count
        let results = try started.dropFirst().map { try $0.readerReport() }
        started[0].say("STOP")
        for node in started { _ = node.process.waitUntilExit() }
        return (written, results)
    }
}
