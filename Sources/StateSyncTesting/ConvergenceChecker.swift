public import StateSync

/// The verdict's rules, pure and separately testable: given what the workload wrote, what every
/// node holds at the end and what every watcher saw, find what is wrong. One checker for
/// `statesync harness` (real processes) and `statesync simulate` (the simulator).
public struct ConvergenceChecker: Sendable {
    /// One write the workload issued: values (possibly expiring), deletions of properties, or the
    /// deletion of the model.
    public struct Write: Sendable, Equatable {
        /// The model written.
        public var model: String
        /// The values written.
        public var properties: [String: Value]
        /// The node it was sent to.
        public var node: String
        /// The version the node answered with, when the write was acknowledged as applied.
        public var acknowledged: Version?
        /// When the client got the acknowledgement (the simulator's milliseconds), if it did.
        public var acknowledgedAt: UInt64?
        /// The properties it deleted.
        public var deleted: [String] = []
        /// Whether it deleted the whole model.
        public var deletesModel = false
        /// The time to live of the values written, in milliseconds (0: none).
        public var timeToLive: UInt64 = 0

        /// A write of `properties` of `model` through `node`, acknowledged with a version or not.
        public init(
            model: String, properties: [String: Value], node: String, acknowledged: Version?, deleted: [String] = [],
            deletesModel: Bool = false, timeToLive: UInt64 = 0
        ) {
            self.model = model
            self.properties = properties
            self.node = node
            self.acknowledged = acknowledged
            self.deleted = deleted
            self.deletesModel = deletesModel
            self.timeToLive = timeToLive
        }

        /// The writes to send: values with their time to live, deletions, or the model's.
        public var propertyWrites: [PropertyWrite] {
            if deletesModel { return [.modelDeletion] }
            return properties.keys.sorted().map {
                PropertyWrite(name: $0, value: properties[$0]!, timeToLive: timeToLive)
            } + deleted.sorted().map(PropertyWrite.deletion(of:))
        }
    }

    /// What one node holds at the end.
    public struct NodeState: Sendable, Equatable {
        /// The node.
        public var node: String
        /// Its state digest.
        public var digest: UInt64
        /// model → property → register.
        public var models: [String: [String: ReplicaStore.Register]]

        /// What `node` holds.
        public init(node: String, digest: UInt64, models: [String: [String: ReplicaStore.Register]]) {
            self.node = node
            self.digest = digest
            self.models = models
        }
    }

    /// What one watcher saw: sessions split where its connection was re-established.
    public struct WatchHistory: Sendable, Equatable {
        /// The watched node.
        public var node: String
        /// The changes told, per session.
        public var sessions: [[PropertyChange]]
        /// The watcher's own copy of the state at the end (model → property → register), when it
        /// keeps one: it must equal the nodes' converged state, or the watch missed changes.
        public var finalState: [String: [String: ReplicaStore.Register]]?
        /// What the watch asked for: its final copy is compared with that part of the state.
        public var filter: ClientProtocol.WatchFilter?
        /// Per session, the positions of its changes where a reset snapshot began (the node
        /// dropped its state, PROTOCOL.md 7.5): a version told before can be told again after.
        public var resetStarts: [Set<Int>]

        /// What a watcher on `node` saw.
        public init(
            node: String, sessions: [[PropertyChange]], finalState: [String: [String: ReplicaStore.Register]]? = nil,
            filter: ClientProtocol.WatchFilter? = nil, resetStarts: [Set<Int>] = []
        ) {
            self.node = node
            self.sessions = sessions
            self.finalState = finalState
            self.filter = filter
            self.resetStarts = resetStarts
        }
    }

    /// What is wrong with a run (nothing, when it passed).
    public struct Findings: Sendable, Equatable {
        /// All nodes hold equal digests and equal model states.
        public var converged = true
        /// Nodes whose state differs from the majority's.
        public var divergedNodes: [String] = []
        /// Acknowledged writes neither visible nor superseded by a later winner, on some node.
        public var lostWrites: [String] = []
        /// Final values that are not the last-writer-wins winner among the writes issued.
        public var lwwViolations: [String] = []
        /// Notifications whose old is not the previous new, or that repeat a version.
        public var chainViolations: [String] = []
        /// LIST pages that disagree with the node's state (a model missing, listed twice, out of
        /// order, or with a wrong count or version).
        public var listViolations: [String] = []
        /// Writes answered in a form their writer did not ask for (PROTOCOL.md 10.1.1: OKS
        /// messages only to a writer that asked, and then every OK in one) or malformed.
        public var replyViolations: [String] = []
        /// Nodes forgotten while cut off (`statesync forget`) that came back without dropping
        /// their state first (PROTOCOL.md 7.5, "Forgotten while away"): they may bring back data
        /// deleted since. The cluster simulator's forget fault checks it.
        public var resetViolations: [String] = []

        /// Whether every check passed.
        public var passed: Bool {
            converged && lostWrites.isEmpty && lwwViolations.isEmpty && chainViolations.isEmpty
                && listViolations.isEmpty && replyViolations.isEmpty && resetViolations.isEmpty
        }
    }

    /// A checker.
    public init() {}

    /// Checks a run: convergence, last-writer-wins winners, lost acknowledged writes, watch chains.
    /// Values that expire by `expiredThrough` (milliseconds since 1970) count as expired in every
    /// state compared, whether or not a node or watcher had deleted them yet.
    public func check(
        writes: [Write], nodes: [NodeState], watches: [WatchHistory], expiredThrough: UInt64 = 0
    ) -> Findings {
        func live(_ models: [String: [String: ReplicaStore.Register]]) -> [String: [String: ReplicaStore.Register]] {
            guard expiredThrough > 0 else { return models }
            return models.compactMapValues { properties in
                let kept = properties.filter { ($0.value.expiresAt ?? .max) > expiredThrough }
                return kept.isEmpty ? nil : kept
            }
        }
        let nodes = nodes.map { NodeState(node: $0.node, digest: $0.digest, models: live($0.models)) }
        var findings = Findings()
        // (1) Convergence: the majority state, and who differs from it.
        var groups: [[String: [String: ReplicaStore.Register]]: [String]] = [:]
        for node in nodes { groups[node.models, default: []].append(node.node) }
        let majority = groups.max { $0.value.count < $1.value.count }?.key ?? [:]
        findings.divergedNodes = nodes.filter { $0.models != majority }.map(\.node).sorted()
        findings.converged = findings.divergedNodes.isEmpty && Set(nodes.map(\.digest)).count <= 1
        if Set(nodes.map(\.digest)).count > 1 && findings.divergedNodes.isEmpty {
            // Equal on the checked models but different elsewhere: name the minority digests.
            var byDigest: [UInt64: [String]] = [:]
            for node in nodes { byDigest[node.digest, default: []].append(node.node) }
            let common = byDigest.max { $0.value.count < $1.value.count }?.key
            findings.divergedNodes = nodes.filter { $0.digest != common }.map(\.node).sorted()
        }

        // (2) and (3): per property, the acknowledged writes that touched it — values (with
        // their expiry) and deletions, the model's included — and whether an unacknowledged one
        // may have removed it (its version is unknown: it may be the newest).
        struct Event {
            let version: Version
            let value: Value?  // nil: a deletion
            let expiresAt: UInt64?
            func removes(by time: UInt64) -> Bool { value == nil || (expiresAt.map { $0 <= time } ?? false) }
        }
        var events: [String: [String: [Event]]] = [:]
        var modelDeletions: [String: Version] = [:]
        var maybeRemoved: Set<String> = []  // "model" or "model.property"
        for write in writes {
            guard let version = write.acknowledged else {
                if write.deletesModel { maybeRemoved.insert(write.model) }
                for name in write.deleted { maybeRemoved.insert("\(write.model).\(name)") }
                if write.timeToLive > 0 {
                    for name in write.properties.keys { maybeRemoved.insert("\(write.model).\(name)") }
                }
                continue
            }
            if write.deletesModel { modelDeletions[write.model] = max(modelDeletions[write.model] ?? version, version) }
            for (name, value) in write.properties {
                events[write.model, default: [:]][name, default: []].append(
                    Event(
                        version: version, value: value,
                        expiresAt: write.timeToLive > 0 ? version.milliseconds + write.timeToLive : nil))
            }
            for name in write.deleted {
                events[write.model, default: [:]][name, default: []].append(
                    Event(version: version, value: nil, expiresAt: nil))
            }
        }
        for node in nodes {
            let models = Set(events.keys).union(node.models.keys)
            for model in models.sorted() {
                let names = Set(events[model]?.keys ?? [:].keys).union(node.models[model]?.keys ?? [:].keys)
                for name in names.sorted() {
                    var newest = events[model]?[name]?.max { $0.version < $1.version }
                    if let deletion = modelDeletions[model], deletion > (newest?.version ?? .zero) {
                        newest = Event(version: deletion, value: nil, expiresAt: nil)
                    }
                    let held = node.models[model]?[name]
                    if let held {
                        // The held version must be a write that was made, with that value.
                        // Unacknowledged writes are unknown here: only a held version that an
                        // acknowledged write also carries can be checked for its value.
                        if let event = events[model]?[name]?.first(where: { $0.version == held.version }),
                            event.value != held.value
                        {
                            findings.lwwViolations.append(
                                "\(node.node): \(model).\(name) holds \(held.value) for \(held.version), which wrote \(event.value?.description ?? "a deletion")"
                            )
                            // And what that write wrote is nowhere on this node.
                            findings.lostWrites.append(
                                "\(node.node): \(model).\(name) holds \(held.value) @\(held.version), not \(event.value?.description ?? "a deletion") @\(held.version)"
                            )
                        }
                        if let newest, newest.version > held.version {
                            findings.lostWrites.append(
                                "\(node.node): \(model).\(name) holds \(held.value) @\(held.version), not the acknowledged \(newest.value?.description ?? "deletion") @\(newest.version) or later"
                            )
                        }
                    } else if let newest, !newest.removes(by: expiredThrough), !maybeRemoved.contains(model),
                        !maybeRemoved.contains("\(model).\(name)")
                    {
                        findings.lostWrites.append(
                            "\(node.node): \(model).\(name) missing (acknowledged \(newest.value?.description ?? "") @\(newest.version))"
                        )
                    }
                }
            }
        }
        findings.lostWrites = Array(Set(findings.lostWrites)).sorted()
        findings.lwwViolations = Array(Set(findings.lwwViolations)).sorted()

        // (4) Watch chains, per session and property; a watcher's final copy must match.
        for watch in watches {
            var expected = majority
            if let filter = watch.filter {
                expected = majority.reduce(into: [:]) { kept, model in
                    let properties = model.value.filter { filter.passes(model: model.key, property: $0.key) }
                    if !properties.isEmpty { kept[model.key] = properties }
                }
            }
            if let final = watch.finalState.map(live), findings.converged, final != expected {
                let differing = Set(final.keys).union(expected.keys).filter { final[$0] != expected[$0] }.sorted()
                findings.chainViolations.append(
                    "\(watch.node)'s watcher ended with a state different from the nodes' (models \(differing.prefix(5).joined(separator: ", "))): it missed changes, or got what its filter excludes"
                )
            }
            for (sessionIndex, session) in watch.sessions.enumerated() {
                var last: [String: PropertyChange] = [:]
                var seen: [String: Set<[Version]>] = [:]
                let resets = sessionIndex < watch.resetStarts.count ? watch.resetStarts[sessionIndex] : []
                for (position, change) in session.enumerated() {
                    if resets.contains(position) { seen = [:] }
                    let key = "\(change.model).\(change.property)"
                    // After a deletion or an expiry the property has no value: the next old is none.
                    if let previous = last[key], change.old != (previous.isRemoval ? Value?.none : previous.new) {
                        findings.chainViolations.append(
                            "\(watch.node) session \(sessionIndex): \(key) old \(change.old?.description ?? "none") != previous new \(previous.isRemoval ? "none (\(previous.kind.rawValue))" : previous.new.description) at \(change.version)"
                        )
                    }
                    if last[key] == nil || last[key]!.isRemoval, change.isRemoval, change.old == nil {
                        findings.chainViolations.append(
                            "\(watch.node) session \(sessionIndex): \(key) removed at \(change.version) without a value to remove"
                        )
                    }
                    // An expiry is told apart by the write that expired as well: its version
                    // (its time, with the writer's id) can equal the version that writer gave a
                    // write in that millisecond, or another write's expiry (docs/PROTOCOL.md 8.3).
                    let identity =
                        change.kind == .expired ? [change.version, change.writtenVersion ?? .zero] : [change.version]
                    if !seen[key, default: []].insert(identity).inserted {
                        findings.chainViolations.append(
                            "\(watch.node) session \(sessionIndex): \(key) notified twice for \(change.version)")
                    }
                    last[key] = change
                }
            }
        }
        return findings
    }
}
