import Foundation
import StateSync
import StateSyncClient
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif
#if canImport(Glibc)
    import Glibc
#endif

/// The daemon's HTTP listener (`http.listen`) on real daemons: Prometheus metrics that promtool
/// accepts and that move with writes, readiness that follows a peer's death and return, and the
/// live view in a real headless browser.
@Suite("HTTP listener: metrics, health, live view")
struct HTTPListenerTests {
    static let promtool = ["/usr/bin/promtool", "/usr/local/bin/promtool"].first(
        where: FileManager.default.isExecutableFile)
    static let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].first(
        where: FileManager.default.isExecutableFile)

    /// Three daemons on free ports, each with an HTTP listener; heartbeats every 100 ms.
    struct Cluster {
        let daemons = ClusterTests.Daemons()
        let publish = (0..<3).map { _ in "tcp://127.0.0.1:\(freePort())" }
        let api = (0..<3).map { _ in "tcp://127.0.0.1:\(freePort())" }
        let http = (0..<3).map { _ in "127.0.0.1:\(freePort())" }
        let data = (0..<3).map { temporaryPath("http-node\($0 + 1)") }

        func start(_ i: Int) throws {
            let peers = (0..<3).filter { $0 != i }.map { "node\($0 + 1)=\(publish[$0])" }
            _ = try daemons.start(
                config: "Config/node\(i + 1).yaml",
                environment: [
                    "STATESYNC_NODE_DATA_DIR": data[i], "STATESYNC_NETWORK_PUBLISH": publish[i],
                    "STATESYNC_NETWORK_API": api[i], "STATESYNC_NETWORK_PEERS": peers.joined(separator: ","),
                    "STATESYNC_NETWORK_HEARTBEAT_MS": "100", "STATESYNC_HTTP_LISTEN": http[i],
                ], name: "node\(i + 1)")
        }
    }

    static func get(_ url: String) async throws -> (status: Int, body: String) {
        let (data, response) = try await URLSession.shared.data(from: URL(string: url)!)
        return ((response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: data, as: UTF8.self))
    }

    /// The value of the first sample line of `series` (a name with its labels) in a scrape.
    static func sample(_ series: String, in scrape: String) -> Double? {
        for line in scrape.split(separator: "\n") where line.hasPrefix(series + " ") {
            return Double(line.dropFirst(series.count + 1))
        }
        return nil
    }

    @Test func metricsMoveWithWritesAndReadinessFollowsAPeer() async throws {
        let cluster = Cluster()
        do {
            for i in 0..<3 { try cluster.start(i) }
            for api in cluster.api { try await ClusterTests.waitUntilReady(api, peers: 2) }
            let node1 = "http://\(cluster.http[0])"
            let node2 = "http://\(cluster.http[1])"

            #expect(try await Self.get("\(node1)/healthz") == (200, "ok\n"))
            try await waitUntil("node1's /readyz says ready") { try await Self.get("\(node1)/readyz").status == 200 }

            let before = try await Self.get("\(node1)/metrics").body
            let published = Self.sample("statesync_deltas_published_total", in: before) ?? -1
            #expect(published >= 0, "a counter of `statesync status` is exported:\n\(before)")
            let client = try StateSyncClient(endpoint: cluster.api[0])
            defer { client.close() }
            for i in 0..<3 {
                _ = try await client.set(
                    ModelAddress(channel: "ops", model: "m\(i)"), ["secret": .string("value-never-in-metrics-\(i)")])
            }
            try await waitUntil("node1's published counter moved by 3") {
                let now = try await Self.get("\(node1)/metrics").body
                return (Self.sample("statesync_deltas_published_total", in: now) ?? 0) >= published + 3
            }
            try await waitUntil("node2 received and applied the 3 deltas") {
                let now = try await Self.get("\(node2)/metrics").body
                return (Self.sample("statesync_deltas_applied_total", in: now) ?? 0) >= 3
                    && (Self.sample("statesync_remote_apply_lag_seconds_count", in: now) ?? 0) >= 1
            }
            var scrapes: [String] = []
            for http in cluster.http { scrapes.append(try await Self.get("http://\(http)/metrics").body) }
            let node1Scrape = scrapes[0]
            #expect((Self.sample("statesync_fsync_seconds_count", in: node1Scrape) ?? 0) >= 1, "fsync histogram")
            #expect((Self.sample("statesync_write_published_seconds_count", in: node1Scrape) ?? 0) >= 1)
            #expect(Self.sample("statesync_peer_missing_deltas{peer=\"node2\"}", in: node1Scrape) == 0)
            #expect(Self.sample("statesync_peer_connected{peer=\"node3\"}", in: node1Scrape) == 1)
            #expect(Self.sample("statesync_members{state=\"alive\"}", in: node1Scrape) == 3)
            for scrape in scrapes {
                #expect(!scrape.contains("value-never-in-metrics"), "metrics carry no property values")
                #expect(!scrape.contains("m0") && !scrape.contains("\"ops\""), "no model or channel labels")
            }
            // The Grafana dashboard in Config/ asks only for series the node exports.
            let dashboard = try String(contentsOfFile: "Config/grafana-dashboard.json", encoding: .utf8)
            let names = Set(
                dashboard.matches(of: /statesync_[a-z_]+/).map {
                    String($0.output).replacingOccurrences(of: "_bucket", with: "")
                })
            #expect(names.count >= 10)
            for name in names {
                #expect(node1Scrape.contains("# TYPE \(name) "), "the dashboard's \(name) is exported")
            }
            if let promtool = Self.promtool {
                for (i, scrape) in scrapes.enumerated() {
                    let file = "\(cluster.data[i])-scrape.txt"
                    try scrape.write(toFile: file, atomically: true, encoding: .utf8)
                    defer { try? FileManager.default.removeItem(atPath: file) }
                    let check = try ChildProcess("/bin/sh", ["-c", "\(promtool) check metrics < \(file)"])
                    #expect(await check.wait() == 0, "promtool check metrics: \(check.stdout)\(check.stderr)")
                }
            } else {
                Issue.record("promtool is missing (bash .ci/setup --test installs Debian's prometheus)")
            }

            // A peer dies (SIGKILL: no clean leave): node1 is no longer ready, and says which peer.
            _ = await cluster.daemons.processes[2].stop(SIGKILL)
            try await waitUntil("node1's /readyz fails while node3 is dead") {
                let ready = try await Self.get("\(node1)/readyz")
                return ready.status == 503 && ready.body.contains("node3")
            }
            #expect(
                Self.sample("statesync_ready", in: try await Self.get("\(node1)/metrics").body) == 0,
                "the ready gauge follows /readyz")
            try cluster.start(2)
            try await waitUntil("node1's /readyz is ready again once node3 is back") {
                try await Self.get("\(node1)/readyz").status == 200
            }
        } catch {
            Issue.record("\(error)\n\(cluster.daemons.logs())")
        }
        let statuses = await cluster.daemons.stopAll()
        #expect(statuses.first == 0 && statuses.last == 0, "\(statuses)\n\(cluster.daemons.logs())")
    }

    @Test func aPortInUseStopsTheDaemonWithExit1() async throws {
        let cluster = Cluster()
        let blocker = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(blocker) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(cluster.http[0].split(separator: ":")[1])!).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(blocker, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        #expect(bound == 0 && listen(blocker, 1) == 0)
        try cluster.start(0)
        #expect(await cluster.daemons.processes[0].wait() == 1)
        #expect(cluster.daemons.processes[0].stderr.contains("statesyncd: node node1"), "\(cluster.daemons.logs())")
        _ = await cluster.daemons.stopAll()  // (exited already: this removes its data directory)
    }

    /// The live view in Debian's chromium: the page follows a channel of node1 while a change is
    /// made through node3; the page must show it (old → new). A screenshot is kept in
    /// `.build/test-artifacts/live-view.png`.
    @Test(.enabled(if: chromium != nil, "needs chromium (bash .ci/setup --test installs it)"))
    func theLiveViewShowsAChangeMadeThroughAnotherNode() async throws {
        let cluster = Cluster()
        var browser: ChildProcess?
        do {
            for i in 0..<3 { try cluster.start(i) }
            for api in cluster.api { try await ClusterTests.waitUntilReady(api, peers: 2) }
            let node1 = try StateSyncClient(endpoint: cluster.api[0])
            let node3 = try StateSyncClient(endpoint: cluster.api[2])
            defer {
                node1.close()
                node3.close()
            }
            let greeting = ModelAddress(channel: "demo", model: "greeting")
            _ = try await node3.set(greeting, ["text": .string("before")])
            try await waitUntil("node1 has the first value") { try await node1.get(greeting)["text"] != nil }

            let artifacts = packageRoot.appendingPathComponent(".build/test-artifacts").path
            try FileManager.default.createDirectory(atPath: artifacts, withIntermediateDirectories: true)
            // Twice: once dumping the page's DOM (asserted), once taking the screenshot. The page
            // closes its event stream once it shows `until`, so the browser sees the network idle.
            for (round, mode) in ["--dump-dom", "--screenshot=\(artifacts)/live-view.png"].enumerated() {
                let marker = "after-\(round)"
                let url = "http://\(cluster.http[0])/?channel=demo&until=\(marker)"
                let chrome = try ChildProcess(
                    Self.chromium!,
                    [
                        "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
                        "--virtual-time-budget=60000", mode, url,
                    ], name: "chromium")
                browser = chrome
                try await waitUntil("the page's watch is registered on node1") {
                    (try? await node1.status().watchers) == 1
                }
                _ = try await node3.set(greeting, ["text": .string(marker)])
                #expect(await chrome.wait(timeout: .seconds(60)) == 0, "\(chrome.stderr)")
                browser = nil
                try await waitUntil("the page's watch ended") { (try? await node1.status().watchers) == 0 }
                if round == 0 {
                    let dom = chrome.stdout
                    #expect(
                        dom.contains(
                            "<span class=\"old\">\"before\"</span> → <span class=\"new\">\"\(marker)\"</span>"),
                        "the page shows old → new of the change made through node3:\n\(dom)")
                    #expect(dom.contains(">node3<"), "with its origin")
                    #expect(dom.contains("node2") && dom.contains(">connected<"), "and the members' links")
                }
            }
            let screenshot = try FileManager.default.attributesOfItem(atPath: "\(artifacts)/live-view.png")
            #expect((screenshot[.size] as? Int ?? 0) > 10_000, "a screenshot of the page")
        } catch {
            Issue.record("\(error)\n\(cluster.daemons.logs())")
        }
        if let browser { _ = await browser.stop(SIGKILL) }
        #expect(await cluster.daemons.stopAll() == [0, 0, 0], "\(cluster.daemons.logs())")
    }
}

/// The live view of a node with security: channel names and data only with a view token of a
/// client key, and only what that key may read.
@Suite("HTTP listener: the live view with security")
struct SecureLiveViewTests {
    /// Follows `/events` with curl until `condition` holds for what arrived, then stops it.
    static func events(_ url: String, until what: String, _ condition: @escaping (String) -> Bool) async throws
        -> String
    {
        let curl = try ChildProcess("/usr/bin/curl", ["-sN", url], name: "curl")
        defer { curl.signal(SIGKILL) }  // never a reused pid
        try await waitUntil(what) { condition(curl.stdout) }
        return curl.stdout
    }

    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/curl"), "needs curl"))
    func aViewerSeesOnlyWhatItsClientKeyMayRead() async throws {
        let directory = temporaryDirectory("secure-view")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await keygen(["node1", "node2", "viewer", "writer"], in: directory)
        let api = "tcp://127.0.0.1:\(freePort())"
        let http = "127.0.0.1:\(freePort())"
        let path = "\(directory)/node1.yaml"
        try """
        node:
          id: node1
          data_dir: \(directory)/data
        network:
          publish: tcp://127.0.0.1:\(freePort())
          api: \(api)
          peers:
            - node2=tcp://127.0.0.1:\(freePort())
        http:
          listen: \(http)
        security:
          secret_key: \(directory)/node1.key
          peer_keys:
            - node2=\(directory)/node2.key.pub
          client_keys:
            - \(directory)/viewer.key.pub read=sensors* write=sensors*
            - \(directory)/writer.key.pub
        """.write(toFile: path, atomically: true, encoding: .utf8)
        let daemon = try ChildProcess("statesyncd", ["--config", path])
        var lingering: ChildProcess?
        do {
            let writer = try StateSyncClient(
                endpoint: api, requestTimeout: .seconds(3),
                security: .init(serverKey: "\(directory)/node1.key.pub", secretKeyFile: "\(directory)/writer.key"))
            defer { writer.close() }
            try await waitUntil("the daemon answers the writer") {
                (try? await writer.set(ModelAddress(channel: "secret", model: "s1"), ["code": .string("hidden-xyz")]))
                    != nil
            }
            _ = try await writer.set(ModelAddress(channel: "sensors", model: "t1"), ["temp": .int(20)])
            // The API can answer before the HTTP listener is bound (seen once in a loaded suite: a
            // curl that found nothing listening exited, and the wait for its stream timed out).
            try await waitUntil("the HTTP listener answers") {
                (try? await HTTPListenerTests.get("http://\(http)/healthz"))?.status == 200
            }

            // No token: members and counts, no channel names, no data.
            let anonymous = try await Self.events(
                "http://\(http)/events?channel=secret", until: "the anonymous viewer is told to bring a token"
            ) { $0.contains("statesync view-token") && $0.contains("event: status") }
            #expect(!anonymous.contains("hidden-xyz") && !anonymous.contains("event: change"))
            #expect(anonymous.contains("\"channels\":{}"), "no channel names without a token: \(anonymous)")

            let made = try await cli([
                "view-token", "--key", "\(directory)/viewer.key", "--server-key", "\(directory)/node1.key.pub",
            ])
            #expect(made.status == 0, "\(made.stderr)")
            let token = made.stdout.trimmingCharacters(in: .whitespacesAndNewlines)

            // A channel the key may read: its changes arrive; the other channel's name does not.
            let allowed = try await Self.events(
                "http://\(http)/events?channel=sensors&token=\(token)", until: "the viewer sees sensors/t1"
            ) { $0.contains("\"model\":\"t1\"") && $0.contains("event: status") }
            #expect(allowed.contains("\"new\":20"))
            #expect(!allowed.contains("\"secret\"") && !allowed.contains("hidden-xyz"), "\(allowed)")

            // A channel it may not read: refused, nothing of it sent.
            let refused = try await Self.events(
                "http://\(http)/events?channel=secret&token=\(token)", until: "the viewer is refused 'secret'"
            ) { $0.contains("may not read channel 'secret'") }
            #expect(!refused.contains("hidden-xyz") && !refused.contains("event: change"))

            // A forged token (one digit of its MAC changed) proves nothing.
            let last = token.last == "0" ? "1" : "0"
            let forged = try await Self.events(
                "http://\(http)/events?channel=sensors&token=\(token.dropLast())\(last)",
                until: "the forgery is refused"
            ) { $0.contains("the token was not made for this node") }
            #expect(!forged.contains("event: change"))

            // A token made with another node's public key: said so (not "expired").
            let misaimed = try await cli([
                "view-token", "--key", "\(directory)/viewer.key", "--server-key", "\(directory)/node2.key.pub",
            ])
            #expect(misaimed.status == 0, "\(misaimed.stderr)")
            let elsewhere = try await Self.events(
                "http://\(http)/events?channel=sensors&token=\(misaimed.stdout.trimmingCharacters(in: .whitespacesAndNewlines))",
                until: "a token for node2 is refused as not for this node"
            ) { $0.contains("--server-key must be this node's public key") }
            #expect(!elsewhere.contains("event: change") && !elsewhere.contains("token expired"), "\(elsewhere)")

            // /status shows no channel names; a foreign Host (DNS rebinding) is refused.
            let status = try ChildProcess("/usr/bin/curl", ["-s", "http://\(http)/status"])
            #expect(await status.wait() == 0)
            #expect(!status.stdout.contains("sensors") && !status.stdout.contains("secret"), "\(status.stdout)")
            let rebound = try ChildProcess(
                "/usr/bin/curl",
                ["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Host: evil.example", "http://\(http)/status"])
            #expect(await rebound.wait() == 0)
            #expect(rebound.stdout == "421")

            // A reload that takes the viewer's read permission away ends its open view.
            let open = try ChildProcess(
                "/usr/bin/curl", ["-sN", "http://\(http)/events?channel=sensors&token=\(token)"])
            try await waitUntil("the view is open") { open.stdout.contains("watching sensors") }
            try String(contentsOfFile: path, encoding: .utf8)
                .replacingOccurrences(of: "read=sensors* write=sensors*", with: "read=other* write=other*")
                .write(toFile: path, atomically: true, encoding: .utf8)
            daemon.signal(SIGHUP)
            #expect(await open.wait(timeout: .seconds(20)) == 0, "the stream ends (curl exits 0)")
            #expect(open.stdout.contains("what this view may read changed"), "\(open.stdout)")

            // SIGTERM with a live view open: the daemon still stops cleanly.
            _ = try await Self.events("http://\(http)/events", until: "a view without a channel is open") {
                $0.contains("event: status")
            }
            lingering = try ChildProcess("/usr/bin/curl", ["-sN", "http://\(http)/events?channel=x"])
            try await waitUntil("a lingering view is open") { lingering?.stdout.contains("event: status") == true }
        } catch {
            Issue.record("\(error)\n\(daemon.stderr)")
        }
        #expect(await daemon.stop() == 0, "\(daemon.stderr)")
        if let lingering {
            #expect(await lingering.wait(timeout: .seconds(10)) == 0, "the open view ended with the daemon")
        }
    }
}
