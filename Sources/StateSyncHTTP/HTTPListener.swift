import Foundation
public import Hummingbird
public import Logging
import NIOCore
public import StateSync

/// The daemon's HTTP listener (`http.listen`): for operators and their tools, never for data
/// clients.
///
/// - `GET /metrics`: ``MetricsExporter``'s Prometheus text.
/// - `GET /healthz`: 200 while the process serves requests (liveness).
/// - `GET /readyz`: 200, or 503 and why not (``NodeStatus/notReadyReasons``, what `statesync
///   status --ready` says).
/// - `GET /status`: the node's status as JSON (what `statesync status --json` prints).
/// - `GET /`: the live view (``LiveView``); `GET /events`: its server-sent events.
///
/// Built on Hummingbird; run it as a `Service` beside the node (the daemon's service group).
public struct HTTPListener: Sendable {
    let node: StateSyncNode
    let exporter: MetricsExporter
    let host: String
    let port: Int
    let logger: Logger
    let liveView: LiveView

    /// A listener for `node` on `address` (`HOST:PORT`, as `http.listen`; port 0 picks one).
    /// With security, `authority` says which channels a viewer of the live view may see (without
    /// it, none).
    public init(
        address: String, node: StateSyncNode, exporter: MetricsExporter, authority: ViewerAuthority? = nil,
        logger: Logger
    ) throws {
        guard let colon = address.lastIndex(of: ":"), let port = Int(address[address.index(after: colon)...]) else {
            throw StateSyncError(.invalidConfiguration, "http.listen: '\(address)' is not HOST:PORT")
        }
        var host = String(address[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        self.host = host
        self.port = port
        self.node = node
        self.exporter = exporter
        self.logger = logger
        self.liveView = LiveView(node: node, logger: logger, authority: authority)
    }

    /// The Hummingbird application serving the routes: a `Service` (it ends on graceful shutdown).
    /// `onRunning` gets the port it bound (useful with port 0).
    public func application(onRunning: @escaping @Sendable (Int) async -> Void = { _ in }) -> some ApplicationProtocol {
        let router = Router()
        let node = self.node
        let exporter = self.exporter
        router.get("healthz") { _, _ in
            Response(
                status: .ok, headers: [.contentType: "text/plain; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(string: "ok\n")))
        }
        router.get("readyz") { _, _ in
            let reasons = node.status.notReadyReasons
            return Response(
                status: reasons.isEmpty ? .ok : .serviceUnavailable,
                headers: [.contentType: "text/plain; charset=utf-8"],
                body: .init(
                    byteBuffer: ByteBuffer(
                        string: reasons.isEmpty ? "ready\n" : "not ready: \(reasons.joined(separator: "; "))\n")))
        }
        router.get("metrics") { _, _ in
            Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(string: exporter.scrape(node))))
        }
        router.get("status") { _, _ in
            Response(
                status: .ok, headers: [.contentType: "application/json"],
                body: .init(byteBuffer: ByteBuffer(string: node.status.value.jsonText() + "\n")))
        }
        liveView.addRoutes(to: router)
        let logger = self.logger
        return Application(
            router: router,
            configuration: ApplicationConfiguration(address: .hostname(host, port: port), serverName: "statesyncd"),
            onServerRunning: { channel in
                let port = channel.localAddress?.port ?? 0
                logger.info("HTTP listener running", metadata: ["http.port": "\(port)"])
                await onRunning(port)
            },
            logger: logger)
    }
}
