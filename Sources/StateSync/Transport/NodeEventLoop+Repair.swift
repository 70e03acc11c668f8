import Logging
import ZeroMQ

/// Gap repair between nodes (docs/PROTOCOL.md, "Repair"): per-origin sequence numbers reveal
/// missing deltas; the node FETCHes exactly those from a peer over a DEALER connected to the
/// peer's client API, preferring the origin itself, and falls back to a SNAPSHOT when no peer
/// still holds them.
extension NodeEventLoop {
    /// A DEALER to one peer's client API.
    struct RepairLink {
        let peer: String
        let api: String
        let socket: Socket
    }

    struct Outstanding {
        let link: String
        let requestID: UInt64
        let deadline: UInt64
        let range: ClosedRange<UInt64>
    }

    struct RepairState {
        /// Keyed by the peer's publish endpoint (as configured).
        var links: [String: RepairLink] = [:]
        var fetches: [String: Outstanding] = [:]
        var snapshot: Outstanding?
        var nextID: UInt64 = 1
        /// Per origin, the peers that answered a FETCH saying they no longer hold what is missing.
        var exhausted: [String: Set<String>] = [:]
        var needsSnapshot = false
        var rotation = 0
        /// A snapshot was merged and must be made durable (compaction).
        var mergedSnapshot = false
    }

    static let repairTimeout: UInt64 = 1000
    static let maximumFetch: UInt64 = 2000

    /// Opens a DEALER to each peer whose heartbeat advertised an API endpoint. Returns whether
    /// the set of links changed.
    func updateRepairLinks(_ repair: inout RepairState, context: Context, node: StateSyncNode) -> Bool {
        let advertised = node.core.withLock { core in core.peers.compactMapValues(\.api) }
        var changed = false
        for (peer, api) in advertised where repair.links[peer]?.api != api {
            if let old = repair.links.removeValue(forKey: peer) {
                old.socket.close()
                changed = true  // the poller must not keep the closed socket
            }
            do {
                let socket = try SocketFactory.makeRepairLink(context: context, api: api)
                repair.links[peer] = RepairLink(peer: peer, api: api, socket: socket)
                changed = true
            } catch {
                logger.error("cannot open a repair link", metadata: ["peer.endpoint": "\(peer)", "error": "\(error)"])
            }
        }
        return changed
    }

    /// Sends a FETCH for every origin with a gap and no request in flight; a SNAPSHOT when needed.
    func requestRepairs(_ repair: inout RepairState, node: StateSyncNode, now: UInt64) {
        let connected = node.core.withLock { core -> [String: String?] in
            let staleAfter = UInt64(3 * configuration.heartbeatIntervalMilliseconds)
            return core.peers.filter { ($0.value.lastMessageAt.map { now &- $0 <= staleAfter }) ?? false }
                .mapValues(\.node)
        }
        let usable = repair.links.values.filter { connected[$0.peer] != nil }.sorted { $0.peer < $1.peer }
        guard !usable.isEmpty else { return }
        for (origin, fetch) in repair.fetches where fetch.deadline <= now {
            // No answer in time: try another peer next.
            repair.fetches[origin] = nil
            repair.exhausted[origin, default: []].insert(fetch.link)
        }
        if let snapshot = repair.snapshot, snapshot.deadline <= now { repair.snapshot = nil }

        if repair.needsSnapshot, repair.snapshot == nil {
            repair.rotation += 1
            let link = usable[repair.rotation % usable.count]
            let id = repair.nextID
            repair.nextID += 1
            if (try? link.socket.send(ClientProtocol.encodeRequest(.snapshot, id: id, body: []), dontWait: true))
                == true
            {
                repair.snapshot = Outstanding(
                    link: link.peer, requestID: id, deadline: now + 10 * Self.repairTimeout, range: 0...0)
                repair.needsSnapshot = false
                logger.info(
                    "history is gone on the peers; asking for a snapshot", metadata: ["peer.endpoint": "\(link.peer)"])
            }
            return
        }
        guard repair.snapshot == nil else { return }
        for (origin, gap) in node.gaps() where repair.fetches[origin] == nil {
            // Prefer the origin itself; otherwise rotate through the connected peers that may
            // still hold the deltas. When none does, only a snapshot can fill the gap.
            let candidates = usable.filter { !(repair.exhausted[origin]?.contains($0.peer) ?? false) }
            guard !candidates.isEmpty else {
                repair.exhausted[origin] = nil
                repair.needsSnapshot = true
                continue
            }
            let link =
                candidates.first { connected[$0.peer] == .some(origin) }
                ?? {
                    repair.rotation += 1
                    return candidates[repair.rotation % candidates.count]
                }()
            let (end, overflow) = gap.lowerBound.addingReportingOverflow(Self.maximumFetch - 1)
            let range = gap.lowerBound...(overflow ? gap.upperBound : min(gap.upperBound, end))
            let id = repair.nextID
            repair.nextID += 1
            let request = ClientProtocol.encodeRequest(
                .fetch, id: id, body: ClientProtocol.encodeFetch(origin: origin, range: range))
            if (try? link.socket.send(request, dontWait: true)) == true {
                repair.fetches[origin] = Outstanding(
                    link: link.peer, requestID: id, deadline: now + Self.repairTimeout, range: range)
                node.countRepairRequest()
                logger.debug(
                    "fetching missing deltas",
                    metadata: ["peer.id": "\(origin)", "delta.range": "\(range)", "peer.endpoint": "\(link.peer)"])
            }
        }
    }

    /// Applies a FETCH or SNAPSHOT reply. Returns the deltas that were new, and the channels a
    /// merged snapshot changed.
    func handleRepairReply(
        _ frames: [[UInt8]], from link: RepairLink, repair: inout RepairState, node: StateSyncNode
    ) -> (fresh: [StateSyncNode.Applied], merged: Set<String>) {
        guard frames.count == 2, let header = try? ClientProtocol.decodeReplyHeader(frames[0]) else {
            node.countMalformedClientMessage()
            return ([], [])
        }
        let now = monotonicMilliseconds()
        if let snapshot = repair.snapshot, snapshot.requestID == header.requestID {
            repair.snapshot = nil
            guard header.kind == .ok, let decoded = try? DataDirectory.decode(frames[1]) else {
                logger.warning("a peer's snapshot reply was unusable", metadata: ["peer.endpoint": "\(link.peer)"])
                return ([], [])
            }
            let channels = node.merge(decoded)
            repair.mergedSnapshot = true
            logger.info(
                "merged a peer's snapshot",
                metadata: ["peer.endpoint": "\(link.peer)", "channels.changed": "\(channels.count)"])
            return ([], channels)
        }
        guard let (origin, outstanding) = repair.fetches.first(where: { $0.value.requestID == header.requestID }) else {
            return ([], [])  // a late answer to a request already retried
        }
        repair.fetches[origin] = nil
        guard header.kind == .ok, let (deltas, droppedThrough) = try? ClientProtocol.decodeFetched(frames[1]) else {
            return ([], [])
        }
        let wanted = deltas.filter { $0.origin == origin && outstanding.range.contains($0.sequence) }
        let fresh = node.applyRemote(wanted, from: link.peer, at: now, repaired: true)
        node.core.withLock { $0.counters.deltasFetched += deltas.count }
        if deltas.isEmpty {
            // This peer does not hold them (dropped, or never had them); another may, else a
            // snapshot will do.
            _ = droppedThrough
            repair.exhausted[origin, default: []].insert(link.peer)
        } else {
            repair.exhausted[origin] = nil
        }
        return (fresh, [])
    }
}
