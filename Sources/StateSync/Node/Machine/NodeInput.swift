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
    case localRound(LocalWriteRound)
    /// The log is durable through `position` (bytes appended since the node started).
    case logDurable(through: UInt64)
    /// The reservation of sequence numbers through `through` is durable
    /// (``NodeAction/reserveSequences(through:void:)``).
    case sequencesReserved(through: UInt64)
    /// The oldest compaction not yet reported (``NodeAction/compact(_:keeping:)``) is written.
    case compactionWritten
    /// The oldest compaction not yet reported could not be written; the log still holds
    /// everything. It is retried.
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
    /// A subscriber completed its handshake with this node's publish socket: a peer (re)connecting,
    /// or a node joining through this one, which this node may not subscribe to, so does not
    /// hear. With security, only an admitted key gets here.
    case subscriberConnected
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

/// Local writes as the machine takes them (``NodeInput/localRound(_:)``): each write's model,
/// version and emitter, with its properties.
///
/// A model's single set appends its one property to the round's array of properties (its write
/// is a run of it): it has no array of its own. One per set was an allocation by the writing
/// thread and a free by the I/O thread (on another thread's heap): a tenth of a single-set
/// writer's I/O thread went to freeing them (issue #17). The round's deltas share that array
/// (``PropertyWrites``), as a received batch's deltas share theirs. A write of several properties
/// (a transaction, a client's SET) keeps the array it came with: copying it into the round's
/// would cost more than the allocation it saves.
package struct LocalWriteRound: Sendable {
    /// One write of the round.
    package struct Entry: Sendable {
        package let address: ModelAddress
        package let version: Version
        /// The ``ModelRegistrar/instanceID`` of the model that made it (0: none).
        package let emitter: UInt64
        fileprivate let properties: Properties
    }

    /// Where a write's properties are.
    fileprivate enum Properties: Sendable {
        /// An array of their own.
        case own([PropertyWrite])
        /// The one property at this position of the round's ``LocalWriteRound/properties``.
        case shared(Int)
    }

    package private(set) var entries: [Entry] = []
    /// The properties of the writes of one property, in order.
    package private(set) var properties: [PropertyWrite] = []

    /// Room for `capacity` writes before the arrays grow (the array of properties takes its room
    /// at the first single set: a round of transactions never allocates it).
    package init(capacity: Int) {
        entries.reserveCapacity(capacity)
    }

    package init(_ writes: [LocalWrite]) {
        self.init(capacity: writes.count)
        for write in writes { append(write) }
    }

    package var count: Int { entries.count }
    package var isEmpty: Bool { entries.isEmpty }

    /// Appends `write`, keeping its array of properties.
    package mutating func append(_ write: LocalWrite) {
        entries.append(
            Entry(
                address: write.address, version: write.version, emitter: write.emitter,
                properties: .own(write.writes)))
    }

    /// Appends a write of one property, into the round's array.
    package mutating func append(address: ModelAddress, version: Version, property: PropertyWrite, emitter: UInt64) {
        if properties.capacity == 0 { properties.reserveCapacity(Swift.max(entries.capacity - entries.count, 1)) }
        entries.append(
            Entry(address: address, version: version, emitter: emitter, properties: .shared(properties.count)))
        properties.append(property)
    }

    /// Gives the array of properties no more room than it needs: the round's deltas keep it as
    /// long as any of them is in the repair history or the watch journal (a round is made with
    /// room for the last take's writes, and a node written now and then makes rounds of one
    /// write: 64 slots of room held by each of its deltas, a hundred thousand of them by
    /// default, would be 300 MB). A full round is left as it is.
    package mutating func fitProperties() {
        guard properties.capacity > 2 * properties.count + 8 else { return }
        var fitted: [PropertyWrite] = []
        fitted.reserveCapacity(properties.count)
        fitted.append(contentsOf: properties)
        properties = fitted
    }

    /// The properties of the `index`th write, without a copy.
    package func writes(at index: Int) -> PropertyWrites {
        switch entries[index].properties {
        case .own(let own): PropertyWrites(own)
        case .shared(let at): PropertyWrites(properties, range: at..<(at + 1))
        }
    }

    /// Each write as a ``LocalWrite`` of its own, with a copy of its properties (tests and
    /// diagnostics; the machine reads ``entries`` and ``writes(at:)``).
    package var localWrites: [LocalWrite] {
        entries.indices.map { index in
            LocalWrite(
                address: entries[index].address, version: entries[index].version, writes: writes(at: index).array,
                emitter: entries[index].emitter)
        }
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
