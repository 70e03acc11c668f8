public import StateSync

/// The verdict's rules, pure and separately testable: given what the workload wrote, what every
/// node holds at the end and what every watcher saw, find what is wrong. One checker for
/// `statesync harness` (real processes) and `statesync simulate` (the simulator).
public struct ConvergenceChecker: Sendable {
    /// One write the workload issued.
    public struct Write: Sendable, Equatable {
        /// The model written.
        public var model: String
        /// The values written.
        public var properties: [String: Value]
        /// The node it was sent to.
        public var node: String
        /// The version the node answered with, when the write was acknowledged as applied.
        public var acknowledged: Version?

        /// A write of `properties` of `model` through `node`, acknowledged with a version or not.
        public init(model: String, properties: [String: Value], node: String, acknowledged: Version?) {
            self.model = model
            self.properties = properties
            self.node = node
            self.acknowledged = acknowledged
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

        /// What a watcher on `node` saw.
        public init(
            node: String, sessions: [[PropertyChange]], finalState: [String: [String: ReplicaStore.Register]]? = nil,
            filter: ClientProtocol.WatchFilter? = nil
        ) {
            self.node = node
            self.sessions = sessions
            self.finalState = finalState
            self.filter = filter
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

        /// Whether every check passed.
        public var passed: Bool {
            converged && lostWrites.isEmpty && lwwViolations.isEmpty && chainViolations.isEmpty
                && listViolations.isEmpty
        }
    }

    /// A checker.
    public init() {}

    /// Checks a run: convergence, last-writer-wins winners, lost acknowledged writes, watch chains.
    public func check(writes: [Write], nodes: [NodeState], watches: [WatchHistory]) -> Findings {
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

        // (2) and (3): per property, what was written with which version.
        var written: [String: [String: [Version: Value]]] = [:]
        for write in writes {
            guard let version = write.acknowledged else { continue }
            for (name, value) in write.properties {
                written[write.model, default: [:]][name, default: [:]][version] = value
            }
        }
        for node in nodes {
            for write in writes {
                guard let version = write.acknowledged else { continue }
                for (name, value) in write.properties {
                    guard let held = node.models[write.model]?[name] else {
                        findings.lostWrites.append(
                            "\(node.node): \(write.model).\(name) missing (written \(version) via \(write.node))")
                        continue
                    }
                    if held.version < version || (held.version == version && held.value != value) {
                        findings.lostWrites.append(
                            "\(node.node): \(write.model).\(name) holds \(held.value) @\(held.version), not \(value) @\(version) or later"
                        )
                    }
                }
            }
            for (model, properties) in node.models {
                for (name, held) in properties {
                    // The held version must be a write that was made, with that value. Unacknowledged
                    // writes are unknown here: only a held version that an acknowledged write also
                    // carries can be checked for its value.
                    if let value = written[model]?[name]?[held.version], value != held.value {
                        findings.lwwViolations.append(
                            "\(node.node): \(model).\(name) holds \(held.value) for \(held.version), which wrote \(value)"
                        )
                    }
                    if let newest = written[model]?[name]?.keys.max(), newest > held.version {
                        findings.lwwViolations.append(
                            "\(node.node): \(model).\(name) holds \(held.version), older than the acknowledged \(newest)"
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
            if let final = watch.finalState, findings.converged, final != expected {
                let differing = Set(final.keys).union(expected.keys).filter { final[$0] != expected[$0] }.sorted()
                findings.chainViolations.append(
                    "\(watch.node)'s watcher ended with a state different from the nodes' (models \(differing.prefix(5).joined(separator: ", "))): it missed changes, or got what its filter excludes"
                )
            }
            for (sessionIndex, session) in watch.sessions.enumerated() {
                var last: [String: PropertyChange] = [:]
                var seen: [String: Set<Version>] = [:]
                for change in session {
                    let key = "\(change.model).\(change.property)"
                    if let previous = last[key], change.old != previous.new {
                        findings.chainViolations.append(
                            "\(watch.node) session \(sessionIndex): \(key) old \(change.old?.description ?? "null") != previous new \(previous.new) at \(change.version)"
                        )
                    }
                    if !seen[key, default: []].insert(change.version).inserted {
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
