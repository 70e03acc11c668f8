import Configuration
import Foundation

extension NodeConfiguration {
    /// The configuration keys, their meaning and defaults (the README's table is generated from
    /// the same words). Each can be overridden by an environment variable: `STATESYNC_` and the
    /// key upper-cased with `.` as `_` (`node.id` ← `STATESYNC_NODE_ID`; lists comma-separated).
    public enum Key: String, CaseIterable, Sendable {
        case nodeID = "node.id"
        case dataDirectory = "node.data_dir"
        case publish = "network.publish"
        case peers = "network.peers"
        case api = "network.api"
        case repair = "network.repair"
        case heartbeat = "network.heartbeat_ms"
        case maximumDrift = "clock.max_drift_ms"
        case logLevel = "log.level"
        case logFormat = "log.format"
        case httpListen = "http.listen"
        case fsync = "storage.fsync"
        case fsyncInterval = "storage.fsync_interval_ms"
        case publishAt = "storage.publish"
        case compactBytes = "storage.compact_bytes"
        case historyDeltas = "history.deltas_per_origin"
        case highWaterMark = "network.hwm"
        case clientHighWaterMark = "network.client_hwm"
        case batchMaximumDeltas = "network.batch_max_deltas"
        case reserveBytes = "storage.reserve_bytes"
        case tombstoneGrace = "storage.tombstone_grace_ms"
        case secretKey = "security.secret_key"
        case peerKeys = "security.peer_keys"
        case clientKeys = "security.client_keys"

        /// The environment variable that overrides this key.
        public var environmentVariable: String {
            "STATESYNC_" + rawValue.uppercased().replacingOccurrences(of: ".", with: "_")
        }
    }

    /// Why `address` is not a `HOST:PORT` the HTTP listener can bind (`nil`: it is; an empty
    /// string means no listener).
    static func listenAddressProblem(_ address: String) -> String? {
        if address.isEmpty { return nil }
        guard let colon = address.lastIndex(of: ":") else {
            return "'\(address)' is not HOST:PORT (e.g. 127.0.0.1:9464)"
        }
        var host = String(address[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty, !host.contains("/") else {
            return "'\(address)' is not HOST:PORT (e.g. 127.0.0.1:9464)"
        }
        guard let port = Int(address[address.index(after: colon)...]), (0...65_535).contains(port) else {
            return "'\(address)' has no port 0…65535 after the last ':'"
        }
        return nil
    }

    static let logLevels = ["trace", "debug", "info", "notice", "warning", "error", "critical"]

    /// The configuration a node uses when started without a file: one node on loopback, with its
    /// data in `./statesync-data`. Environment variables override it as they override a file.
    public static let defaultYAML = """
        # statesyncd's built-in configuration (used when no --config is given)
        node:
          id: node1
          data_dir: ./statesync-data
        network:
          publish: tcp://127.0.0.1:7001
          api: tcp://127.0.0.1:7101
          peers: []
          heartbeat_ms: 500
        clock:
          max_drift_ms: 60000
        storage:
          fsync: always
          fsync_interval_ms: 50
          # publish: written   # peers get a write while it is fsynced, not after (README: storage.publish)
          compact_bytes: 67108864
        history:
          deltas_per_origin: 100000
        log:
          level: info
        """

    /// Reads the built-in configuration (``defaultYAML``) with environment-variable overrides.
    public static func loadDefaults(environment: [String: String]? = nil) throws(StateSyncError) -> NodeConfiguration {
        try load(yaml: Array(defaultYAML.utf8), source: "built-in defaults", environment: environment)
    }

    /// Reads a node configuration from a YAML file, with environment-variable overrides
    /// (`environment` defaults to the process's).
    ///
    /// - Throws: ``StateSyncError`` with code ``StateSyncError/Code/invalidConfiguration`` and a
    ///   one-line message naming the file (or variable), the key and what is wrong.
    public static func load(
        file path: String,
        environment: [String: String]? = nil
    ) throws(StateSyncError) -> NodeConfiguration {
        return try load(yaml: try readFile(path), source: path, environment: environment)
    }

    /// The octets of the file at `path`; an error gives the kernel's reason (a directory: "Is a
    /// directory", where Foundation said "NSCocoaErrorDomain error 256").
    private static func readFile(_ path: String) throws(StateSyncError) -> [UInt8] {
        func failed(_ error: Int32) -> StateSyncError {
            StateSyncError(.invalidConfiguration, "\(path): cannot read the file: \(String(cString: strerror(error)))")
        }
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw failed(errno) }
        defer { close(descriptor) }
        var octets: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            if count > 0 {
                octets.append(contentsOf: chunk[..<count])
            } else if count == 0 {
                return octets
            } else if errno != EINTR {
                throw failed(errno)
            }
        }
    }

    static func load(yaml: [UInt8], source path: String, environment: [String: String]?) throws(StateSyncError)
        -> NodeConfiguration
    {
        let environment = environment ?? ProcessInfo.processInfo.environment
        let snapshot: YAMLSnapshot
        do {
            snapshot = try yaml.withUnsafeBytes { raw in
                try YAMLSnapshot(data: RawSpan(_unsafeBytes: raw), providerName: path, parsingOptions: .default)
            }
        } catch {
            // Yams reports the position and the parser's complaint over several lines: keep one line.
            let lines = "\(error)".split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
            let reason = lines.filter { !$0.isEmpty && !$0.allSatisfy({ $0 == "^" }) }.prefix(2).joined(separator: " ")
            throw StateSyncError(.invalidConfiguration, "\(path): not a valid YAML mapping: \(reason)")
        }
        if let problem = unknownKeyProblem(yaml: yaml, source: path) ?? nonTextValueProblem(yaml: yaml, source: path)
            ?? unknownEnvironmentProblem(environment)
        {
            throw StateSyncError(.invalidConfiguration, problem)
        }
        let reader = KeyReader(
            path: path, file: snapshot, environment: EnvironmentVariablesProvider(environmentVariables: environment))

        let nodeID = try reader.requiredString(.nodeID)
        guard Self.isValidNodeID(nodeID) else {
            throw reader.invalid(.nodeID, "'\(nodeID)' must be 1–64 characters of letters, digits, '.', '_' or '-'")
        }
        let dataDirectory = try reader.requiredString(.dataDirectory)
        let publish = try reader.requiredString(.publish)
        try reader.checkEndpoint(.publish, publish)
        var peers: [String] = []
        var peerNodeIDs: [String: String] = [:]
        for entry in try reader.stringArray(.peers) ?? [] {
            // `NODE_ID=ENDPOINT` names the node at that endpoint (security needs it).
            var peer = entry
            if let equals = entry.firstIndex(of: "="), !entry[..<equals].contains(":") {
                let id = String(entry[..<equals])
                peer = String(entry[entry.index(after: equals)...])
                guard Self.isValidNodeID(id) else {
                    throw reader.invalid(.peers, "'\(entry)': '\(id)' is not a node id (1–64 of A-Z a-z 0-9 . _ -)")
                }
                peerNodeIDs[peer] = id
            }
            try reader.checkEndpoint(.peers, peer)
            peers.append(peer)
        }
        if peers.contains(publish) {
            throw reader.invalid(.peers, "lists this node's own publish endpoint \(publish)")
        }
        let api = try reader.string(.api)
        if let api { try reader.checkEndpoint(.api, api) }
        if let api, api == publish {
            throw reader.invalid(.api, "is the same endpoint as network.publish")
        }
        let repair = try reader.string(.repair)
        if let repair {
            try reader.checkEndpoint(.repair, repair)
            if api != nil {
                throw reader.invalid(
                    .repair, "is for nodes without network.api; with an API, peers repair through it (remove one)")
            }
            if repair == publish { throw reader.invalid(.repair, "is the same endpoint as network.publish") }
        }
        let heartbeat = try reader.int(.heartbeat) ?? 500
        guard (10...60_000).contains(heartbeat) else {
            throw reader.invalid(.heartbeat, "\(heartbeat) is outside 10…60000 milliseconds")
        }
        let drift = try reader.int(.maximumDrift) ?? 60_000
        guard drift > 0 else { throw reader.invalid(.maximumDrift, "\(drift) must be positive") }
        let format = try reader.string(.logFormat) ?? "text"
        guard ["text", "json"].contains(format) else {
            throw reader.invalid(.logFormat, "'\(format)' is not text or json")
        }
        let httpListen = try reader.string(.httpListen)
        if let httpListen, let problem = Self.listenAddressProblem(httpListen) {
            throw reader.invalid(.httpListen, problem)
        }
        let level = try reader.string(.logLevel) ?? "info"
        guard logLevels.contains(level) else {
            throw reader.invalid(.logLevel, "'\(level)' is not one of \(logLevels.joined(separator: ", "))")
        }
        let fsyncText = try reader.string(.fsync) ?? "always"
        guard let fsync = FsyncPolicy(rawValue: fsyncText) else {
            throw reader.invalid(.fsync, "'\(fsyncText)' is not one of always, interval")
        }
        let fsyncInterval = try reader.int(.fsyncInterval) ?? 50
        guard (1...10_000).contains(fsyncInterval) else {
            throw reader.invalid(.fsyncInterval, "\(fsyncInterval) is outside 1…10000 milliseconds")
        }
        let publishText = try reader.string(.publishAt) ?? (fsync == .interval ? "written" : "synced")
        guard ["synced", "written"].contains(publishText) else {
            throw reader.invalid(.publishAt, "'\(publishText)' is not one of synced, written")
        }
        if fsync == .interval, publishText == "synced" {
            let publishFix =
                reader.origin(of: .publishAt) == path
                ? "set written or remove the key" : "unset \(Key.publishAt.environmentVariable) or set it to written"
            throw reader.invalid(
                .publishAt,
                "'synced' does not go with storage.fsync: interval (from \(reader.origin(of: .fsync))), which publishes writes once written (\(publishFix), or set storage.fsync: always)"
            )
        }
        let compactBytes = try reader.int(.compactBytes) ?? 64 << 20
        guard compactBytes >= 4096 else { throw reader.invalid(.compactBytes, "\(compactBytes) is below 4096 bytes") }
        let reserveBytes = try reader.int(.reserveBytes) ?? 64 << 20
        guard reserveBytes >= 0 else {
            throw reader.invalid(.reserveBytes, "\(reserveBytes) must not be negative (0 = no reserve)")
        }
        let historyDeltas = try reader.int(.historyDeltas) ?? 100_000
        guard (0...100_000_000).contains(historyDeltas) else {
            throw reader.invalid(.historyDeltas, "\(historyDeltas) is outside 0…100000000")
        }
        let hwm = try reader.int(.highWaterMark) ?? 100_000
        guard hwm >= 0 else { throw reader.invalid(.highWaterMark, "\(hwm) must not be negative (0 = unbounded)") }
        let clientHWM = try reader.int(.clientHighWaterMark) ?? 10_000
        guard clientHWM >= 1 else { throw reader.invalid(.clientHighWaterMark, "\(clientHWM) must be at least 1") }
        let grace = try reader.int(.tombstoneGrace) ?? 3_600_000
        guard (0...2_592_000_000).contains(grace) else {
            throw reader.invalid(.tombstoneGrace, "\(grace) is outside 0…2592000000 milliseconds (30 days)")
        }
        let batch = try reader.int(.batchMaximumDeltas) ?? 4096
        guard (1...65_536).contains(batch) else {
            throw reader.invalid(.batchMaximumDeltas, "\(batch) is outside 1…65536 deltas per message")
        }
        // A relative data directory is relative to the working directory, as for any CLI path.
        var configuration = NodeConfiguration(
            nodeID: nodeID, dataDirectory: dataDirectory, publishEndpoint: publish, peers: peers,
            apiEndpoint: api, heartbeatIntervalMilliseconds: heartbeat, maximumClockDriftMilliseconds: drift,
            logLevel: level, fsync: fsync, fsyncIntervalMilliseconds: fsyncInterval, compactBytes: compactBytes,
            historyDeltas: historyDeltas, highWaterMark: hwm)
        configuration.repairEndpoint = repair
        configuration.publishBeforeSync = publishText == "written" && fsync == .always
        configuration.clientHighWaterMark = clientHWM
        configuration.batchMaximumDeltas = batch
        configuration.peerNodeIDs = peerNodeIDs
        configuration.reserveBytes = reserveBytes
        configuration.tombstoneGraceMilliseconds = grace
        configuration.logFormat = format
        configuration.httpListen = httpListen.flatMap { $0.isEmpty ? nil : $0 }
        configuration.security = try security(reader, peers: peers, peerNodeIDs: peerNodeIDs)
        return configuration
    }

    /// Whether `id` is a node id this implementation gives a node: 1–64 of `A-Z a-z 0-9 . _ -`.
    public static func isValidNodeID(_ id: String) -> Bool {
        id.range(of: #"^[A-Za-z0-9._-]{1,64}$"#, options: .regularExpression) != nil
    }

    /// The `security.*` keys: all or nothing, and every peer named and keyed.
    private static func security(_ reader: KeyReader, peers: [String], peerNodeIDs: [String: String])
        throws(StateSyncError) -> SecurityConfiguration?
    {
        let secretKey = try reader.string(.secretKey)
        let peerKeyEntries = try reader.stringArray(.peerKeys) ?? []
        let clientKeys = try reader.stringArray(.clientKeys) ?? []
        guard let secretKey, !secretKey.isEmpty else {
            if !peerKeyEntries.isEmpty || !clientKeys.isEmpty {
                throw reader.invalid(
                    peerKeyEntries.isEmpty ? .clientKeys : .peerKeys,
                    "is set but security.secret_key is not: security is all or nothing (set this node's secret key, made with statesync keygen --out PATH, or remove security.*)"
                )
            }
            return nil
        }
        var peerKeys: [String: [String]] = [:]
        for entry in peerKeyEntries {
            guard let equals = entry.firstIndex(of: "="), equals != entry.startIndex else {
                throw reader.invalid(
                    .peerKeys, "'\(entry)' is not NODE_ID=KEY (the key as Z85 text or the path of its .pub file)")
            }
            let id = String(entry[..<equals])
            guard isValidNodeID(id) else { throw reader.invalid(.peerKeys, "'\(id)' is not a node id") }
            // A node named twice has two trusted keys: the way a peer rotates its key pair.
            let key = String(entry[entry.index(after: equals)...])
            guard !(peerKeys[id]?.contains(key) ?? false) else {
                throw reader.invalid(.peerKeys, "names \(id)=\(key) twice")
            }
            peerKeys[id, default: []].append(key)
        }
        for peer in peers {
            guard let id = peerNodeIDs[peer] else {
                throw reader.invalid(
                    .peers,
                    "\(peer) has no node id; with security.secret_key every peer is written NODE_ID=ENDPOINT (e.g. node2=\(peer)), so the node knows whose key to expect there"
                )
            }
            guard peerKeys[id] != nil else {
                throw reader.invalid(
                    .peerKeys, "has no key for \(id) (network.peers \(peer)); add \(id)=KEY (its .pub file or Z85 text)"
                )
            }
        }
        var clients: [SecurityConfiguration.ClientAccess] = []
        for entry in clientKeys {
            // KEY [read=PATTERN|PATTERN...] [write=PATTERN|...]; without either: every channel.
            let tokens = entry.split(separator: " ", omittingEmptySubsequences: true).map(String.init)
            guard let key = tokens.first else { throw reader.invalid(.clientKeys, "has an empty entry") }
            var read: [String]?
            var write: [String]?
            for token in tokens.dropFirst() {
                let parts = token.split(separator: "=", maxSplits: 1).map(String.init)
                guard parts.count == 2, ["read", "write"].contains(parts[0]) else {
                    throw reader.invalid(
                        .clientKeys,
                        "'\(entry)': '\(token)' is not read=PATTERN|PATTERN or write=PATTERN|... (a pattern: a channel, prefix*, or *)"
                    )
                }
                let patterns = parts[1].split(separator: "|").map(String.init)
                if parts[0] == "read" { read = patterns } else { write = patterns }
            }
            if read == nil && write == nil { (read, write) = (["*"], ["*"]) }
            clients.append(.init(key: key, read: read ?? [], write: write ?? []))
        }
        return SecurityConfiguration(secretKeyFile: secretKey, peerKeys: peerKeys, clients: clients)
    }

    /// Reads keys from the environment first, then the file, and names the source of any error.
    private final class KeyReader {
        let path: String
        let file: YAMLSnapshot
        let environment: EnvironmentVariablesProvider
        /// Keys whose value came from the environment: errors about them name the variable.
        private var fromEnvironment: Set<Key> = []

        init(path: String, file: YAMLSnapshot, environment: EnvironmentVariablesProvider) {
            self.path = path
            self.file = file
            self.environment = environment
        }

        func invalid(_ key: Key, _ reason: String, source: String? = nil) -> StateSyncError {
            StateSyncError(.invalidConfiguration, "\(source ?? origin(of: key)): \(key.rawValue): \(reason)")
        }

        /// Where `key`'s value came from: its environment variable, or the file.
        func origin(of key: Key) -> String {
            fromEnvironment.contains(key) ? "environment variable \(key.environmentVariable)" : path
        }

        private func lookup(_ key: Key, _ type: ConfigType) throws(StateSyncError) -> ConfigContent? {
            let components = key.rawValue.split(separator: ".").map(String.init)
            do {
                if let value = try environment.value(forKey: AbsoluteConfigKey(["statesync"] + components), type: type)
                    .value
                {
                    fromEnvironment.insert(key)
                    return value.content
                }
            } catch {
                let given = try? environment.value(forKey: AbsoluteConfigKey(["statesync"] + components), type: .string)
                throw invalid(
                    key, "expected \(Self.describe(type))\(Self.quoting(given?.value?.content))",
                    source: "environment variable \(key.environmentVariable)")
            }
            do {
                return try file.value(forKey: AbsoluteConfigKey(components), type: type).value?.content
            } catch {
                let given = try? file.value(forKey: AbsoluteConfigKey(components), type: .string)
                throw invalid(key, "expected \(Self.describe(type))\(Self.quoting(given?.value?.content))")
            }
        }

        /// ", not 'fast'": the value given, when it reads as text (its start, if long).
        static func quoting(_ given: ConfigContent?) -> String {
            guard case .string(let text)? = given else { return "" }
            return ", not '\(text.count <= 60 ? text : String(text.prefix(57)) + "...")'"
        }

        static func describe(_ type: ConfigType) -> String {
            switch type {
            case .string: "a string"
            case .int: "an integer"
            case .stringArray: "a list of strings"
            default: "\(type)"
            }
        }

        func string(_ key: Key) throws(StateSyncError) -> String? {
            guard let content = try lookup(key, .string) else { return nil }
            guard case .string(let s) = content else { throw invalid(key, "expected a string") }
            return s
        }

        func requiredString(_ key: Key) throws(StateSyncError) -> String {
            guard let value = try string(key) else {
                throw invalid(key, "missing (set it in the file or with \(key.environmentVariable))")
            }
            guard !value.trimmingCharacters(in: .whitespaces).isEmpty else { throw invalid(key, "is empty") }
            return value
        }

        func int(_ key: Key) throws(StateSyncError) -> Int? {
            guard let content = try lookup(key, .int) else { return nil }
            guard case .int(let i) = content else { throw invalid(key, "expected an integer") }
            return i
        }

        func stringArray(_ key: Key) throws(StateSyncError) -> [String]? {
            guard let content = try lookup(key, .stringArray) else { return nil }
            guard case .stringArray(let list) = content else { throw invalid(key, "expected a list of strings") }
            return list.map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }

        func checkEndpoint(_ key: Key, _ endpoint: String) throws(StateSyncError) {
            if let problem = NodeConfiguration.endpointProblem(endpoint) { throw invalid(key, problem) }
        }
    }

    /// Why `endpoint` is not a usable ZeroMQ endpoint, or `nil` when it is.
    public static func endpointProblem(_ endpoint: String) -> String? {
        if endpoint.hasPrefix("tcp://") {
            let rest = endpoint.dropFirst("tcp://".count)
            guard let colon = rest.lastIndex(of: ":"), colon != rest.startIndex else {
                return "'\(endpoint)' needs a host and a port (tcp://HOST:PORT)"
            }
            let port = rest[rest.index(after: colon)...]
            if port == "*" { return nil }
            guard let number = Int(port), (1...65535).contains(number) else {
                return "'\(endpoint)' has no valid port (1–65535 or *)"
            }
            return nil
        }
        if endpoint.hasPrefix("ipc://") || endpoint.hasPrefix("inproc://") {
            return endpoint.split(separator: "/", omittingEmptySubsequences: true).count >= 2
                ? nil : "'\(endpoint)' names no path"
        }
        return "'\(endpoint)' is not a ZeroMQ endpoint (expected tcp://HOST:PORT, ipc://PATH or inproc://NAME)"
    }
}

extension NodeConfiguration {
    /// What this configuration holds for `key`, as text to compare (the peers as a set: a list
    /// in another order holds the same).
    func comparableText(of key: Key) -> String {
        switch key {
        case .nodeID: nodeID
        case .dataDirectory: dataDirectory
        case .publish: publishEndpoint
        case .peers:
            peers.map { peer in (peerNodeIDs[peer].map { "\($0)=" } ?? "") + peer }.sorted().joined(separator: ",")
        case .api: apiEndpoint ?? ""
        case .repair: repairEndpoint ?? ""
        case .heartbeat: "\(heartbeatIntervalMilliseconds)"
        case .maximumDrift: "\(maximumClockDriftMilliseconds)"
        case .logLevel: logLevel
        case .logFormat: logFormat
        case .httpListen: httpListen ?? ""
        case .fsync: fsync.rawValue
        case .fsyncInterval: "\(fsyncIntervalMilliseconds)"
        case .publishAt: publishesBeforeSync ? "written" : "synced"
        case .compactBytes: "\(compactBytes)"
        case .historyDeltas: "\(historyDeltas)"
        case .highWaterMark: "\(highWaterMark)"
        case .clientHighWaterMark: "\(clientHighWaterMark)"
        case .batchMaximumDeltas: "\(batchMaximumDeltas)"
        case .reserveBytes: "\(reserveBytes)"
        case .tombstoneGrace: "\(tombstoneGraceMilliseconds)"
        case .secretKey: security?.secretKeyFile ?? ""
        case .peerKeys:
            (security?.peerKeys ?? [:]).map { "\($0.key)=\($0.value.joined(separator: "|"))" }.sorted()
                .joined(separator: ",")
        case .clientKeys: (security?.clients ?? []).map { "\($0)" }.joined(separator: ",")
        }
    }

    /// The keys whose values differ between this configuration and `other`, in the order of
    /// ``Key`` (a reload names what changed, not only that something did).
    public func keysDiffering(from other: NodeConfiguration) -> [Key] {
        Key.allCases.filter { comparableText(of: $0) != other.comparableText(of: $0) }
    }
}
