import Testing

@testable import StateSync
@testable import StateSyncTesting

/// The harness's checker must be able to fail: it is fed corrupted histories and states.
@Suite("Harness checker")
struct ConvergenceCheckerTests {
    static let v1 = Version(milliseconds: 100, counter: 0, node: "n1")
    static let v2 = Version(milliseconds: 200, counter: 0, node: "n2")

    static func state(_ node: String, _ value: Value, _ version: Version, digest: UInt64 = 1)
        -> ConvergenceChecker.NodeState
    {
        ConvergenceChecker.NodeState(
            node: node, digest: digest, models: ["m": ["p": .init(value: value, version: version)]])
    }

    static let writes = [
        ConvergenceChecker.Write(model: "m", properties: ["p": "a"], node: "n1", acknowledged: v1),
        ConvergenceChecker.Write(model: "m", properties: ["p": "b"], node: "n2", acknowledged: v2),
    ]

    @Test func aHealthyRunPasses() {
        let findings = ConvergenceChecker().check(
            writes: Self.writes, nodes: [Self.state("n1", "b", Self.v2), Self.state("n2", "b", Self.v2)],
            watches: [
                .init(
                    node: "n1",
                    sessions: [
                        [
                            PropertyChange(
                                channel: "c", model: "m", property: "p", old: nil, new: "a", version: Self.v1),
                            PropertyChange(
                                channel: "c", model: "m", property: "p", old: "a", new: "b", version: Self.v2),
                        ]
                    ])
            ])
        #expect(findings.passed)
    }

    @Test func aDivergedNodeIsNamed() {
        let findings = ConvergenceChecker().check(
            writes: Self.writes,
            nodes: [
                Self.state("n1", "b", Self.v2), Self.state("n2", "b", Self.v2),
                Self.state("n3", "a", Self.v1, digest: 2),
            ],
            watches: [])
        #expect(!findings.converged)
        #expect(findings.divergedNodes == ["n3"])
        #expect(findings.lostWrites.count == 1 && findings.lostWrites[0].hasPrefix("n3:"))
    }

    @Test func aValueThatIsNotTheWritesValueIsALWWViolation() {
        let findings = ConvergenceChecker().check(
            writes: Self.writes, nodes: [Self.state("n1", "corrupt", Self.v2), Self.state("n2", "corrupt", Self.v2)],
            watches: [])
        #expect(findings.converged)
        #expect(!findings.lwwViolations.isEmpty && !findings.lostWrites.isEmpty)
    }

    /// Deletions and expiries (PROTOCOL.md 8.2, 8.3): a value the newest acknowledged write
    /// deleted, or that expired, must be gone; one deleted by an unacknowledged write may be.
    @Test func aDeletedOrExpiredValueMustBeGoneAndAKeptOneIsFound() {
        let v3 = Version(milliseconds: 300, counter: 0, node: "n1")
        var deletion = ConvergenceChecker.Write(model: "m", properties: [:], node: "n1", acknowledged: v3)
        deletion.deleted = ["p"]
        let empty = ConvergenceChecker.NodeState(node: "n1", digest: 0, models: [:])
        #expect(ConvergenceChecker().check(writes: Self.writes + [deletion], nodes: [empty], watches: []).passed)
        // A node that kept the deleted value: it holds an older version than the deletion's.
        let kept = ConvergenceChecker().check(
            writes: Self.writes + [deletion], nodes: [Self.state("n1", "b", Self.v2)], watches: [])
        #expect(kept.lostWrites.count == 1 && kept.lostWrites[0].contains("deletion"))
        // The model's deletion counts for every property.
        var modelDeletion = deletion
        modelDeletion.deleted = []
        modelDeletion.deletesModel = true
        #expect(
            !ConvergenceChecker().check(
                writes: Self.writes + [modelDeletion], nodes: [Self.state("n1", "b", Self.v2)], watches: []
            ).passed)
        // A value gone with no acknowledged reason is lost; an unacknowledged deletion may be it.
        #expect(!ConvergenceChecker().check(writes: Self.writes, nodes: [empty], watches: []).passed)
        var unacknowledged = deletion
        unacknowledged.acknowledged = nil
        #expect(ConvergenceChecker().check(writes: Self.writes + [unacknowledged], nodes: [empty], watches: []).passed)
        // An expiring write: gone once its time passed, and still there before.
        var expiring = ConvergenceChecker.Write(model: "m", properties: ["p": "c"], node: "n1", acknowledged: v3)
        expiring.timeToLive = 100
        #expect(
            ConvergenceChecker().check(
                writes: Self.writes + [expiring], nodes: [empty], watches: [], expiredThrough: 400
            )
            .passed)
        #expect(
            !ConvergenceChecker().check(
                writes: Self.writes + [expiring], nodes: [empty], watches: [], expiredThrough: 399
            ).passed)
        // A node (or watcher) that still shows an expired value is normalised, not flagged.
        let stale = ConvergenceChecker.NodeState(
            node: "n2", digest: 0, models: ["m": ["p": .init(value: "c", version: v3, timeToLive: 100)]])
        #expect(
            ConvergenceChecker().check(
                writes: Self.writes + [expiring], nodes: [empty, stale], watches: [], expiredThrough: 400
            ).converged)
    }

    @Test func aChainThroughADeletionHasNoOldAfterIt() {
        let v3 = Version(milliseconds: 300, counter: 0, node: "n1")
        func change(_ old: Value?, _ new: Value, _ version: Version, _ kind: PropertyChange.Kind = .set)
            -> PropertyChange
        {
            PropertyChange(channel: "c", model: "m", property: "p", old: old, new: new, version: version, kind: kind)
        }
        let good = [change(nil, "a", Self.v1), change("a", .null, Self.v2, .deleted), change(nil, "b", v3)]
        let bad = [change(nil, "a", Self.v1), change("a", .null, Self.v2, .expired), change(.null, "b", v3)]
        let twice = [
            change(nil, "a", Self.v1), change("a", .null, Self.v2, .deleted), change(nil, .null, v3, .deleted),
        ]
        let findings = ConvergenceChecker().check(
            writes: [], nodes: [], watches: [.init(node: "n1", sessions: [good, bad, twice])])
        #expect(findings.chainViolations.count == 2, "\(findings.chainViolations)")
        #expect(findings.chainViolations.contains { $0.contains("session 1") && $0.contains("none (expired)") })
        #expect(findings.chainViolations.contains { $0.contains("session 2") && $0.contains("without a value") })
    }

    @Test func equalDigestsOfDifferentModelsAreStillDivergence() {
        let findings = ConvergenceChecker().check(
            writes: [], nodes: [Self.state("n1", "a", Self.v1, digest: 5), Self.state("n2", "a", Self.v1, digest: 6)],
            watches: [])
        #expect(!findings.converged && findings.divergedNodes.count == 1)
    }

    @Test func brokenAndDuplicatedChainsAreFound() {
        let change = { (old: Value?, new: Value, version: Version) in
            PropertyChange(channel: "c", model: "m", property: "p", old: old, new: new, version: version)
        }
        let findings = ConvergenceChecker().check(
            writes: [], nodes: [],
            watches: [
                .init(
                    node: "n1",
                    sessions: [
                        [change(nil, "a", Self.v1), change("x", "b", Self.v2)],  // old x != previous new a
                        [change(nil, "a", Self.v1), change("a", "a", Self.v1)],  // version notified twice
                    ])
            ])
        #expect(findings.chainViolations.count == 2)
        #expect(findings.chainViolations[0].contains("old \"x\" != previous new \"a\""))
        #expect(findings.chainViolations[1].contains("notified twice"))
    }

    /// An expiry's version can equal a write's (the writer's next write in that millisecond, as
    /// simulator seed 5242 showed): not a duplicate. The same expiry told twice is.
    @Test func anExpiryIsToldApartByTheWriteThatExpired() {
        let expiry = Version(timestamp: 5_296 << 16, node: "n2")
        let written = Version(timestamp: 4_416 << 16, node: "n2")
        var expired = PropertyChange(
            channel: "c", model: "m", property: "p", old: "a", new: .null, version: expiry, kind: .expired)
        expired.writtenVersion = written
        let set = PropertyChange(channel: "c", model: "m", property: "p", old: nil, new: "b", version: expiry)
        let first = PropertyChange(channel: "c", model: "m", property: "p", old: nil, new: "a", version: written)
        let findings = ConvergenceChecker().check(
            writes: [], nodes: [],
            watches: [.init(node: "n2", sessions: [[first, expired, set], [first, expired, expired]])])
        #expect(findings.chainViolations.count == 2, "\(findings.chainViolations)")
        #expect(findings.chainViolations.allSatisfy { $0.contains("session 1") })
    }

    @Test func sessionsAreCheckedSeparately() {
        let findings = ConvergenceChecker().check(
            writes: [], nodes: [],
            watches: [
                .init(
                    node: "n1",
                    sessions: [
                        [PropertyChange(channel: "c", model: "m", property: "p", old: nil, new: "a", version: Self.v1)],
                        [PropertyChange(channel: "c", model: "m", property: "p", old: "z", new: "b", version: Self.v2)],
                    ])
            ])
        #expect(findings.chainViolations.isEmpty, "a reconnected watch starts a new chain")
    }
}
