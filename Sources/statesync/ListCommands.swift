import ArgumentParser
import Foundation
import StateSync
import StateSyncClient

extension StateSyncCLI {
    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "ls",
            abstract: "List the models of a channel: names, property counts, newest versions.",
            discussion: """
                Asks the node page by page (at most 1000 models per reply, in name order) and \
                prints every model, or the first --limit. None prints no line (without --json, \
                stderr says so; the exit status is 0). With security, needs read permission on \
                the channel.
                """)

        @Argument(help: "The channel.")
        var channel: String

        @Option(help: ArgumentHelp("Only models whose names start with this.", valueName: "PREFIX"))
        var prefix: String = ""

        @Option(help: ArgumentHelp("At most this many models.", valueName: "N"))
        var limit: Int?

        @Flag(name: .long, help: "Print one JSON object per line.")
        var json = false

        @OptionGroup var connection: ConnectionOptions

        func validate() throws {
            do { try Names.validateChannel(channel) } catch { throw ValidationError("\(error)") }
            if let limit, limit < 1 { throw ValidationError("--limit must be at least 1") }
        }

        func run() async throws {
            try await failingClearly {
                let client = try connection.client()
                defer { client.close() }
                try await printAll(
                    client, channel: channel, prefix: prefix, limit: limit, json: json, what: "properties")
            }
        }
    }

    struct Channels: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List the channels: names, model counts, newest versions.",
            discussion: "With security, only the channels this client's key may read.")

        @Option(help: ArgumentHelp("Only channels whose names start with this.", valueName: "PREFIX"))
        var prefix: String = ""

        @Flag(name: .long, help: "Print one JSON object per line.")
        var json = false

        @OptionGroup var connection: ConnectionOptions

        func run() async throws {
            try await failingClearly {
                let client = try connection.client()
                defer { client.close() }
                try await printAll(client, channel: nil, prefix: prefix, limit: nil, json: json, what: "models")
            }
        }
    }
}

/// Pages through a LIST and prints each entry as it arrives.
private func printAll(
    _ client: StateSyncClient, channel: String?, prefix: String, limit: Int?, json: Bool, what: String
) async throws {
    let singular = what == "properties" ? "property" : String(what.dropLast())
    var after = ""
    var printed = 0
    while true {
        let page = try await client.list(
            channel: channel, prefix: prefix, after: after,
            limit: min(ClientProtocol.ListRequest.maximumLimit, (limit ?? Int.max) - printed))
        for entry in page.entries {
            if json {
                emit(
                    Value.map([
                        "name": .string(entry.name), what: .int(Int64(entry.count)),
                        "latest_version": .string(entry.latest.description),
                    ]).jsonText())
            } else {
                emit("\(entry.name)  \(entry.count) \(entry.count == 1 ? singular : what)  [\(entry.latest)]")
            }
        }
        printed += page.entries.count
        if printed == 0 && !json {
            // Nothing on stdout (a script reads no lines); a person is told why.
            let which = prefix.isEmpty ? "" : " whose names start with '\(prefix)'"
            let none = channel.map { "no models\(which) in channel '\($0)'" } ?? "no channels\(which)"
            FileHandle.standardError.write(Data("statesync: \(none)\n".utf8))
        }
        guard page.more, let last = page.entries.last, printed < (limit ?? Int.max) else { return }
        after = last.name
    }
}
