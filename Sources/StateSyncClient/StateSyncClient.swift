import Foundation
@_exported public import StateSync
import Synchronization
package import ZeroMQ

/// A client of a StateSync node's API (`network.api`): get and set model properties, watch a
/// channel's changes as an `AsyncSequence`, ask for the node's status. The `statesync` CLI is a
/// thin layer over this type.
///
/// ```swift
/// let client = try StateSyncClient(endpoint: "tcp://127.0.0.1:7101")
/// let version = try await client.set(ModelAddress(channel: "demo", model: "greeting"), ["text": "hello"])
/// for try await change in try await client.watch(channel: "demo") { print(change.old, change.new) }
/// ```
///
/// Thread safety: all methods may be called from any task. The client owns one I/O thread and
/// one DEALER socket; ``close()`` (or deinitialisation) stops them.
public final class StateSyncClient: Sendable {
    /// The node endpoint this client talks to.
    public let endpoint: String
    /// How long a request may wait for its answer before failing with a timeout.
    public let requestTimeout: Duration
    /// The other daemons the typed models of this client fail over to, in order, when theirs
    /// dies (``model(_:channel:id:)``); empty for one endpoint.
    public let failoverEndpoints: [String]
    let security: Security?
    private let io: ClientIO
    /// The live typed models of this client, by address, and their failover connections.
    let models = ClientModels()
    let connections = ClientConnections()

    /// CurveZMQ credentials for a node with security configured (docs/PROTOCOL.md section 14).
    public struct Security: Sendable {
        /// The node's public key (its `.pub` file, or the 40 Z85 characters).
        public var serverKey: String
        /// This client's secret key file (`statesync keygen --out PATH`); its public key must be
        /// in the node's `security.client_keys`.
        public var secretKeyFile: String

        /// Credentials: the node's public key and this client's secret key file.
        public init(serverKey: String, secretKeyFile: String) {
            self.serverKey = serverKey
            self.secretKeyFile = secretKeyFile
        }
    }

    /// Connects (in the background: ZeroMQ connects lazily and reconnects by itself) to the node
    /// API at `endpoint`. Requests fail after `requestTimeout` if the node does not answer — also
    /// when it does not admit this client's key (a refused CURVE handshake is silent).
    ///
    /// - Throws: ``StateSyncError`` for a bad endpoint, or `security` whose keys cannot be read.
    public convenience init(
        endpoint: String = "tcp://127.0.0.1:7101", requestTimeout: Duration = .seconds(5), security: Security? = nil
    ) throws {
        if let problem = NodeConfiguration.endpointProblem(endpoint) {
            throw StateSyncError(.invalidConfiguration, "endpoint: \(problem)")
        }
        try self.init(endpoint: endpoint, failover: [], requestTimeout: requestTimeout, security: security)
    }

    /// A client of the first of `endpoints`, whose typed models (``model(_:channel:id:)``) fail
    /// over to the next one when their daemon dies (no answer within `requestTimeout`), and so
    /// on round the list. Requests made on the client itself go to the first endpoint.
    ///
    /// - Throws: ``StateSyncError`` for an empty list, a bad endpoint, or unreadable keys.
    public convenience init(
        endpoints: [String], requestTimeout: Duration = .seconds(5), security: Security? = nil
    ) throws {
        guard let first = endpoints.first else {
            throw StateSyncError(.invalidConfiguration, "give at least one daemon endpoint")
        }
        for endpoint in endpoints {
            if let problem = NodeConfiguration.endpointProblem(endpoint) {
                throw StateSyncError(.invalidConfiguration, "endpoint \(endpoint): \(problem)")
            }
        }
        try self.init(
            endpoint: first, failover: Array(endpoints.dropFirst()), requestTimeout: requestTimeout,
            security: security)
    }

    /// A client whose watches lag once their consumer leaves `watchBacklog` events untaken (tests:
    /// a small bound is reached in a few writes).
    package convenience init(endpoint: String, requestTimeout: Duration = .seconds(5), watchBacklog: Int) throws {
        try self.init(
            endpoint: endpoint, failover: [], requestTimeout: requestTimeout, security: nil, watchBacklog: watchBacklog)
    }

    private init(
        endpoint: String, failover: [String], requestTimeout: Duration, security: Security?,
        watchBacklog: Int = ClientIO.defaultBacklogLimit
    ) throws {
        self.endpoint = endpoint
        self.requestTimeout = requestTimeout
        self.failoverEndpoints = failover
        self.security = security
        var credentials: (serverKey: [UInt8], pair: Curve.KeyPair)?
        if let security {
            do {
                credentials = (
                    try CurveKeyFile.publicKey(security.serverKey),
                    try CurveKeyFile.readSecretKey(at: security.secretKeyFile)
                )
            } catch {
                throw StateSyncError(.invalidConfiguration, "\(error)")
            }
        }
        self.io = try ClientIO(
            endpoint: endpoint, timeout: requestTimeout, credentials: credentials, backlogLimit: watchBacklog)
        connections.setOwner(self)
    }

    /// A client whose CurveZMQ key pair is held in memory, never in a file (the daemon's own
    /// live view reads through one).
    package init(
        endpoint: String, requestTimeout: Duration = .seconds(5), serverKey: [UInt8], keyPair: Curve.KeyPair
    ) throws {
        if let problem = NodeConfiguration.endpointProblem(endpoint) {
            throw StateSyncError(.invalidConfiguration, "endpoint: \(problem)")
        }
        self.endpoint = endpoint
        self.requestTimeout = requestTimeout
        self.failoverEndpoints = []
        self.security = nil
        self.io = try ClientIO(endpoint: endpoint, timeout: requestTimeout, credentials: (serverKey, keyPair))
        connections.setOwner(self)
    }

    deinit {
        models.closeAll()
        connections.closeAll()
        io.close()
    }

    /// Stops the client's thread and closes its socket; pending requests and watches fail. Returns
    /// once the thread has stopped: from then on no watch event arrives and no replica changes, so
    /// a replica can be handed to another client to resume from exactly where it stands.
    public func close() {
        models.closeAll()
        connections.closeAll()
        io.close()
    }

    /// The result of a ``set(_:_:)``.
    public struct SetResult: Sendable, Equatable {
        /// What the write did on the node.
        public enum Outcome: UInt8, Sendable {
            /// Every value was already current; no delta was made.
            case unchanged = 0
            /// The write applied and was published.
            case changed = 1
            /// The node already holds newer versions of every property named (a peer's clock is
            /// ahead of this node's): the write changed nothing.
            case superseded = 2
        }
        /// The version of the write; when it did not apply, the newest version of the properties
        /// named.
        public var version: Version
        /// What the SET did.
        public var outcome: Outcome
        /// Whether any property changed.
        public var changed: Bool { outcome == .changed }
    }

    /// Writes properties of one model as one delta. Returns once the node has applied it (with
    /// `storage.fsync: always`, once it is durable). A write may carry a time to live
    /// (``PropertyWrite/init(name:value:timeToLive:)``) or delete its property
    /// (``PropertyWrite/deletion(of:)``). The whole model is deleted by ``delete(_:properties:)``
    /// naming no property: a set of ``PropertyWrite/modelDeletion`` is refused (ERROR 3).
    @discardableResult
    public func set(_ address: ModelAddress, _ properties: [PropertyWrite]) async throws -> SetResult {
        try setResult(try await io.request(.set, ClientProtocol.encodeSet(address, properties)))
    }

    /// Writes properties of one model as one delta that expires `timeToLive` after its version:
    /// then every replica deletes them (docs/PROTOCOL.md 8.3). Writing them again renews it.
    @discardableResult
    public func set(_ address: ModelAddress, _ properties: [String: Value], timeToLive: Duration) async throws
        -> SetResult
    {
        let (seconds, attoseconds) = timeToLive.components
        let milliseconds = UInt64(clamping: max(1, seconds * 1000 + attoseconds / 1_000_000_000_000_000))
        return try await set(
            address,
            properties.keys.sorted().map { PropertyWrite(name: $0, value: properties[$0]!, timeToLive: milliseconds) })
    }

    /// Deletes properties of one model — or, with none named, the whole model (every property
    /// written before the deletion, on every replica) — as one versioned write that replicates
    /// and merges by last-writer-wins like a set. A deletion is always written, also of what
    /// this node holds no value for (an older write of it may still be on its way).
    @discardableResult
    public func delete(_ address: ModelAddress, properties: [String] = []) async throws -> SetResult {
        try setResult(try await io.request(.delete, ClientProtocol.encodeDelete(address, properties: properties)))
    }

    /// Sends `writes` of one model as one request: a DELETE when they are deletions (of the
    /// model, or of properties), a SET otherwise.
    @discardableResult
    package func write(_ address: ModelAddress, _ writes: [PropertyWrite]) async throws -> SetResult {
        if writes.contains(where: \.isModelDeletion) { return try await delete(address) }
        if !writes.isEmpty, writes.allSatisfy(\.isDeletion) {
            return try await delete(address, properties: writes.map(\.name))
        }
        return try await set(address, writes)
    }

    private func setResult(_ body: [UInt8]) throws -> SetResult {
        do {
            var reader = WireReader(body)
            let version = Version(timestamp: try reader.uint64("version"), node: try reader.string("version node"))
            let raw = reader.isAtEnd ? 1 : try reader.byte("outcome")
            guard let outcome = SetResult.Outcome(rawValue: raw) else {
                throw WireError.invalid(field: "outcome", reason: "unknown value \(raw)")
            }
            return SetResult(version: version, outcome: outcome)
        } catch {
            throw StateSyncError(.protocolError, "malformed SET reply from \(endpoint): \(error)")
        }
    }

    /// Writes properties of one model as one delta (properties in name order).
    @discardableResult
    public func set(_ address: ModelAddress, _ properties: [String: Value]) async throws -> SetResult {
        try await set(address, properties.keys.sorted().map { PropertyWrite(name: $0, value: properties[$0]!) })
    }

    /// One page of a LIST (docs/PROTOCOL.md 10.13): the models of `channel` (the channels, when
    /// `channel` is nil) whose names start with `prefix` and sort after `after`, at most `limit`
    /// (the node caps it at 1000), in name order; `more` says whether another page follows (ask
    /// again with `after` = the last name).
    public func list(
        channel: String?, prefix: String = "", after: String = "",
        limit: Int = ClientProtocol.ListRequest.maximumLimit
    ) async throws -> (entries: [ClientProtocol.ListEntry], more: Bool) {
        if let channel { try Names.validateChannel(channel) }
        let request = ClientProtocol.ListRequest(channel: channel ?? "", prefix: prefix, after: after, limit: limit)
        let body = try await io.request(.list, ClientProtocol.encodeList(request))
        do {
            return try ClientProtocol.decodeListReply(body)
        } catch {
            throw StateSyncError(.protocolError, "malformed LIST reply from \(endpoint): \(error)")
        }
    }

    /// Every entry of a LIST, page by page.
    public func listAll(channel: String?, prefix: String = "") async throws -> [ClientProtocol.ListEntry] {
        var all: [ClientProtocol.ListEntry] = []
        var after = ""
        while true {
            let page = try await list(channel: channel, prefix: prefix, after: after)
            all += page.entries
            guard page.more, let last = page.entries.last else { return all }
            // A node must page forwards; one that does not would be asked forever.
            guard after.utf8.lexicographicallyPrecedes(last.name.utf8) else {
                throw StateSyncError(.protocolError, "LIST from \(endpoint) did not move past '\(after)'")
            }
            after = last.name
        }
    }

    /// The properties of one model as the node holds them (empty for an unknown model).
    public func get(_ address: ModelAddress) async throws -> [String: ReplicaStore.Register] {
        let body = try await io.request(.get, ClientProtocol.encodeAddress(address))
        do {
            return try ClientProtocol.decodeProperties(body)
        } catch {
            throw StateSyncError(.protocolError, "malformed GET reply from \(endpoint): \(error)")
        }
    }

    /// Removes the member `nodeID` from the cluster for good (`statesync forget`): the node
    /// writes its member entry as forgotten, the entry spreads, and every node drops its links to
    /// it and stops awaiting its deltas. For a node that is gone for good: a running node that
    /// hears it was forgotten says it is alive again.
    ///
    /// - Throws: ``StateSyncError`` with code ``StateSyncError/Code/remote`` when the node
    ///   refuses (an unknown id, its own id, or with security a key that may not write every
    ///   channel).
    public func forget(_ nodeID: String) async throws {
        var body = WireWriter()
        body.string(nodeID)
        _ = try await io.request(.forget, body.bytes)
    }

    /// The node's status.
    public func status() async throws -> NodeStatus {
        let body = try await io.request(.status, [])
        guard let value = try? ClientProtocol.decodeValue(body), let status = NodeStatus(value) else {
            throw StateSyncError(.protocolError, "malformed STATUS reply from \(endpoint)")
        }
        return status
    }

    /// Watches `channel`: its current state (``WatchEvent/Kind/initial`` changes, then
    /// ``WatchEvent/initialStateComplete(records:cursor:)``), then every change applied to its
    /// models, with exact old and new values, and periodic ``WatchEvent/caughtUp(cursor:latest:nodeMissing:)``
    /// markers. Returns once the node has registered the watch.
    ///
    /// Pass the `replica` of an earlier watch (of this or any other node) to resume it: the node
    /// sends every delta after the replica's cursor exactly once (or, when its history no longer
    /// reaches back that far, a snapshot flagged as a resync), and old → new is computed against
    /// the replica, so observers keep exact chains across the gap.
    ///
    /// The sequence ends with an error when the connection to the node is lost (no answer to
    /// liveness pings within ``requestTimeout``) or the node restarted: a watch never silently
    /// misses changes; resume it with its replica. Stop iterating to end the watch.
    /// `onLag` says what the node does when this client falls behind its history: `.resync` (the
    /// default: a snapshot, changes flagged ``WatchEvent/Kind/resync``) or `.end` (the stream
    /// ends with an error; watch again with the replica to continue).
    ///
    /// `filter` asks the node for the models whose ids start with a prefix, only some properties,
    /// and whether to start with the current state (docs/PROTOCOL.md 10.5.1); a node that does not
    /// know filters sends everything, and the changes that do not pass are dropped here.
    ///
    /// A consumer that falls behind does not grow this process without end: once it leaves
    /// 16,384 events untaken (a snapshot being received is not cut), the client ends the watch at
    /// the node and applies nothing more of it, and once the consumer has taken half of them it
    /// watches again from the replica's cursor. The node then sends exactly what followed, or the
    /// state again (``WatchEvent/Kind/resync``) when its history no longer reaches back (with
    /// `onLag: .end`, the client ends the stream with an error instead, its replica at what the
    /// consumer was given). The consumer sees one unbroken sequence; nothing else on this client
    /// waits meanwhile.
    public func watch(
        channel: String, replica: ChannelReplica? = nil, onLag: ClientProtocol.LagPolicy = .resync,
        filter: ClientProtocol.WatchFilter? = nil
    ) async throws -> (
        events: AsyncThrowingStream<WatchEvent, any Error>, replica: ChannelReplica
    ) {
        let replica = try watchedReplica(channel: channel, replica: replica)
        // The client's I/O thread drops what does not pass the filter (a node older than filters
        // sends everything).
        return (try await io.watch(replica: replica, onLag: onLag, filter: filter), replica)
    }

    /// ``watch(channel:replica:onLag:filter:)`` for consumers that keep up with many changes a
    /// second: the same events in the same order, each element holding the events that arrived
    /// together (never empty). A consumer is resumed once per batch instead of once per event,
    /// which at tens of thousands of changes a second is most of its cost (`statesync watch`
    /// reads its events this way).
    public func watchInBatches(
        channel: String, replica: ChannelReplica? = nil, onLag: ClientProtocol.LagPolicy = .resync,
        filter: ClientProtocol.WatchFilter? = nil
    ) async throws -> (
        events: AsyncThrowingStream<[WatchEvent], any Error>, replica: ChannelReplica
    ) {
        let replica = try watchedReplica(channel: channel, replica: replica)
        return (try await io.watchInBatches(replica: replica, onLag: onLag, filter: filter), replica)
    }

    /// The replica a watch of `channel` applies events to: `replica`, checked, or a new one.
    private func watchedReplica(channel: String, replica: ChannelReplica?) throws -> ChannelReplica {
        try Names.validateChannel(channel)
        let replica = replica ?? ChannelReplica(channel: channel)
        guard replica.channel == channel else {
            throw StateSyncError(.invalidName, "the replica is of channel '\(replica.channel)', not '\(channel)'")
        }
        return replica
    }

    /// The changes of `channel` only (no markers), from now on: a convenience over
    /// ``watch(channel:replica:onLag:filter:)``, which lags the same way when its consumer falls
    /// behind.
    public func changes(channel: String) async throws -> AsyncThrowingStream<PropertyChange, any Error> {
        try await io.changes(replica: watchedReplica(channel: channel, replica: nil))
    }
}
