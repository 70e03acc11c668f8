import Foundation
import StateSync
import StateSyncClient
import StateSyncTesting
import StateSyncZeroMQ
import Synchronization
import ZeroMQ

#if canImport(Glibc)
    import Glibc
#endif

/// The multi-node convergence harness behind `statesync harness`: starts real `statesyncd`
/// processes on loopback, runs concurrent writers and a watcher per node, injects faults on a
/// seeded schedule, heals, waits for quiet, and checks the result (``ConvergenceChecker``).
public enum Harness {
    static let channel = "harness"

    /// Runs the harness. `progress` receives one-line updates for a live display.
    public static func run(_ options: HarnessOptions, progress: @escaping @Sendable (Progress) -> Void) async throws
        -> HarnessReport
    {
        guard (2...32).contains(options.nodes) else { throw HarnessError("--nodes must be between 2 and 32") }
        guard options.operations > 0 else { throw HarnessError("--ops must be positive") }
        guard FileManager.default.isExecutableFile(atPath: options.daemonPath) else {
            throw HarnessError(
                "cannot run statesyncd at \(options.daemonPath); build it (swift build) or pass --statesyncd PATH")
        }
        let started = Date()
        let work =
            options.workDirectory
            ?? (NSTemporaryDirectory() + "statesync-harness-\(options.seed)-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        var rng = SeededGenerator(seed: options.seed)

        // The cluster. On loopback, node i subscribes to node j through relay (i, j), so links can
        // be cut; with --netns every node is a host of its own and faults act on real links.
        let names = (1...options.nodes).map { "n\($0)" }
        let lab = options.netns ? try NetnsLab(nodes: options.nodes, seed: options.seed) : nil
        defer { lab?.tearDown() }
        let hosts = names.indices.map { lab?.address($0) ?? "127.0.0.1" }
        let publishPorts = try names.map { _ in lab == nil ? try freePort() : 7001 }
        let apiPorts = try names.map { _ in lab == nil ? try freePort() : 7101 }
        var links: [String: LinkProxy] = [:]  // "i>j": i's subscription to j
        if lab == nil {
            for i in names.indices {
                for j in names.indices where i != j {
                    links["\(i)>\(j)"] = try LinkProxy(name: "\(names[i])<\(names[j])", targetPort: publishPorts[j])
                }
            }
        }
        let relays = links
        func peerEndpoint(_ i: Int, _ j: Int) -> String {
            relays["\(i)>\(j)"]?.endpoint ?? "tcp://\(hosts[j]):\(publishPorts[j])"
        }
        let skewed: Int? = options.faults.contains(.clock) ? Int(rng.next() % UInt64(options.nodes)) : nil
        let skewMilliseconds = 1500 + Int(rng.next() % UInt64(Self.maximumClockSkewMilliseconds - 1500))
        let planted: Int? = options.plantedBug == nil ? nil : options.nodes - 1
        // --faults join: the last node starts late, knowing only n1; no one knows it.
        let joiner: Int? = options.faults.contains(.join) ? options.nodes - 1 : nil
        func configuredPeers(_ i: Int) -> [Int] {
            i == joiner ? [0] : names.indices.filter { $0 != i && $0 != joiner }
        }
        // --secure: a key pair per node and one for the harness's clients, in the work directory.
        var publicKeys: [String] = []
        /// The harness clients' credentials for `node` (nil without --secure).
        func security(_ node: String) -> StateSyncClient.Security? {
            options.secure ? .init(serverKey: "\(work)/\(node).key.pub", secretKeyFile: "\(work)/client.key") : nil
        }
        if options.secure {
            for name in names + ["client"] {
                let pair = try CurveKeyFile.generate(at: "\(work)/\(name).key")
                publicKeys.append(try Curve.z85Encode(pair.publicKey))
            }
        }
        var built: [NodeProcess] = []
        for i in names.indices {
            var environment = [
                "STATESYNC_NODE_ID": names[i],
                "STATESYNC_NODE_DATA_DIR": "\(work)/\(names[i])",
                "STATESYNC_NETWORK_PUBLISH": "tcp://\(hosts[i]):\(publishPorts[i])",
                "STATESYNC_NETWORK_API": "tcp://\(hosts[i]):\(apiPorts[i])",
                "STATESYNC_NETWORK_PEERS": configuredPeers(i).map { "\(names[$0])=" + peerEndpoint(i, $0) }
                    .joined(separator: ","),
                "STATESYNC_NETWORK_HEARTBEAT_MS": "100",
                "STATESYNC_LOG_LEVEL": "info",
            ]
            if options.secure {
                environment["STATESYNC_SECURITY_SECRET_KEY"] = "\(work)/\(names[i]).key"
                environment["STATESYNC_SECURITY_PEER_KEYS"] = names.indices.filter { $0 != i }.map {
                    "\(names[$0])=\(publicKeys[$0])"
                }.joined(separator: ",")
                environment["STATESYNC_SECURITY_CLIENT_KEYS"] = publicKeys[names.count]
            }
            if i == skewed { environment["STATESYNC_TEST_CLOCK_OFFSET_MS"] = String(skewMilliseconds) }
            if i == planted {
                switch options.plantedBug {
                case .dropDeltas, nil: environment["STATESYNC_TEST_DROP_REMOTE_DELTAS"] = "0.3"
                case .neverExpire: environment["STATESYNC_TEST_NEVER_EXPIRE"] = "1"
                }
            }
            built.append(
                NodeProcess(
                    name: names[i], api: "tcp://\(hosts[i]):\(apiPorts[i])", publishPort: publishPorts[i],
                    environment: environment, daemonPath: options.daemonPath, logPath: "\(work)/\(names[i]).log",
                    launcher: lab?.launcher(node: i, executable: options.daemonPath)))
        }
        let nodes = built
        let faults = FaultLog()
        if let skewed {
            faults.record(
                kind: "clock", target: names[skewed], detail: "+\(skewMilliseconds) ms for the whole run", at: 0,
                healed: nil)
        }
        if let planted {
            let detail = options.plantedBug == .neverExpire ? "never-expire" : "drop-deltas 30%"
            faults.record(kind: "planted-bug", target: names[planted], detail: detail, at: 0, healed: nil)
        }

        defer {
            for node in nodes { _ = node.stop() }
            for relay in relays.values { relay.stop() }
        }
        // Stopped by a signal before the end (`statesync harness`): undone as a run that ends.
        let keep = options.keep
        let interruption = HarnessInterruption.register {
            for node in nodes { _ = node.stop(timeout: 5) }
            for relay in relays.values { relay.stop() }
            lab?.tearDown()
            if !keep { try? FileManager.default.removeItem(atPath: work) }
        }
        defer { HarnessInterruption.unregister(interruption) }
        for (index, node) in nodes.enumerated() where index != joiner { try node.start() }
        let clients = try nodes.map { node in
            try StateSyncClient(
                endpoint: node.api, requestTimeout: .seconds(2), security: security(node.name))
        }
        defer { for client in clients { client.close() } }
        let initial = clients.indices.filter { $0 != joiner }.map { clients[$0] }
        try await waitFor("every node to answer", seconds: 30) {
            for client in initial where (try? await client.status()) == nil { return false }
            return true
        }
        // Many nodes on few cores take a while: every node dials every other.
        try await waitFor("every node to see its peers", seconds: 30 + 2 * Double(options.nodes)) {
            for client in initial {
                guard let status = try? await client.status(), status.peers.allSatisfy(\.meshed) else {
                    return false
                }
            }
            return true
        }

        // Watchers: one per node, recording sessions between reconnections.
        let watchers = names.indices.map {
            WatchRecorder(node: names[$0], endpoint: nodes[$0].api, security: security(names[$0]))
        }
        let watchTasks = watchers.map { watcher in Task { await watcher.run() } }
        defer {
            // Also when a step below throws: no watcher may outlive the run.
            for task in watchTasks { task.cancel() }
            for watcher in watchers { watcher.stop() }
        }
        try await waitFor("every watcher to be registered", seconds: 30) {
            watchers.indices.allSatisfy { $0 == joiner || watchers[$0].isWatching }
        }

        // Workload and faults run together.
        let counter = SharedCounter()
        let workloadDone = SharedFlag()
        let minimumDuration = max(2.0, Double(options.faults.filter { $0 != .clock }.count) * 1.5)
        // (A late joiner's clients and watcher wait for it like for a killed node.)
        let workloadStart = Date()
        let writes = WriteLog()
        let expiries = LatestExpiry()
        // The report's pictures: every write's time and outcome, and each node's lag, sampled
        // through clients of their own (a node that does not answer does not hold up the others).
        let timeline = TimelineRecorder()
        func sinceStart() -> Int { Int(Date().timeIntervalSince(workloadStart) * 1000) }
        let samplers = try nodes.map { node in
            try StateSyncClient(endpoint: node.api, requestTimeout: .milliseconds(400), security: security(node.name))
        }
        defer { for sampler in samplers { sampler.close() } }
        let samplingDone = SharedFlag()
        let samplingTask = Task {
            while !samplingDone.isSet {
                await withTaskGroup(of: Void.self) { group in
                    for (index, sampler) in samplers.enumerated() {
                        group.addTask {
                            let status = try? await sampler.status()
                            timeline.lag(of: names[index], at: sinceStart(), missing: status?.missingDeltas)
                        }
                    }
                }
                try? await Task.sleep(for: .milliseconds(200))
            }
        }
        defer { samplingDone.set() }  // also when a step below throws
        let faultTask = Task {
            await FaultController(
                nodes: nodes, relays: relays, lab: lab, names: names, seed: options.seed &+ 1, log: faults,
                joiner: joiner, neverRestarted: options.plantedBug == .dropDeltas ? planted : nil
            )
            .run(faults: options.faults.filter { $0 != .clock }, until: { workloadDone.isSet }, start: workloadStart)
        }
        let progressTask = Task {
            while !workloadDone.isSet {
                progress(
                    Progress(
                        operations: counter.value, total: options.operations, faults: faults.count,
                        active: faults.active))
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
        await withTaskGroup(of: Void.self) { group in
            for client in 0..<options.clients {
                let seed = options.seed &+ UInt64(client) &* 7919
                group.addTask {
                    var rng = SeededGenerator(seed: seed)
                    while true {
                        let index = counter.increment()
                        if index > options.operations { break }
                        // Spread the operations over the fault schedule.
                        let due = minimumDuration * Double(index) / Double(options.operations)
                        let elapsed = Date().timeIntervalSince(workloadStart)
                        if elapsed < due { try? await Task.sleep(for: .milliseconds(Int((due - elapsed) * 1000))) }
                        let target = Int(rng.next() % UInt64(names.count))
                        var write = Self.drawWrite(
                            &rng, models: options.models, value: "c\(client)-\(index)", node: names[target])
                        let sentAt = Self.wallMilliseconds()
                        let address = ModelAddress(channel: channel, model: write.model)
                        let result = try? await clients[target].write(address, write.propertyWrites)
                        if let result, result.outcome == .changed { write.acknowledged = result.version }
                        if write.timeToLive > 0 {
                            // When it expires at the latest: its version's time, or, unacknowledged,
                            // a version a skewed clock may have given it.
                            let latest =
                                write.acknowledged.map { $0.milliseconds }
                                ?? sentAt + UInt64(Self.maximumClockSkewMilliseconds)
                            expiries.note(latest + write.timeToLive)
                        }
                        writes.append(write)
                        timeline.write(at: sinceStart(), acknowledged: write.acknowledged != nil)
                    }
                }
            }
        }
        workloadDone.set()
        await faultTask.value
        await progressTask.value
        progress(
            Progress(operations: options.operations, total: options.operations, faults: faults.count, active: "healing")
        )

        // Heal everything, then wait for quiet.
        for relay in relays.values {
            relay.setCut(false)
            relay.setDelay(milliseconds: 0)
        }
        if let lab {
            lab.setPartition(Set(0..<options.nodes), cut: false)
            for node in 0..<options.nodes { lab.setLink(node: node, up: true) }
        }
        for node in nodes {
            if node.isPaused { node.resume() }
            if !node.isRunning { try node.start() }
        }
        let healed = Date()
        var converged = false
        // Values written with a time to live must have expired everywhere before the states are
        // compared (a node's clock may be skewed ahead: it deletes them earlier than the others).
        // A tick or two after the latest expiry, every node has deleted them.
        let expiredBy = expiries.latest.map { $0 + 500 } ?? 0
        let deadline = max(
            healed.addingTimeInterval(TimeInterval(options.convergenceTimeoutSeconds)),
            Date(timeIntervalSince1970: Double(expiredBy) / 1000 + 10))
        var quietSince: Date?
        var equalSince: Date?  // when the states last became equal (the convergence time)
        var lastDigests: [UInt64] = []
        while Date() < deadline {
            var statuses: [NodeStatus] = []
            for client in clients { if let status = try? await client.status() { statuses.append(status) } }
            let settled =
                statuses.count == clients.count
                && statuses.allSatisfy({ $0.missingDeltas == 0 && $0.peers.allSatisfy(\.meshed) })
            let equal = settled && Set(statuses.map(\.stateDigest)).count == 1
            if equal, equalSince == nil { equalSince = Date() }
            if !equal { equalSince = nil }
            let expiriesDone = Self.wallMilliseconds() >= expiredBy
            if equal && expiriesDone {
                converged = true
                break
            }
            // Quiet but different: nothing is missing, nothing changes, and still the states
            // differ. Waiting longer will not help (unless values are still to expire).
            let digests = statuses.map(\.stateDigest)
            if settled && !equal && expiriesDone && digests == lastDigests {
                if let since = quietSince, Date().timeIntervalSince(since) > 3 { break }
                if quietSince == nil { quietSince = Date() }
            } else {
                quietSince = nil
            }
            lastDigests = digests
            try await Task.sleep(for: .milliseconds(20))
        }
        let convergenceMilliseconds =
            converged ? Int((equalSince ?? Date()).timeIntervalSince(healed) * 1000) : nil
        samplingDone.set()
        await samplingTask.value
        let healedAt = Int(healed.timeIntervalSince(workloadStart) * 1000)
        let runTimeline = timeline.timeline(
            healed: healedAt, converged: convergenceMilliseconds.map { healedAt + $0 }, end: sinceStart())

        // What each node used, before anything else runs on it.
        var resources: [String: ProcessResources] = [:]
        var peerMessages: [String: Int] = [:]
        var antiEntropy = HarnessReport.AntiEntropy()
        for (index, node) in nodes.enumerated() {
            if let pid = node.pid, let used = ProcessResources.read(pid: pid) { resources[node.name] = used }
            if let status = try? await clients[index].status() {
                peerMessages[node.name] = status.counters["peer_messages_received"] ?? 0
                antiEntropy.comparisons += status.counters["digest_comparisons"] ?? 0
                antiEntropy.divergences += status.counters["state_divergences"] ?? 0
                if !status.divergedPeers.isEmpty {
                    antiEntropy.divergedAtEnd.append(
                        "\(node.name) differs from \(status.divergedPeers.joined(separator: ", "))")
                }
            }
        }

        // Final states.
        var states: [ConvergenceChecker.NodeState] = []
        var newest: Version?  // the newest version any node holds (nil: nothing written)
        for (index, client) in clients.enumerated() {
            var models: [String: [String: ReplicaStore.Register]] = [:]
            for m in 0..<options.models {
                let registers = (try? await client.get(ModelAddress(channel: channel, model: "m\(m)"))) ?? [:]
                if !registers.isEmpty { models["m\(m)"] = registers }
            }
            let status = try? await client.status()
            if let latest = status?.latestVersion { newest = max(newest ?? latest, latest) }
            states.append(
                ConvergenceChecker.NodeState(node: names[index], digest: status?.stateDigest ?? 0, models: models))
        }
        // Let the watchers take what is already on their way: each must have been told, by a
        // caught-up marker of its node, that it holds everything through the newest version (a
        // watcher still reconnecting to a node restarted at the very end is waited for; quiet
        // alone is not enough). Then stop them.
        try? await waitFor("watchers to catch up", seconds: 30) {
            guard let newest else { return watchers.allSatisfy(\.isWatching) }
            return watchers.allSatisfy { $0.isWatching && $0.caughtUpTo.map { $0 >= newest } == true }
        }
        for task in watchTasks { task.cancel() }
        for watcher in watchers { watcher.stop() }

        let histories = watchers.map { watcher in
            let models = Dictionary(
                uniqueKeysWithValues: watcher.replica.models.map { ($0, watcher.replica.properties(of: $0)) })
            return ConvergenceChecker.WatchHistory(node: watcher.node, sessions: watcher.sessions, finalState: models)
        }
        let findings = ConvergenceChecker().check(
            writes: writes.all, nodes: states, watches: histories, expiredThrough: expiredBy)
        // --secure: every node must refuse a stranger's key and a client without CURVE.
        var strangersRefused: Bool?
        if options.secure {
            try? FileManager.default.removeItem(atPath: "\(work)/stranger.key")
            try? FileManager.default.removeItem(atPath: "\(work)/stranger.key.pub")
            _ = try CurveKeyFile.generate(at: "\(work)/stranger.key")
            var refused = true
            for node in nodes {
                let stranger = try StateSyncClient(
                    endpoint: node.api, requestTimeout: .milliseconds(800),
                    security: .init(serverKey: "\(work)/\(node.name).key.pub", secretKeyFile: "\(work)/stranger.key"))
                let plain = try StateSyncClient(endpoint: node.api, requestTimeout: .milliseconds(800))
                let strangerAnswered = (try? await stranger.status()) != nil
                let plainAnswered = (try? await plain.status()) != nil
                if strangerAnswered || plainAnswered { refused = false }
                stranger.close()
                plain.close()
            }
            strangersRefused = refused
        }
        var report = HarnessReport(
            seed: options.seed, nodes: options.nodes, operations: options.operations,
            acknowledged: writes.all.filter { $0.acknowledged != nil }.count, findings: findings,
            converged: converged && findings.converged, convergenceMilliseconds: convergenceMilliseconds,
            faults: faults.events, durationSeconds: Date().timeIntervalSince(started), workDirectory: work,
            notifications: watchers.reduce(0) { $0 + $1.sessions.reduce(0) { $0 + $1.count } })
        report.strangersRefused = strangersRefused
        let acknowledged = writes.all.filter { $0.acknowledged != nil }
        report.deletions = acknowledged.filter { $0.deletesModel || !$0.deleted.isEmpty }.count
        report.expiringWrites = acknowledged.filter { $0.timeToLive > 0 }.count
        report.resources = resources
        report.peerMessagesReceived = peerMessages
        report.antiEntropy = antiEntropy
        report.timeline = runTimeline
        for node in nodes { report.exitStatuses[node.name] = node.stop() }
        for relay in relays.values { relay.stop() }
        if report.passed && !options.keep {
            try? FileManager.default.removeItem(atPath: work)
            report.workDirectory = nil
        }
        return report
    }

    /// The largest clock skew the `clock` fault gives a node.
    static let maximumClockSkewMilliseconds = 3500

    static func wallMilliseconds() -> UInt64 { UInt64(Date().timeIntervalSince1970 * 1000) }

    /// One client operation, drawn from `rng`: mostly sets of one to three properties, some
    /// with a time to live (0.3–3 s), some deletions of properties, some of the whole model.
    static func drawWrite(
        _ rng: inout SeededGenerator, models: Int, value: String, node: String
    ) -> ConvergenceChecker.Write {
        let model = "m\(rng.next() % UInt64(models))"
        let kind = rng.next() % 100
        if kind < 5 {
            return ConvergenceChecker.Write(
                model: model, properties: [:], node: node, acknowledged: nil, deletesModel: true)
        }
        if kind < 13 {
            let deleted = Set((0..<(1 + rng.next() % 2)).map { _ in "p\(rng.next() % 4)" })
            return ConvergenceChecker.Write(
                model: model, properties: [:], node: node, acknowledged: nil, deleted: deleted.sorted())
        }
        let propertyCount = rng.next() % 10 < 3 ? 2 + Int(rng.next() % 2) : 1
        var properties: [String: Value] = [:]
        for _ in 0..<propertyCount { properties["p\(rng.next() % 4)"] = .string(value) }
        let timeToLive = kind < 25 ? 300 + rng.next() % 2700 : 0
        return ConvergenceChecker.Write(
            model: model, properties: properties, node: node, acknowledged: nil, timeToLive: timeToLive)
    }

    /// One progress update.
    public struct Progress: Sendable {
        public var operations: Int
        public var total: Int
        public var faults: Int
        public var active: String
    }

    package static func waitFor(_ what: String, seconds: Double, _ condition: () async -> Bool) async throws {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if await condition() { return }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw HarnessError("timed out after \(Int(seconds)) s waiting for \(what)")
    }

    static func freePort() throws -> Int {
        try LoopbackPorts.free()
    }
}

/// The writes the workload made, from all clients.

/// The latest expiry of the values written with a time to live, in wall-clock milliseconds.
final class LatestExpiry: Sendable {
    private let value = Mutex<UInt64?>(nil)
    func note(_ expiry: UInt64) { value.withLock { $0 = max($0 ?? expiry, expiry) } }
    var latest: UInt64? { value.withLock { $0 } }
}

final class WriteLog: Sendable {
    private let writes = Mutex<[ConvergenceChecker.Write]>([])
    func append(_ write: ConvergenceChecker.Write) { writes.withLock { $0.append(write) } }
    var all: [ConvergenceChecker.Write] { writes.withLock { $0 } }
}

/// A deterministic generator (SplitMix64): the same seed gives the same workload and schedule.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// A counter tasks can share.
final class SharedCounter: Sendable {
    private let atomic = Atomic<Int>(0)
    func increment() -> Int { atomic.add(1, ordering: .relaxed).newValue }
    var value: Int { atomic.load(ordering: .relaxed) }
}

/// A one-way flag tasks can share.
final class SharedFlag: Sendable {
    private let atomic = Atomic<Bool>(false)
    func set() { atomic.store(true, ordering: .releasing) }
    var isSet: Bool { atomic.load(ordering: .acquiring) }
}
