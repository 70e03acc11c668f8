import Logging
import Synchronization
import Testing

@testable import StateSync

/// Log lines a test can read.
final class CapturedLogs: Sendable {
    struct Line: Sendable {
        let level: Logger.Level
        let message: String
        let metadata: [String: String]
    }

    private let lines = Mutex<[Line]>([])
    var all: [Line] { lines.withLock { $0 } }

    var logger: Logger {
        Logger(label: "captured", factory: { _ in Handler(logs: self) })
    }

    struct Handler: LogHandler {
        let logs: CapturedLogs
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let fields = (event.metadata ?? [:]).mapValues { "\($0)" }
            logs.lines.withLock { $0.append(Line(level: event.level, message: "\(event.message)", metadata: fields)) }
        }
    }
}

/// Bad input is logged at a limited rate and every suppressed line is accounted for
/// (PROTOCOL.md section 12), on the node machine alone.
@Suite("Malformed input in the logs")
struct MalformedInputLogTests {
    /// The limiter: one line per kind per second; the tail of a burst is reported once its
    /// second is over, not only with the next line of the kind.
    @Test func theLimiterReportsTheTailOfABurst() {
        var limiter = LogLimiter()
        #expect(limiter.allow("k", now: 1) == 0)
        for time in 2...6 as ClosedRange<UInt64> { #expect(limiter.allow("k", now: time) == nil) }
        #expect(limiter.closedWindows(now: 500).isEmpty, "the second is not over")
        let closed = limiter.closedWindows(now: 1001)
        #expect(closed.count == 1 && closed.first?.kind == "k" && closed.first?.suppressed == 5)
        #expect(limiter.closedWindows(now: 5000).isEmpty, "reported once")
        #expect(limiter.allow("k", now: 5001) == 0)
    }

    /// A burst of malformed client requests is counted in full, logged at once, and its tail
    /// reported a second later: the log accounts for every one.
    @Test func aBurstOfMalformedClientRequestsIsLoggedAndAccountedFor() throws {
        let logs = CapturedLogs()
        var node = MachineRunner(MachineRunner.configuration("n1"), logger: logs.logger)
        let burst = 5000
        for index in 0..<burst {
            let frames: [[UInt8]] = index.isMultiple(of: 2) ? [[1, 2, 3]] : [[0x01], []]  // no body; a short header
            node.handle(.clientRequest(client: [0x53, UInt8(index % 200)], frames: frames))
        }
        #expect(node.machine.counters.malformedMessages == burst)
        node.advance(1000)
        let lines = logs.all.filter {
            $0.metadata["kind"] == "malformed-client-message"
                || ($0.metadata["kind"] == nil && $0.metadata["client"] != nil)
        }
        let logged = lines.filter { $0.metadata["kind"] == nil }.count
        let suppressed = lines.compactMap { Int($0.metadata["suppressed"] ?? "") }.reduce(0, +)
        #expect(logged >= 1, "logged, not only counted")
        #expect(
            logged + suppressed == burst, "every one is in the log, as a line or in a count: \(lines.map(\.message))")
    }
}

/// A node without security warns once, at start, when it binds an address others can reach.
@Suite("Exposure warning")
struct ExposureWarningTests {
    @Test func loopbackIsQuietAndAnythingElseWarnsOnce() {
        #expect(NodeMachine.isLoopbackOnly("tcp://127.0.0.1:7001"))
        #expect(NodeMachine.isLoopbackOnly("tcp://localhost:7001") && NodeMachine.isLoopbackOnly("tcp://[::1]:7001"))
        #expect(NodeMachine.isLoopbackOnly("ipc:///tmp/x") && NodeMachine.isLoopbackOnly("inproc://x"))
        #expect(!NodeMachine.isLoopbackOnly("tcp://*:7001") && !NodeMachine.isLoopbackOnly("tcp://0.0.0.0:7001"))
        #expect(!NodeMachine.isLoopbackOnly("tcp://10.0.0.2:7001") && !NodeMachine.isLoopbackOnly("tcp://eth0:7001"))

        func warnings(publish: String, repair: String) -> [CapturedLogs.Line] {
            let logs = CapturedLogs()
            var node = MachineRunner(MachineRunner.configuration("n1"), logger: logs.logger)
            node.handle(.endpointsBound(publish: publish, repair: repair))
            node.advance(5000)
            return logs.all.filter { $0.level == .warning && $0.message.contains("without security") }
        }
        #expect(warnings(publish: "tcp://127.0.0.1:7001", repair: "tcp://127.0.0.1:7101").isEmpty)
        let exposed = warnings(publish: "tcp://0.0.0.0:7001", repair: "tcp://127.0.0.1:7101")
        #expect(exposed.count == 1)
        #expect(exposed.first?.metadata["endpoints"] == "tcp://0.0.0.0:7001")
    }
}
