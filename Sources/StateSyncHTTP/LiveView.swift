import Foundation
import Hummingbird
import Logging
import NIOCore
import ServiceLifecycle
import StateSync
import StateSyncClient
import Synchronization

/// The live view: one page (no build step, no CDN: everything inline) that shows the members
/// and the state of every link, each peer's lag, the channels with their model counts, and the
/// changes of the channel the viewer picks as they arrive (old → new, version, origin).
///
/// The page holds one server-sent-events stream, `GET /events?channel=NAME`: an `event: status`
/// every second, and an `event: change` per change of the channel. The changes come from a watch
/// on this node's own client API (the same path, order and old values as `statesync watch`).
/// With security configured, a viewer sees channel names and data only with a ``ViewToken``
/// (`?token=`, from `statesync view-token`) of a client key, and only the channels that key may
/// read; the token is checked again every second (expiry, reloaded permissions).
struct LiveView: Sendable {
    let node: StateSyncNode
    let logger: Logger
    let authority: ViewerAuthority?
    /// Open `/events` streams: each holds a client connection and a task, so they are bounded.
    let viewers = Viewers()

    /// At most this many `/events` streams at once.
    static let maximumViewers = 64

    final class Viewers: Sendable {
        let open = Atomic<Int>(0)
    }

    func addRoutes(to router: Router<BasicRequestContext>) {
        router.get("/") { _, _ in
            Response(
                status: .ok, headers: [.contentType: "text/html; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(string: LiveView.page)))
        }
        router.get("events") { request, _ in
            let channel = request.uri.queryParameters.get("channel").flatMap { $0.isEmpty ? nil : String($0) }
            if let channel {
                do {
                    try Names.validateChannel(channel)
                } catch {
                    return Self.text(.badRequest, "\(error)\n")
                }
            }
            guard viewers.open.add(1, ordering: .relaxed).newValue <= Self.maximumViewers else {
                viewers.open.subtract(1, ordering: .relaxed)
                return Self.text(.serviceUnavailable, "too many live views open (at most \(Self.maximumViewers))\n")
            }
            let token = request.uri.queryParameters.get("token").map { String($0) }
            let (stream, finish) = self.events(channel: channel, token: token)
            let viewers = self.viewers
            return Response(
                status: .ok,
                headers: [.contentType: "text/event-stream", .cacheControl: "no-cache"],
                body: ResponseBody { writer in
                    defer {
                        finish()
                        viewers.open.subtract(1, ordering: .relaxed)
                    }
                    try await withGracefulShutdownHandler {
                        for await chunk in stream { try await writer.write(ByteBuffer(string: chunk)) }
                    } onGracefulShutdown: {
                        finish()
                    }
                    try await writer.finish(nil)
                })
        }
    }

    static func text(_ status: HTTPResponse.Status, _ body: String) -> Response {
        Response(
            status: status, headers: [.contentType: "text/plain; charset=utf-8"],
            body: .init(byteBuffer: ByteBuffer(string: body)))
    }

    /// What a viewer may read: `nil` without security (everything), else the read patterns its
    /// token proves now (none without a valid token).
    func readPatterns(token: String?) -> [String]? {
        access(token: token).patterns
    }

    /// What a viewer may read (`nil` patterns: everything), and why nothing when it is nothing.
    func access(token: String?) -> (patterns: [String]?, refusal: String?) {
        guard node.configuration.security != nil else { return (nil, nil) }
        guard let token, let authority else {
            return ([], "this node has security: open the page with ?token=… (statesync view-token) to see channels")
        }
        switch authority.readPatterns(token: token) {
        case .success(let patterns): return (patterns, nil)
        case .failure(let refusal): return ([], "\(refusal)")
        }
    }

    /// The stream of one viewer (status every second, and the changes of `channel`), and how to
    /// end it. At most 10,000 events wait for a slow viewer; past that they are dropped and
    /// counted (`dropped_changes` in its status events). The stream ends when what the token may
    /// read changes (expiry, a reload): the page reconnects under the new permissions.
    func events(channel: String?, token: String?) -> (AsyncStream<String>, @Sendable () -> Void) {
        let (patterns, refusal) = access(token: token)
        let (stream, continuation) = AsyncStream.makeStream(of: String.self, bufferingPolicy: .bufferingOldest(10_000))
        let dropped = Atomic<Int>(0)
        let send: @Sendable (String, Value) -> Void = { event, value in
            if case .dropped = continuation.yield("event: \(event)\ndata: \(value.jsonText())\n\n") {
                dropped.add(1, ordering: .relaxed)
            }
        }
        let node = self.node
        let statusTask = Task {
            while !Task.isCancelled {
                if readPatterns(token: token) != patterns {
                    send("notice", .string("what this view may read changed (token expired, or keys reloaded)"))
                    continuation.finish()
                    return
                }
                var status = node.status
                if let patterns {
                    status.channels = status.channels.filter {
                        SecurityConfiguration.ClientAccess.allows(patterns, $0.key)
                    }
                }
                send(
                    "status",
                    .map([
                        "status": status.value,
                        "not_ready": .array(status.notReadyReasons.map(Value.string)),
                        "dropped_changes": .int(Int64(dropped.load(ordering: .relaxed))),
                    ]))
                try? await Task.sleep(for: .seconds(1))
            }
        }
        let watchTask = Task {
            if let refusal {
                send("notice", .string(refusal))
                return
            }
            if patterns == [] {
                send("notice", .string("this client key may read no channel (security.client_keys gives it no read=)"))
                return
            }
            guard let channel else { return }
            if let patterns, !SecurityConfiguration.ClientAccess.allows(patterns, channel) {
                send("notice", .string("this client key may not read channel '\(channel)'"))
                return
            }
            await self.watch(channel: channel, send: send)
        }
        continuation.onTermination = { _ in
            statusTask.cancel()
            watchTask.cancel()
        }
        return (stream, { continuation.finish() })
    }

    /// Watches `channel` through this node's own client API and sends its changes; a watch that
    /// ends (the node restarted its API, a timeout) is resumed from its replica.
    private func watch(channel: String, send: @Sendable (String, Value) -> Void) async {
        guard let api = node.apiEndpoint.map(Self.loopback) else {
            send("notice", .string("this node serves no client API (network.api): no channel data to show"))
            return
        }
        var replica: ChannelReplica?
        while !Task.isCancelled {
            do {
                let client =
                    if let authority {
                        try StateSyncClient(
                            endpoint: api, serverKey: authority.serverPublicKey, keyPair: authority.viewKeys)
                    } else {
                        try StateSyncClient(endpoint: api)
                    }
                defer { client.close() }
                let (events, current) = try await client.watch(channel: channel, replica: replica)
                replica = current
                send("notice", .string("watching \(channel)"))
                for try await event in events {
                    guard case .change(let change, let kind, _) = event else { continue }
                    send(
                        "change",
                        .map([
                            "channel": .string(change.channel), "model": .string(change.model),
                            "property": .string(change.property), "old": change.old ?? .null, "new": change.new,
                            "version": .string(change.version.description), "origin": .string(change.version.node),
                            "kind": .string("\(kind)"),
                        ]))
                }
            } catch {
                if Task.isCancelled { return }
                send("notice", .string("the watch ended (\(error)); resuming"))
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// `endpoint` with a wildcard host replaced by loopback (a bound `tcp://*:7101` or
    /// `tcp://0.0.0.0:7101` is reached at 127.0.0.1).
    static func loopback(_ endpoint: String) -> String {
        endpoint.replacingOccurrences(of: "tcp://*:", with: "tcp://127.0.0.1:")
            .replacingOccurrences(of: "tcp://0.0.0.0:", with: "tcp://127.0.0.1:")
            .replacingOccurrences(of: "tcp://[::]:", with: "tcp://[::1]:")
    }
}
