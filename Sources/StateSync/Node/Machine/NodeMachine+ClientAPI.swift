import Logging

/// The client API on the node's ROUTER (docs/PROTOCOL.md section 10): requests in, replies and
/// watch events out. Without `network.api` the same socket is the repair endpoint, which serves
/// only peers (FETCH, SNAPSHOT, PING).
extension NodeMachine {
    /// The largest write a SET may carry (names and encoded values), so its delta fits a log
    /// record and a message with room to spare.
    static let maximumWriteBytes = 32 << 20

    /// What a client's SET did (the outcome octet of its OK).
    enum SetResult: UInt8, Sendable {
        /// Every value was already current: no delta.
        case unchanged = 0
        /// The write applied.
        case changed = 1
        /// The write lost last-writer-wins for every property: this node already holds newer
        /// versions (written by a peer whose clock is ahead). It is published but changes nothing.
        case superseded = 2
    }

    /// Counts a client message dropped as malformed and logs it at a limited rate (section 12).
    mutating func countMalformedRequest(from client: [UInt8], _ message: String, reason: String) {
        counters.malformedMessages += 1
        warnLimited(
            "malformed-client-message", "\(message)",
            metadata: ["client": "\(Self.hex(client))", "error": "\(reason)"])
    }

    /// A routing id as hexadecimal (for logs).
    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        for byte in bytes.prefix(32) {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 15)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// Handles one request: `frames` are its header and body.
    /// A request its sender's key may not make (section 14): answered ERROR 8.
    struct Forbidden: Error {
        let message: String
    }

    /// With security, why `command` is refused to its sender whatever its arguments (`nil`: go
    /// on to the per-channel checks): a connection without identity, or whose key was removed
    /// by a reload, may do nothing; a peer's key may only ask for repairs, PING and STATUS (it
    /// cannot write through another node's API in that node's name).
    static func refusal(
        _ command: ClientProtocol.Command, identity: String?, security: Bool,
        clients: [String: SecurityConfiguration.ClientAccess], peers: Set<String>
    ) -> String? {
        guard security else { return nil }
        guard let identity else { return "this connection has no admitted key" }
        if identity.hasPrefix("node:") {
            guard peers.contains(String(identity.dropFirst(5))) else {
                return "this peer's key is no longer admitted (security.peer_keys was reloaded)"
            }
            guard [.fetch, .snapshot, .ping, .status, .announce].contains(command) else {
                return "a peer's key may only ask for repairs (FETCH, SNAPSHOT), PING, STATUS and ANNOUNCE"
            }
            return nil
        }
        guard clients[identity] != nil else {
            return "this client's key is no longer admitted (security.client_keys was reloaded)"
        }
        return nil
    }

    /// What the sender of a request may do: `nil` is everything (no security, or a peer node).
    /// A client no longer admitted (its key removed by a reload) may do nothing.
    func access(of identity: String?) -> SecurityConfiguration.ClientAccess? {
        guard configuration.security != nil else { return nil }
        guard let identity else { return .init(key: "", read: [], write: []) }
        if identity.hasPrefix("node:") { return nil }
        return clientAccess[identity] ?? .init(key: "", read: [], write: [])
    }

    /// The admitted clients changed (at start, and at a reload): from now on requests are checked
    /// against `access`, and every watch whose key may no longer read its channel ends with
    /// ERROR 8.
    mutating func clientAccessChanged(_ access: [String: SecurityConfiguration.ClientAccess]) {
        clientAccess = access
        for key in watches.order {
            guard let watch = watches.byKey[key], watch.identity != nil else { continue }
            if let rights = self.access(of: watch.identity),
                !SecurityConfiguration.ClientAccess.allows(rights.read, watch.channel)
            {
                removeWatch(key)
                actions.append(
                    .reply(
                        client: key.client,
                        frames: ClientProtocol.encodeReply(
                            .error, id: key.requestID,
                            body: ClientProtocol.encodeError(
                                .forbidden,
                                "this client's key may no longer read channel '\(watch.channel)' (security.client_keys was reloaded)"
                            ))))
            }
        }
    }

    /// Repairs (FETCH, SNAPSHOT) hand out every channel: peers only, or a client that may read
    /// every channel.
    func authorizeRepair(_ identity: String?) throws(Forbidden) {
        guard let access = access(of: identity), !access.read.contains("*") else { return }
        throw Forbidden(
            message: "repairs (FETCH, SNAPSHOT) serve every channel: only peers and clients that may read '*' may ask")
    }

    /// Throws ``Forbidden`` unless the sender may `read` (or write) `channel`.
    func authorize(_ identity: String?, write: Bool, channel: String) throws(Forbidden) {
        guard let access = access(of: identity) else { return }
        let patterns = write ? access.write : access.read
        guard SecurityConfiguration.ClientAccess.allows(patterns, channel) else {
            throw Forbidden(
                message:
                    "this client's key (\(identity.map { String($0.dropFirst(7).prefix(8)) } ?? "?")…, security.client_keys) may not \(write ? "write" : "read") channel '\(channel)'"
            )
        }
    }

    mutating func handleClientRequest(_ frames: [[UInt8]], from client: [UInt8], identity: String? = nil) {
        guard frames.count == 2 else {
            countMalformedRequest(
                from: client, "a client message that is not [routing id][header][body] was dropped",
                reason: "\(frames.count) frames after the routing id")
            return
        }
        let header: ClientProtocol.RequestHeader
        do {
            header = try ClientProtocol.decodeRequestHeader(frames[0])
        } catch {
            countMalformedRequest(
                from: client, "a client request with a malformed header was dropped", reason: "\(error)")
            if case .unsupported = error {
                reply(client, .error, 0, ClientProtocol.encodeError(.unsupportedVersion, "\(error)"))
            }
            return
        }
        let id = header.requestID
        counters.clientRequests += 1
        guard let command = ClientProtocol.Command(rawValue: header.command) else {
            counters.clientErrors += 1
            reply(
                client, .error, id,
                ClientProtocol.encodeError(.unknownCommand, "unknown command 0x\(String(header.command, radix: 16))"))
            return
        }
        guard configuration.apiEndpoint != nil || [.fetch, .snapshot, .ping, .announce].contains(command) else {
            counters.clientErrors += 1
            reply(
                client, .error, id,
                ClientProtocol.encodeError(
                    .denied,
                    "this is node \(configuration.nodeID)'s repair endpoint, which serves only its peers; it has no client API (network.api)"
                ))
            return
        }
        if let refusal = Self.refusal(
            command, identity: identity, security: configuration.security != nil,
            clients: clientAccess, peers: admittedPeers)
        {
            counters.clientErrors += 1
            reply(client, .error, id, ClientProtocol.encodeError(.forbidden, refusal))
            return
        }
        let body = frames[1]
        do {
            switch command {
            case .set:
                let (address, writes) = try ClientProtocol.decodeSet(body)
                try authorize(identity, write: true, channel: address.channel)
                try refuseWhenDiskFull(client, id, writing: body.count)
                try holdWhileSettling(frames, client, identity, id)
                try write(
                    address, writes, encodedIn: body.count, deletesModelAllowed: false, client: client, id: id,
                    batchedReply: takesBatchedReplies(header))
            case .delete:
                let (address, names) = try ClientProtocol.decodeDelete(body)
                if names.contains(where: \.isEmpty) {
                    throw StateSyncError(
                        .invalidName, "property name is empty (to delete the whole model, name no property)")
                }
                try authorize(identity, write: true, channel: address.channel)
                try refuseWhenDiskFull(client, id, writing: body.count)
                try holdWhileSettling(frames, client, identity, id)
                let writes = names.isEmpty ? [PropertyWrite.modelDeletion] : names.map(PropertyWrite.deletion(of:))
                try write(
                    address, writes, encodedIn: body.count, deletesModelAllowed: true, client: client, id: id,
                    batchedReply: takesBatchedReplies(header))
            case .get:
                let address = try ClientProtocol.decodeAddress(body)
                try Names.validateChannel(address.channel)
                try Names.validateModel(address.model)
                try authorize(identity, write: false, channel: address.channel)
                reply(client, .ok, id, ClientProtocol.encodeProperties(store.properties(of: address)))
            case .watch:
                let watch = try ClientProtocol.decodeWatchRequest(body)
                try Names.validateChannel(watch.channel)
                try authorize(identity, write: false, channel: watch.channel)
                if let cursor = watch.cursor { try refuseCursorAheadOfOwnWrites(cursor) }
                // OK first: the watch's events (snapshot, deltas, markers) follow it.
                reply(client, .ok, id, [])
                addWatch(
                    WatchKey(client: client, requestID: id), channel: watch.channel, from: watch.cursor,
                    onLag: watch.onLag, identity: identity, filter: watch.filter, batchedEvents: watch.batchedEvents,
                    takesResets: watch.takesResets, heldAbove: watch.heldAbove)
            case .unwatch:
                var reader = WireReader(body)
                let watchID = try reader.uint64("watch id")
                removeWatch(WatchKey(client: client, requestID: watchID))
                reply(client, .ok, id, [])
            case .status:
                var answer = status(now: now)
                // With security a client sees the names of the channels it may read only.
                if let rights = access(of: identity) {
                    answer.channels = answer.channels.filter {
                        SecurityConfiguration.ClientAccess.allows(rights.read, $0.key)
                    }
                }
                reply(client, .ok, id, ClientProtocol.encodeValue(answer.value))
            case .list:
                let request = try ClientProtocol.decodeList(body)
                let rights = access(of: identity)
                if !request.channel.isEmpty {
                    try Names.validateChannel(request.channel)
                    try authorize(identity, write: false, channel: request.channel)
                }
                // The channel list shows only the channels this client may read.
                let page = store.list(
                    channel: request.channel, prefix: request.prefix, after: request.after, limit: request.limit,
                    readable: { channel in
                        rights.map { SecurityConfiguration.ClientAccess.allows($0.read, channel) } ?? true
                    })
                reply(client, .ok, id, ClientProtocol.encodeListReply(page.entries, more: page.more))
            case .fetch:
                let (origin, range) = try ClientProtocol.decodeFetch(body)
                try authorizeRepair(identity)
                let (deltas, dropped, void) = fetch(origin: origin, range: Self.limited(range))
                reply(client, .ok, id, ClientProtocol.encodeFetched(deltas, droppedThrough: dropped, void: void))
            case .snapshot:
                let paged = try SnapshotPage.decodeRequest(body)
                try authorizeRepair(identity)
                // A later page of a stream begun before this node dropped its state (section 7.5):
                // its pages before stand for a state that is gone, so the requester starts over.
                if repair.servingBeforeReset.remove(client) != nil, paged?.after != nil {
                    reply(
                        client, .error, id,
                        ClientProtocol.encodeError(
                            .internal,
                            "this node dropped its state since the first page of this snapshot (it was forgotten): start it over"
                        ))
                    break
                }
                // A transfer counts once: at its first page, or as one whole reply.
                if paged == nil || paged?.after == nil { counters.snapshotsServed += 1 }
                // Held until this node's own writes in it are durable (section 10.9).
                let body =
                    if let paged {
                        snapshotPage(
                            for: client, after: paged.after, maximumOctets: paged.maximumOctets,
                            withHorizon: paged.withHorizon)
                    } else {
                        StateSnapshot.encode(servedSnapshot, collectedThrough: servedHorizon)
                    }
                replyOnceOwnWritesAreDurable(
                    client: client, frames: ClientProtocol.encodeReply(.ok, id: id, body: body))
            case .forget:
                var reader = WireReader(body)
                let member = try reader.string("node id")
                guard NodeConfiguration.isValidNodeID(member) else {
                    throw StateSyncError(.protocolError, "'\(member.prefix(64))' is not a node id")
                }
                // An operator's request: a client that may write every channel.
                if let access = access(of: identity), !access.write.contains("*") {
                    throw Forbidden(
                        message:
                            "forgetting a member needs a client key with write=* (security.client_keys)")
                }
                try forget(member)
                reply(client, .ok, id, [])
            case .announce:
                // A client key may not speak for a node (section 14); a peer only for itself.
                if let identity, !identity.hasPrefix("node:") {
                    throw Forbidden(message: "only a node's key may ANNOUNCE a member entry")
                }
                let taken = try receiveAnnounce(body, identity: identity)
                // Saved before the answer: the sender takes this node's deltas once told
                // (section 7.5), and this node must still know it after a power loss.
                saveMembersIfChanged()
                reply(client, .ok, id, [taken ? 1 : 0])
            case .ping:
                // The body lists the watch ids the client holds; the reply names those this node
                // no longer has (dropped when the client was unreachable), so no gap goes unseen.
                var reader = WireReader(body)
                var lost: [Value] = []
                if !reader.isAtEnd {
                    let count = try reader.count("watch count", minimumItemSize: 8)
                    for _ in 0..<count {
                        let watchID = try reader.uint64("watch id")
                        if watches[WatchKey(client: client, requestID: watchID)] == nil {
                            lost.append(.int(Int64(bitPattern: watchID)))
                        }
                    }
                }
                let answer: Value = ["incarnation": .string(String(incarnation, radix: 16)), "lost": .array(lost)]
                reply(client, .ok, id, ClientProtocol.encodeValue(answer))
            }
        } catch is DiskFull {
            return
        } catch is HeldUntilSettled {
            return
        } catch let error as Forbidden {
            counters.clientErrors += 1
            reply(client, .error, id, ClientProtocol.encodeError(.forbidden, error.message))
        } catch let error as WireError {
            counters.clientErrors += 1
            warnLimited(
                "malformed-client-request", "a client request with a malformed body was refused (ERROR 1)",
                metadata: [
                    "client": "\(Self.hex(client))", "command": "\(command)", "error": "\(error)",
                ])
            reply(client, .error, id, ClientProtocol.encodeError(.malformed, "malformed \(command) request: \(error)"))
        } catch let error as StateSyncError {
            counters.clientErrors += 1
            reply(client, .error, id, ClientProtocol.encodeError(.invalidArgument, error.message))
        } catch {
            counters.clientErrors += 1
            reply(client, .error, id, ClientProtocol.encodeError(.internal, "\(error)"))
        }
    }

    /// A WATCH cursor naming more of this node's own writes than it ever numbered (section
    /// 10.5.1) comes from another cluster, or from an earlier life of this node's id (its data
    /// directory emptied, in a cluster where no peer held its writes): resumed, it would skip
    /// this node's writes up to that number, and say it is caught up. Refused, with ERROR 3.
    /// (Not while settling: the node takes back the numbers its peers hold, and a cursor from a
    /// peer may name them.)
    func refuseCursorAheadOfOwnWrites(_ cursor: WatchCursor) throws(StateSyncError) {
        let own = configuration.nodeID
        guard settling == nil, cursor[own] > nextSequence - 1 else { return }
        throw StateSyncError(
            .protocolError,
            "the cursor names \(own):\(cursor[own]), but node \(own) has numbered only \(nextSequence - 1) writes: it comes from another cluster or from an earlier life of this node (its data directory emptied). Resuming would skip this node's writes; watch without a cursor (and drop what the cursor's state held)"
        )
    }

    /// Thrown once a write was answered with ERROR 9.
    struct DiskFull: Error {}

    /// Thrown once a write was held until the node settles (or refused: too many are held).
    struct HeldUntilSettled: Error {}

    /// While the node settles after a power loss (section 11.2), holds a SET or DELETE that
    /// passed every check, to be taken once it knows its next sequence number; past
    /// ``heldRequestLimit`` answers ERROR 5. Throws ``HeldUntilSettled`` either way.
    private mutating func holdWhileSettling(
        _ frames: [[UInt8]], _ client: [UInt8], _ identity: String?, _ id: UInt64
    ) throws(HeldUntilSettled) {
        guard settling != nil else { return }
        if !hold(request: frames, from: client, identity: identity) {
            counters.clientErrors += 1
            reply(
                client, .error, id,
                ClientProtocol.encodeError(
                    .internal,
                    "node \(configuration.nodeID) is settling its sequence numbers after \(settling?.cause.rawValue ?? "a power loss") and holds too many writes already; try again"
                ))
        }
        throw HeldUntilSettled()
    }

    /// Answers ERROR 9 and throws ``DiskFull`` while the data directory's disk is under its
    /// reserve, or when a write of `octets` (its request body: about what its log record takes)
    /// would take it there: the node takes no writes until space returns. The log grows a step
    /// at a time, and the writes taken since the last measurement count too, so a write the disk
    /// cannot hold is refused instead of failing its append (which stops the node: an own write
    /// that cannot be logged must not be acknowledged).
    private mutating func refuseWhenDiskFull(_ client: [UInt8], _ id: UInt64, writing octets: Int) throws(DiskFull) {
        let needed =
            UInt64(max(configuration.reserveBytes, 0)) + writtenSinceSpaceCheck + UInt64(octets) + Self.logGrowthMargin
        guard diskFull || (diskFree.map { $0 < needed } ?? false) else {
            writtenSinceSpaceCheck += UInt64(octets)
            return
        }
        counters.clientErrors += 1
        let free = diskFree ?? 0
        if !diskFull {
            counters.writesRefusedForSpace += 1
            let metadata: Logger.Metadata = [
                "write.bytes": "\(octets)", "disk.free_bytes": "\(free)",
                "storage.reserve_bytes": "\(configuration.reserveBytes)",
            ]
            warnLimited(
                "write-refused-for-space",
                "refused a write the disk's free space above storage.reserve_bytes cannot hold (with the log's growth)",
                metadata: metadata)
        }
        let why =
            diskFull
            ? "is full (\(free) bytes free, under storage.reserve_bytes \(configuration.reserveBytes)): it takes no writes until space returns"
            : "has \(free) bytes free: too few for this write of \(octets) bytes above storage.reserve_bytes \(configuration.reserveBytes) and the log's growth; it takes no such write until space returns"
        reply(
            client, .error, id, ClientProtocol.encodeError(.diskFull, "the disk of node \(configuration.nodeID) \(why)")
        )
        throw DiskFull()
    }

    /// Room kept for the log's next growth (it is grown 256 KiB ahead of its records, twice).
    static let logGrowthMargin: UInt64 = 2 * UInt64(DeltaLog.preallocationStep)

    /// Makes a client's write (SET or DELETE) and answers it once durable; in an OKS message
    /// when `batchedReply` (the request's header asked for it, section 10.1.1). `encodedIn` is
    /// the size of the request body that carried the writes; `deletesModelAllowed`: whether
    /// they may be the model's deletion (a DELETE's, not a SET's: section 10.3).
    mutating func write(
        _ address: ModelAddress, _ writes: [PropertyWrite], encodedIn octets: Int, deletesModelAllowed: Bool,
        client: [UInt8], id: UInt64, batchedReply: Bool
    ) throws(StateSyncError) {
        let (version, result) = try clientSet(
            address, writes, encodedIn: octets, deletesModelAllowed: deletesModelAllowed)
        var answer = ClientProtocol.encodeVersion(version)
        answer.append(result.rawValue)
        // Answered once durable: an acknowledged write survives a crash.
        replyWhenDurable(
            client: client,
            batchedReply ? .batchedOK((id, answer)) : .frames(ClientProtocol.encodeReply(.ok, id: id, body: answer)))
    }

    /// Whether a write's OK goes in an OKS message (section 10.1.1).
    private func takesBatchedReplies(_ header: ClientProtocol.RequestHeader) -> Bool {
        header.takesBatchedReplies && !faults.ignoreRequestFlags
    }

    private mutating func reply(_ client: [UInt8], _ kind: ClientProtocol.ReplyKind, _ id: UInt64, _ body: [UInt8]) {
        actions.append(.reply(client: client, frames: ClientProtocol.encodeReply(kind, id: id, body: body)))
    }

    /// A client's SET (or DELETE): the writes that change something become one delta with a new
    /// version. A value equal to the one held changes nothing unless a time to live is given or
    /// removed; a deletion is always written (an older write of what it deletes, still on its
    /// way, must lose to it on every replica). Returns the version to report (the
    /// write's, or when nothing changed the newest of the named properties) and what happened.
    ///
    /// `encodedIn` is the size of the request body that carried the writes: when it is within
    /// ``maximumWriteBytes``, so are the writes, and their size is not counted again.
    mutating func clientSet(
        _ address: ModelAddress, _ writes: [PropertyWrite], encodedIn octets: Int, deletesModelAllowed: Bool
    ) throws(StateSyncError) -> (version: Version, result: SetResult) {
        try validateWrite(address, writes, encodedIn: octets, deletesModelAllowed: deletesModelAllowed)
        // One property (the usual SET) is looked up alone; several, in one copy of the model's.
        // Looked up here, not in `held`: a nested function reading `store` captured a copy of the
        // whole store (a retain and a release of each of its parts) per SET.
        let single = writes.count == 1 ? store.property(writes[0].name, of: address) : nil
        let current = writes.count == 1 ? [:] : store.properties(of: address)
        func held(_ name: String) -> ReplicaStore.Register? {
            writes.count == 1 ? single : current[name]
        }
        // A deletion is always written: whatever this node holds, a write older than it may still
        // be on its way, and must lose to it everywhere.
        func changes(_ write: PropertyWrite) -> Bool {
            guard !write.isDeletion, let register = held(write.name) else { return true }
            return register.value != write.value || register.timeToLive != 0 || write.timeToLive != 0
        }
        // Usually every write changes something: the request's array is taken as it is.
        let effective = writes.allSatisfy(changes) ? writes : writes.filter(changes)
        guard !effective.isEmpty else {
            return (writes.compactMap { held($0.name)?.version }.max() ?? .zero, .unchanged)
        }
        let version = clock.next()
        let applied = applyLocal(LocalWriteRound([LocalWrite(address: address, version: version, writes: effective)]))
        if !(applied.entries.first?.wonAny ?? false) {
            let held = store.records(of: address)
            return (writes.compactMap { held[$0.name]?.version }.max() ?? version, .superseded)
        }
        return (version, .changed)
    }

    /// Checks a SET or DELETE (ERROR 3): names, no property twice, the size. Without
    /// `deletesModelAllowed` (a SET), the empty name is invalid also as a deletion (section 10.3:
    /// the model's deletion is for DELETE, whose writes are then the node's own
    /// `[.modelDeletion]`). `encodedIn`: the size of the request body that carried the writes,
    /// which is at least theirs (each name with its length, each value as it came: decoded and
    /// encoded again, a value never grows).
    func validateWrite(
        _ address: ModelAddress, _ writes: [PropertyWrite], encodedIn octets: Int, deletesModelAllowed: Bool
    ) throws(StateSyncError) {
        try Names.validateChannel(address.channel)
        try Names.validateModel(address.model)
        guard !writes.isEmpty else { throw StateSyncError(.invalidName, "a set needs at least one property") }
        // No set for the usual single write.
        var seen = writes.count > 1 ? Set<String>(minimumCapacity: writes.count) : []
        for write in writes {
            if !deletesModelAllowed, write.isModelDeletion {
                throw StateSyncError(
                    .invalidName,
                    "property name is empty (a SET cannot delete the whole model: a DELETE naming no property does)")
            }
            try Names.validateWrite(write)
            guard writes.count == 1 || seen.insert(write.name).inserted else {
                throw StateSyncError(.invalidName, "property '\(write.name)' is given twice")
            }
        }
        guard octets > Self.maximumWriteBytes else { return }
        let size = writes.reduce(0) { total, write in
            var w = WireWriter()
            w.propertyValue(write)
            return total + write.name.utf8.count + w.bytes.count
        }
        guard size <= Self.maximumWriteBytes else {
            throw StateSyncError(
                .invalidName, "the write is \(size) bytes; a delta may carry at most \(Self.maximumWriteBytes)")
        }
    }
}
