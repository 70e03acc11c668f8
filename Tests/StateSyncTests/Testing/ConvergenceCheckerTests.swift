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
