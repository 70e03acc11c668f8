public import StateSync
public import StateSyncTesting

/// The harness's verdict, for people and for machines.
public struct HarnessReport: Sendable {
    public struct FaultEvent: Sendable, Equatable {
        public var kind: String
        public var target: String
        public var detail: String
        public var startMilliseconds: Int
        public var healMilliseconds: Int?
    }

    public var seed: UInt64
    public var nodes: Int
    public var operations: Int
    public var acknowledged: Int
    /// Of the acknowledged writes: deletions (of properties or models), and sets with a time to
    /// live.
    public var deletions = 0
    public var expiringWrites = 0
    public var findings: ConvergenceChecker.Findings
    public var converged: Bool
    /// From the last heal until every node held the same state with nothing missing.
    public var convergenceMilliseconds: Int?
    public var faults: [FaultEvent]
    public var durationSeconds: Double
    /// Kept when a check failed (or with --keep): the nodes' logs and data.
    public var workDirectory: String?
    public var notifications: Int
    public var exitStatuses: [String: Int32?] = [:]
    /// With `--secure`: whether every node refused a client with a key of no one's and a client
    /// without CURVE (no answer), after the run. `nil` without `--secure`.
    public var strangersRefused: Bool?
    /// Per node, what its last process used, and the messages of peers' live streams it received
    /// (HEARTBEATs and DELTA messages, counter `peer_messages_received`).
    public var resources: [String: ProcessResources] = [:]
    public var peerMessagesReceived: [String: Int] = [:]
    /// Writes, acknowledgements and each node's lag over time (for ``html``).
    public var timeline: RunTimeline?

    /// What the nodes' state digests said (PROTOCOL.md 11.4), as their last starts counted it.
    public struct AntiEntropy: Sendable {
        /// Peers' digests compared at equal progress, and divergences reported, over all nodes.
        public var comparisons = 0
        public var divergences = 0
        /// The nodes that still reported a peer diverged at the end.
        public var divergedAtEnd: [String] = []
        /// No node found a divergence.
        public var clean: Bool { divergences == 0 && divergedAtEnd.isEmpty }
    }
    public var antiEntropy = AntiEntropy()

    public var passed: Bool { converged && findings.passed && strangersRefused != false && antiEntropy.clean }

    public var value: Value {
        var map: [String: Value] = [
            "passed": .bool(passed), "converged": .bool(converged), "seed": .int(Int64(bitPattern: seed)),
            "nodes": .int(Int64(nodes)), "ops": .int(Int64(operations)), "acknowledged": .int(Int64(acknowledged)),
            "deletions": .int(Int64(deletions)), "expiring_writes": .int(Int64(expiringWrites)),
            "lost_writes": .int(Int64(findings.lostWrites.count)),
            "chain_violations": .int(Int64(findings.chainViolations.count)),
            "lww_violations": .int(Int64(findings.lwwViolations.count)),
            "diverged_nodes": .array(findings.divergedNodes.map(Value.string)),
            "notifications": .int(Int64(notifications)),
            "secure": .bool(strangersRefused != nil), "strangers_refused": strangersRefused.map(Value.bool) ?? .null,
            "duration_s": .double((durationSeconds * 10).rounded() / 10),
            "faults": .array(
                faults.map { fault in
                    .map([
                        "kind": .string(fault.kind), "target": .string(fault.target), "detail": .string(fault.detail),
                        "start_ms": .int(Int64(fault.startMilliseconds)),
                        "heal_ms": fault.healMilliseconds.map { .int(Int64($0)) } ?? .null,
                    ])
                }),
            "details": .array(
                (findings.lostWrites.prefix(5) + findings.lwwViolations.prefix(5) + findings.chainViolations.prefix(5))
                    .map(Value.string)),
        ]
        map["convergence_ms"] = convergenceMilliseconds.map { .int(Int64($0)) } ?? .null
        map["node_resources"] = .map(
            resources.mapValues { used in
                .map([
                    "cpu_s": .double((used.cpuSeconds * 100).rounded() / 100),
                    "max_rss_kb": .int(Int64(used.peakResidentKilobytes)),
                    "uptime_s": .double((used.uptimeSeconds * 10).rounded() / 10),
                ])
            })
        map["peer_messages_received"] = .map(peerMessagesReceived.mapValues { .int(Int64($0)) })
        map["digest_comparisons"] = .int(Int64(antiEntropy.comparisons))
        map["state_divergences"] = .int(Int64(antiEntropy.divergences))
        map["diverged_at_end"] = .array(antiEntropy.divergedAtEnd.map(Value.string))
        map["work_dir"] = workDirectory.map(Value.string) ?? .null
        return .map(map)
    }

    public var humanText: String {
        var lines: [String] = []
        lines.append(
            "StateSync harness: \(nodes) nodes, \(operations) ops (\(acknowledged) acknowledged: \(deletions) deletions, \(expiringWrites) with a time to live), seed \(seed), \(String(format: "%.1f", durationSeconds)) s"
        )
        lines.append("faults (\(faults.count)):")
        for fault in faults {
            lines.append("  \(fault.startMilliseconds) ms  \(fault.kind) \(fault.target): \(fault.detail)")
        }
        func mark(_ ok: Bool) -> String { ok ? "ok  " : "FAIL" }
        lines.append("verdict:")
        lines.append(
            "  [\(mark(converged))] replicas converged (equal state digests)"
                + (convergenceMilliseconds.map { " in \($0) ms after the last heal" } ?? ""))
        if !findings.divergedNodes.isEmpty {
            lines.append("         diverged: \(findings.divergedNodes.joined(separator: ", "))")
        }
        lines.append(
            "  [\(mark(findings.lwwViolations.isEmpty))] final values are the last-writer-wins winners (\(findings.lwwViolations.count) violations)"
        )
        lines.append(
            "  [\(mark(findings.lostWrites.isEmpty))] no acknowledged write lost (\(findings.lostWrites.count) lost)")
        lines.append(
            "  [\(mark(findings.chainViolations.isEmpty))] watchers' old/new chains unbroken, no duplicates (\(notifications) notifications, \(findings.chainViolations.count) violations)"
        )
        lines.append(
            "  [\(mark(antiEntropy.clean))] no node found its state differing from a peer's at equal progress (\(antiEntropy.comparisons) digests compared, \(antiEntropy.divergences) divergences)"
        )
        if !antiEntropy.divergedAtEnd.isEmpty {
            lines.append("         at the end: \(antiEntropy.divergedAtEnd.joined(separator: "; "))")
        }
        if let strangersRefused {
            lines.append(
                "  [\(mark(strangersRefused))] security: every node refused a client with an unknown key and one without CURVE"
            )
        }
        for detail
            in (findings.lostWrites.prefix(5) + findings.lwwViolations.prefix(5) + findings.chainViolations.prefix(5))
        {
            lines.append("         \(detail)")
        }
        lines.append(passed ? "PASSED" : "FAILED")
        if let workDirectory { lines.append("nodes' logs and data kept in \(workDirectory)") }
        return lines.joined(separator: "\n")
    }
}
