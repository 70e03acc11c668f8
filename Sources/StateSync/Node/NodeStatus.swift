/// What an operator (or a readiness probe) asks of a node.
public struct NodeStatus: Sendable, Equatable {
    /// One configured peer.
    public struct Peer: Sendable, Equatable {
        /// The peer's publish endpoint, as configured.
        public var endpoint: String
        /// The peer's node id, once a message from it arrived.
        public var node: String?
        /// Whether a heartbeat or delta arrived within three heartbeat intervals.
        public var connected: Bool
        /// Milliseconds since the last message from the peer, if any arrived.
        public var lastSeenMillisecondsAgo: Int?
        /// Deltas received from this peer.
        public var deltasReceived: Int
        /// Whether the peer knows this node (its member list names it, or it took its
        /// ANNOUNCE): only then are its own deltas taken from it (docs/PROTOCOL.md 7.5,
        /// "Known before taken").
        public var knowsThisNode = true

        /// Connected, and knows this node: deltas flow both ways between them.
        public var meshed: Bool { connected && knowsThisNode }
    }

    /// The node's id.
    public var node: String
    /// The node's incarnation: new at every start.
    public var incarnation: UInt64
    /// The endpoint its PUB socket is bound to.
    public var publishEndpoint: String
    /// The endpoint its client API is bound to, if it serves one.
    public var apiEndpoint: String?
    /// Every configured peer and what this node hears from it.
    public var peers: [Peer]
    /// Channel name → number of models held.
    public var channels: [String: Int]
    /// The highest version this node has applied (`nil` before the first write).
    public var latestVersion: Version?
    /// This node's latest sequence number.
    public var latestSequence: UInt64
    /// The highest of its sequence numbers this node has published (durable and sent).
    public var publishedSequence: UInt64 = 0
    /// A digest of the whole replicated state: equal digests mean equal state.
    public var stateDigest: UInt64
    /// Every counter of ``NodeCounters``, by its snake_case name.
    public var counters: [String: Int]
    /// Sequence numbers known to exist but not yet received, over all origins (0 = caught up).
    public var missingDeltas: Int
    /// Watches whose clients are not taking events as fast as they come (they wait, and are
    /// resynced with a snapshot if they fall behind the retained history).
    public var laggingWatches: Int
    /// Active watches (a client may hold several).
    public var watchers: Int
    /// With security: refused connections by key fingerprint (its first 8 Z85 characters), for
    /// the most recent distinct keys (at most 32).
    public var refusedKeys: [String: Int] = [:]
    /// Whether the node is settling its sequence numbers after a power loss (it publishes before
    /// syncing: `storage.fsync: interval`, or `storage.publish: written`): it takes no writes until its peers said which of its
    /// deltas they hold (docs/PROTOCOL.md 11.2); `writesHeld` wait meanwhile.
    public var settling = false
    public var writesHeld = 0
    /// While settling: the peers whose answer the node still waits for (empty once every one
    /// answered, while it makes its new reservation durable; empty when not settling). `nil` in
    /// the status of a node that does not say (an older version).
    public var settlingWaitsFor: [SettlingPeer]? = []
    /// How the node makes writes durable (`storage.fsync`, `storage.publish`); `nil` in the
    /// status of a node that does not say (an older version).
    public var storage: Storage?

    /// A peer a settling node waits for (docs/PROTOCOL.md 11.2).
    public struct SettlingPeer: Sendable, Equatable {
        /// The peer's publish endpoint.
        public var endpoint: String
        /// Its node id, when known.
        public var node: String?
        /// Whether the node can ask it now: connected, with a repair link (an API endpoint it
        /// may dial). One that is not is down, left, or advertises no API this node may dial.
        public var reachable: Bool

        public init(endpoint: String, node: String?, reachable: Bool) {
            self.endpoint = endpoint
            self.node = node
            self.reachable = reachable
        }

        /// Its id, or its endpoint when the id is not known.
        public var name: String { node ?? endpoint }
    }

    /// The node's storage policy, as configured.
    public struct Storage: Sendable, Equatable {
        /// `always` or `interval` (`storage.fsync`).
        public var fsync: String
        /// `synced` or `written` (`storage.publish`): whether peers get an own write once it is
        /// durable, or once written to the OS (before its sync, or while it runs).
        public var publish: String
        /// With `interval`: the milliseconds between syncs (`storage.fsync_interval_ms`).
        public var intervalMilliseconds: Int?

        public init(fsync: String, publish: String, intervalMilliseconds: Int? = nil) {
            self.fsync = fsync
            self.publish = publish
            self.intervalMilliseconds = intervalMilliseconds
        }

        /// One line for people: `always, publish synced`, `interval (every 50 ms), publish written`.
        public var description: String {
            "\(fsync)\(intervalMilliseconds.map { " (every \($0) ms)" } ?? ""), publish \(publish)"
        }
    }
    /// Whether the node refuses writes because its disk is nearly full, and the free bytes it last
    /// measured (`nil`: unknown).
    public var diskFull = false
    public var diskFreeBytes: UInt64?
    /// Every member this node knows of, itself included (docs/PROTOCOL.md section 7.5), by id.
    public var members: [Member] = []
    /// Deletions held (tombstones, expired values, deletions of models), not yet collected.
    public var tombstones = 0
    /// The timestamp (milliseconds << 16 | counter) through which deletions were collected
    /// (docs/PROTOCOL.md 8.4); 0 before any collection.
    public var collectedThrough: UInt64 = 0
    /// The member (or peer endpoint never heard) holding collection back: it has no stable floor
    /// yet, or its floor is the least. `nil` before the first HEARTBEAT.
    public var collectionHeldBy: String?
    /// Node ids this node hears two nodes run under (their HEARTBEATs alternate between two
    /// incarnations), with the publish endpoints heard: they number their writes over each
    /// other's (docs/PROTOCOL.md 7.5, "Two nodes under one id"). Empty when there are none.
    public var duplicateNodeIDs: [String: [String]] = [:]
    /// Peers (node ids) whose state differs from this node's although both hold the same deltas
    /// of every origin, comparison after comparison (docs/PROTOCOL.md 11.4). Empty when none does.
    public var divergedPeers: [String] = []

    /// One member of the cluster, as this node sees it.
    public struct Member: Sendable, Equatable {
        public var id: String
        public var publishEndpoint: String
        public var apiEndpoint: String
        /// `alive` (heard from within 3 heartbeat intervals, or this node itself), `suspect`
        /// (silent for longer), `down` (silent for the silence limit, or never heard), `left`
        /// (stopped cleanly and said so) or `forgotten`.
        public var state: String
        /// Milliseconds since this node last heard from it (`nil`: never, or itself).
        public var lastSeenMillisecondsAgo: Int?
        /// Its deltas known to exist that this node has not received.
        public var missingDeltas: Int
        /// Whether this node has a live link to it (a message within 3 heartbeat intervals).
        public var connected: Bool
        /// The entry's version (who wrote it, when).
        public var version: String

        /// Whether the node expects to hear this member: not one that left or was forgotten
        /// (readiness does not wait for those, and they have no per-peer metrics).
        public var isExpected: Bool { state != "left" && state != "forgotten" }

        public init(
            id: String, publishEndpoint: String, apiEndpoint: String, state: String, lastSeenMillisecondsAgo: Int?,
            missingDeltas: Int, connected: Bool, version: String
        ) {
            self.id = id
            self.publishEndpoint = publishEndpoint
            self.apiEndpoint = apiEndpoint
            self.state = state
            self.lastSeenMillisecondsAgo = lastSeenMillisecondsAgo
            self.missingDeltas = missingDeltas
            self.connected = connected
            self.version = version
        }

        /// The member as a ``Value`` map (its wire and JSON form).
        public var value: Value {
            var map: [String: Value] = [
                "id": .string(id), "publish": .string(publishEndpoint), "api": .string(apiEndpoint),
                "state": .string(state), "missing_deltas": .int(Int64(missingDeltas)), "connected": .bool(connected),
                "version": .string(version),
            ]
            map["last_seen_ms_ago"] = lastSeenMillisecondsAgo.map { .int(Int64($0)) } ?? .null
            return .map(map)
        }

        init?(_ value: Value) {
            guard case .map(let map) = value, case .string(let id)? = map["id"] else { return nil }
            func string(_ key: String) -> String {
                if case .string(let s)? = map[key] { return s }
                return ""
            }
            func int(_ key: String) -> Int? {
                if case .int(let i)? = map[key] { return Int(i) }
                return nil
            }
            var connected = false
            if case .bool(let c)? = map["connected"] { connected = c }
            self.init(
                id: id, publishEndpoint: string("publish"), apiEndpoint: string("api"), state: string("state"),
                lastSeenMillisecondsAgo: int("last_seen_ms_ago"), missingDeltas: int("missing_deltas") ?? 0,
                connected: connected, version: string("version"))
        }
    }

    /// Why the node is not ready (empty: it is): peers or members it should hear that it does
    /// not (a configured peer or a known member, unless it left or was forgotten), connected
    /// peers that do not know it yet (``Peer/knowsThisNode``), deltas known to exist that it has
    /// not received, a disk too full to take writes, or settling after a power loss. `statesync
    /// status --ready` and the HTTP listener's `/readyz` both answer with this.
    public var notReadyReasons: [String] {
        var reasons: [String] = []
        let gone = Set(members.filter { !$0.isExpected }.map(\.id))
        // A peer not heard in this run is named by its member entry's id when it has one (else the
        // same node would be listed twice: by id as a member, by endpoint as a peer).
        // (Members that left or were forgotten are not among them: a node replaced under a new
        // id at the same address would hide the one configured there.)
        let byEndpoint = Dictionary(
            members.filter(\.isExpected).map { ($0.publishEndpoint, $0.id) }, uniquingKeysWith: { first, _ in first })
        let unheard = peers.filter { !$0.connected }.map { $0.node ?? byEndpoint[$0.endpoint] ?? $0.endpoint }
        var down = Set(unheard.filter { !gone.contains($0) })
        for member in members where member.id != node && !gone.contains(member.id) && !member.connected {
            down.insert(member.id)
        }
        if !down.isEmpty { reasons.append("peers not connected: \(down.sorted().joined(separator: ", "))") }
        let strangers = peers.filter { $0.connected && !$0.knowsThisNode }.map { $0.node ?? $0.endpoint }
        if !strangers.isEmpty {
            reasons.append(
                "peers that do not know this node yet (their deltas wait until they do): \(strangers.sorted().joined(separator: ", "))"
            )
        }
        if missingDeltas > 0 { reasons.append("catching up: \(missingDeltas) deltas known but not received") }
        if diskFull { reasons.append("disk nearly full: writes are refused") }
        if settling {
            reasons.append(
                "settling (after a power loss or a damaged log): \(writesHeld) writes held until every peer said which of this node's deltas it holds\(settlingWaitsText)"
            )
        }
        return reasons
    }

    /// What a settling node waits for, as the end of a sentence (with no semicolon: readiness
    /// reasons are joined with them): ` — waiting for n2, n3 (not reachable: n3, …)`, or that
    /// no peer is left to hear from. Empty when not settling, or when a node did not say (an
    /// older version).
    public var settlingWaitsText: String {
        guard settling, let settlingWaitsFor else { return "" }
        guard !settlingWaitsFor.isEmpty else {
            return " — no peer left to hear from: making its new reservation durable"
        }
        let unreachable = settlingWaitsFor.filter { !$0.reachable }.map(\.name)
        let hint =
            unreachable.isEmpty
            ? ""
            : " (not reachable: \(unreachable.joined(separator: ", ")), down, left or advertising no API this node may dial: statesync forget a peer gone for good)"
        return " — waiting for \(settlingWaitsFor.map(\.name).joined(separator: ", "))\(hint)"
    }

    /// The status as a ``Value`` map (its wire and JSON form).
    public var value: Value {
        var map: [String: Value] = [
            "node": .string(node),
            "incarnation": .string(String(incarnation, radix: 16)),
            "publish": .string(publishEndpoint),
            "peers": .array(
                peers.map { peer in
                    var p: [String: Value] = [
                        "endpoint": .string(peer.endpoint), "connected": .bool(peer.connected),
                        "deltas_received": .int(Int64(peer.deltasReceived)),
                        "knows_this_node": .bool(peer.knowsThisNode),
                    ]
                    p["node"] = peer.node.map(Value.string) ?? .null
                    p["last_seen_ms_ago"] = peer.lastSeenMillisecondsAgo.map { .int(Int64($0)) } ?? .null
                    return .map(p)
                }),
            "channels": .map(channels.mapValues { .int(Int64($0)) }),
            "latest_version": latestVersion.map { .string($0.description) } ?? .null,
            "latest_sequence": .int(Int64(clamping: latestSequence)),
            "published_sequence": .int(Int64(clamping: publishedSequence)),
            "state_digest": .string(String(stateDigest, radix: 16)),
            "counters": .map(counters.mapValues { .int(Int64($0)) }),
            "watchers": .int(Int64(watchers)),
            "missing_deltas": .int(Int64(missingDeltas)),
            "lagging_watches": .int(Int64(laggingWatches)),
            "refused_keys": .map(refusedKeys.mapValues { .int(Int64($0)) }),
            "disk_full": .bool(diskFull),
            "settling": .bool(settling),
            "writes_held": .int(Int64(writesHeld)),
        ]
        map["disk_free_bytes"] = diskFreeBytes.map { .int(Int64(clamping: $0)) } ?? .null
        map["api"] = apiEndpoint.map(Value.string) ?? .null
        map["members"] = .array(members.map(\.value))
        map["tombstones"] = .int(Int64(tombstones))
        // The text form of a version's clock part (section 6.3), without a node.
        map["collected_through"] = .string("\(collectedThrough >> 16).\(collectedThrough & 0xFFFF)")
        map["collection_held_by"] = collectionHeldBy.map(Value.string) ?? .null
        map["duplicate_node_ids"] = .map(duplicateNodeIDs.mapValues { .array($0.map(Value.string)) })
        map["diverged_peers"] = .array(divergedPeers.map(Value.string))
        map["settling_waits_for"] = settlingWaitsFor.map { waits in
            .array(
                waits.map { peer in
                    .map([
                        "endpoint": .string(peer.endpoint), "node": peer.node.map(Value.string) ?? .null,
                        "reachable": .bool(peer.reachable),
                    ])
                })
        }
        if let storage {
            var policy: [String: Value] = ["fsync": .string(storage.fsync), "publish": .string(storage.publish)]
            if let interval = storage.intervalMilliseconds { policy["interval_ms"] = .int(Int64(interval)) }
            map["storage"] = .map(policy)
        }
        return .map(map)
    }

    /// Reads a status back from its ``value`` form; unknown keys are ignored.
    public init?(_ value: Value) {
        guard case .map(let map) = value, case .string(let node)? = map["node"] else { return nil }
        func string(_ key: String) -> String? {
            if case .string(let s)? = map[key] { return s }
            return nil
        }
        func int(_ v: Value?) -> Int? {
            if case .int(let i)? = v { return Int(i) }
            return nil
        }
        self.node = node
        self.incarnation = string("incarnation").flatMap { UInt64($0, radix: 16) } ?? 0
        self.publishEndpoint = string("publish") ?? ""
        self.apiEndpoint = string("api")
        var peers: [Peer] = []
        if case .array(let list)? = map["peers"] {
            for case .map(let p) in list {
                guard case .string(let endpoint)? = p["endpoint"] else { continue }
                var peerNode: String?
                if case .string(let n)? = p["node"] { peerNode = n }
                var connected = false
                if case .bool(let c)? = p["connected"] { connected = c }
                // Absent from an older node's status: it takes every peer's deltas.
                var knows = true
                if case .bool(let k)? = p["knows_this_node"] { knows = k }
                peers.append(
                    Peer(
                        endpoint: endpoint, node: peerNode, connected: connected,
                        lastSeenMillisecondsAgo: int(p["last_seen_ms_ago"]),
                        deltasReceived: int(p["deltas_received"]) ?? 0, knowsThisNode: knows))
            }
        }
        self.peers = peers
        var channels: [String: Int] = [:]
        if case .map(let c)? = map["channels"] { for (k, v) in c { channels[k] = int(v) ?? 0 } }
        self.channels = channels
        self.latestVersion = string("latest_version").flatMap(Version.init)
        self.latestSequence = UInt64(clamping: int(map["latest_sequence"]) ?? 0)
        self.publishedSequence = UInt64(clamping: int(map["published_sequence"]) ?? 0)
        self.stateDigest = string("state_digest").flatMap { UInt64($0, radix: 16) } ?? 0
        var counters: [String: Int] = [:]
        if case .map(let c)? = map["counters"] { for (k, v) in c { counters[k] = int(v) ?? 0 } }
        self.counters = counters
        self.watchers = int(map["watchers"]) ?? 0
        self.missingDeltas = int(map["missing_deltas"]) ?? 0
        self.laggingWatches = int(map["lagging_watches"]) ?? 0
        if case .map(let refused)? = map["refused_keys"] { self.refusedKeys = refused.mapValues { int($0) ?? 0 } }
        if case .bool(let full)? = map["disk_full"] { self.diskFull = full }
        if case .bool(let settling)? = map["settling"] { self.settling = settling }
        self.writesHeld = int(map["writes_held"]) ?? 0
        self.diskFreeBytes = int(map["disk_free_bytes"]).map { UInt64(clamping: $0) }
        if case .array(let list)? = map["members"] { self.members = list.compactMap(Member.init) }
        self.tombstones = int(map["tombstones"]) ?? 0
        if let through = string("collected_through"), let version = Version(through + "@-") {
            self.collectedThrough = version.timestamp  // (parsed as a version of a placeholder node)
        }
        self.collectionHeldBy = string("collection_held_by")
        if case .array(let list)? = map["diverged_peers"] {
            self.divergedPeers = list.compactMap { if case .string(let s) = $0 { s } else { nil } }
        }
        self.settlingWaitsFor = nil
        if case .array(let list)? = map["settling_waits_for"] {
            self.settlingWaitsFor = list.compactMap { entry in
                guard case .map(let peer) = entry, case .string(let endpoint)? = peer["endpoint"] else { return nil }
                var node: String?
                if case .string(let id)? = peer["node"] { node = id }
                var reachable = false
                if case .bool(let r)? = peer["reachable"] { reachable = r }
                return SettlingPeer(endpoint: endpoint, node: node, reachable: reachable)
            }
        }
        if case .map(let policy)? = map["storage"], case .string(let fsync)? = policy["fsync"],
            case .string(let publish)? = policy["publish"]
        {
            self.storage = Storage(fsync: fsync, publish: publish, intervalMilliseconds: int(policy["interval_ms"]))
        }
        if case .map(let duplicates)? = map["duplicate_node_ids"] {
            self.duplicateNodeIDs = duplicates.mapValues { endpoints in
                guard case .array(let list) = endpoints else { return [] }
                return list.compactMap { if case .string(let s) = $0 { s } else { nil } }
            }
        }
    }

    init(
        node: String, incarnation: UInt64, publishEndpoint: String, apiEndpoint: String?, peers: [Peer],
        channels: [String: Int], latestVersion: Version?, latestSequence: UInt64, stateDigest: UInt64,
        counters: [String: Int], watchers: Int, missingDeltas: Int, laggingWatches: Int
    ) {
        self.laggingWatches = laggingWatches
        self.missingDeltas = missingDeltas
        self.node = node
        self.incarnation = incarnation
        self.publishEndpoint = publishEndpoint
        self.apiEndpoint = apiEndpoint
        self.peers = peers
        self.channels = channels
        self.latestVersion = latestVersion
        self.latestSequence = latestSequence
        self.stateDigest = stateDigest
        self.counters = counters
        self.watchers = watchers
    }
}
