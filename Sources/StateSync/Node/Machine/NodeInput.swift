/// Everything that can happen to a node, as its ``NodeMachine`` sees it. A driver (the ZeroMQ
/// I/O thread, the simulator) turns what it observes into these; the machine answers with
/// ``NodeAction``s. Time is not an input of its own: every input comes with the driver's `now`.
package enum NodeInput: Sendable {
    /// The node's sockets are bound: the endpoints to report and to advertise to peers (a `*`
    /// port resolved).
    case endpointsBound(publish: String, repair: String)
    /// A message (or DELTA batch) from the SUB socket connected to the peer whose configured
    /// publish endpoint is `peer`.
    case peerMessage(peer: String, frames: [[UInt8]])
    /// A request on the client API (or the repair endpoint): the client's routing id, then the
    /// header and body frames; with security, who its key is (`node:ID` or `client:N`, the user
    /// id its ZAP admission gave it): what it may do depends on it.
    case clientRequest(client: [UInt8], frames: [[UInt8]], identity: String? = nil)
    /// A reply on the repair link to `peer` (an answer to a FETCH or SNAPSHOT this node sent).
    case repairReply(peer: String, frames: [[UInt8]])
    /// The repair request `requestID` to `peer` could not be queued (the link is not connected
    /// yet, or full): it is not in flight.
    case repairRequestUnsent(peer: String, requestID: UInt64)
    /// Writes made by live models, in the order they were made.
    case localWrites([LocalWrite])
    /// The log is durable through `position` (bytes appended since the node started).
    case logDurable(through: UInt64)
    /// The reservation of sequence numbers through `through` is durable
    /// (``NodeAction/reserveSequences(through:void:)``).
    case sequencesReserved(through: UInt64)
    /// A compaction could not be written; the log still holds everything. It is retried.
    case compactionFailed(String)
    /// The driver sent the first `accepted` messages of the batch a ``NodeAction/sendWatchEvents``
    /// asked for; `clientGone` when the client is unreachable.
    case watchEventsSent(WatchKey, accepted: Int, clientGone: Bool)
    /// A reply could not be queued to its client (the client's queue is full).
    case replyDropped
    /// The free space of the data directory's file system (the host measures it now and then).
    case diskSpace(availableBytes: UInt64)
    /// With security: the clients admitted and what each may do, by identity (at start, and at a
    /// reload of the keys).
    case clientAccessChanged([String: SecurityConfiguration.ClientAccess], peers: Set<String> = [])
    /// With security, a connection that presented a key this node does not admit was refused
    /// (`fingerprint`: the key's first 8 Z85 characters; `address`: where it came from).
    case authenticationRefused(fingerprint: String, address: String)
    /// The driver finished a round of inputs, or a deadline (``NodeMachine/nextDeadline(after:)``)
    /// passed: timers run, writes become durable, watches are sent what they are owed.
    /// `observerBacklog` is how many changes wait for their observers.
    case tick(observerBacklog: Int)
    /// The node is stopping: make every local write durable and published.
    case stop
}

/// A write made by a live model (or the node on a client's behalf): not yet numbered.
package struct LocalWrite: Sendable {
    package let address: ModelAddress
    package let version: Version
    package let writes: [PropertyWrite]
    /// The ``ModelRegistrar/instanceID`` of the model that made it (0: none); that model holds
    /// the write already and is not sent it back.
    package let emitter: UInt64

    package init(address: ModelAddress, version: Version, writes: [PropertyWrite], emitter: UInt64 = 0) {
        self.address = address
        self.version = version
        self.writes = writes
        self.emitter = emitter
    }
}

/// One watch: the client that holds it and the request id it was opened with.
package struct WatchKey: Hashable, Sendable {
    package let client: [UInt8]
    package let requestID: UInt64

    package init(client: [UInt8], requestID: UInt64) {
        self.client = client
        self.requestID = requestID
    }
}
