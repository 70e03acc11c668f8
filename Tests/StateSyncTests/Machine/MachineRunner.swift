import Logging
import Synchronization
import Testing

@testable import StateSync

/// Drives one ``NodeMachine`` by hand, with no thread, socket or file: a test feeds inputs at a
/// time it chooses and reads what came out. Actions are performed the simplest way (the log is
/// durable at once unless `holdsSyncs`, a client takes `clientCapacity` events per batch) and
/// their outcomes fed back, as a driver would.
struct MachineRunner {
    var machine: NodeMachine
    /// Monotonic milliseconds.
    var now: UInt64 = 10_000
    var wall: Wall
    /// Messages published on the PUB socket, in order.
    var published: [[[UInt8]]] = []
    /// Replies and watch events sent to clients, in order (routing id, frames).
    var sent: [(client: [UInt8], frames: [[UInt8]])] = []
    /// Repair requests sent, per peer.
    var repairRequests: [(peer: String, frames: [[UInt8]])] = []
    var logBytes: [UInt8] = []
    /// The records the log would hold had each of `deltas` been encoded afresh
    /// (`DeltaLog.Batch.add`), in order: what a node's own writes must be logged as, octet for
    /// octet, however they were encoded on the way.
    static func freshRecords(of deltas: [Delta]) -> [UInt8] {
        var records = DeltaLog.Batch()
        for delta in deltas { records.add(delta) }
        return records.bytes
    }
    var compactions = 0
    /// The last compaction asked for (its snapshot and kept records).
    var lastCompaction: NodeAction?
    /// When set, every compaction is reported failed (a full disk), else written.
    var failsCompactions = false
    var failedCompactions = 0
    /// The member list the machine last asked to save.
    var savedMembers: [UInt8]?
    var damageSettled = false
    /// How many watch events a client takes per batch (its queue space).
    var clientCapacity = Int.max
    var intakePaused = false
    /// Repair links the machine asked to connect (again), by peer, in order.
    var repairLinksConnected: [String] = []
    /// Peer links the machine asked to replace, in order.
    var linkResets: [String] = []
    /// Members the machine subscribed to (publish endpoint, node id), in order.
    var subscribed: [(endpoint: String, node: String)] = []
    /// Peer endpoints the machine dropped its links to, in order.
    var unsubscribed: [String] = []
    /// Why the machine refused to run, each time it said so.
    var refusals: [String] = []
    /// The sequence reservations asked for (each reported made at once, unless not
    /// `reportsReservations`: then never).
    var reservations: [UInt64] = []
    /// The void numbers each of them carried.
    var reservationVoids: [[ClosedRange<UInt64>]] = []
    var reportsReservations = true
    /// When set, the log's syncs are held in `heldSyncs` (a disk that has not answered yet)
    /// until ``releaseSyncs()``.
    var holdsSyncs = false
    var heldSyncs: [UInt64] = []
    /// When set, the client's report of what it took of each batch of watch events is held in
    /// `heldWatchReports` (the events are on their way) until ``releaseWatchReports()``.
    var holdsWatchReports = false
    var heldWatchReports: [NodeInput] = []
    /// Unless cleared, every peer a message comes from is taken to know this node already (its
    /// member list named it, PROTOCOL.md 7.5 "Known before taken"): tests of other rules send
    /// deltas without that exchange first. The tests of that rule clear it.
    var peersKnowThisNode = true

    /// A wall clock tests can move (the node's clock reads it).
    final class Wall: Sendable {
        private let value: Shared<UInt64>
        init(_ milliseconds: UInt64) { value = Shared(milliseconds) }
        var milliseconds: UInt64 {
            get { value.value }
            set { value.withLock { $0 = newValue } }
        }
    }

    init(
        _ configuration: NodeConfiguration, wall: UInt64 = 1_800_000_000_000, recovery: NodeMachine.Recovery = .init(),
        faults: NodeFaults = NodeFaults(),
        logger: Logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
    ) {
        let wall = Wall(wall)
        self.wall = wall
        let clock = HybridLogicalClock(node: configuration.nodeID, wallClock: { wall.milliseconds })
        machine = NodeMachine(
            configuration: configuration, clock: clock, incarnation: Self.nextIncarnation(), recovery: recovery,
            faults: faults, logger: logger)
    }

    /// Every start its own incarnation, as a real node draws one (member entries name the start
    /// they are about by it, PROTOCOL.md 7.5): distinct within a test run, and never 0.
    private static let incarnations = Atomic<UInt64>(0xABCD)
    private static func nextIncarnation() -> UInt64 {
        incarnations.add(1, ordering: .relaxed).newValue
    }

    /// A configuration for a node `id` with peers `peers` (their publish endpoints are their ids).
    static func configuration(_ id: String, peers: [String] = [], api: Bool = true) -> NodeConfiguration {
        var configuration = NodeConfiguration(
            nodeID: id, dataDirectory: "/nonexistent", publishEndpoint: "inproc://\(id)",
            peers: peers.map { "inproc://\($0)" }, apiEndpoint: api ? "inproc://\(id).api" : nil,
            heartbeatIntervalMilliseconds: 100)
        configuration.historyDeltas = 1000
        return configuration
    }

    /// Feeds `input` and everything its actions report back.
    mutating func handle(_ input: NodeInput) {
        if peersKnowThisNode {
            switch input {
            case .peerMessage(let peer, _), .repairReply(let peer, _):
                machine.peers[peer, default: PeerProgress()].listsThisNode = true
            default: break
            }
        }
        // Also after: a first HEARTBEAT (a new incarnation) clears it.
        defer {
            if peersKnowThisNode { for peer in machine.peers.keys { machine.peers[peer]?.listsThisNode = true } }
        }
        var inputs = [input]
        var next = 0
        while next < inputs.count {
            let actions = machine.handle(inputs[next], now: now)
            next += 1
            for action in actions {
                switch action {
                case .publish(let frames): published.append(frames)
                case .appendLog(let bytes, _): logBytes += bytes
                case .syncLog(let position, _):
                    if holdsSyncs { heldSyncs.append(position) } else { inputs.append(.logDurable(through: position)) }
                case .reserveSequences(let through, let void):
                    reservations.append(through)
                    reservationVoids.append(void)
                    if reportsReservations { inputs.append(.sequencesReserved(through: through)) }
                case .compact:
                    compactions += 1
                    lastCompaction = action
                    if failsCompactions { failedCompactions += 1 }
                    inputs.append(failsCompactions ? .compactionFailed("the disk is full") : .compactionWritten)
                case .saveMembers(let bytes): savedMembers = bytes
                case .logDamageSettled: damageSettled = true
                case .deliver: break
                case .connectRepairLink(let peer, _): repairLinksConnected.append(peer)
                case .sendRepairRequest(let peer, _, let frames): repairRequests.append((peer, frames))
                case .reply(let client, let frames): sent.append((client, frames))
                case .sendWatchEvents(let key, let events):
                    let accepted = min(events.count, clientCapacity)
                    for frames in events.prefix(accepted) { sent.append((key.client, frames)) }
                    let report = NodeInput.watchEventsSent(key, accepted: accepted, clientGone: false)
                    if holdsWatchReports { heldWatchReports.append(report) } else { inputs.append(report) }
                case .pauseIntake(let paused): intakePaused = paused
                case .resetPeerLink(let endpoint): linkResets.append(endpoint)
                case .connectPeer(let endpoint, let node): subscribed.append((endpoint, node))
                case .disconnectPeer(let endpoint): unsubscribed.append(endpoint)
                case .refuseToRun(let reason): refusals.append(reason)
                }
            }
        }
    }

    /// Reports every held sync done, in order, and stops holding them.
    mutating func releaseSyncs() {
        holdsSyncs = false
        let positions = heldSyncs
        heldSyncs = []
        for position in positions { handle(.logDurable(through: position)) }
    }

    /// Reports every held batch of watch events taken, in order, and stops holding them.
    mutating func releaseWatchReports() {
        holdsWatchReports = false
        let reports = heldWatchReports
        heldWatchReports = []
        for report in reports { handle(report) }
    }

    /// Moves time on by `milliseconds` and ticks.
    mutating func advance(_ milliseconds: UInt64) {
        now += milliseconds
        wall.milliseconds += milliseconds
        handle(.tick(observerBacklog: 0))
    }

    /// Sends FORGET of member `id` (PROTOCOL.md 10.12) and returns the reply to it.
    mutating func forget(_ id: String, requestID: UInt64 = 9, identity: String? = nil) -> (
        ClientProtocol.ReplyHeader, [UInt8]
    )? {
        var body = WireWriter()
        body.string(id)
        return request(.forget, id: requestID, body.bytes, identity: identity)
    }

    /// Sends a client request and returns the reply to it (header, body), if one was sent.
    mutating func request(
        _ command: ClientProtocol.Command, id: UInt64, _ body: [UInt8], client: [UInt8] = [0x53, 1],
        identity: String? = nil
    ) -> (ClientProtocol.ReplyHeader, [UInt8])? {
        let before = sent.count
        handle(
            .clientRequest(
                client: client, frames: ClientProtocol.encodeRequest(command, id: id, body: body), identity: identity))
        handle(.tick(observerBacklog: 0))
        for (to, frames) in sent[before...] where to == client {
            guard let header = try? ClientProtocol.decodeReplyHeader(frames[0]), header.requestID == id,
                header.kind != .event
            else { continue }
            return (header, frames[1])
        }
        return nil
    }

    /// The watch events sent to `client` for watch `id`, decoded, from position `from` of `sent`.
    func events(of client: [UInt8] = [0x53, 1], watch id: UInt64, from: Int = 0) -> [ClientProtocol.WatchEventBody] {
        var events: [ClientProtocol.WatchEventBody] = []
        for (to, frames) in sent[from...] {
            guard to == client, let header = try? ClientProtocol.decodeReplyHeader(frames[0]), header.kind == .event,
                header.requestID == id
            else { continue }
            // A batched watch's message carries several bodies (PROTOCOL.md 10.5.7).
            for body in frames.dropFirst() {
                if let event = try? ClientProtocol.decodeWatchEvent(body) { events.append(event) }
            }
        }
        return events
    }
}

extension NodeInput {
    /// ``localRound(_:)`` of `writes`, each with its own array of properties.
    static func localWrites(_ writes: [LocalWrite]) -> NodeInput { .localRound(LocalWriteRound(writes)) }
}
