import ChildProcesses
import Foundation
import StateSync
import StateSyncClient
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The CLI's habits (issue #16's first slice): common options before or after the subcommand,
/// `--json` on the write commands, values from a file or stdin, shell completion.
@Suite("CLI habits")
struct CLIHabitsTests {
    /// One daemon on the built-in configuration, on free loopback ports, no peers.
    static func daemon(data: String) throws -> (ChildProcess, api: String) {
        let api = "tcp://127.0.0.1:\(freePort())"
        let daemon = try ChildProcess(
            "statesyncd", [],
            environment: [
                "STATESYNC_NODE_DATA_DIR": data, "STATESYNC_NETWORK_API": api,
                "STATESYNC_NETWORK_PUBLISH": "tcp://127.0.0.1:\(freePort())", "STATESYNC_NETWORK_PEERS": "",
            ])
        return (daemon, api)
    }

    @Test func optionsBeforeTheSubcommandJSONOutputAndValuesFromFilesAndStdin() async throws {
        let directory = temporaryDirectory("cli-habits")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (daemon, api) = try Self.daemon(data: "\(directory)/data")
        do {
            try await waitUntil("the daemon answers") {
                try await cli(["status", "--daemon", api, "--timeout", "0.3"]).status == 0
            }
            // With no deletion held, the deletions line names no member that collection waits for.
            let fresh = try await cli(["status", "--daemon", api]).stdout.split(separator: "\n")
            let deletions = fresh.first { $0.hasPrefix("deletions:") } ?? ""
            #expect(deletions.hasPrefix("deletions: 0 held") && !deletions.contains("("), "\(deletions)")
            // --daemon before the subcommand, both spellings; set --json says version and outcome.
            let set = try await cli(["--daemon", api, "set", "demo/g", "n=1", "--json"])
            #expect(set.status == 0, "\(set.stderr)")
            let written = jsonObject(Substring(set.stdout))
            #expect(written?["outcome"] as? String == "changed")
            #expect((written?["version"] as? String).flatMap(Version.init)?.node == "node1", "\(set.stdout)")
            let again = try await cli(["--daemon=\(api)", "--timeout", "3", "set", "demo/g", "n=1", "--json"])
            #expect(jsonObject(Substring(again.stdout))?["outcome"] as? String == "unchanged", "\(again.stderr)")

            // A value from a file, and an object of properties from stdin.
            try #"{"rows": [1, 2, 3], "name": "big"}"#.write(
                toFile: "\(directory)/value.json", atomically: true, encoding: .utf8)
            let fromFile = try await cli(["set", "demo/g", "blob=@\(directory)/value.json", "--daemon", api])
            #expect(fromFile.status == 0, "\(fromFile.stderr)")
            let piped = try ChildProcess(
                "/bin/sh",
                [
                    "-c",
                    "echo '{\"piped\": \"yes\", \"count\": 7}' | '\(binaries.path)/statesync' set demo/g --stdin --daemon \(api)",
                ])
            #expect(await piped.wait() == 0, "\(piped.stderr)")
            let got = try await cli(["--daemon", api, "get", "demo/g", "--json"])
            let properties = jsonObject(Substring(got.stdout))?["properties"] as? [String: Any]
            #expect((properties?["blob"] as? [String: Any])?["name"] as? String == "big", "\(got.stdout)")
            #expect(properties?["piped"] as? String == "yes" && properties?["count"] as? Int == 7)
            let missing = try await cli(["set", "demo/g", "x=@\(directory)/nope.json", "--daemon", api])
            #expect(missing.status != 0 && missing.stderr.contains("cannot read"), "\(missing.stderr)")

            // ls and channels: exactly the live models, in name order, page by page.
            for model in ["a1", "a2", "b1"] {
                #expect(try await cli(["set", "demo/\(model)", "x=1", "y=2", "--daemon", api]).status == 0)
            }
            #expect(try await cli(["set", "other/m", "x=1", "--daemon", api]).status == 0)
            let listed = try await cli(["ls", "demo", "--json", "--daemon", api])
            let names = listed.stdout.split(separator: "\n").compactMap { jsonObject($0)?["name"] as? String }
            #expect(names == ["a1", "a2", "b1", "g"], "\(listed.stdout)\(listed.stderr)")
            let a1 = listed.stdout.split(separator: "\n").compactMap(jsonObject).first { $0["name"] as? String == "a1" }
            #expect(a1?["properties"] as? Int == 2)
            let prefixed = try await cli(["ls", "demo", "--prefix", "a", "--limit", "1", "--daemon", api])
            #expect(prefixed.stdout.hasPrefix("a1  2 properties") && prefixed.stdout.split(separator: "\n").count == 1)
            // An empty listing prints no line (a script reads none) and says so on stderr.
            let empty = try await cli(["ls", "demo", "--prefix", "zz", "--daemon", api])
            #expect(empty.status == 0 && empty.stdout.isEmpty, "\(empty.stdout)")
            #expect(empty.stderr.contains("no models whose names start with 'zz' in channel 'demo'"), "\(empty.stderr)")
            let emptyJSON = try await cli(["ls", "nothing-here", "--json", "--daemon", api])
            #expect(
                emptyJSON.status == 0 && emptyJSON.stdout.isEmpty && emptyJSON.stderr.isEmpty, "\(emptyJSON.stderr)")
            let channels = try await cli(["channels", "--json", "--daemon", api])
            let counts = channels.stdout.split(separator: "\n").compactMap(jsonObject).map {
                "\($0["name"] as? String ?? "?")=\($0["models"] as? Int ?? -1)"
            }
            #expect(counts == ["demo=4", "other=1"], "\(channels.stdout)")
            // In words: "1 model", not "1 models".
            let worded = try await cli(["channels", "--daemon", api]).stdout.split(separator: "\n")
            #expect(
                worded.map { $0.split(separator: "[")[0] } == ["demo  4 models  ", "other  1 model  "], "\(worded)")
            // A live deletion says so once in a watch's line, as its new value.
            let human = try ChildProcess("statesync", ["watch", "other", "--daemon", api])
            defer { human.signal(SIGKILL) }
            try await waitUntil("the initial state printed") { human.stdout.contains("other/m x: null -> 1") }
            #expect(try await cli(["delete", "other/m", "x", "--daemon", api]).status == 0)
            try await waitUntil("the deletion printed") { human.stdout.contains("-> (deleted)") }
            let deletion = human.stdout.split(separator: "\n").first { $0.contains("-> (deleted)") } ?? ""
            #expect(deletion.hasPrefix("other/m x: 1 -> (deleted)  [") && deletion.hasSuffix("]"), "\(deletion)")
            human.signal(SIGTERM)
            _ = await human.wait(timeout: .seconds(20))

            // A filtered watch: models a*, property x, no initial state.
            let filtered = try ChildProcess(
                "statesync",
                ["watch", "demo", "--json", "--prefix", "a", "--property", "x", "--no-initial", "--daemon", api])
            defer { filtered.signal(SIGKILL) }
            let node = try StateSyncClient(endpoint: api)
            defer { node.close() }
            try await waitUntil("the filtered watch is registered") { (try? await node.status().watchers) == 1 }
            for (model, property, value) in [("a1", "y", 5), ("b1", "x", 6), ("a2", "x", 7)] {
                #expect(try await cli(["set", "demo/\(model)", "\(property)=\(value)", "--daemon", api]).status == 0)
            }
            try await waitUntil("the filtered watch prints a2.x") { filtered.stdout.contains("\"a2\"") }
            let printed = filtered.stdout.split(separator: "\n").compactMap(jsonObject)
            #expect(printed.count == 1, "only a2.x passes, and no initial state: \(filtered.stdout)")
            #expect(printed.first?["property"] as? String == "x" && printed.first?["new"] as? Int == 7)
            #expect(printed.first?["old"] is NSNull, "no initial state: the watch did not hold a2.x before")
        } catch {
            Issue.record("\(error)\n\(daemon.stderr)")
        }
        #expect(await daemon.stop() == 0)
    }

    /// `watch --state FILE`: a watch ended and started again resumes after its last line, with
    /// the exact old value of the first change (not null), and prints nothing twice.
    @Test func aWatchResumedFromItsStateFilePrintsExactOldValues() async throws {
        let directory = temporaryDirectory("watch-state")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (daemon, api) = try Self.daemon(data: "\(directory)/data")
        let file = "\(directory)/watch.state"
        func watcher() throws -> ChildProcess {
            try ChildProcess("statesync", ["watch", "demo", "--json", "--markers", "--state", file, "--daemon", api])
        }
        func lines(_ process: ChildProcess) -> [[String: Any]] {
            process.stdout.split(separator: "\n").compactMap(jsonObject).filter { $0["marker"] == nil }
        }
        func caughtUp(_ process: ChildProcess) -> Int {
            process.stdout.split(separator: "\n").compactMap(jsonObject).filter {
                $0["marker"] as? String == "caught_up"
            }.count
        }
        do {
            try await waitUntil("the daemon answers") {
                try await cli(["status", "--daemon", api, "--timeout", "0.3"]).status == 0
            }
            #expect(try await cli(["set", "demo/g", "n=1", "--daemon", api]).status == 0)
            let first = try watcher()
            defer { first.signal(SIGKILL) }
            try await waitUntil("the first watch prints the initial state") { lines(first).count == 1 }
            #expect(try await cli(["set", "demo/g", "n=2", "--daemon", api]).status == 0)
            try await waitUntil("the first watch prints n: 1 -> 2") { lines(first).count == 2 }
            #expect(await first.stop(SIGINT) == 0, "SIGINT saves the state and exits 0: \(first.stderr)")
            #expect(FileManager.default.fileExists(atPath: file))

            #expect(try await cli(["set", "demo/g", "n=3", "--daemon", api]).status == 0)
            let second = try watcher()
            defer { second.signal(SIGKILL) }
            try await waitUntil("the resumed watch prints n: 2 -> 3") { lines(second).count == 1 }
            #expect(try await cli(["set", "demo/g", "n=4", "--daemon", api]).status == 0)
            try await waitUntil("and then n: 3 -> 4") { lines(second).count == 2 }
            let resumed = lines(second)
            #expect(resumed[0]["old"] as? Int == 2 && resumed[0]["new"] as? Int == 3, "exact old value: \(resumed)")
            #expect(resumed[0]["kind"] as? String == "live", "not the initial state again")
            #expect(resumed[1]["old"] as? Int == 3 && resumed[1]["new"] as? Int == 4)
            // Idle, the watch does not rewrite its file at every marker (about one a second).
            let markers = caughtUp(second)
            // (Two: a line is printed before it is recorded, so the first one's save is done once
            // the second one is printed.)
            try await waitUntil("two markers after the last change") { caughtUp(second) >= markers + 2 }
            let saved = try FileManager.default.attributesOfItem(atPath: file)[.modificationDate] as? Date
            let idle = caughtUp(second)
            try await waitUntil("two more markers") { caughtUp(second) >= idle + 2 }
            #expect(try FileManager.default.attributesOfItem(atPath: file)[.modificationDate] as? Date == saved)
            #expect(await second.stop(SIGTERM) == 0)
            // A filtered watch cannot keep a state file (its cursor skips what the filter left out).
            let filteredState = try await cli(["watch", "demo", "--state", file, "--prefix", "a", "--daemon", api])
            #expect(filteredState.status == 64 && filteredState.stderr.contains("--state keeps unfiltered watches"))
            // A state file of another channel is refused with one line.
            let other = try await cli(["watch", "other", "--state", file, "--daemon", api])
            #expect(other.status != 0 && other.stderr.contains("holds a watch of channel 'demo'"), "\(other.stderr)")
        } catch {
            Issue.record("\(error)\n\(daemon.stderr)")
        }
        #expect(await daemon.stop() == 0)
    }

    /// A node that stops cleanly ends its watches with an ERROR saying so, after what it had to
    /// send: `statesync watch` prints every change, then that line and where to resume, and exits
    /// 1. Before, the watch learnt of it only when a liveness PING went unanswered (5 s later,
    /// "no answer to a liveness ping").
    @Test func aWatchIsToldWhenItsNodeStops() async throws {
        let directory = temporaryDirectory("watch-node-stops")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (daemon, api) = try Self.daemon(data: "\(directory)/data")
        do {
            try await waitUntil("the daemon answers") {
                try await cli(["status", "--daemon", api, "--timeout", "0.3"]).status == 0
            }
            let watch = try ChildProcess("statesync", ["watch", "demo", "--json", "--daemon", api])
            defer { watch.signal(SIGKILL) }
            let client = try StateSyncClient(endpoint: api)
            defer { client.close() }
            try await waitUntil("the watch is registered") { (try? await client.status().watchers) == 1 }
            for i in 1...3 {
                try await client.set(ModelAddress(channel: "demo", model: "m\(i)"), ["v": .int(Int64(i))])
            }
            #expect(await daemon.stop() == 0)
            #expect(await watch.wait(timeout: .seconds(20)) == 1)
            #expect(watch.stdout.split(separator: "\n").count == 3, "every change first: \(watch.stdout)")
            #expect(watch.stderr.contains("is stopping: this watch ends here; resume with --from "), "\(watch.stderr)")
            #expect(!watch.stderr.contains("liveness ping"), "\(watch.stderr)")
        } catch {
            Issue.record("\(error)\n\(daemon.stderr)")
            _ = await daemon.stop()
        }
    }

    /// A watch whose standard output is no longer read (a paused pager, a stalled pipe) still
    /// ends on SIGINT: it gives the lines it cannot write a second, then exits and says so.
    @Test func aWatchWhoseOutputIsNotReadStillEndsOnSIGINT() async throws {
        let directory = temporaryDirectory("watch-stalled")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (daemon, api) = try Self.daemon(data: "\(directory)/data")
        let errors = "\(directory)/watch.err"
        _ = FileManager.default.createFile(atPath: errors, contents: nil)
        let pipe = Pipe()  // never read
        do {
            try await waitUntil("the daemon answers") {
                try await cli(["status", "--daemon", api, "--timeout", "0.3"]).status == 0
            }
            let watch = try SpawnedProcess(
                executable: binaries.appendingPathComponent("statesync").path,
                arguments: ["watch", "demo", "--json", "--daemon", api],
                environment: ProcessInfo.processInfo.environment,
                standardOutput: .descriptor(pipe.fileHandleForWriting.fileDescriptor),
                standardError: .file(errors, append: false))
            defer {
                watch.signal(SIGKILL)
                _ = watch.waitUntilExit()
            }
            let client = try StateSyncClient(endpoint: api)
            defer { client.close() }
            try await waitUntil("the watch is registered") { (try? await client.status().watchers) == 1 }
            // Far more than a pipe holds (64 KiB): the watch ends up blocked in a write.
            let value = Value.string(String(repeating: "x", count: 1000))
            for i in 0..<300 { try await client.set(ModelAddress(channel: "demo", model: "m\(i)"), ["v": value]) }
            // Blocked: one of its threads waits in a pipe write (its wait channel says so).
            let tasks = "/proc/\(watch.pid)/task"
            try await waitUntil("the watch is blocked writing to the full pipe") {
                let threads = (try? FileManager.default.contentsOfDirectory(atPath: tasks)) ?? []
                return threads.contains { thread in
                    let channel = (try? String(contentsOfFile: "\(tasks)/\(thread)/wchan", encoding: .utf8)) ?? ""
                    return channel.contains("pipe_write")
                }
            }
            watch.signal(SIGINT)
            try await waitUntil("the watch ends", timeout: .seconds(10)) { !watch.isRunning }
            #expect(watch.exitStatus() == 130)
            let said = (try? String(contentsOfFile: errors, encoding: .utf8)) ?? ""
            #expect(said.contains("not written: standard output is not being read"), "\(said)")
        } catch {
            Issue.record("\(error)\n\(daemon.stderr)")
        }
        #expect(await daemon.stop() == 0)
    }

    /// A request larger than a node takes in one message (64 MiB) is refused by the client with
    /// a clear error before it is sent: sent, libzmq would drop the connection and the writer
    /// would wait for an answer that never comes ("no answer within 5 s", as a new user's trial
    /// found). The client goes on: its next request is answered.
    @Test func aRequestTooLargeForOneMessageIsRefusedBeforeItIsSent() async throws {
        let directory = temporaryDirectory("cli-too-large")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (daemon, api) = try Self.daemon(data: "\(directory)/data")
        do {
            let client = try StateSyncClient(endpoint: api)
            defer { client.close() }
            let address = ModelAddress(channel: "big", model: "m")
            let huge = Value.bytes([UInt8](repeating: 7, count: ClientProtocol.maximumFrameOctets + 1))
            let error = await #expect(throws: StateSyncError.self) { try await client.set(address, ["v": huge]) }
            #expect(error?.code == .tooLarge)
            #expect(error?.message.contains("64 MiB") == true, "\(error?.message ?? "")")
            let fits = Value.bytes([UInt8](repeating: 7, count: 1 << 20))
            try await client.set(address, ["v": fits])
            #expect(try await client.get(address)["v"]?.value == fits)
        } catch {
            Issue.record("\(error)\n\(daemon.stderr)")
        }
        #expect(await daemon.stop() == 0)
    }

    /// Bad arguments exit 64 with one line saying what is wrong, also those found once the
    /// command runs (what --stdin held), before any daemon is asked: the cases a new user's
    /// trial found exiting 1, or with a message that did not fit.
    @Test func badArgumentsExit64WithALineThatFits() async throws {
        let unreachable = "tcp://127.0.0.1:\(freePort())"
        let cases: [([String], String)] = [
            (["forget", "bad id!"], "'bad id!' is not a node id"),
            (["set", "demo/x", "v=1", "--ttl", "0s"], "--ttl 0s must be above 0"),
            (["set", "demo/x", "v=1", "--ttl", "-1s"], "--ttl -1s must be above 0"),
            (["status", "--timeout", "0"], "--timeout must be above 0 and at most 3600 seconds"),
            (["set", "demo/x", #"b={"$bytes":"!!notbase64"}"#], "holds bytes as base64 text, and this is not base64"),
            (["set", "demo/x", "v=1e400"], "a number out of range"),
            // An integer past 64 bits is refused, not rounded into a double (a trial's).
            (["set", "demo/x", "a=12345678901234567890123"], "12345678901234567890123 is an integer out of range"),
            // A misspelled option's value is read as an assignment, and its check runs first.
            (["set", "demo/x", "--tll", "30s", "v=1"], "'--tll' before it is not an option of statesync set"),
        ]
        // view-token's lifetime: what is wrong with it, not only what it takes (a trial's).
        for (ttl, expected) in [
            ("0s", "--ttl 0s must be at least 1s"), ("soon", "--ttl 'soon' is not a duration"),
            ("400d", "--ttl 400d is too long: at most 366d"),
        ] {
            let result = try await cli(["view-token", "--key", "k", "--server-key", "s", "--ttl", ttl])
            #expect(result.status == 64 && result.stderr.contains(expected), "\(ttl): \(result.stderr)")
        }
        for (arguments, expected) in cases {
            let result = try await cli(arguments + ["--daemon", unreachable])
            #expect(result.status == 64, "\(arguments): \(result.stderr)")
            #expect(result.stderr.contains(expected), "\(arguments): \(result.stderr)")
        }
        // A bare word gets the quoting hint; malformed JSON only the parser's reason, and a long
        // one is quoted by its start (a 5 MB --stdin was echoed whole before).
        let bare = try await cli(["set", "demo/x", "title=hello", "--daemon", unreachable])
        #expect(bare.stderr.contains(#"a string needs JSON quotes: title='"hello"'"#), "\(bare.stderr)")
        let malformed = try await cli(["set", "demo/x", #"v={"a":"#, "--daemon", unreachable])
        #expect(malformed.status == 64 && !malformed.stderr.contains("needs JSON quotes"), "\(malformed.stderr)")
        let long = try await cli([
            "set", "demo/x", "v=[" + String(repeating: "1,", count: 5000), "--daemon", unreachable,
        ])
        #expect(long.status == 64 && long.stderr.contains("(10001 bytes)"), "\(long.stderr.prefix(300))")
        #expect(long.stderr.utf8.count < 600, "one short line, not the value: \(long.stderr.utf8.count) bytes")
        for input in ["[1,2]", #"{"v": 1}"#] {
            let piped = try ChildProcess(
                "/bin/sh",
                ["-c", "echo '\(input)' | '\(binaries.path)/statesync' set demo/g v=2 --stdin --daemon \(unreachable)"])
            #expect(await piped.wait() == 64, "\(input): \(piped.stderr)")
            #expect(piped.stderr.split(separator: "\n").count == 1, "\(piped.stderr)")
        }
    }

    @Test func shellCompletionAndKeygenJSON() async throws {
        let help = try await cli(["--daemon", "tcp://127.0.0.1:1", "--help"])
        #expect(help.status == 0 && help.stdout.contains("USAGE"), "\(help.stdout)\(help.stderr)")
        let completion = try await cli(["--generate-completion-script", "bash"])
        #expect(completion.status == 0 && completion.stdout.contains("view-token"), "\(completion.stderr)")
        let directory = temporaryDirectory("keygen-json")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // The key's directory is made when missing (keys/ of the example configs), private.
        let made = try await cli(["keygen", "--out", "\(directory)/keys/a.key", "--json"])
        let object = jsonObject(Substring(made.stdout))
        #expect((object?["public_key"] as? String)?.count == 40, "\(made.stdout)\(made.stderr)")
        #expect(object?["secret_key_file"] as? String == "\(directory)/keys/a.key")
        #expect(object?["made_directory"] as? String == "\(directory)/keys", "said, not made silently")
        let mode = try FileManager.default.attributesOfItem(atPath: "\(directory)/keys")[.posixPermissions] as? Int
        #expect(mode == 0o700)
    }
}
