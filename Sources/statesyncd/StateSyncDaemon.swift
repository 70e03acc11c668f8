import ArgumentParser
import CoreMetrics
import Foundation
import Logging
import ServiceLifecycle
import StateSync
import StateSyncHTTP
import StateSyncZeroMQ
import Synchronization

/// `statesyncd`: one StateSync node in the foreground. SIGINT/SIGTERM stop it cleanly.
@main
struct StateSyncDaemon: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "statesyncd",
        abstract: "Run a StateSync node: replicate observable models over ZeroMQ.",
        discussion: """
            Runs in the foreground until SIGINT or SIGTERM, then publishes what is queued, closes \
            its sockets, writes its snapshot and exits 0. Every configuration key can be overridden \
            by an environment variable: STATESYNC_ + the key upper-cased with '.' as '_' \
            (node.id <- STATESYNC_NODE_ID; lists comma-separated). An unknown key, or a variable \
            that starts like an override (STATESYNC_NETWORK_...) but names no key, is refused. SIGHUP re-reads the file's \
            security.* keys (admitted keys and client permissions) without a restart, and logs \
            that a change of any other key waits for the next start. SIGPIPE is \
            ignored: if what reads its output goes away, those log lines are lost, not the node.

            Exit codes: 0 clean stop, 1 runtime failure (e.g. a port in use), 2 invalid configuration \
            (a key file missing or unreadable, or a data directory this user may not write, \
            included: found before the data directory is touched), a data directory the node must \
            not run with (an empty one under an id the cluster knows, or that was forgotten), or \
            another node found running under this node's id.
            """)

    @Option(name: .long, help: ArgumentHelp("The node's YAML configuration file.", valueName: "FILE"))
    var config: String?

    @Flag(name: .long, help: "Print the built-in configuration (used without --config) and exit.")
    var printDefaultConfig = false

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Check a configuration file (its environment overrides, its key files, and whether this user may write its node.data_dir) and exit: 0 and one summary line, or 2 and the one-line error.",
            valueName: "FILE"))
    var checkConfig: String?

    @Flag(
        name: .long,
        help: ArgumentHelp(
            "Stop cleanly, as on SIGTERM, when standard input reaches its end.",
            discussion:
                "For a supervisor that starts the daemon with a pipe on its standard input and keeps the other end open: if the supervisor dies, however it dies, the kernel closes that end and the node stops instead of running on orphaned. What is written to the pipe is ignored. Not with /dev/null or a file on standard input (it ends at once: systemd, nohup, docker without -i); a terminal is not watched."
        ))
    var stopWhenStdinCloses = false

    /// The key files and the data directory `configuration` names, each error said after the
    /// configuration file it came from (`nil`: the built-in defaults), as the loader's are.
    private static func checkFiles(of configuration: NodeConfiguration, from file: String?) throws {
        do {
            try StateSyncNode.checkKeys(of: configuration)
            try StateSyncNode.checkDataDirectory(of: configuration)
        } catch let error as StateSyncError {
            throw StateSyncError(error.code, "\(file ?? "built-in defaults"): \(error.message)")
        }
    }

    func run() async throws {
        // A SIGHUP (e.g. a service manager's reload) during a long start must not end the daemon;
        // once the node runs, it reloads the keys (reloadOnHangUp).
        signal(SIGHUP, SIG_IGN)
        // A log line to a pipe whose reader went away (a log shipper restarting, a supervisor
        // that died) must not end the node: the write fails with EPIPE and the line is lost.
        // (Every socket the node has is libzmq's or NIO's, which never raise it.)
        signal(SIGPIPE, SIG_IGN)
        if printDefaultConfig {
            print(NodeConfiguration.defaultYAML)
            return
        }
        if let checkConfig {
            do {
                let configuration = try NodeConfiguration.load(file: checkConfig)
                try Self.checkFiles(of: configuration, from: checkConfig)
                print(
                    "\(checkConfig): ok — node \(configuration.nodeID), publish \(configuration.publishEndpoint), api \(configuration.apiEndpoint ?? "none"), http \(configuration.httpListen ?? "off"), \(configuration.peers.count) peers, storage \(configuration.fsync.rawValue) (publish \(configuration.publishesBeforeSync ? "written" : "synced")), security \(configuration.security == nil ? "off" : "on")"
                )
                return
            } catch {
                printError("statesyncd: invalid configuration: \(error)")
                throw ExitCode(2)
            }
        }
        var configuration: NodeConfiguration
        do {
            configuration = try config.map { try NodeConfiguration.load(file: $0) } ?? NodeConfiguration.loadDefaults()
            // Key files are part of the configuration: one missing or unreadable is exit 2, as
            // --check-config says, and found before the node locks or writes its data directory.
            // So is a data directory this user may not write.
            try Self.checkFiles(of: configuration, from: config)
        } catch {
            printError("statesyncd: invalid configuration: \(error)")
            throw ExitCode(2)
        }
        // With security and an HTTP listener: the live view's own client key (admitted to read,
        // never to write), and what viewers' tokens may see.
        var authority: ViewerAuthority?
        if configuration.httpListen != nil, let security = configuration.security {
            do {
                let made = try ViewerAuthority(security: security)
                configuration.security?.clients.append(made.viewAccess)
                authority = made
            } catch {
                printError("statesyncd: cannot prepare the live view's client key: \(error)")
                throw ExitCode(1)
            }
        }
        let level = Logger.Level(rawValue: configuration.logLevel) ?? .info
        let json = configuration.logFormat == "json"
        LoggingSystem.bootstrap { label in
            if json {
                var handler = JSONLogHandler(label: label)
                handler.logLevel = level
                return handler
            }
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "statesyncd")
        // SIGTERM or SIGINT during the start (before the service group listens) must still stop
        // the node cleanly, not kill the process: caught from here on, acted on once it runs.
        let early = EarlyStop()
        defer { early.cancel() }
        if stopWhenStdinCloses { early.stopWhenStandardInputCloses(logger: logger) }
        // With `http.listen`: one Prometheus registry for the process, filled through swift-metrics.
        let exporter = configuration.httpListen.map { _ in MetricsExporter() }
        if let exporter { MetricsSystem.bootstrap(exporter.factory) }
        // Off the start's path: with DNS down, each look-up can take the resolver's timeout.
        let peersToResolve = configuration
        Task.detached { Self.warnAboutUnresolvedPeers(peersToResolve, logger: logger) }
        if let listen = configuration.httpListen {
            do {
                try HTTPListener.checkBindable(listen)
            } catch {
                printError("statesyncd: node \(configuration.nodeID): \(error.message)")
                throw ExitCode(1)
            }
        }
        let node: StateSyncNode
        do {
            node = try await StateSyncNode.start(
                configuration: configuration, logger: logger, testHooks: Self.testHooks(logger: logger),
                metrics: exporter.map { NodeMetrics(factory: $0.factory) } ?? NodeMetrics())
        } catch {
            printError("statesyncd: cannot start node \(configuration.nodeID): \(error)")
            throw ExitCode(1)
        }
        early.attach(node)
        // kill -HUP: re-read security.* (admitted keys, client permissions) without a restart.
        let hangUp = Self.reloadOnHangUp(
            node: node, running: configuration, configFile: config, authority: authority, logger: logger)
        defer { hangUp.cancel() }
        // The node last: a graceful shutdown stops services in reverse order, and a SIGTERM also
        // reaches the node through EarlyStop, so the node must be the first one stopped (the
        // HTTP listener ends right after it).
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = []
        if let listen = configuration.httpListen, let exporter {
            let listener: HTTPListener
            do {
                listener = try HTTPListener(
                    address: listen, node: node, exporter: exporter, authority: authority, logger: logger)
            } catch {
                await node.stop()
                printError("statesyncd: node \(configuration.nodeID): \(error)")
                throw ExitCode(2)
            }
            services.append(
                .init(service: listener.application(), failureTerminationBehavior: .gracefullyShutdownGroup))
        }
        services.append(.init(service: node, successTerminationBehavior: .gracefullyShutdownGroup))
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        do {
            try await group.run()
        } catch {
            // The HTTP listener could not bind (the node has stopped cleanly by now).
            printError(
                "statesyncd: node \(configuration.nodeID): the HTTP listener (http.listen \(configuration.httpListen ?? "-")) stopped: \(error)"
            )
            throw ExitCode(1)
        }
        if let refusal = node.refusal {
            printError("statesyncd: node \(configuration.nodeID) stopped: \(refusal.message)")
            throw ExitCode(2)
        }
    }

    /// On SIGHUP, re-reads the configuration file and applies its `security.*` keys (the other
    /// keys need a restart); a file or key that does not load changes nothing and is logged.
    static func reloadOnHangUp(
        node: StateSyncNode, running: NodeConfiguration, configFile: String?, authority: ViewerAuthority?,
        logger: Logger
    ) -> any DispatchSourceSignal {
        signal(SIGHUP, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: SIGHUP, queue: .global())
        source.setEventHandler {
            guard let configFile else {
                logger.warning("SIGHUP: running on the built-in configuration; nothing to reload")
                return
            }
            do {
                let fromEnvironment = [
                    "STATESYNC_SECURITY_SECRET_KEY", "STATESYNC_SECURITY_PEER_KEYS", "STATESYNC_SECURITY_CLIENT_KEYS",
                ]
                .filter { ProcessInfo.processInfo.environment[$0] != nil }
                if !fromEnvironment.isEmpty {
                    logger.warning(
                        "SIGHUP: these security keys come from the environment, which wins over the file; editing the file does not change them",
                        metadata: ["variables": "\(fromEnvironment.joined(separator: ","))"])
                }
                let reloaded = try NodeConfiguration.load(file: configFile)
                // What else changed takes effect at the next start: said, key by key, not
                // silently ignored. (The peers compare as a set: a file that lists them in
                // another order changes nothing.)
                let changed = reloaded.keysDiffering(from: running).filter { !$0.rawValue.hasPrefix("security.") }
                if !changed.isEmpty {
                    logger.warning(
                        "SIGHUP: keys other than security.* changed in the file; they take effect when the node restarts",
                        metadata: [
                            "config": "\(configFile)", "keys": "\(changed.map(\.rawValue).joined(separator: ","))",
                        ])
                }
                guard running.security != nil else {
                    guard reloaded.security == nil else {
                        throw StateSyncError(
                            .invalidConfiguration,
                            "\(configFile): sets security.*, but this node runs without it; turning security on needs a restart"
                        )
                    }
                    logger.notice(
                        "SIGHUP: this node runs without security; nothing to reload (only security.* is reloaded)",
                        metadata: ["config": "\(configFile)"])
                    return
                }
                guard var security = reloaded.security else {
                    throw StateSyncError(
                        .invalidConfiguration,
                        "\(configFile): has no security.secret_key; turning security off needs a restart")
                }
                if let authority { security.clients.append(authority.viewAccess) }
                try node.reloadSecurity(security)
                // The node took the keys, so they read: the live view follows the new permissions.
                try authority?.update(security)
                logger.notice(
                    "SIGHUP: reloaded security.* (admitted keys and client permissions); other keys need a restart",
                    metadata: ["config": "\(configFile)"])
            } catch {
                logger.error("SIGHUP: kept the current keys", metadata: ["error": "\(error)"])
            }
        }
        source.resume()
        return source
    }

    /// A configured peer whose host name does not resolve is dialled until it does (libzmq says
    /// nothing meanwhile, and `status` shows it as a peer never seen): said at start, once.
    static func warnAboutUnresolvedPeers(_ configuration: NodeConfiguration, logger: Logger) {
        for endpoint in configuration.peers {
            guard var host = tcpHost(of: endpoint).map(String.init) else { continue }
            if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
            var hints = addrinfo()
            hints.ai_flags = AI_NUMERICHOST
            var found: UnsafeMutablePointer<addrinfo>?
            if getaddrinfo(host, nil, &hints, &found) == 0 {
                freeaddrinfo(found)
                continue  // an address, not a name
            }
            hints.ai_flags = 0
            let resolved = getaddrinfo(host, nil, &hints, &found)
            if resolved == 0 {
                freeaddrinfo(found)
                continue
            }
            logger.warning(
                "a configured peer's host name does not resolve; the node dials it until it does",
                metadata: [
                    "peer.endpoint": "\(endpoint)", "error": "\(String(cString: gai_strerror(resolved)))",
                ])
        }
    }

    /// The test harness's fault injection (docs/PROTOCOL.md, Appendix C): read here, by the
    /// daemon, never by the library. Unset, empty, not a number or 0: no effect.
    static func testHooks(logger: Logger) -> StateSyncNode.TestHooks {
        let environment = ProcessInfo.processInfo.environment
        let share = environment["STATESYNC_TEST_DROP_REMOTE_DELTAS"].flatMap(Double.init) ?? 0
        let offset = environment["STATESYNC_TEST_CLOCK_OFFSET_MS"].flatMap(Int64.init) ?? 0
        let neverExpire = environment["STATESYNC_TEST_NEVER_EXPIRE"].flatMap(Int.init) ?? 0 != 0
        if offset != 0 {
            logger.warning(
                "TEST FAULT INJECTION: this node's wall clock is skewed", metadata: ["offset_ms": "\(offset)"])
        }
        if neverExpire { logger.warning("TEST FAULT INJECTION: this node never deletes expired values") }
        return StateSyncNode.TestHooks(
            faults: NodeFaults(dropRemoteDeltasShare: share, neverExpire: neverExpire),
            clockOffsetMilliseconds: offset)
    }
}

/// Catches SIGTERM and SIGINT from before the node starts: a signal that arrives before the node
/// runs stops it as soon as it does; one that arrives later stops it at once (the service group
/// stops it too; stopping twice is harmless). Used by `run()` alone, on its task.
final class EarlyStop {
    /// What the signal handlers (on a global queue) and `run()` share.
    private final class Requests: Sendable {
        let state = Mutex<(requested: Bool, node: StateSyncNode?)>((false, nil))

        /// Stops the node, now if it runs, else as soon as it does.
        func request() {
            let node = state.withLock { current -> StateSyncNode? in
                current.requested = true
                return current.node
            }
            if let node { Task { await node.stop() } }
        }
    }

    private let requests = Requests()
    private var sources: [any DispatchSourceSignal] = []

    init() {
        let requests = self.requests
        for signal in [SIGTERM, SIGINT] {
            Glibc.signal(signal, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: signal, queue: .global())
            source.setEventHandler { requests.request() }
            source.resume()
            sources.append(source)
        }
    }

    /// `--stop-when-stdin-closes`: a thread reads standard input (and ignores what it reads)
    /// until its end, then stops the node as a SIGTERM would. A terminal is not watched (a read
    /// from a background job would suspend the daemon), and a read error other than the end
    /// ends the watch, not the node.
    func stopWhenStandardInputCloses(logger: Logger) {
        if isatty(STDIN_FILENO) != 0 {
            logger.warning(
                "--stop-when-stdin-closes: standard input is a terminal, not a supervisor's pipe; not watching it")
            return
        }
        let requests = self.requests
        let reader = Thread {
            var buffer = [UInt8](repeating: 0, count: 512)
            while true {
                let count = read(STDIN_FILENO, &buffer, buffer.count)
                if count > 0 { continue }
                if count == 0 { break }
                switch errno {
                case EINTR: continue
                case EAGAIN:  // a non-blocking descriptor: wait until it is readable (or ends)
                    var wait = pollfd(fd: STDIN_FILENO, events: Int16(POLLIN), revents: 0)
                    _ = poll(&wait, 1, -1)
                default:
                    logger.warning(
                        "--stop-when-stdin-closes: cannot read standard input; not watching it",
                        metadata: ["errno": "\(errno)"])
                    return
                }
            }
            logger.notice("standard input reached its end (--stop-when-stdin-closes): stopping")
            requests.request()
        }
        reader.name = "stdin-watch"
        reader.start()
    }

    /// The node now runs: stop it if a signal came during its start.
    func attach(_ node: StateSyncNode) {
        let requested = requests.state.withLock { current -> Bool in
            current.node = node
            return current.requested
        }
        if requested { Task { await node.stop() } }
    }

    func cancel() {
        for source in sources { source.cancel() }
    }
}

/// Writes `line` and a newline to standard error, whatever becomes of it: a reader that went
/// away (EPIPE, with SIGPIPE ignored) must not turn an exit code the unit acts on (2: do not
/// restart) into a trap, as `FileHandle.write` does when the write fails.
func printError(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    var written = 0
    while written < bytes.count {
        let result = bytes.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress! + written, $0.count - written) }
        if result > 0 {
            written += result
        } else if result < 0, errno == EINTR {
            continue
        } else {
            return
        }
    }
}
