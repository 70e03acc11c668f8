/// The counters a node keeps: each is a metric waiting to be exported, and all of them are
/// reported by `statesync status`.
public struct NodeCounters: Sendable, Equatable {
    /// Deltas this node wrote and published.
    public var deltasPublished = 0
    /// Deltas received from peers (well-formed).
    public var deltasReceived = 0
    /// DELTA messages published (a batch counts once).
    public var deltaMessagesPublished = 0
    /// Of those, channel batches (deltas of several models in one message, docs/PROTOCOL.md 7.6):
    /// it does not grow while a linked peer has not said it takes them (an older node, or one not
    /// heard from).
    public var channelBatchesPublished = 0
    /// Of the DELTA messages published, packed batches (a channel's deltas in one frame,
    /// docs/PROTOCOL.md 7.7; not counted as channel batches): sent, instead of the other forms,
    /// once every linked peer said it takes them.
    public var packedBatchesPublished = 0
    /// Peer links (SUB sockets) replaced after the peer was silent for long, and repair links
    /// replaced after a request got no answer in time.
    public var peerLinkResets = 0
    public var repairLinkResets = 0
    /// Sequence numbers peers announced that no peer, their origin included, ever held: no
    /// longer waited for (a peer announcing what it does not have).
    public var phantomSequences = 0
    /// Sequence numbers taken as void: lost everywhere in a power loss of their origin, which
    /// declared them so after settling (its own, counted when it settles, and peers').
    public var voidSequences = 0
    /// Own deltas this node took back from its peers while settling (docs/PROTOCOL.md 11.2):
    /// published before they were durable, then lost from its log in a power loss or a damage.
    public var ownDeltasTakenBack = 0
    /// Subscribers that completed their handshake with this node's publish socket (peers
    /// connecting and reconnecting, joining nodes, tools reading the stream).
    public var subscribersConnected = 0
    /// With security: connections refused because their key is not admitted.
    public var authenticationRefusals = 0
    /// With security: deltas and heartbeats a peer sent in another node's name on its live
    /// stream, dropped.
    public var forgedOrigins = 0
    /// Deltas of a peer's own origin not taken from it because it did not know this node yet
    /// (its member list did not name this node): repaired once it does (section 7.5).
    public var deltasBeforeKnown = 0
    /// Times the data directory's free space fell under `storage.reserve_bytes`.
    public var diskFullEpisodes = 0
    /// Client writes refused (ERROR 9) because the free space above the reserve could not hold
    /// them, the disk not yet under its reserve.
    public var writesRefusedForSpace = 0
    /// Peer HEARTBEATs whose API was on another host than their stream: not dialled.
    public var foreignRepairEndpoints = 0
    /// Times two nodes were found running under one node id (section 7.5, "Two nodes under one
    /// id"): by a peer hearing both, or by one of them, which then refuses to run.
    public var duplicateNodeIDs = 0
    /// Writes published again under new numbers because a peer held another write under one of
    /// this node's numbers (section 7.5, "Mending split writes"): the other start's, and its own.
    public var splitWritesReissued = 0
    /// Well-formed messages from peers' live streams (HEARTBEATs and DELTA messages, a batch
    /// counting once): with the node count, the cost of the full mesh.
    public var peerMessagesReceived = 0
    /// Pages of streamed SNAPSHOTs served (section 10.9).
    public var snapshotPagesServed = 0
    /// Member entries taken from peers (HEARTBEAT lists, ANNOUNCE) that changed the member list.
    public var membershipUpdates = 0
    /// ANNOUNCE requests sent (this node's entry, to a peer whose list lacked it).
    public var announcesSent = 0
    /// Well-formed DELTA messages received from peers (a batch counts once): with
    /// ``deltasReceived``, how well deltas are batched.
    public var deltaMessagesReceived = 0
    /// Received deltas that changed at least one property.
    public var deltasApplied = 0
    /// Received properties that lost last-writer-wins and changed nothing.
    public var propertiesStale = 0
    /// Messages from peers or clients that could not be decoded and were dropped.
    public var malformedMessages = 0
    /// Gaps found in an origin's sequence numbers, by a later delta or by an announcement of
    /// later ones (deltas lost on the way): each one is a repair to make.
    public var sequenceGaps = 0
    /// Deltas received again (a sequence number already seen from that origin).
    public var duplicateDeltas = 0
    /// Peer versions too far ahead of the local clock to follow.
    public var clockDriftRejections = 0
    /// Properties a local model rejected (wrong type for the model's declaration).
    public var rejectedProperties = 0
    /// Client requests served, and those answered with an error.
    public var clientRequests = 0
    /// Client requests answered with an error.
    public var clientErrors = 0
    /// Gap repairs asked of peers (FETCH requests sent).
    public var repairRequests = 0
    /// Deltas received through repair.
    public var deltasFetched = 0
    /// Deltas served to peers' repairs, and snapshots served and applied.
    public var deltasServed = 0
    /// Snapshots served to peers.
    public var snapshotsServed = 0
    /// Peers' snapshots merged.
    public var snapshotsApplied = 0
    /// Torn or corrupt bytes cut from the log's tail at start.
    public var logBytesCut = 0
    /// Compactions of the log into the snapshot written, and failed (each retried later).
    public var compactions = 0
    public var compactionsFailed = 0
    /// Replies that could not be queued to a client (its queue was full).
    public var repliesDropped = 0
    /// Local writes whose value could not be encoded for the wire.
    public var encodingFailures = 0
    /// Times the node stopped taking peer deltas because its observer queue was more than
    /// 100,000 changes behind, and the milliseconds it spent so in all.
    public var observerBackpressurePauses = 0
    /// Milliseconds spent with peer intake paused (see `observerBackpressurePauses`).
    public var observerBackpressureMilliseconds = 0
    /// Values whose time to live ran out, deleted by this node.
    public var valuesExpired = 0
    /// Deletions (tombstones, expired values, deletions of models) collected once no delta they
    /// must beat could still arrive.
    public var tombstonesCollected = 0
    /// Times this node dropped its state for a peer's snapshot, having been forgotten while away.
    public var resyncs = 0
    /// Peers' state digests compared with this node's at equal progress (docs/PROTOCOL.md 11.4).
    public var digestComparisons = 0
    /// Times a peer's state was found to differ from this node's at equal progress, comparison
    /// after comparison (docs/PROTOCOL.md 11.4): replicas that should be equal are not.
    public var stateDivergences = 0

    /// All counters at zero.
    public init() {}

    /// Name → value, for status output and metrics.
    public var all: [(String, Int)] {
        [
            ("deltas_published", deltasPublished), ("deltas_received", deltasReceived),
            ("delta_messages_received", deltaMessagesReceived), ("peer_link_resets", peerLinkResets),
            ("repair_link_resets", repairLinkResets), ("phantom_sequences", phantomSequences),
            ("void_sequences", voidSequences), ("own_deltas_taken_back", ownDeltasTakenBack),
            ("subscribers_connected", subscribersConnected),
            ("authentication_refusals", authenticationRefusals), ("forged_origins", forgedOrigins),
            ("deltas_before_known", deltasBeforeKnown),
            ("disk_full_episodes", diskFullEpisodes), ("writes_refused_for_space", writesRefusedForSpace),
            ("foreign_repair_endpoints", foreignRepairEndpoints), ("duplicate_node_ids", duplicateNodeIDs),
            ("split_writes_reissued", splitWritesReissued),
            ("membership_updates", membershipUpdates), ("announces_sent", announcesSent),
            ("peer_messages_received", peerMessagesReceived), ("snapshot_pages_served", snapshotPagesServed),
            ("delta_messages_published", deltaMessagesPublished),
            ("channel_batches_published", channelBatchesPublished),
            ("packed_batches_published", packedBatchesPublished),
            ("deltas_applied", deltasApplied), ("properties_stale", propertiesStale),
            ("malformed_messages", malformedMessages), ("sequence_gaps", sequenceGaps),
            ("duplicate_deltas", duplicateDeltas), ("clock_drift_rejections", clockDriftRejections),
            ("rejected_properties", rejectedProperties), ("client_requests", clientRequests),
            ("client_errors", clientErrors),
            ("replies_dropped", repliesDropped), ("repair_requests", repairRequests),
            ("deltas_fetched", deltasFetched), ("deltas_served", deltasServed),
            ("snapshots_served", snapshotsServed), ("snapshots_applied", snapshotsApplied),
            ("log_bytes_cut", logBytesCut), ("compactions", compactions), ("compactions_failed", compactionsFailed),
            ("encoding_failures", encodingFailures), ("observer_backpressure_pauses", observerBackpressurePauses),
            ("observer_backpressure_ms", observerBackpressureMilliseconds), ("values_expired", valuesExpired),
            ("tombstones_collected", tombstonesCollected), ("resyncs", resyncs),
            ("digest_comparisons", digestComparisons), ("state_divergences", stateDivergences),
        ]
    }
}
