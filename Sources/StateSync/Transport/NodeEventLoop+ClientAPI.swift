import Logging
import ZeroMQ

/// The client API on the node's ROUTER socket (docs/PROTOCOL.md, "Client API").
extension NodeEventLoop {
    /// Handles one client request (watches it starts are pumped by the loop after the batch).
    func handleClientMessage(_ frames: [[UInt8]], state: inout LoopState, api: Socket, node: StateSyncNode) {
        // [client routing id][header][body]
        guard frames.count == 3 else {
            node.countMalformedClientMessage()
            return
        }
        let client = frames[0]
        let header: ClientProtocol.RequestHeader
        do {
            header = try ClientProtocol.decodeRequestHeader(frames[1])
        } catch {
            node.countMalformedClientMessage()
            if case .unsupported = error {
                reply(client, .error, 0, ClientProtocol.encodeError(.unsupportedVersion, "\(error)"), api, node: node)
            }
            return
        }
        let id = header.requestID
        guard let command = ClientProtocol.Command(rawValue: header.command) else {
            node.countClientRequest(error: true)
            reply(
                client, .error, id,
                ClientProtocol.encodeError(.unknownCommand, "unknown command 0x\(String(header.command, radix: 16))"),
                api, node: node)
            return
        }
        let body = frames[2]
        guard configuration.apiEndpoint != nil || [.fetch, .snapshot, .ping].contains(command) else {
            node.countClientRequest(error: true)
            reply(
                client, .error, id,
                ClientProtocol.encodeError(
                    .denied,
                    "this is node \(configuration.nodeID)'s repair endpoint, which serves only its peers; it has no client API (network.api)"
                ), api, node: node)
            return
        }
        do {
            switch command {
            case .set:
                let (address, writes) = try ClientProtocol.decodeSet(body)
                let (published, version, result) = try node.clientSet(address, writes)
                // Answered once durable (see `flush`): an acknowledged write survives a crash.
                stage(published, state: &state, node: node)
                var body = ClientProtocol.encodeVersion(version)
                body.append(result.rawValue)
                state.staged.replies.append((client, id, body))
            case .get:
                let address = try ClientProtocol.decodeAddress(body)
                try Names.validateChannel(address.channel)
                try Names.validateModel(address.model)
                reply(client, .ok, id, ClientProtocol.encodeProperties(node.properties(of: address)), api, node: node)
            case .watch:
                let (channel, cursor, onLag) = try ClientProtocol.decodeWatch(body)
                try Names.validateChannel(channel)
                // OK first: the watch's events (snapshot, deltas, markers) follow it.
                reply(client, .ok, id, [], api, node: node)
                addWatch(
                    WatchKey(client: client, requestID: id), channel: channel, from: cursor, onLag: onLag,
                    state: &state, node: node)
            case .unwatch:
                var reader = WireReader(body)
                let watchID = try reader.uint64("watch id")
                removeWatch(WatchKey(client: client, requestID: watchID), state: &state)
                reply(client, .ok, id, [], api, node: node)
            case .status:
                reply(client, .ok, id, ClientProtocol.encodeValue(node.status.value), api, node: node)
            case .fetch:
                let (origin, range) = try ClientProtocol.decodeFetch(body)
                let (end, overflow) = range.lowerBound.addingReportingOverflow(Self.maximumFetch - 1)
                let limited = range.lowerBound...(overflow ? range.upperBound : min(range.upperBound, end))
                let (deltas, dropped) = node.fetch(origin: origin, range: limited)
                reply(client, .ok, id, ClientProtocol.encodeFetched(deltas, droppedThrough: dropped), api, node: node)
            case .snapshot:
                reply(client, .ok, id, DataDirectory.encode(node.snapshot()), api, node: node)
            case .ping:
                // The body lists the watch ids the client holds; the reply names those this node
                // no longer has (dropped when the client was unreachable), so no gap goes unseen.
                var reader = WireReader(body)
                var lost: [Value] = []
                if !reader.isAtEnd {
                    let count = try reader.count("watch count", minimumItemSize: 8)
                    for _ in 0..<count {
                        let watchID = try reader.uint64("watch id")
                        if state.watches[WatchKey(client: client, requestID: watchID)] == nil {
                            lost.append(.int(Int64(bitPattern: watchID)))
                        }
                    }
                }
                let answer: Value = ["incarnation": .string(String(node.incarnation, radix: 16)), "lost": .array(lost)]
                reply(client, .ok, id, ClientProtocol.encodeValue(answer), api, node: node)
            }
            node.countClientRequest(error: false)
        } catch let error as WireError {
            node.countClientRequest(error: true)
            reply(
                client, .error, id, ClientProtocol.encodeError(.malformed, "malformed \(command) request: \(error)"),
                api, node: node)
        } catch let error as StateSyncError {
            node.countClientRequest(error: true)
            reply(client, .error, id, ClientProtocol.encodeError(.invalidArgument, error.message), api, node: node)
        } catch {
            node.countClientRequest(error: true)
            reply(client, .error, id, ClientProtocol.encodeError(.internal, "\(error)"), api, node: node)
        }
    }

    /// Sends a staged reply (a SET answered once its write is durable).
    func send(_ staged: (client: [UInt8], id: UInt64, body: [UInt8]), api: Socket?, node: StateSyncNode) {
        guard let api else { return }
        reply(staged.client, .ok, staged.id, staged.body, api, node: node)
    }

    private func reply(
        _ client: [UInt8], _ kind: ClientProtocol.ReplyKind, _ id: UInt64, _ body: [UInt8], _ api: Socket,
        node: StateSyncNode
    ) {
        do {
            if try !api.send([client] + ClientProtocol.encodeReply(kind, id: id, body: body), dontWait: true) {
                node.countDroppedReply()  // the client's queue is full; it will time out and retry
            }
        } catch let error where error.isHostUnreachable {
            // The client left before its answer; nothing to do.
        } catch {
            logger.error("sending a reply failed", metadata: ["error": "\(error)"])
        }
    }
}
