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
        (host, port) = try Self.hostAndPort(address)
        self.node = node
        self.exporter = exporter
        self.logger = logger
        self.liveView = LiveView(node: node, logger: logger, authority: authority)
    }

    /// Binds `address` (`HOST:PORT`, as `http.listen`) once and lets it go: a port in use or an
    /// address not of this host is said before the node starts, with the key and the address,
    /// instead of by the HTTP server after the node started (and stopped again). It binds the
    /// first address `getaddrinfo` gives, which is the one the server binds (SwiftNIO's
    /// `SocketAddress.makeAddressResolvingHost` takes the first result too).
    public static func checkBindable(_ address: String) throws(StateSyncError) {
        let (host, port) = try hostAndPort(address)
        var hints = addrinfo()
        hints.ai_flags = AI_PASSIVE
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var found: UnsafeMutablePointer<addrinfo>?
        let resolved = getaddrinfo(host.isEmpty ? nil : host, String(port), &hints, &found)
        guard resolved == 0, let first = found else {
            throw StateSyncError(
                .invalidConfiguration,
                "cannot bind http.listen \(address): \(String(cString: gai_strerror(resolved)))")
        }
        defer { freeaddrinfo(found) }
        let descriptor = socket(first.pointee.ai_family, first.pointee.ai_socktype, first.pointee.ai_protocol)
        guard descriptor >= 0 else { return }  // the server will say what is wrong
        defer { close(descriptor) }
        var on: Int32 = 1
        _ = setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(MemoryLayout<Int32>.size))
        guard bind(descriptor, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0 else {
            throw StateSyncError(
                .invalidConfiguration, "cannot bind http.listen \(address): \(String(cString: strerror(errno)))")
        }
    }

    /// The host (without an IPv6 address's brackets) and port of `http.listen`'s `HOST:PORT`.
    private static func hostAndPort(_ address: String) throws(StateSyncError) -> (host: String, port: Int) {
        guard let colon = address.lastIndex(of: ":"), let port = Int(address[address.index(after: colon)...]) else {
            throw StateSyncError(.invalidConfiguration, "http.listen: '\(address)' is not HOST:PORT")
        }
        var host = String(address[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        return (host, port)
    }

    /// The Hummingbird application serving the routes: a `Service` (it ends on graceful shutdown).
    /// `onRunning` gets the port it bound (useful with port 0).
    public func application(onRunning: @escaping @Sendable (Int) async -> Void = { _ in }) -> some ApplicationProtocol {
        let router = Router()
        router.add(middleware: HostCheck(listenHost: host))
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
            var status = node.status
            // With security, channel names are for viewers whose key may read them (the live view).
            if node.configuration.security != nil { status.channels = [:] }
            return Response(
                status: .ok, headers: [.contentType: "application/json"],
                body: .init(byteBuffer: ByteBuffer(string: status.value.jsonText() + "\n")))
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

/// Answers only requests whose `Host` is an IP address, `localhost` or the configured listen host:
/// a web page on another origin cannot reach the listener through DNS rebinding (its requests
/// carry the attacker's host name). A request without `Host` (HTTP/1.0) is answered.
struct HostCheck<Context: RequestContext>: RouterMiddleware {
    let listenHost: String

    func handle(
        _ request: Request, context: Context, next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        guard let authority = request.head.authority, !ListenerHost.allows(authority, listenHost: listenHost) else {
            return try await next(request, context)
        }
        return Response(
            status: .misdirectedRequest, headers: [.contentType: "text/plain; charset=utf-8"],
            body: .init(byteBuffer: ByteBuffer(string: "this listener answers only its own address or localhost\n")))
    }
}

/// Which `Host` values name the listener.
enum ListenerHost {
    /// Whether `authority` (`host[:port]`, `[v6][:port]`) names this listener.
    static func allows(_ authority: String, listenHost: String) -> Bool {
        var host = Substring(authority)
        if host.hasPrefix("["), let close = host.firstIndex(of: "]") {
            host = host[host.index(after: host.startIndex)..<close]
        } else if let colon = host.lastIndex(of: ":") {
            host = host[..<colon]
        }
        let name = host.lowercased()
        if name == "localhost" || name == listenHost.lowercased() { return true }
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, name, &v4) == 1 || inet_pton(AF_INET6, name, &v6) == 1
    }
}
