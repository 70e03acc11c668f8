public import Logging
public import StateSync

extension StateSyncNode {
    /// Starts a node from a YAML configuration file (see the README's configuration table), over
    /// ZeroMQ.
    public static func start(configFile: String, logger: Logger? = nil) async throws -> StateSyncNode {
        let configuration = try NodeConfiguration.load(file: configFile)
        return try await start(configuration: configuration, logger: logger)
    }

    /// Starts a node over ZeroMQ: takes its data directory, recovers its state (snapshot, then
    /// the write-ahead log), binds its sockets and connects to its peers. Returns once it is
    /// bound and ready.
    ///
    /// `metrics`: where the node records its latency histograms (by default the process's
    /// swift-metrics backend; see ``NodeMetrics``).
    ///
    /// - Throws: ``StateSyncError`` when the data directory is unusable or in use, or an endpoint
    ///   cannot be bound (the message names which).
    public static func start(
        configuration: NodeConfiguration, logger: Logger? = nil, metrics: NodeMetrics = NodeMetrics()
    ) async throws -> StateSyncNode {
        try await start(configuration: configuration, logger: logger, testHooks: TestHooks(), metrics: metrics)
    }

    /// Replaces the keys this node admits and what each client may do (`kill -HUP` of
    /// `statesyncd` calls this with its re-read configuration), without a restart: connections
    /// of keys that stay admitted go on (their watches too, where the key may still read the
    /// channel); a removed client key gets ERROR 8 for every request and its watches end; a
    /// removed or changed key can no longer connect. A removed peer key is cut off at once: the
    /// publish socket is bound afresh (the peers still trusted reconnect and fetch what they
    /// missed), and a peer with no trusted key left is no longer dialled. A peer may have several
    /// trusted keys (while it rotates): links to it move to its next key when they stay silent.
    ///
    /// - Throws: ``StateSyncError`` (and changes nothing) when a key cannot be read, or when the
    ///   node runs without security (turning it on or off needs a restart).
    public func reloadSecurity(_ security: SecurityConfiguration) throws {
        guard configuration.security != nil else {
            throw StateSyncError(
                .invalidConfiguration,
                "node \(configuration.nodeID) runs without security; turning it on needs a restart")
        }
        let keys = try NodeKeys(security)
        guard let driver = attachedDriver as? ZeroMQNodeDriver else {
            throw StateSyncError(.stopped, "node \(configuration.nodeID) is not running")
        }
        // The node's own key is set on its bound sockets: changing it needs a restart.
        guard driver.ownPublicKey == nil || driver.ownPublicKey == keys.pair.publicKey else {
            throw StateSyncError(
                .invalidConfiguration,
                "security.secret_key: this node's own key changed; that needs a restart (nothing was reloaded)")
        }
        driver.reload(keys)
    }

    /// Checks what starting a node with `configuration` would check before it binds anything:
    /// with security, that every key file and key reads and parses, the secret key is its
    /// owner's alone, and no key is given two roles (`statesyncd --check-config`).
    ///
    /// - Throws: ``StateSyncError`` with one line naming the key and the fix.
    public static func checkKeys(of configuration: NodeConfiguration) throws {
        guard let security = configuration.security else { return }
        _ = try NodeKeys(security)
    }

    /// Checks that this process can create and write `node.data_dir` and the files in it
    /// (`statesyncd --check-config`, and before a daemon starts: a directory its user may not
    /// write is a configuration the node must not start with).
    ///
    /// - Throws: ``StateSyncError`` with one line naming the directory, the user and the fix.
    public static func checkDataDirectory(of configuration: NodeConfiguration) throws {
        try DataDirectory.checkWritable(configuration.dataDirectory)
    }

    /// Faults the test harness plants in a daemon (docs/PROTOCOL.md, Appendix C); never in
    /// production.
    package struct TestHooks: Sendable {
        package var faults = NodeFaults()
        /// Added to the node's wall clock (the harness's clock fault).
        package var clockOffsetMilliseconds: Int64 = 0

        package init(faults: NodeFaults = NodeFaults(), clockOffsetMilliseconds: Int64 = 0) {
            self.faults = faults
            self.clockOffsetMilliseconds = clockOffsetMilliseconds
        }
    }

    package static func start(
        configuration: NodeConfiguration, logger: Logger?, testHooks: TestHooks, metrics: NodeMetrics = NodeMetrics()
    ) async throws -> StateSyncNode {
        var logger = logger ?? Logger(label: "statesync")
        logger[metadataKey: "node.id"] = .string(configuration.nodeID)
        let storage = try DataDirectory(path: configuration.dataDirectory)
        let offset = testHooks.clockOffsetMilliseconds
        let wallClock: @Sendable () -> UInt64 = {
            UInt64(max(0, Int64(HybridLogicalClock.systemMilliseconds()) + offset))
        }
        let clock = HybridLogicalClock(
            node: configuration.nodeID, maximumDriftMilliseconds: UInt64(configuration.maximumClockDriftMilliseconds),
            wallClock: wallClock)
        let node: StateSyncNode
        do {
            node = try StateSyncNode(
                configuration: configuration, storage: storage, clock: clock,
                monotonicNow: { MonotonicClock.milliseconds() },
                incarnation: UInt64.random(in: 1...UInt64.max),
                observers: DispatchObserverExecutor(label: "statesync-observers.\(configuration.nodeID)"),
                faults: testHooks.faults, metrics: metrics, logger: logger)
        } catch {
            storage.close()
            throw error
        }
        let driver = ZeroMQNodeDriver(configuration: configuration, logger: logger)
        node.attach(driver: driver)
        do {
            try await driver.start(node)
        } catch {
            storage.close()
            throw error
        }
        logger.info(
            "node started",
            metadata: [
                "publish": "\(node.publishEndpoint)", "api": "\(node.apiEndpoint ?? "-")",
                "repair": "\(node.repairEndpoint)", "peers": "\(configuration.peers.joined(separator: ","))",
                "security": "\(configuration.security == nil ? "none" : "curve")",
            ])
        return node
    }
}
