import Logging
import ZeroMQ

/// The client API on the node's ROUTER socket (docs/PROTOCOL.md, "Client API").
extension NodeEventLoop {
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
            reply(client, .error, id, ClientProtocol.encodeError(.unknownCommand, "unknown command 0x\(String(header.command, radix: 16))"), api, node: node)
            return
        }
        let body = frames[2]
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
                let channel = try ClientProtocol.decodeChannel(body)
                try Names.validateChannel(channel)
                state.add(LoopState.Watch(client: client, requestID: id), channel: channel)
                updateWatcherCount(state)
                reply(client, .ok, id, [], api, node: node)
            case .unwatch:
                var reader = WireReader(body)
                let watchID = try reader.uint64("watch id")
                state.remove(LoopState.Watch(client: client, requestID: watchID))
                updateWatcherCount(state)
                reply(client, .ok, id, [], api, node: node)
            case .status:
                reply(client, .ok, id, ClientProtocol.encodeValue(node.status.value), api, node: node)
            case .fetch:
                let (origin, range) = try ClientProtocol.decodeFetch(body)
                let limited = range.lowerBound...min(range.upperBound, range.lowerBound + Self.maximumFetch - 1)
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
                    let held = state.channelsByClient[client] ?? [:]
                    for _ in 0..<count {
                        let watchID = try reader.uint64("watch id")
                        if held[watchID] == nil { lost.append(.int(Int64(bitPattern: watchID))) }
                    }
                }
                let answer: Value = ["incarnation": .string(String(node.incarnation, radix: 16)), "lost": .array(lost)]
                reply(client, .ok, id, ClientProtocol.encodeValue(answer), api, node: node)
            }
            node.countClientRequest(error: false)
        } catch let error as WireError {
            node.countClientRequest(error: true)
            reply(client, .error, id, ClientProtocol.encodeError(.malformed, "malformed \(command) request: \(error)"), api, node: node)
        } catch let error as StateSyncError {
            node.countClientRequest(error: true)
            reply(client, .error, id, ClientProtocol.encodeError(.invalidArgument, error.message), api, node: node)
        } catch {
            node.countClientRequest(error: true)
            reply(client, .error, id, ClientProtocol.encodeError(.internal, "\(error)"), api, node: node)
        }
    }

    private func updateWatcherCount(_ state: LoopState) {
        setWatcherCount(state.count)
    }

    /// Sends the changes one delta applied to every client watching its channel.
    func notifyWatchers(_ changes: [PropertyChange], state: inout LoopState, api: Socket?, node: StateSyncNode) {
        guard let api, let first = changes.first, let watches = state.watchesByChannel[first.channel] else { return }
        let body = ClientProtocol.encodeEvent(changes)
        var gone: [[UInt8]] = []
        for watch in watches {
            do {
                let queued = try api.send([watch.client] + ClientProtocol.encodeReply(.event, id: watch.requestID, body: body), dontWait: true)
                if !queued {
                    node.countDroppedWatchEvent()
                    if let suppressed = node.limiter.allow("slow-watcher") {
                        logger.warning(
                            "a watching client is not keeping up; dropped an event",
                            metadata: ["watch.channel": "\(first.channel)", "suppressed": "\(suppressed)"])
                    }
                }
            } catch let error where error.isHostUnreachable {
                gone.append(watch.client)  // the client disconnected: its watches end
            } catch {
                logger.error("sending a watch event failed", metadata: ["error": "\(error)"])
            }
        }
        if !gone.isEmpty {
            for client in gone { state.removeClient(client) }
            updateWatcherCount(state)
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
