/// Everything a node needs to run: who it is, where it publishes, whom it follows, where clients
/// reach it and where it keeps its data. Load it from YAML with ``load(file:environment:)``.
public struct NodeConfiguration: Sendable, Equatable {
    /// This node's id, unique in the cluster: stamped into every version it writes.
    public var nodeID: String
    /// Where this node keeps its state (created when missing).
    public var dataDirectory: String
    /// The endpoint this node's PUB socket binds, e.g. `tcp://127.0.0.1:7001`.
    public var publishEndpoint: String
    /// The publish endpoints of the other nodes, which this node's SUB sockets connect to.
    public var peers: [String]
    /// The node id of a peer's publish endpoint, where the configuration names it
    /// (`network.peers` entries written `NODE_ID=ENDPOINT`); required for every peer with
    /// ``security``, which must know whose key to expect at each endpoint.
    public var peerNodeIDs: [String: String] = [:]
    /// CurveZMQ encryption and authentication of every socket; `nil`: none (every endpoint is open
    /// to whoever can reach it).
    public var security: SecurityConfiguration?
    /// The endpoint of the client API (ROUTER), e.g. `tcp://127.0.0.1:7101`; `nil` for an
    /// embedded node that serves no clients. Peers also fetch repairs here.
    public var apiEndpoint: String?
    /// Without ``apiEndpoint``: where the node serves only its peers' repair requests (FETCH and
    /// SNAPSHOT). `nil` picks one from ``publishEndpoint`` (see ``repairServiceEndpoint``).
    public var repairEndpoint: String?
    /// How often the node publishes a heartbeat.
    public var heartbeatIntervalMilliseconds: Int
    /// A peer whose clock is further ahead than this is not followed (and is logged and counted).
    public var maximumClockDriftMilliseconds: Int
    /// The log level of the daemon (`trace` … `critical`).
    public var logLevel: String
    /// How the daemon writes its log lines: `text` (for people) or `json` (one object per line,
    /// for log shippers).
    public var logFormat: String = "text"
    /// `HOST:PORT` of the daemon's HTTP listener (`/metrics`, `/healthz`, `/readyz` and the
    /// live view), or `nil`: no listener. Bind it to loopback unless a firewall guards the port.
    public var httpListen: String?
    /// The high-water mark of the client API socket, per client, in messages: watch events queue
    /// here before a slow client's watch waits (and, past the history, resyncs).
    public var clientHighWaterMark: Int = 10_000
    /// At most this many consecutive deltas travel in one message: of one model in a DELTA batch,
    /// of one channel in a channel batch or a packed batch (when every linked peer takes them,
    /// docs/PROTOCOL.md 7.6 and 7.7); 1 sends one message per delta. Batching adds no delay: a
    /// batch is what is ready to publish. 4096, a round of local writes: under load, each
    /// message's costs (a wake-up of the observers' queue, a log write, a look-up of the model)
    /// are shared by more deltas (256 took 9 % more CPU per single set, issue #17).
    public var batchMaximumDeltas: Int = 4096
    /// Whether the node takes and sends channel batches (deltas of several models of a channel in
    /// one message, docs/PROTOCOL.md 7.6). Always on in a real node; the simulator turns it off
    /// for some nodes to stand for nodes older than channel batches in a mixed cluster.
    package var channelBatches = true
    /// Whether the node takes and sends packed batches (deltas of a channel in one frame,
    /// docs/PROTOCOL.md 7.7). Always on in a real node; the simulator turns it off for some
    /// nodes to stand for nodes older than packed batches.
    package var packedBatches = true
    /// When the node's observer queue is this many changes behind, the node stops taking peer
    /// deltas until it is back under half of it: backpressure instead of unbounded memory.
    public var observerBacklogLimit: Int = 100_000
    /// When local writes become durable (see ``FsyncPolicy``).
    public var fsync: FsyncPolicy
    /// With ``FsyncPolicy/interval``: how often the log is synced.
    public var fsyncIntervalMilliseconds: Int
    /// With ``FsyncPolicy/always``: publish each round of local writes once it is written to the
    /// OS, while its `fdatasync` runs, instead of after it (`storage.publish: written`). A write
    /// is still acknowledged only once durable; peers see it a sync sooner. The node then
    /// reserves sequence numbers durably ahead, as with ``FsyncPolicy/interval``, and after a
    /// power loss it settles with its peers before it takes writes (docs/PROTOCOL.md 11.2).
    /// Off by default. With ``FsyncPolicy/interval`` writes are always published so.
    public var publishBeforeSync = false

    /// Whether local writes are published before they are durable: always with
    /// ``FsyncPolicy/interval``, with ``FsyncPolicy/always`` when ``publishBeforeSync`` is set.
    public var publishesBeforeSync: Bool { fsync == .interval || publishBeforeSync }
    /// The log is compacted into the snapshot when it grew by more than this many bytes since
    /// the last compaction (the records that compaction kept do not count).
    public var compactBytes: Int
    /// Local writes are refused (client SETs get ERROR 9) while the data directory's file system
    /// has less free space than this; reads, watches and repairs go on.
    public var reserveBytes: Int = 64 << 20
    /// How old (by its version, in milliseconds) a deletion must be before it may be collected,
    /// once it is stable (docs/PROTOCOL.md 8.4): the time within which a writer the cluster does
    /// not know yet — a new node cut off at its start, one that runs alone first — must reach it.
    public var tombstoneGraceMilliseconds: Int = 3_600_000
    /// How many deltas per origin are kept in memory to serve peers' repairs.
    public var historyDeltas: Int
    /// The size of the pages a snapshot is streamed in when this node asks a peer for one
    /// (docs/PROTOCOL.md 10.9): the largest message a transfer of any state size takes and the
    /// memory a page costs on both sides (4 MiB until 2026-11-29; a 1 M-property join took no
    /// longer with the smaller pages). The joiner reads and merges a page a slice at a time
    /// (``snapshotMergeSliceRegisters``); what it does at once is check the page's checksum.
    public var snapshotPageOctets: Int = 1 << 20
    /// A received snapshot page is read and merged this many registers at a time (whole
    /// models), the node answering its sockets between slices: a page of 1 MiB holds some
    /// 45,000 registers of a small value each, which took the joiner's I/O thread 35–55 ms in
    /// one go here, and a slice of 4,096 a few milliseconds.
    package var snapshotMergeSliceRegisters = 4096
    /// The high-water mark of the PUB socket and of each SUB socket, in messages: how much may be
    /// queued for or from one peer before libzmq drops (dropped deltas are then repaired).
    public var highWaterMark: Int

    /// The endpoint where peers send this node repair requests: the client API when there is
    /// one; otherwise ``repairEndpoint``, or, when that is not set either, one derived from the
    /// publish endpoint — the same host on a free port (`tcp://HOST:*`), or the publish path with
    /// `.repair` appended (`ipc://`, `inproc://`). Every node serves repairs: without them a peer
    /// that missed deltas could never get them back.
    public var repairServiceEndpoint: String {
        if let apiEndpoint { return apiEndpoint }
        if let repairEndpoint { return repairEndpoint }
        if publishEndpoint.hasPrefix("tcp://"), let colon = publishEndpoint.lastIndex(of: ":") {
            return publishEndpoint[..<colon] + ":*"
        }
        return publishEndpoint + ".repair"
    }

    /// When a node's local writes become durable.
    public enum FsyncPolicy: String, Sendable, Equatable, CaseIterable {
        /// Every batch of local writes is fsynced before it is acknowledged or published: an
        /// acknowledged write survives a crash or power loss. The default.
        case always
        /// Writes are acknowledged once written to the OS; the log is fsynced (and they are
        /// published) every `storage.fsync_interval_ms`. Faster; a power loss (not a process
        /// crash) can lose up to one interval of acknowledged writes.
        case interval
    }

    /// A configuration with every setting given (the rest at their defaults).
    public init(
        nodeID: String,
        dataDirectory: String,
        publishEndpoint: String,
        peers: [String] = [],
        apiEndpoint: String? = nil,
        heartbeatIntervalMilliseconds: Int = 500,
        maximumClockDriftMilliseconds: Int = 60_000,
        logLevel: String = "info",
        fsync: FsyncPolicy = .always,
        fsyncIntervalMilliseconds: Int = 50,
        compactBytes: Int = 64 << 20,
        historyDeltas: Int = 100_000,
        highWaterMark: Int = 100_000
    ) {
        self.nodeID = nodeID
        self.dataDirectory = dataDirectory
        self.publishEndpoint = publishEndpoint
        self.peers = peers
        self.apiEndpoint = apiEndpoint
        self.heartbeatIntervalMilliseconds = heartbeatIntervalMilliseconds
        self.maximumClockDriftMilliseconds = maximumClockDriftMilliseconds
        self.logLevel = logLevel
        self.fsync = fsync
        self.fsyncIntervalMilliseconds = fsyncIntervalMilliseconds
        self.compactBytes = compactBytes
        self.historyDeltas = historyDeltas
        self.highWaterMark = highWaterMark
    }
}
