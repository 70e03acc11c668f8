import ArgumentParser
import Foundation
import StateSync
import StateSyncClient
import Synchronization

/// `statesync`: the command-line client of a StateSync node.
@main
struct StateSyncCLI: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "statesync",
        abstract: "Get, set and watch replicated models on a StateSync node.",
        discussion: """
            The node is chosen with --daemon (default: $STATESYNC_DAEMON, else tcp://127.0.0.1:7101), \
            given before or after the subcommand. Shell completion: statesync \
            --generate-completion-script bash (or zsh, fish).
            """,
        subcommands: [
            Set.self, Delete.self, Get.self, Watch.self, List.self, Channels.self, Status.self, Members.self,
            Forget.self,
            Keygen.self, ViewTokenCommand.self,
            Harness.self,
            Simulate.self,
            Bench.self,
            BenchNode.self,
        ])

    /// Runs the command line with the common options given before the subcommand moved after it
    /// (`statesync --daemon X get m/c` works as `statesync get m/c --daemon X`).
    static func main() async {
        await main(hoistingCommonOptions(Array(CommandLine.arguments.dropFirst())))
    }

    /// The options of ``ConnectionOptions``, which every node command takes.
    static let commonOptions: Swift.Set<String> = ["--daemon", "--timeout", "--key", "--server-key"]

    /// `arguments` with the common options (`--daemon X` or `--daemon=X`) that come before the
    /// subcommand moved to right after it; anything else is left as it is.
    static func hoistingCommonOptions(_ arguments: [String]) -> [String] {
        var leading: [String] = []
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            let name = String(argument.split(separator: "=", maxSplits: 1).first ?? "")
            guard commonOptions.contains(name) else { break }
            if argument.contains("=") {
                leading.append(argument)
                index += 1
            } else {
                guard index + 1 < arguments.count else { break }
                leading += [argument, arguments[index + 1]]
                index += 2
            }
        }
        guard !leading.isEmpty, index < arguments.count else { return arguments }
        // `statesync --daemon X --help`: the help, not an unknown option.
        if ["--help", "-h", "help"].contains(arguments[index]) { return Array(arguments[index...]) }
        guard !arguments[index].hasPrefix("-") else { return arguments }
        return [arguments[index]] + leading + arguments[(index + 1)...]
    }
}

/// Options every subcommand shares: which node, how long to wait for it.
struct ConnectionOptions: ParsableArguments {
    @Option(
        name: .long,
        help: ArgumentHelp("The node's client API endpoint ($STATESYNC_DAEMON when set).", valueName: "ENDPOINT"))
    var daemon: String = ProcessInfo.processInfo.environment["STATESYNC_DAEMON"] ?? "tcp://127.0.0.1:7101"

    @Option(name: .long, help: ArgumentHelp("Seconds to wait for the node to answer.", valueName: "SECONDS"))
    var timeout: Double = 5

    @Option(
        name: .long,
        help: ArgumentHelp(
            "With a secured node: this client's secret key file (statesync keygen; default: $STATESYNC_KEY).",
            valueName: "PATH"))
    var key: String?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "With a secured node: the node's public key, as Z85 text or its .pub file (default: $STATESYNC_SERVER_KEY).",
            valueName: "KEY|PATH"))
    var serverKey: String?

    /// The options, else their environment variables.
    var secretKeyFile: String? { key ?? ProcessInfo.processInfo.environment["STATESYNC_KEY"] }
    var nodeKey: String? { serverKey ?? ProcessInfo.processInfo.environment["STATESYNC_SERVER_KEY"] }

    func validate() throws {
        guard timeout > 0, timeout <= 3600 else {
            throw ValidationError("--timeout must be above 0 and at most 3600 seconds (\(timeout) given)")
        }
        if let problem = NodeConfiguration.endpointProblem(daemon) { throw ValidationError("--daemon: \(problem)") }
        if (secretKeyFile == nil) != (nodeKey == nil) {
            throw ValidationError(
                "a secured node needs both --key (this client's secret key) and --server-key (the node's public key)")
        }
    }

    func client() throws -> StateSyncClient {
        try StateSyncClient(
            endpoint: daemon, requestTimeout: .milliseconds(Int(timeout * 1000)),
            security: secretKeyFile.map { StateSyncClient.Security(serverKey: nodeKey ?? "", secretKeyFile: $0) })
    }
}

/// Prints one clear line on stderr and exits 1 for every failure of a command's body.
func failingClearly(_ body: () async throws -> Void) async throws {
    do {
        try await body()
    } catch let error as ExitCode {
        throw error
    } catch let error as ValidationError {
        // Bad arguments found once the command runs (what --stdin held): exit 64, as the
        // parser's own.
        FileHandle.standardError.write(Data("statesync: \(error.message)\n".utf8))
        throw ExitCode(64)
    } catch {
        FileHandle.standardError.write(Data("statesync: \(error)\n".utf8))
        throw ExitCode(1)
    }
}

/// The path of this `statesync` executable (the bench starts node processes of it).
func currentExecutable() -> String {
    (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
}

/// The `statesyncd` next to this `statesync` (the harness and `bench --join --daemons` start it).
func siblingDaemon() -> String {
    URL(fileURLWithPath: currentExecutable()).deletingLastPathComponent().appendingPathComponent("statesyncd").path
}

/// Writes a line to stdout and flushes it (watch output goes to pipes line by line).
func emit(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// Writes a `--report` page; a file that cannot be written is an error that names it (exit 2).
func writeReport(_ html: String, to path: String) throws {
    do {
        try html.write(toFile: path, atomically: true, encoding: .utf8)
        FileHandle.standardError.write(Data("statesync: report written to \(path)\n".utf8))
    } catch {
        FileHandle.standardError.write(
            Data("statesync: cannot write the report to \(path): \(error.localizedDescription)\n".utf8))
        throw ExitCode(2)
    }
}

/// Parses a duration with its unit — `500ms`, `30s`, `2m`, `1h`, `1d`, fractions allowed
/// (`1.5s`) — into milliseconds (at least 1).
func parseDuration(_ text: String, option: String) throws -> UInt64 {
    let units: [(String, Double)] = [("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)]
    for (unit, scale) in units where text.hasSuffix(unit) {
        let number = text.dropLast(unit.count)
        // "ms" also ends in "s": a number before it is needed for "s" to be the unit.
        guard let value = Double(number), value.isFinite else { continue }
        guard value > 0 else {
            throw ValidationError("\(option) \(text) must be above 0 (a value that should go, delete it)")
        }
        let milliseconds = (value * scale).rounded(.up)
        guard milliseconds <= Double(PropertyWrite.maximumTimeToLive) else {
            throw ValidationError("\(option) \(text) is too long")
        }
        return UInt64(milliseconds)
    }
    throw ValidationError("\(option) '\(text)' is not a duration with a unit (500ms, 30s, 2m, 1h, 1d)")
}

/// Parses `CHANNEL/MODEL`.
func parseAddress(_ text: String) throws -> ModelAddress {
    guard let slash = text.firstIndex(of: "/") else {
        throw ValidationError("'\(text)' is not CHANNEL/MODEL (e.g. demo/greeting)")
    }
    let address = ModelAddress(channel: String(text[..<slash]), model: String(text[text.index(after: slash)...]))
    do {
        try Names.validateChannel(address.channel)
        try Names.validateModel(address.model)
    } catch {
        throw ValidationError("'\(text)': \(error)")
    }
    return address
}

/// Prints the outcome of a SET or DELETE: its version, and why when it changed nothing.
func report(_ result: StateSyncClient.SetResult, json: Bool, unchanged: String) {
    if json {
        let outcome =
            switch result.outcome {
            case .changed: "changed"
            case .unchanged: "unchanged"
            case .superseded: "superseded"
            }
        emit(Value.map(["version": .string(result.version.description), "outcome": .string(outcome)]).jsonText())
        return
    }
    switch result.outcome {
    case .changed: emit("\(result.version)")
    case .unchanged: emit("\(result.version) (unchanged: \(unchanged))")
    case .superseded:
        emit("\(result.version) (superseded: the node holds a newer version; check peers' clocks)")
    }
}

extension StateSyncCLI {
    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write properties of one model as one delta; prints the new version.",
            discussion: """
                Each PROP=JSON assigns a JSON value: count=3, title='"hello"', tags='["a","b"]', \
                cleared=null. PROP=@FILE reads the JSON value from FILE; --stdin reads one JSON object \
                of properties from standard input (for values too large for an argument list). \
                One write travels in one message, at most 64 MiB: a larger one is refused before \
                it is sent. With --ttl the properties written expire that long after the write's version: every \
                node deletes them then (a model whose last property expires is gone); setting them \
                again renews it, and setting them without --ttl keeps them for good. \
                Returns once the node has applied the write.
                """)

        @Argument(help: ArgumentHelp("The model to write.", valueName: "CHANNEL/MODEL"))
        var model: String

        @Argument(
            help: ArgumentHelp("Properties to assign (PROP=@FILE: the value is in FILE).", valueName: "PROP=JSON"))
        var assignments: [String] = []

        @Flag(name: .long, help: "Also read one JSON object of PROP: value pairs from standard input.")
        var stdin = false

        @Flag(name: .long, help: "Print one JSON object: the version and the outcome.")
        var json = false

        // Unconditional: `--ttl -1s` reaches the duration's check ("must be above 0") instead of
        // being taken for an option.
        @Option(
            parsing: .unconditional,
            help: ArgumentHelp(
                "Time to live of the properties written (500ms, 30s, 2m, 1h, 1d): then every node deletes them.",
                valueName: "DURATION"))
        var ttl: String?

        @OptionGroup var connection: ConnectionOptions

        func validate() throws {
            _ = try parseAddress(model)
            if let ttl { _ = try parseDuration(ttl, option: "--ttl") }
            guard !assignments.isEmpty || stdin else {
                throw ValidationError("give at least one PROP=JSON (or --stdin)")
            }
            _ = try parseAssignments()  // the arguments; --stdin is read and checked in run()
        }

        /// When the argument before `argument` looks like an option this command does not take
        /// (`--tll 30s`): the parser reads the value as an assignment and this check runs first.
        static func unknownOptionHint(before argument: String) -> String {
            let arguments = CommandLine.arguments
            guard let index = arguments.firstIndex(of: argument), index > 1 else { return "" }
            let previous = arguments[index - 1]
            guard previous.hasPrefix("-"), previous != "--", !["--stdin", "--json"].contains(previous) else {
                return ""
            }
            return "; '\(previous)' before it is not an option of statesync set (see statesync set --help)"
        }

        func parseAssignments(standardInput: String? = nil) throws -> [PropertyWrite] {
            let timeToLive = try ttl.map { try parseDuration($0, option: "--ttl") } ?? 0
            var seen = Swift.Set<String>()
            var writes = try assignments.map { assignment in
                guard let equals = assignment.firstIndex(of: "="), equals != assignment.startIndex else {
                    throw ValidationError(
                        "'\(assignment)' is not PROP=JSON (e.g. count=3 or title='\"hello\"')"
                            + Self.unknownOptionHint(before: assignment))
                }
                let name = String(assignment[..<equals])
                var json = String(assignment[assignment.index(after: equals)...])
                guard seen.insert(name).inserted else { throw ValidationError("property '\(name)' is given twice") }
                let fromFile = json.hasPrefix("@")
                if fromFile {
                    let path = String(json.dropFirst())
                    guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
                        throw ValidationError("value of '\(name)': cannot read \(path)")
                    }
                    json = text
                }
                do {
                    return PropertyWrite(name: name, value: try Value(json: json), timeToLive: timeToLive)
                } catch {
                    // A bare word was meant as a string: say how to quote it. JSON that is only
                    // malformed (or a file's) gets the parser's reason alone.
                    let bare =
                        !fromFile && json.first.map { !"{[\"-0123456789".contains($0) } ?? false
                        && !["true", "false", "null"].contains(json) && !json.contains("\"") && json.count <= 40
                    throw ValidationError(
                        "value of '\(name)': \(error)\(bare ? " (a string needs JSON quotes: \(name)='\"\(json)\"')" : "")"
                    )
                }
            }
            if let standardInput {
                let object: Value
                do {
                    object = try Value(json: standardInput)
                } catch {
                    throw ValidationError("--stdin: \(error)")
                }
                guard case .map(let properties) = object, !properties.isEmpty else {
                    throw ValidationError("--stdin: give one JSON object of PROP: value pairs, e.g. {\"count\": 3}")
                }
                for (name, value) in properties.sorted(by: { $0.key < $1.key }) {
                    guard seen.insert(name).inserted else {
                        throw ValidationError("property '\(name)' is given twice (argument and --stdin)")
                    }
                    writes.append(PropertyWrite(name: name, value: value, timeToLive: timeToLive))
                }
            }
            return writes
        }

        func run() async throws {
            try await failingClearly {
                let client = try connection.client()
                defer { client.close() }
                let input =
                    stdin ? String(decoding: FileHandle.standardInput.readDataToEndOfFile(), as: UTF8.self) : nil
                let result = try await client.set(try parseAddress(model), try parseAssignments(standardInput: input))
                report(result, json: json, unchanged: "every value was already current")
            }
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete properties of one model, or the whole model; prints the deletion's version.",
            discussion: """
                With PROP names, deletes those properties; with none, deletes the model: every \
                property written before the deletion, on every node. A deletion is a versioned write: \
                a concurrent set with a later version wins over it on every node, and a later set \
                re-creates what it deleted. Watches report it with kind "deleted" and the old value. \
                It is always written, also of what the node holds deleted or never saw (an older \
                write of it may still be on its way), so it answers "changed" with its version there too.
                """)

        @Argument(help: ArgumentHelp("The model.", valueName: "CHANNEL/MODEL"))
        var model: String

        @Argument(help: ArgumentHelp("Properties to delete (none: the whole model).", valueName: "PROP"))
        var properties: [String] = []

        @Flag(name: .long, help: "Print one JSON object: the version and the outcome.")
        var json = false

        @OptionGroup var connection: ConnectionOptions

        func validate() throws {
            _ = try parseAddress(model)
            var seen = Swift.Set<String>()
            for property in properties {
                do { try Names.validateProperty(property) } catch { throw ValidationError("\(error)") }
                guard seen.insert(property).inserted else {
                    throw ValidationError("property '\(property)' is given twice")
                }
            }
        }

        func run() async throws {
            try await failingClearly {
                let client = try connection.client()
                defer { client.close() }
                let result = try await client.delete(try parseAddress(model), properties: properties)
                report(
                    result, json: json,
                    unchanged: properties.isEmpty
                        ? "the model has no property with a value" : "nothing named has a value")
            }
        }
    }

    struct Get: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the current properties of one model.")

        @Argument(help: ArgumentHelp("The model to read.", valueName: "CHANNEL/MODEL"))
        var model: String

        @Flag(name: .long, help: "Print one JSON object.")
        var json = false

        @OptionGroup var connection: ConnectionOptions

        func validate() throws { _ = try parseAddress(model) }

        func run() async throws {
            try await failingClearly {
                let client = try connection.client()
                defer { client.close() }
                let address = try parseAddress(model)
                let properties = try await client.get(address)
                if json {
                    let object: Value = .map([
                        "channel": .string(address.channel), "model": .string(address.model),
                        "properties": .map(properties.mapValues(\.value)),
                        "versions": .map(properties.mapValues { .string($0.version.description) }),
                        "expires_at": .map(properties.compactMapValues { $0.expiresAt.map { .int(Int64($0)) } }),
                    ])
                    emit(object.jsonText())
                } else if properties.isEmpty {
                    emit("\(address): no properties")
                } else {
                    let now = UInt64(Date().timeIntervalSince1970 * 1000)
                    for name in properties.keys.sorted() {
                        let register = properties[name]!
                        let expiry = register.expiresAt.map { at in
                            at > now ? "  (expires in \(Double(at - now) / 1000) s)" : "  (expiring)"
                        }
                        emit("\(name) = \(register.value.jsonText())  [\(register.version)]\(expiry ?? "")")
                    }
                }
            }
        }
    }

    struct Watch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print one line per change applied to a channel's models, until interrupted.",
            discussion: """
                First the channel's current state (lines marked initial), then every change, with \
                old and new values. With --json each line is an object with channel, model, \
                property, old, new, version, origin, kind (initial | live | deleted | expired | \
                resync), deleted (true when the property has no value after it: new is null), \
                expires_at (milliseconds since 1970, for a value written with a time to live) and \
                cursor.

                To resume after an interruption — on this node or any other — pass the last \
                cursor printed: --from CURSOR delivers every change after it, then the live ones. \
                A fresh process does not hold the earlier state: the first change of each \
                property after resuming shows old as null, a deletion of what was set before the \
                cursor is printed with old null (a whole model's also as one line with an empty \
                property), a write that lost on the node to one made before the cursor is printed \
                as if it won, a value set before the cursor that expires after it is not printed, \
                and a change the earlier watch got out of order (above a gap that was being \
                repaired) can be printed again (--state FILE has none of these caveats). If the \
                node's history no longer reaches back to the cursor, it says so and sends the \
                current state as a resync instead of skipping anything (deletions and expiries it \
                holds included, with old null). A cursor naming more of the node's own writes \
                than it has numbered (another cluster's, or from before its data directory was \
                emptied) is refused: exit 1. If the node drops its \
                state (it was forgotten while away and came back), it says so too, and its state \
                replaces what the watch printed: resync lines, values going back to older ones or \
                away included.

                --state FILE keeps what the watch printed in FILE: started again with the same \
                FILE, on this node or another, it resumes after the last line printed with exact \
                old values. The file is saved at most every 200 ms while changes print, at the next \
                marker, and on SIGINT/SIGTERM; after a kill -9 the lines of up to the last second \
                can print again, none is skipped.

                If the node stops (it says so at once), the connection is lost or the node \
                restarts, the watch ends with exit 1 and prints the cursor to resume from.

                SIGINT and SIGTERM end the watch after printing the lines it holds and (without \
                --state) "resume with --from CURSOR" on stderr; if standard \
                output is not being read (a paused pager), it waits at most a second for it, then \
                says on stderr what was not written and exits (130 or 143).
                """)

        @Argument(help: "The channel to watch.")
        var channel: String

        @Flag(name: .long, help: "Print one JSON object per line.")
        var json = false

        @Option(
            help: ArgumentHelp("Resume after this cursor (as printed in a watch's JSON lines).", valueName: "CURSOR"))
        var from: String?

        @Flag(help: "Also print markers (initial state complete, caught up) as lines.")
        var markers = false

        @Option(
            help: ArgumentHelp(
                "Keep what this watch printed in FILE and resume from it when started again (exact old values).",
                valueName: "FILE"))
        var state: String?

        @Option(
            help: ArgumentHelp(
                "Only models whose ids start with this (resume such a watch with --from only under the same filter).",
                valueName: "PREFIX"))
        var prefix: String?

        @Option(
            name: .customLong("property"),
            help: ArgumentHelp("Only this property (repeat for several).", valueName: "NAME"))
        var properties: [String] = []

        @Flag(name: .customLong("no-initial"), help: "Do not start with the channel's current state: changes only.")
        var noInitial = false

        var filter: ClientProtocol.WatchFilter? {
            guard prefix != nil || !properties.isEmpty || noInitial else { return nil }
            return .init(
                prefix: prefix ?? "", properties: properties.isEmpty ? nil : Swift.Set(properties),
                initialState: !noInitial)
        }

        @Option(
            name: .customLong("on-lag"),
            help: ArgumentHelp(
                "If this watch falls behind the node's history: resync (send the current state) or end (exit 1).",
                valueName: "resync|end"))
        var onLag: String = "resync"

        @OptionGroup var connection: ConnectionOptions

        func validate() throws {
            do { try Names.validateChannel(channel) } catch { throw ValidationError("\(error)") }
            guard ["resync", "end"].contains(onLag) else { throw ValidationError("--on-lag must be resync or end") }
            if state != nil, from != nil { throw ValidationError("--state resumes from its own cursor: drop --from") }
            for property in properties {
                do { try Names.validateProperty(property) } catch { throw ValidationError("--property: \(error)") }
            }
            // A filtered watch's cursor moves over what its filter leaves out: resumed without the
            // same filter it would never get that part. The state file does not record a filter.
            if state != nil, filter != nil {
                throw ValidationError("--state keeps unfiltered watches only: drop --prefix/--property/--no-initial")
            }
            if let from, WatchCursor(from) == nil {
                if Version(from) != nil {
                    throw ValidationError(
                        "--from takes a cursor (the \"cursor\" of a watch's JSON line, like n1:12,n2:7), not a version: with many writers, no single version orders changes the same way on every node"
                    )
                }
                throw ValidationError("--from '\(from)' is not a cursor (origin:sequence pairs, like n1:12,n2:7)")
            }
        }

        func run() async throws {
            try await failingClearly {
                let client = try connection.client()
                defer { client.close() }
                let saved = try state.map { try WatchState(path: $0, channel: channel) }
                let replica =
                    saved?.liveReplica
                    ?? from.flatMap(WatchCursor.init).map { ChannelReplica(channel: channel, cursor: $0) }
                let (batches, watched) = try await client.watchInBatches(
                    channel: channel, replica: replica, onLag: onLag == "end" ? .end : .resync, filter: filter)
                FileHandle.standardError.write(Data("statesync: watching \(channel) on \(connection.daemon)\n".utf8))
                // Without --state, the lines of the events that arrived together are written at
                // once; with it, a line counts as printed once written (WatchState).
                let output = LineOutput(batched: saved == nil)
                // The cursor after the last line shown (not the replica's: it may be past lines
                // still to be shown when a signal comes).
                let shownThrough = Mutex<WatchCursor?>(nil)
                // SIGINT and SIGTERM: with --state, save what was printed; without, print what is
                // queued (for at most a second: a reader that stopped reading must not keep the
                // watch from ending) and, if all of it went, the cursor to resume from; then the
                // process ends.
                var signals: [any DispatchSourceSignal] = []
                for number in [SIGINT, SIGTERM] {
                    signal(number, SIG_IGN)
                    let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
                    source.setEventHandler {
                        saved?.saveAndExit()
                        if output.flushBeforeExit(within: .seconds(1)), let cursor = shownThrough.withLock({ $0 }) {
                            FileHandle.standardError.write(Data("statesync: resume with --from \(cursor)\n".utf8))
                        }
                        _exit(128 + number)
                    }
                    source.resume()
                    signals.append(source)
                }
                defer { for source in signals { source.cancel() } }
                do {
                    for try await batch in batches {
                        for event in batch {
                            if let saved {
                                saved.printing(event) { show(event, to: output) }
                            } else {
                                show(event, to: output)
                                if let cursor = Self.resumeCursor(after: event) {
                                    shownThrough.withLock { $0 = cursor }
                                }
                            }
                        }
                        output.flush()
                    }
                    output.flush()
                    saved?.saveNow()
                } catch {
                    output.flush()
                    saved?.saveNow()
                    let resume =
                        saved.map { "resume with --state \($0.path)" } ?? "resume with --from \(watched.cursor)"
                    throw StateSyncError(.connectionLost, "\(error); \(resume)")
                }
            }
        }

        /// The cursor a watch shown through `event` resumes from, when the event moves it: a live
        /// change, or the end of a snapshot or a caught-up marker (initial and resync lines carry
        /// the cursor from before their snapshot).
        static func resumeCursor(after event: WatchEvent) -> WatchCursor? {
            switch event {
            case .change(_, let kind, let cursor): kind == .live ? cursor : nil
            case .initialStateComplete(_, let cursor), .resyncComplete(_, let cursor), .caughtUp(let cursor, _, _):
                cursor
            case .resyncStarted: nil
            }
        }

        /// Prints `event` to `output`, which is flushed before anything goes to stderr, so the two
        /// keep their order.
        func show(_ event: WatchEvent, to output: LineOutput) {
            switch event {
            case .change(let change, let kind, let cursor):
                if json {
                    output.print { change.writeWatchJSONLine(kind: kind, cursor: cursor, into: &$0) }
                } else {
                    output.print(Self.human(change, kind: kind))
                }
            case .initialStateComplete(let records, let cursor):
                marker(
                    output, "initial", "initial state complete: \(records) properties",
                    ["records": .int(Int64(records)), "cursor": .string(cursor.description)])
            case .resyncStarted(let reason):
                let why =
                    switch reason {
                    case .lagged: "this watch fell behind the node's history, or the node merged a peer's snapshot"
                    case .historyGone: "the node's history no longer reaches back to the cursor"
                    case .reset:
                        "the node dropped its state and took a peer's (it was forgotten); values can go back or away"
                    }
                output.flush()
                FileHandle.standardError.write(
                    Data("statesync: resync: \(why); the current state follows as changes marked resync\n".utf8))
                marker(
                    output, "resync", "resync started",
                    ["reason": .string(Self.reasonName(reason))],
                    always: false)
            case .resyncComplete(let records, let cursor):
                marker(
                    output, "resynced", "resync complete: \(records) properties",
                    ["records": .int(Int64(records)), "cursor": .string(cursor.description)])
            case .caughtUp(let cursor, let latest, let missing):
                marker(
                    output, "caught_up",
                    "caught up to \(latest?.description ?? "nothing yet")\(missing > 0 ? " (node still missing \(missing) deltas)" : "")",
                    [
                        "cursor": .string(cursor.description),
                        "latest": latest.map { .string($0.description) } ?? .null, "node_missing": .int(Int64(missing)),
                    ])
            }
        }

        func marker(
            _ output: LineOutput, _ kind: String, _ text: String, _ fields: [String: Value], always: Bool = false
        ) {
            guard markers || always else { return }
            if json {
                var map = fields
                map["marker"] = .string(kind)
                map["channel"] = .string(channel)
                output.print(Value.map(map).jsonText())
            } else {
                output.print("-- \(text)")
            }
        }

        /// A resync's reason as the JSON marker names it.
        static func reasonName(_ reason: WatchEvent.ResyncReason) -> String {
            switch reason {
            case .lagged: "lagged"
            case .historyGone: "history_gone"
            case .reset: "reset"
            }
        }

        static func human(_ change: PropertyChange, kind: WatchEvent.Kind) -> String {
            let new = change.isRemoval ? "(\(change.kind.rawValue))" : change.new.jsonText()
            // A live change has no tag: a live deletion or expiry says so once, as its new value.
            let tag = kind == .live ? "" : " (\(change.watchKindName(kind)))"
            // A whole model's deletion that a watch resumed from a cursor alone cannot name the
            // properties of (it never saw them): one line for the model.
            let property = change.property.isEmpty && change.byModelDeletion ? "(the whole model)" : change.property
            return
                "\(change.channel)/\(change.model) \(property): \(change.old?.jsonText() ?? "null") -> \(new)  [\(change.version)]\(tag)"
        }
    }

    struct Status: AsyncParsableCommand {
        /// What the deletions line says of the member collection waits for: some member always
        /// has the oldest floor, which is normal while it is alive (and not worth a word while no
        /// deletion is held); one that is not holds collection back until it is back or
        /// forgotten.
        static func collectionFollows(_ holder: String, state: String?, node: String, tombstones: Int) -> String {
            switch state {
            case "alive", nil:
                tombstones == 0
                    ? ""
                    : holder == node
                        ? " (as far as this node allows: it is the member furthest behind, which is normal)"
                        : " (as far as \(holder) allows: the member furthest behind, which is normal)"
            default:
                " (held back by \(holder), \(state ?? "unknown"): nothing newer is collected until it is back, or forgotten)"
            }
        }

        static let configuration = CommandConfiguration(
            abstract: "Print the node's id, storage policy, peers, channels and latest version.",
            discussion: """
                A node settling after a power loss names the peers whose answer it still waits for, \
                and which of them it cannot reach. Exits 0 when the node answers. With --ready, exits 3 unless the node is ready: every \
                configured peer and known member (but those that left or were forgotten) connected, \
                every connected peer knowing this node (it takes a peer's deltas only then, \
                docs/PROTOCOL.md 7.5), no deltas known but missing, the disk not full, and not \
                settling after a power loss or a damaged log (docs/PROTOCOL.md 11.2). The HTTP listener's /readyz says \
                the same.
                """)

        @Flag(name: .long, help: "Print one JSON object.")
        var json = false

        @Flag(
            name: .long,
            help:
                "Exit 3 unless the node is ready (peers connected and knowing this node, caught up, disk not full, not settling)."
        )
        var ready = false

        @OptionGroup var connection: ConnectionOptions

        func run() async throws {
            try await failingClearly {
                let client = try connection.client()
                defer { client.close() }
                let status = try await client.status()
                let reasons = status.notReadyReasons
                defer {
                    if ready, !reasons.isEmpty {
                        FileHandle.standardError.write(
                            Data("statesync: not ready: \(reasons.joined(separator: "; "))\n".utf8))
                    }
                }
                if ready, !reasons.isEmpty {
                    if json { emit(status.value.jsonText()) }
                    throw ExitCode(3)
                }
                if json {
                    emit(status.value.jsonText())
                    return
                }
                emit("node:      \(status.node) (incarnation \(String(status.incarnation, radix: 16)))")
                emit("publish:   \(status.publishEndpoint)")
                emit("api:       \(status.apiEndpoint ?? "-")")
                emit(
                    "version:   \(status.latestVersion?.description ?? "none yet")  (sequence \(status.latestSequence))"
                )
                emit("digest:    \(String(status.stateDigest, radix: 16))")
                if let storage = status.storage { emit("storage:   fsync \(storage.description)") }
                let horizon =
                    status.collectedThrough == 0
                    ? "none collected yet"
                    : "collected through \(status.collectedThrough >> 16).\(status.collectedThrough & 0xFFFF)"
                // A member's id, or the endpoint of a peer not heard from yet (just started). The
                // node works this out once a heartbeat interval: the peer may be connected by now.
                let heldBy = status.collectionHeldBy.map { holder in
                    holder.contains("://")
                        ? " (held back: the peer at \(holder) was not heard from yet at the last check)"
                        : Self.collectionFollows(
                            holder, state: status.members.first { $0.id == holder }?.state, node: status.node,
                            tombstones: status.tombstones)
                }
                emit("deletions: \(status.tombstones) held, \(horizon)\(heldBy ?? "")")
                let alive = status.members.filter { $0.state == "alive" }.count
                emit("members:   \(status.members.count) known, \(alive) alive (statesync members)")
                emit("peers:")
                if status.peers.isEmpty { emit("  (none)") }
                for peer in status.peers {
                    let seen = peer.lastSeenMillisecondsAgo.map { "last seen \($0) ms ago" } ?? "never seen"
                    emit(
                        "  \(peer.endpoint)  \(peer.node ?? "?")  \(peer.connected ? (peer.knowsThisNode ? "connected" : "connected, does not know this node yet") : "NOT CONNECTED")  \(seen)"
                    )
                }
                emit("channels:")
                if status.channels.isEmpty { emit("  (none)") }
                for name in status.channels.keys.sorted() { emit("  \(name): \(status.channels[name]!) models") }
                emit(
                    "missing:   \(status.missingDeltas) deltas known but not yet received (repair in progress when > 0)"
                )
                emit(
                    "watchers:  \(status.watchers)\(status.laggingWatches > 0 ? " (\(status.laggingWatches) lagging)" : "")"
                )
                if status.diskFull {
                    emit(
                        "disk:      FULL (\(status.diskFreeBytes.map(String.init) ?? "?") bytes free, under storage.reserve_bytes): writes are refused"
                    )
                }
                if status.settling {
                    emit(
                        "settling:  after a power loss or a damaged log: \(status.writesHeld) writes held until every peer has said which of this node's deltas it holds (docs/PROTOCOL.md 11.2)\(status.settlingWaitsText)"
                    )
                }
                for (id, endpoints) in status.duplicateNodeIDs.sorted(by: { $0.key < $1.key }) {
                    emit(
                        "DUPLICATE: two nodes run under node id \(id) (publishing at \(endpoints.joined(separator: ", "))): they number writes over each other's, and writes may be lost; give one of them another node.id"
                    )
                }
                if !status.divergedPeers.isEmpty {
                    emit(
                        "DIVERGED:  this node's state differs from \(status.divergedPeers.joined(separator: ", "))'s although both hold the same deltas of every origin (docs/PROTOCOL.md 11.4); see both nodes' logs"
                    )
                }
                if !status.refusedKeys.isEmpty {
                    emit(
                        "refused:   "
                            + status.refusedKeys.sorted { $0.key < $1.key }.map { "key \($0.key)… ×\($0.value)" }
                            .joined(
                                separator: ", ") + " (keys not in security.*_keys)")
                }
                let nonZero = status.counters.filter { $0.value != 0 }.sorted { $0.key < $1.key }
                emit(
                    "counters:  "
                        + (nonZero.isEmpty
                            ? "all zero" : nonZero.map { "\($0.key)=\($0.value)" }.joined(separator: " ")))
            }
        }
    }

    struct Members: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List the cluster's members as this node sees them.",
            discussion: """
                One line per member: id, state (alive; suspect: silent for over 3 heartbeat \
                intervals; down: silent for the silence limit, or never heard; left: stopped \
                cleanly; forgotten), its publish and API endpoints, when this node last heard from \
                it, and how many of its deltas this node knows of but lacks. The list spreads in \
                heartbeats (docs/PROTOCOL.md 7.5): a node started with one reachable member in \
                network.peers learns the rest.
                """)

        @Flag(name: .long, help: "Print one JSON array.")
        var json = false

        @OptionGroup var connection: ConnectionOptions

        func run() async throws {
            try await failingClearly {
                let client = try connection.client()
                defer { client.close() }
                let status = try await client.status()
                if json {
                    emit(Value.array(status.members.map(\.value)).jsonText())
                    return
                }
                let width = max(4, status.members.map(\.id.count).max() ?? 0)
                for member in status.members {
                    let seen =
                        member.id == status.node
                        ? "this node" : member.lastSeenMillisecondsAgo.map { "heard \($0) ms ago" } ?? "never heard"
                    let id = member.id.padding(toLength: width, withPad: " ", startingAt: 0)
                    let state = member.state.padding(toLength: 9, withPad: " ", startingAt: 0)
                    let api = member.apiEndpoint.isEmpty ? "-" : member.apiEndpoint
                    emit(
                        "\(id)  \(state)  publish \(member.publishEndpoint)  api \(api)  \(seen)  missing \(member.missingDeltas)"
                    )
                }
            }
        }
    }

    struct Forget: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a member that is gone for good from the cluster.",
            discussion: """
                The node writes NODE_ID's member entry as forgotten; the entry spreads to every \
                member, which drops its links to NODE_ID and stops waiting for its missing deltas \
                (the deltas it holds stay). For a node that died for good: a node that stops \
                cleanly is already listed as left, a member this node still hears from is refused \
                (stop it first), and a forgotten node restarted with its data comes back alive, \
                once it has heard of the forget: then (still running but cut off, or restarted \
                with its data) it takes the others' state and drops the writes it took that no \
                other node holds, acknowledged ones too. Forget only a node that is gone. With \
                security, needs a client key with write=*.
                """)

        @Argument(help: "The id of the member to forget.")
        var nodeID: String

        @Flag(name: .long, help: "Print one JSON object.")
        var json = false

        @OptionGroup var connection: ConnectionOptions

        func validate() throws {
            guard NodeConfiguration.isValidNodeID(nodeID) else {
                throw ValidationError("'\(nodeID)' is not a node id (1–64 of A-Z a-z 0-9 . _ -)")
            }
        }

        func run() async throws {
            try await failingClearly {
                let client = try connection.client()
                defer { client.close() }
                try await client.forget(nodeID)
                if json {
                    emit(Value.map(["forgotten": .string(nodeID)]).jsonText())
                } else {
                    emit("forgot \(nodeID); every member drops it as the entry spreads (statesync members)")
                }
            }
        }
    }
}
