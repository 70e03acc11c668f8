import Foundation
import Logging
import Synchronization

/// `log.format: json`: one JSON object per line on standard error — `ts` (ISO 8601, UTC, ms),
/// `level`, `label`, `message`, `source`, and every metadata key as a string — for log
/// shippers.
struct JSONLogHandler: LogHandler {
    let label: String
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    /// One line is written with one `write(2)`, under a lock shared by every handler, so lines of
    /// concurrent loggers never interleave.
    private static let output = Mutex<Void>(())

    init(label: String) {
        self.label = label
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var object: [String: String] = [:]
        for (key, value) in metadata { object[key] = "\(value)" }
        for (key, value) in event.metadata ?? [:] { object[key] = "\(value)" }
        object["ts"] = Self.timestamp()
        object["level"] = event.level.rawValue
        object["label"] = label
        object["message"] = event.message.description
        object["source"] = event.source
        if let error = event.error { object["error"] = "\(error)" }
        guard
            var data = try? JSONSerialization.data(
                withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
        else { return }
        data.append(0x0A)
        // A failed write (a closed stderr) loses the line, never the daemon.
        Self.output.withLock { _ in try? FileHandle.standardError.write(contentsOf: data) }
    }

    static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var time = tm()
        var seconds = now.tv_sec
        gmtime_r(&seconds, &time)
        return String(
            format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", time.tm_year + 1900, time.tm_mon + 1, time.tm_mday,
            time.tm_hour, time.tm_min, time.tm_sec, now.tv_nsec / 1_000_000)
    }
}
