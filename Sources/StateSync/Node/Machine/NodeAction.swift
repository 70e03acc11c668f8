/// What a ``NodeMachine`` asks its driver to do, in order. The driver performs them in the order
/// given; where an action has an outcome the machine needs, the driver reports it as an input
/// (``NodeInput/logDurable(through:)``, ``NodeInput/watchEventsSent(_:accepted:clientGone:)``, ...).
package enum NodeAction: Sendable {
    /// Send a message on the PUB socket.
    case publish([[UInt8]])
    /// Append encoded log records (Appendix B). `mustSucceed`: the node's own writes, which it
    /// must not acknowledge or publish unless logged — a failure stops the node. A failure to log
    /// a peer's deltas is logged and survived (a peer can send them again).
    case appendLog(bytes: [UInt8], mustSucceed: Bool)
    /// Make the log durable (fdatasync) through `position`, then report
    /// ``NodeInput/logDurable(through:)``. A failure stops the node (after a failed fsync the
    /// kernel may have dropped the data; acknowledging would lie). `atOnce`: the node is
    /// stopping, and its last round must end with every write durable and published, so a host
    /// that could sync in the background (the simulator's slow disk) syncs before going on.
    case syncLog(through: UInt64, atOnce: Bool)
    /// Record durably, with the OS's boot id, that this node may publish its deltas through
    /// sequence number `through` before they are durable (`storage.fsync: interval`, or
    /// `storage.publish: written`), then report
    /// ``NodeInput/sequencesReserved(through:)``. With it, every own number settling declared
    /// void (section 11.2), which a restart must still know. A failure stops the node, as a
    /// failed sync does.
    case reserveSequences(through: UInt64, void: [ClosedRange<UInt64>])
    /// Write `snapshot` durably as the state snapshot (after syncing the log), then replace the
    /// log with one holding only `keeping` (log records: the deltas received above a gap,
    /// ``NodeMachine/recordsAboveGaps``); then report ``NodeInput/compactionWritten``, or
    /// ``NodeInput/compactionFailed(_:)`` (the log still holds everything). A host may write it
    /// in the background while it goes on (``BackgroundCompactingStorage``), but not one
    /// `atOnce`: a reset's (section 7.5), written before any other input is taken, after the
    /// compactions under way, whose outcomes are reported first.
    case compact(StateSnapshot, keeping: [UInt8], atOnce: Bool = false)
    /// Write the member list (a members file, ``Membership/encodeFile(_:)``) durably, before
    /// the actions that follow. A failure is logged: the list is relearned from peers.
    case saveMembers([UInt8])
    /// The node settled after its log was found damaged: the storage's record of the damage
    /// (``NodeStorage/logDamageSettled()``), which makes a restart settle again until then, is
    /// set aside.
    case logDamageSettled
    /// Apply writes to the live models at their addresses (the node's host does; observers run
    /// on its observer executor).
    case deliver([ModelDelivery])
    /// Connect (or reconnect) the repair link to `peer` at `endpoint` (its advertised API or
    /// repair endpoint).
    case connectRepairLink(peer: String, endpoint: String)
    /// Send a repair request (FETCH, SNAPSHOT) on the link to `peer`; report
    /// ``NodeInput/repairRequestUnsent(peer:requestID:)`` if it cannot be queued.
    case sendRepairRequest(peer: String, requestID: UInt64, frames: [[UInt8]])
    /// Send a reply to a client (routing id first, then the frames); report
    /// ``NodeInput/replyDropped`` if its queue is full.
    case reply(client: [UInt8], frames: [[UInt8]])
    /// Send a watch's events in order, as many as the client's queue takes, then report how many
    /// with ``NodeInput/watchEventsSent(_:accepted:clientGone:)``. Each element is the frames of
    /// one EVENT (or the final ERROR), without the routing id.
    case sendWatchEvents(WatchKey, [[[UInt8]]])
    /// Stop (or resume) reading peers' deltas: backpressure while observers are far behind.
    case pauseIntake(Bool)
    /// Close the SUB socket of the peer at `endpoint` and connect a new one: libzmq drops a
    /// connection for good after some input (a frame over the maximum message size is a
    /// protocol error it does not reconnect after), so a peer silent for long gets a new link.
    case resetPeerLink(endpoint: String)
    /// Subscribe to a member learned from the member list (section 7.5): a new SUB socket to its
    /// publish endpoint, expecting node `node` there (with security, dialled with its key).
    case connectPeer(endpoint: String, node: String)
    /// Close the SUB socket and the repair link of the peer at `endpoint`: it left the cluster
    /// or was forgotten (section 7.5).
    case disconnectPeer(endpoint: String)
    /// Stop the node: it must not run under this id with its data directory (it started empty,
    /// and the cluster knows the id's earlier deltas, or the id was forgotten — section 7.5).
    case refuseToRun(reason: String)
}

/// Writes for the live model at one address, in apply order.
package struct ModelDelivery: Sendable {
    package let address: ModelAddress
    package var sets: [ModelRegistrar.RemoteWriteSet]
}
