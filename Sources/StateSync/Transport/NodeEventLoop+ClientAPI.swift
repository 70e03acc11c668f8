import Logging
import ZeroMQ

/// The client API on the node's ROUTER socket (docs/PROTOCOL.md, "Client API").
extension NodeEventLoop {
    func handleClientMessage(
        _ frames: [[UInt8]], state: inout LoopState, api: Socket, publisher: Socket, node: StateSyncNode
    ) {
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
                reply(client, .error, 0, ClientProtocol.encodeError(.unsupportedVersion, "\(error)"), api)
            }
            return
        }
        let id = header.requestID
        guard let command = ClientProtocol.Command(rawValue: header.command) else {
            node.countClientRequest(error: true)
            reply(client, .error, id, ClientProtocol.encodeError(.unknownCommand, "unknown command 0x\(String(header.command, radix: 16))"), api)
            return
        }
        let body = frames[2]
        do {
            switch command {
            case .set:
                let (address, writes) = try ClientProtocol.decodeSet(body)
                let (published, version) = try node.clientSet(address, writes)
                for applied in published {
                    publish(.delta(applied.delta), on: publisher)
                    notifyWatchers(applied.changes, state: &state, api: api, node: node)
                }
                let current = version ?? latestVersion(of: address, names: writes.map(\.name), node: node)
                var body = ClientProtocol.encodeVersion(current)
                body.append(version == nil ? 0 : 1)  // 1 = this set changed something
                reply(client, .ok, id, body, api)
            case .get:
                let address = try ClientProtocol.decodeAddress(body)
                try Names.validateChannel(address.channel)
                try Names.validateModel(address.model)
                reply(client, .ok, id, ClientProtocol.encodeProperties(node.properties(of: address)), api)
            case .watch:
                let channel = try ClientProtocol.decodeChannel(body)
                try Names.validateChannel(channel)
                state.add(LoopState.Watch(client: client, requestID: id), channel: channel)
                updateWatcherCount(state)
                reply(client, .ok, id, [], api)
            case .unwatch:
                var reader = WireReader(body)
                let watchID = try reader.uint64("watch id")
                state.remove(LoopState.Watch(client: client, requestID: watchID))
                updateWatcherCount(state)
                reply(client, .ok, id, [], api)
            case .status:
                reply(client, .ok, id, ClientProtocol.encodeValue(node.status.value), api)
            case .ping:
                reply(client, .ok, id, ClientProtocol.encodeValue(["incarnation": .string(String(node.incarnation, radix: 16))]), api)
            }
            node.countClientRequest(error: false)
        } catch let error as WireError {
            node.countClientRequest(error: true)
            reply(client, .error, id, ClientProtocol.encodeError(.malformed, "malformed \(command) request: \(error)"), api)
        } catch let error as StateSyncError {
            node.countClientRequest(error: true)
            reply(client, .error, id, ClientProtocol.encodeError(.invalidArgument, error.message), api)
        } catch {
            node.countClientRequest(error: true)
            reply(client, .error, id, ClientProtocol.encodeError(.internal, "\(error)"), api)
        }
    }

    private func latestVersion(of address: ModelAddress, names: [String], node: StateSyncNode) -> Version {
        let registers = node.properties(of: address)
        return names.compactMap { registers[$0]?.version }.max() ?? .zero
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

    private func reply(_ client: [UInt8], _ kind: ClientProtocol.ReplyKind, _ id: UInt64, _ body: [UInt8], _ api: Socket) {
        do {
            try api.send([client] + ClientProtocol.encodeReply(kind, id: id, body: body), dontWait: true)
        } catch let error where error.isHostUnreachable {
            // The client left before its answer; nothing to do.
        } catch {
            logger.error("sending a reply failed", metadata: ["error": "\(error)"])
        }
    }
}
