/// One id, one node (docs/PROTOCOL.md section 7.5, "Two nodes under one id"). Two nodes started
/// under the same `node.id` both number their writes from the same sequence numbers, and each
/// peer keeps the first delta it receives under each number and drops the other as a duplicate:
/// writes acknowledged by either are lost. No message says "I am a second node"; two signs do:
///
/// - The id's member entry is written again and again by two incarnations, each superseding
///   the other's (a node supersedes an entry about itself written by another start, section
///   7.5). A start that supersedes a live entry of another incarnation, and then hears a newer
///   live entry of that same incarnation, knows that incarnation runs: it refuses to run — at
///   once if it holds no write of the id (or was just started empty), else only after several
///   more, so that a node added under the id of one with writes is the one that stops
///   (between two alike, the higher incarnation waits for more). The first HEARTBEAT heard in
///   its own id from another incarnation (it lists the other's endpoint among its peers) counts
///   the same.
/// - A peer hears the id's HEARTBEATs alternate between incarnations, going back to one it had
///   heard before: a stopped incarnation never speaks again. It counts and logs that, and
///   says so in its status, while both are heard.
extension NodeMachine {
    /// Signs of the start `other` of its id a node takes before it refuses to run: 8 when it
    /// holds writes of the id that its peers take, 2 when it does not — it has numbered none; or
    /// it started with an empty data directory less than ``newcomerMilliseconds`` ago (a copy
    /// just added, whatever it took since: the node it copies has held the id for longer); or no
    /// peer ever subscribed to it (a copy that joined through a seed: its peers link one endpoint
    /// per member id, the other's, and what it takes reaches no one) — and 4 more for the higher
    /// incarnation. Entry signs alternate — each start writes a newer entry only to supersede
    /// one of the other's — and a HEARTBEAT counts once, so of two alike the lower has stopped
    /// before the higher has taken its own. (A higher one whose other does not take signs, an
    /// older version, still stops.)
    func signsBeforeRefusing(against other: UInt64) -> Int {
        (holdsWritesPeersTake ? 8 : 2) + (incarnation > other ? 4 : 0)
    }

    /// Whether this start holds writes of its id that its peers take (``signsBeforeRefusing(against:)``).
    var holdsWritesPeersTake: Bool {
        let newcomer = startedWithoutOwnDeltas && boundAt.map { now &- $0 < Self.newcomerMilliseconds } ?? true
        return nextSequence > 1 && !newcomer && counters.subscribersConnected > 0
    }

    /// How long a node started with an empty data directory counts as just added.
    static let newcomerMilliseconds: UInt64 = 60_000

    /// How recently an incarnation must have been heard to count as running: 3 heartbeat
    /// intervals, of this node's or of the id's as heard (its nodes may beat slower).
    func incarnationWindow(_ trail: IncarnationTrail) -> UInt64 {
        3 * max(UInt64(configuration.heartbeatIntervalMilliseconds), trail.interval)
    }

    /// The incarnations of one node id a peer remembers, most recent last.
    static let incarnationsRemembered = 4
    /// HEARTBEATs of an id that went back to an incarnation heard before it takes to say that
    /// two nodes run under it. (A stopped start's last HEARTBEAT overtaken, on another
    /// connection, by its successor's first makes two: it, and the successor's next.)
    static let returnsForDuplicate = 3

    /// The incarnations a peer heard under one node id.
    struct IncarnationTrail: Sendable {
        struct Heard: Sendable {
            var incarnation: UInt64
            var endpoint: String
            var at: UInt64
        }

        /// Most recent last; at most ``NodeMachine/incarnationsRemembered``.
        var heard: [Heard] = []
        /// HEARTBEATs that went back to an incarnation heard before, while two were heard.
        var returns = 0
        /// Whether the duplicate was logged (again once it ended and came back).
        var reported = false
        /// The last time between two HEARTBEATs of one incarnation (at most a minute).
        var interval: UInt64 = 0
    }

    /// A start that supersedes another incarnation's live entry about this node's id: if that
    /// incarnation writes newer live entries after it, it runs, and this node refuses to run
    /// (``signsBeforeRefusing(against:)``). Returns `true` when it refused.
    mutating func refuseIfAnotherStartRuns(_ member: Membership.Member) -> Bool {
        guard member.state == .alive, member.version.node == configuration.nodeID,
            let other = member.incarnation, other != incarnation
        else { return false }
        // (The node answers only entries newer than its own, which is newer than every one it
        // answered: each counted here is one more the other start wrote.)
        return refuseAtSign(
            of: other, publishingAt: member.publish, "its member entry was written again after this node superseded it")
    }

    /// A HEARTBEAT in this node's id from another incarnation at `endpoint`: the first of that
    /// incarnation is a sign (one each interval would outpace the entries' signs, and the node
    /// that hears the other would stop first whatever it holds). `true` when it refused.
    mutating func refuseIfAnotherStartSpeaks(_ other: UInt64, at endpoint: String) -> Bool {
        guard refusal == nil else { return true }
        guard startsHeardSpeaking.insert(other).inserted else { return false }
        return refuseAtSign(of: other, publishingAt: endpoint, "its HEARTBEATs are heard")
    }

    private mutating func refuseAtSign(of other: UInt64, publishingAt endpoint: String, _ sign: String) -> Bool {
        guard refusal == nil else { return true }
        let signs = (signsOfOtherStarts[other] ?? 0) + 1
        signsOfOtherStarts[other] = signs
        guard signs >= signsBeforeRefusing(against: other) else {
            // Should the other stop, what peers took of each under the same numbers is mended.
            scheduleSplitWritesCheck()
            return false
        }
        counters.duplicateNodeIDs += 1
        refuseToRun(
            "another node runs with this node's id \(configuration.nodeID), publishing at \(endpoint) (incarnation \(String(other, radix: 16))): \(sign). Two nodes under one id number their writes over each other's, and peers keep only one write per number: writes either acknowledged may be lost. Give one of them another node.id (a node copied from another keeps its own)"
        )
        return true
    }

    /// A HEARTBEAT of `id` in `incarnation` came from `endpoint`: notes it, and says (once while
    /// it lasts) when two nodes run under the id.
    mutating func noteIncarnation(_ incarnation: UInt64, of id: String, at endpoint: String) {
        var trail = incarnationTrails[id] ?? IncarnationTrail()
        if let previous = trail.heard.last(where: { $0.incarnation == incarnation }) {
            trail.interval = min(now &- previous.at, 60_000)
        }
        let window = incarnationWindow(trail)
        if let last = trail.heard.last, last.incarnation != incarnation,
            trail.heard.contains(where: { $0.incarnation == incarnation })
        {
            trail.returns += 1
            pauseDigestsForSplitWrites()
        }
        trail.heard.removeAll { $0.incarnation == incarnation }
        trail.heard.append(IncarnationTrail.Heard(incarnation: incarnation, endpoint: endpoint, at: now))
        if trail.heard.count > Self.incarnationsRemembered { trail.heard.removeFirst() }
        // Heard alone for a while: the other stopped (or was one that restarted).
        let live = trail.heard.filter { now &- $0.at <= window }
        if live.count < 2 {
            trail.returns = 0
            trail.reported = false
        } else if trail.returns >= Self.returnsForDuplicate, !trail.reported {
            trail.reported = true
            counters.duplicateNodeIDs += 1
            logger.error(
                "two nodes run under one node id: their HEARTBEATs alternate between two incarnations. They number their writes over each other's, and this node keeps only the first write it gets under each number; give one of them another node.id",
                metadata: [
                    "node.id": "\(id)",
                    "publish.endpoints": "\(Set(live.map(\.endpoint)).sorted().joined(separator: ", "))",
                    "incarnations": "\(live.map { String($0.incarnation, radix: 16) }.joined(separator: ", "))",
                ])
        }
        incarnationTrails[id] = trail
    }

    /// The node ids two live incarnations are heard under, with their publish endpoints.
    var duplicateNodeIDs: [String: [String]] {
        var found: [String: [String]] = [:]
        for (id, trail) in incarnationTrails where trail.reported {
            let window = incarnationWindow(trail)
            let live = trail.heard.filter { now &- $0.at <= window }
            if live.count >= 2 { found[id] = Set(live.map(\.endpoint)).sorted() }
        }
        return found
    }
}
