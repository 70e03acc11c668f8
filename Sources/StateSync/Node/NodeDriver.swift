/// What a node's driver does with a ``NodeMachine``'s network actions: it owns the sockets (or
/// the simulated links) and is called only from the thread that drives the node.
package protocol NodeTransport {
    /// Sends a message on the node's PUB socket (to every peer that subscribes).
    func publish(_ frames: [[UInt8]])
    /// Connects (or reconnects) the repair link to `peer` at `endpoint`.
    func connectRepairLink(peer: String, endpoint: String)
    /// Queues a repair request on the link to `peer`; `false` when it cannot be queued now.
    func sendRepairRequest(peer: String, frames: [[UInt8]]) -> Bool
    /// Sends a reply to the client with routing id `client`.
    func reply(client: [UInt8], frames: [[UInt8]]) -> ReplyOutcome
    /// Sends watch event messages in order until the client's queue is full; returns how many
    /// messages were sent, and whether the client is gone.
    func sendWatchEvents(client: [UInt8], events: [[[UInt8]]]) -> (accepted: Int, clientGone: Bool)
    /// Stops (or resumes) reading peers' deltas.
    func pauseIntake(_ paused: Bool)
    /// Replaces the SUB socket connected to the peer at `endpoint` with a new one.
    func resetPeerLink(_ endpoint: String)
    /// Subscribes to a member learned at run time: node `node` publishing at `endpoint`.
    func connectPeer(endpoint: String, node: String)
    /// Closes the links to the peer publishing at `endpoint` (it left, or was forgotten).
    func disconnectPeer(endpoint: String)
    /// The node refuses to run (``NodeAction/refuseToRun(reason:)``): stop it.
    func refuseToRun(_ reason: String)
    /// Takes over the sync of the log through `position`, to sync it later and then feed the
    /// node ``NodeInput/logDurable(through:)``; `false` (the default) leaves it to the host,
    /// which syncs at once. The simulator's slow disk takes it over, so that writes made while
    /// a sync runs wait for the next one, as on a real disk.
    func syncLater(through position: UInt64) -> Bool
    /// Takes over a compaction, to write it later and then feed the node
    /// ``NodeInput/compactionWritten``: the records appended meanwhile go after `records` in the
    /// new log. `false` (the default) leaves it to the host. The simulator's slow disk takes it
    /// over, as the daemon's data directory writes it in the background
    /// (``BackgroundCompactingStorage``).
    func compactLater(_ snapshot: StateSnapshot, keeping records: [UInt8]) -> Bool
    /// Writes at once the compactions taken over by ``compactLater(_:keeping:)`` and not yet
    /// written; returns how many (each to be reported written, in order, before the next
    /// compaction's outcome).
    func finishCompactionsNow() -> Int
}

extension NodeTransport {
    package func syncLater(through position: UInt64) -> Bool { false }
    package func compactLater(_ snapshot: StateSnapshot, keeping records: [UInt8]) -> Bool { false }
    package func finishCompactionsNow() -> Int { 0 }
}

/// What became of a reply.
package enum ReplyOutcome: Sendable, Equatable {
    case sent
    /// The client's queue is full: the reply is dropped (the client times out and retries).
    case full
    /// The client is unreachable.
    case gone
}

/// The part of a driver its node calls from other threads.
package protocol NodeDriver: Sendable {
    /// Local writes are waiting in the node's outbox: feed them soon.
    func wake()
    /// Feeds the node ``NodeInput/stop``, closes the driver's sockets within a bounded linger and
    /// returns once it has stopped driving the node.
    func stop() async
    /// Whether the calling thread may wait for the driver to take the node's queued local
    /// writes: only a driver that takes them on a thread of its own, and not on that thread.
    func mayWaitForOutbox() -> Bool
}

extension NodeDriver {
    /// No: the caller may be the thread that drives the node (the simulator's).
    package func mayWaitForOutbox() -> Bool { false }
}
