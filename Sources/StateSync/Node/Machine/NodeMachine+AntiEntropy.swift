/// Anti-entropy by state digest (docs/PROTOCOL.md 11.4): replicas that hold the same deltas of
/// every origin hold the same state, so two nodes whose progress lists are equal must have equal
/// state digests (section 9.2). Sequence tracking cannot see a difference at equal progress (two
/// writes of two starts under one id with one version under one number, a deletion collected
/// before a write it had to beat arrived, a forgotten member's writes given up by some nodes and
/// held by others, a bug): this compares the digests and reports one.
///
/// Only at rest: a node sends its digest on a HEARTBEAT with a member list when its state is
/// exactly what its progress list says (no gap, all of its own writes published, no snapshot
/// being merged, none merged since its server was last heard at rest, for 20 intervals and 10 s
/// at most) and its list is the one its previous HEARTBEAT sent; a node compares it when it is
/// at rest in the same sense, its own list is the same, no value it holds expires, nor expired,
/// within `clock.max_drift_ms` (and a heartbeat interval) of its clock (replicas expire a value
/// by their own clocks, a moment apart), and no split writes are being mended: of its own id,
/// or of an id it hears two starts under, until a minute after it last did. A node that writes
/// or takes deltas all the time compares nothing, and folds nothing more than before.
extension NodeMachine {
    /// What this node learned from comparing its digest with its peers'.
    struct AntiEntropy: Sendable {
        /// The progress list of this node's previous HEARTBEAT.
        var lastProgress: [String: UInt64]?
        /// Per peer node id, while its digests differ from this node's (none once they agree).
        var peers: [String: PeerDigests] = [:]
        /// The peer (publish endpoint) whose snapshot this node merged last, and when, until it
        /// is heard at rest or ``NodeMachine/snapshotServerWait`` has passed: its pages hold
        /// everything it held, also what it held above a gap of an origin, beyond the marks it
        /// gave; at rest it has no gap, and its progress list tells this node of every number
        /// its state may hold.
        var snapshotServer: (endpoint: String, mergedAt: UInt64)?
        /// Until when nothing is compared: two starts were heard under one id (section 7.5),
        /// whose split writes peers hold one or the other of until the one that goes on mends
        /// them.
        var pausedUntil: UInt64 = 0
    }

    /// How a peer's digests compared with this node's, at equal progress, since they last agreed.
    struct PeerDigests: Sendable {
        /// Comparisons in a row that differed.
        var mismatches = 0
        /// When the last one was made (one per half heartbeat interval at most: a HEARTBEAT
        /// delivered twice counts once).
        var comparedAt: UInt64 = 0
        /// Whether a difference lasted ``NodeMachine/divergenceComparisons`` comparisons.
        var diverged = false
    }

    /// How many comparisons in a row must differ before a peer is reported diverged: a digest is
    /// taken at a moment, and two nodes at rest may still be apart by an input on its way (an
    /// expiry a tick later, a write whose HEARTBEAT has not come yet).
    static let divergenceComparisons = 3

    /// How long a node that merged a peer's snapshot waits for that peer to be heard at rest
    /// before it compares again anyway: 20 heartbeat intervals, at least 10 s. A server that
    /// never rests (an origin down with a number it alone lacks, or a faulty node) would
    /// otherwise keep it from comparing for good; what the snapshot brought beyond its marks is
    /// then a difference that lasts, and is reported.
    var snapshotServerWait: UInt64 { max(10_000, 20 * UInt64(configuration.heartbeatIntervalMilliseconds)) }

    /// The progress list of this node's HEARTBEATs (section 7.3): its own deltas count as received
    /// once published (a peer told of one still waiting for its fsync would see a gap that is not
    /// there, and with a long queue ahead of it could even give up on it and take a snapshot).
    var heartbeatProgress: [String: UInt64] {
        var progress: [String: UInt64] = [:]
        for (origin, state) in origins where state.contiguous > 0 {
            progress[origin] = origin == configuration.nodeID ? min(state.contiguous, published) : state.contiguous
        }
        if progress[configuration.nodeID] == 0 { progress[configuration.nodeID] = nil }
        return progress
    }

    /// Whether this node's state is exactly what its progress list says: no gap (numbers held
    /// above one are in the state, not in the list), every write of its own published, no
    /// snapshot being merged nor merged since its server was last heard at rest (for
    /// ``snapshotServerWait`` at most), not settling, not recovering its own deltas.
    var stateMatchesProgress: Bool {
        guard durability.staged.isEmpty, published == nextSequence - 1, repair.stream == nil, settling == nil,
            repair.ownRecovery == nil, !resetUnwritten,
            antiEntropy.snapshotServer.map({ now &- $0.mergedAt >= snapshotServerWait }) ?? true
        else { return false }
        // No number known to exist and not held either: above a gap, a peer's snapshot merged
        // here may have brought what its server held past its own gap, beyond the marks it gave.
        for progress in origins.values where progress.hasGap { return false }
        return origins[configuration.nodeID].map { $0.contiguous == published } ?? (published == 0)
    }

    /// The digest for a HEARTBEAT with `progress`: only with a member list, when the state is at
    /// rest, and then folded now, so that it is the state this progress list describes.
    mutating func digestForHeartbeat(progress: [String: UInt64], withMembers: Bool) -> UInt64? {
        defer { antiEntropy.lastProgress = progress }
        guard withMembers, antiEntropy.lastProgress == progress, stateMatchesProgress else { return nil }
        store.foldDigests()
        return store.digest
    }

    /// Whether a value this node holds expires, or one it holds expired (here, or in a snapshot
    /// it merged) expired, within the drift it accepts between clocks and a heartbeat interval: a
    /// peer's clock may be that far off and expire it a moment apart, and its digest may be a
    /// tick older than its expiries.
    var expiryNearby: Bool {
        let wall = clock.wallMilliseconds()
        let margin =
            UInt64(configuration.maximumClockDriftMilliseconds) + UInt64(configuration.heartbeatIntervalMilliseconds)
        if let next = store.nextExpiry, next <= wall &+ margin { return true }
        return store.latestExpired > 0 && store.latestExpired &+ margin >= wall
    }

    /// Compares the digest a peer's HEARTBEAT carries with this node's, when both are at rest at
    /// the same progress (section 11.4): counts the comparison, and reports a peer whose state
    /// differs ``divergenceComparisons`` times in a row, and again when it agrees once more.
    mutating func compareDigest(of beat: PeerMessage.Heartbeat, from endpoint: String) {
        guard let theirs = beat.stateDigest, beat.node != configuration.nodeID else { return }
        // Its server at rest: every number this node's state may hold is in its progress list.
        if antiEntropy.snapshotServer?.endpoint == endpoint { antiEntropy.snapshotServer = nil }
        guard stateMatchesProgress, heartbeatProgress == beat.progress, !expiryNearby, splitWritesCheck == nil,
            duplicateNodeIDs.isEmpty, now >= antiEntropy.pausedUntil
        else { return }
        var peer = antiEntropy.peers[beat.node] ?? PeerDigests()
        if peer.mismatches > 0, now &- peer.comparedAt < UInt64(configuration.heartbeatIntervalMilliseconds) / 2 {
            return  // the same HEARTBEAT again, or one a moment after it
        }
        store.foldDigests()
        let ours = store.digest
        counters.digestComparisons += 1
        if ours == theirs {
            if peer.diverged {
                logger.notice(
                    "state agrees with a peer's again (equal digests at equal progress)",
                    metadata: ["peer.id": "\(beat.node)", "digest": "\(String(ours, radix: 16))"])
            }
            antiEntropy.peers[beat.node] = nil
            return
        }
        defer { antiEntropy.peers[beat.node] = peer }
        peer.mismatches += 1
        peer.comparedAt = now
        guard !peer.diverged, peer.mismatches >= Self.divergenceComparisons else { return }
        peer.diverged = true
        counters.stateDivergences += 1
        logger.error(
            "state differs from a peer's at equal progress: both hold the same deltas of every origin, yet their states differ (docs/PROTOCOL.md 11.4); compare the two nodes' models (`statesync channels`, `ls`, `get` on each), and report it with both logs",
            metadata: [
                "peer.id": "\(beat.node)", "digest": "\(String(ours, radix: 16))",
                "peer.digest": "\(String(theirs, radix: 16))", "origins": "\(beat.progress.count)",
            ])
    }

    /// The peers whose state differs from this node's at equal progress, by id.
    var divergedPeers: [String] {
        antiEntropy.peers.filter(\.value.diverged).keys.sorted()
    }

    /// A member left or was forgotten: its digests are no longer compared, nor is it waited for
    /// as a snapshot's server.
    mutating func forgetDigests(of id: String, publishingAt publish: String) {
        antiEntropy.peers[id] = nil
        if let server = antiEntropy.snapshotServer?.endpoint, server == publish || linkedID(of: server) == id {
            antiEntropy.snapshotServer = nil
        }
    }

    /// A peer's snapshot was merged, whole or in part (a stream given up keeps the pages it
    /// merged): until it is heard at rest, this node is not at rest.
    mutating func noteSnapshotMerged(from endpoint: String) {
        antiEntropy.snapshotServer = (endpoint, now)
    }

    /// Two starts of one id were heard taking turns (section 7.5): peers may hold one's write or
    /// the other's under one number until the start that goes on mends them (it waits for quiet,
    /// then asks for a minute at most). Nothing is compared until then.
    mutating func pauseDigestsForSplitWrites() {
        antiEntropy.pausedUntil = max(
            antiEntropy.pausedUntil, now + splitWritesQuietTime + Self.splitWritesPatience)
    }
}
