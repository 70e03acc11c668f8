/// Settling after a power loss (docs/PROTOCOL.md section 11.2). With `storage.fsync: interval`
/// a node publishes its writes before they are durable, within sequence numbers it reserved
/// durably. When the OS went down while it ran (a power loss, a kernel crash), its log may lack
/// deltas it had published: peers may hold them, and a new write under one of their numbers
/// would be dropped by those peers as a duplicate. So the node numbers no local write until
/// every peer it links to has answered a FETCH of its own origin over the numbers the log may
/// have lost; it takes back what they hold, and numbers on after the highest any of them held.
extension NodeMachine {
    struct Settling: Sendable {
        /// The own sequence numbers the log may have lost: after the greatest recovered, through
        /// the reservation.
        let range: ClosedRange<UInt64>
        /// Per peer (its publish endpoint), the next number to ask it for.
        var askFrom: [String: UInt64] = [:]
        /// Per peer, the FETCH in flight.
        var fetches: [String: Outstanding] = [:]
        /// Local writes and write requests that arrived meanwhile, in order: taken once settled.
        var held: [Held] = []
        /// How many of them are client requests.
        var heldRequests = 0
        /// The oldest timestamp among the held local writes (they are below the node's floor).
        var heldFloor: UInt64 = .max
        /// Own deltas taken back from peers.
        var recovered = 0
        /// When the node last said what it waits for.
        var lastReport: UInt64?

        init(range: ClosedRange<UInt64>) { self.range = range }
    }

    enum Held: Sendable {
        case localWrites([LocalWrite])
        case request(client: [UInt8], frames: [[UInt8]], identity: String?)
    }

    /// The most client write requests held while settling; beyond it a SET or DELETE is refused
    /// (ERROR 5) and may be sent again.
    static let heldRequestLimit = 65_536

    /// Holds live models' writes until the node has settled.
    mutating func hold(_ writes: [LocalWrite]) {
        guard !writes.isEmpty, let floor = settling?.heldFloor else { return }
        // In place (optional chaining): the held list is not copied.
        settling?.heldFloor = min(floor, writes.lazy.map(\.version.timestamp).min() ?? .max)
        settling?.held.append(.localWrites(writes))
    }

    /// Holds a client's SET or DELETE until the node has settled; `false` when too many wait.
    mutating func hold(request frames: [[UInt8]], from client: [UInt8], identity: String?) -> Bool {
        guard let requests = settling?.heldRequests, requests < Self.heldRequestLimit else { return false }
        settling?.heldRequests += 1
        settling?.held.append(.request(client: client, frames: frames, identity: identity))
        return true
    }

    /// At every repair round: asks each peer that has not answered for the next part of the
    /// range; once every linked peer has answered all of it, numbers the held writes.
    mutating func advanceSettling() {
        guard var settling else { return }
        for (peer, fetch) in settling.fetches where fetch.deadline <= now { settling.fetches[peer] = nil }
        var waiting: [String] = []
        for peer in peerEndpoints.sorted() {
            let from = settling.askFrom[peer] ?? settling.range.lowerBound
            guard from <= settling.range.upperBound else { continue }
            waiting.append(peer)
            guard settling.fetches[peer] == nil, repair.links[peer] != nil,
                peers[peer].map({ isConnected($0) }) ?? false
            else { continue }
            let range = from...min(settling.range.upperBound, from &+ (Self.maximumFetch - 1))
            let id = nextRepairID()
            settling.fetches[peer] = Outstanding(
                peer: peer, requestID: id, deadline: now + Self.repairTimeout, range: range)
            actions.append(
                .sendRepairRequest(
                    peer: peer, requestID: id,
                    frames: ClientProtocol.encodeRequest(
                        .fetch, id: id,
                        body: ClientProtocol.encodeFetch(origin: configuration.nodeID, range: range))))
        }
        guard !waiting.isEmpty else {
            self.settling = settling
            finishSettling()
            return
        }
        if settling.lastReport.map({ now &- $0 >= 10_000 }) ?? true {
            settling.lastReport = now
            logger.warning(
                "holding writes until these peers say which of this node's possibly lost deltas they hold (a peer that is gone for good: statesync forget it)",
                metadata: [
                    "peers": "\(waiting.joined(separator: ", "))", "delta.range": "\(settling.range)",
                    "writes.held": "\(settling.held.count)",
                ])
        }
        self.settling = settling
    }

    /// A FETCH reply to a settling request: takes back the own deltas it holds, moves the next
    /// sequence number past them (and past what the peer dropped from its history), and asks
    /// the next part of the range at the next round. Returns `false` for another request.
    mutating func settlingReply(_ requestID: UInt64, kind: ClientProtocol.ReplyKind, body: [UInt8], from peer: String)
        -> Bool
    {
        guard var settling, let fetch = settling.fetches[peer], fetch.requestID == requestID else { return false }
        settling.fetches[peer] = nil
        self.settling = settling
        // An error or an undecodable answer is asked again at the next round.
        guard kind == .ok, let (deltas, droppedThrough) = try? ClientProtocol.decodeFetched(body) else { return true }
        let own = configuration.nodeID
        let wanted = deltas.filter { $0.origin == own && fetch.range.contains($0.sequence) }
        let fresh = applyRemote(wanted, from: peer, repaired: true)
        counters.deltasFetched += deltas.count
        var highest = wanted.lazy.map(\.sequence).max() ?? 0
        // Numbers it held and dropped from its history exist too.
        if droppedThrough >= fetch.range.lowerBound {
            highest = max(highest, min(droppedThrough, fetch.range.upperBound))
        }
        if highest > 0 {
            nextSequence = max(nextSequence, highest + 1)
            ownHeldByPeers(through: highest)
        }
        self.settling?.recovered += fresh.count
        self.settling?.askFrom[peer] = fetch.range.upperBound &+ 1
        // The next part at once, not at the next round.
        advanceSettling()
        return true
    }

    /// Every linked peer answered: the held writes are numbered after everything any of them
    /// holds, in the order they came.
    private mutating func finishSettling() {
        guard let settled = settling else { return }
        settling = nil
        logger.notice(
            "settled after a power loss: every peer said which of this node's deltas it holds",
            metadata: [
                "delta.range": "\(settled.range)", "deltas.taken_back": "\(settled.recovered)",
                "next_sequence": "\(nextSequence)", "writes.held": "\(settled.held.count)",
            ])
        for held in settled.held {
            switch held {
            case .localWrites(let writes): takeLocalWrites(writes)
            case .request(let client, let frames, let identity):
                handleClientRequest(frames, from: client, identity: identity)
            }
        }
    }
}
