import Foundation
import Testing
import ZeroMQ

@testable import StateSync
@testable import StateSyncHTTP

/// What the HTTP listener decides without a network: readiness, and view tokens.
@Suite("Readiness and view tokens")
struct OperatorViewTests {
    static func status(peers: [(String, Bool)], members: [(String, String, Bool)], missing: Int = 0) -> NodeStatus {
        var status = NodeStatus(
            node: "node1", incarnation: 1, publishEndpoint: "tcp://127.0.0.1:7001", apiEndpoint: nil,
            peers: peers.map {
                .init(
                    endpoint: "tcp://h:\($0.0)", node: $0.0, connected: $0.1, lastSeenMillisecondsAgo: nil,
                    deltasReceived: 0, knowsThisNode: $0.1)
            }, channels: [:], latestVersion: nil, latestSequence: 0, stateDigest: 0, counters: [:], watchers: 0,
            missingDeltas: missing, laggingWatches: 0)
        status.members = members.map {
            .init(
                id: $0.0, publishEndpoint: "", apiEndpoint: "", state: $0.1, lastSeenMillisecondsAgo: nil,
                missingDeltas: 0, connected: $0.2, version: "")
        }
        return status
    }

    @Test func readyMeansEveryLivePeerConnectedCaughtUpAndRoomOnDisk() {
        #expect(
            Self.status(peers: [("node2", true)], members: [("node1", "alive", false), ("node2", "alive", true)])
                .notReadyReasons.isEmpty, "this node's own entry is never 'not connected'")
        let down = Self.status(peers: [("node2", false)], members: [("node3", "down", false)]).notReadyReasons
        #expect(down == ["peers not connected: node2, node3"], "a configured peer and a learned member")
        // A configured peer not heard in this run (its id unknown to the peer list) is the member
        // with its publish endpoint: named once, by its id (a helper saw each peer twice).
        var unheard = Self.status(peers: [("node2", false)], members: [("node2", "down", false)])
        unheard.peers[0].node = nil
        unheard.members[0].publishEndpoint = "tcp://h:node2"
        #expect(unheard.notReadyReasons == ["peers not connected: node2"])
        unheard.members = []
        #expect(unheard.notReadyReasons == ["peers not connected: tcp://h:node2"], "no member entry: its endpoint")
        #expect(
            Self.status(peers: [("node2", false)], members: [("node2", "left", false), ("node3", "forgotten", false)])
                .notReadyReasons.isEmpty, "members that left or were forgotten are not waited for")
        #expect(
            Self.status(peers: [], members: [], missing: 3).notReadyReasons == [
                "catching up: 3 deltas known but not received"
            ])
        var stranger = Self.status(peers: [("node2", true)], members: [])
        stranger.peers[0].knowsThisNode = false
        #expect(
            stranger.notReadyReasons == [
                "peers that do not know this node yet (their deltas wait until they do): node2"
            ], "a connected peer whose deltas this node does not take yet")
        var full = Self.status(peers: [], members: [])
        full.diskFull = true
        #expect(full.notReadyReasons == ["disk nearly full: writes are refused"])
    }

    /// Per-peer series exist for the members a node expects to hear, not for one that left or
    /// was forgotten: a `statesync_peer_connected` of 0 kept for a forgotten member would hold
    /// a peer-down alert for good (a new user's trial found it). Its series go when it is
    /// forgotten, and come back if it is alive again.
    @Test func aForgottenOrDepartedMemberHasNoPeerSeries() {
        let exporter = MetricsExporter()
        func scrape(_ members: [(String, String, Bool)]) -> String {
            exporter.update(from: Self.status(peers: [], members: members), observerQueueDepth: 0)
            var buffer: [UInt8] = []
            exporter.registry.emit(into: &buffer)
            return String(decoding: buffer, as: UTF8.self)
        }
        let all = scrape([("node1", "alive", false), ("node2", "alive", true), ("node3", "down", false)])
        #expect(all.contains(#"statesync_peer_connected{peer="node2"} 1"#), "\(all)")
        #expect(all.contains(#"statesync_peer_connected{peer="node3"} 0"#))
        #expect(!all.contains(#"peer="node1""#), "this node is not its own peer")
        let after = scrape([("node1", "alive", false), ("node2", "left", false), ("node3", "forgotten", false)])
        #expect(!after.contains("statesync_peer_"), "\(after)")
        #expect(
            after.contains(#"statesync_members{state="forgotten"} 1"#)
                && after.contains(#"statesync_members{state="left"} 1"#))
        let back = scrape([("node1", "alive", false), ("node2", "alive", true), ("node3", "forgotten", false)])
        #expect(back.contains(#"statesync_peer_connected{peer="node2"} 1"#) && !back.contains(#"peer="node3""#))
    }

    @Test func theListenerAnswersOnlyItsOwnHostNamesAndAddresses() {
        for good in ["127.0.0.1:9461", "localhost:9461", "[::1]:9461", "10.0.0.7", "node1.internal:80", "LOCALHOST"] {
            #expect(ListenerHost.allows(good, listenHost: "node1.internal"), "\(good)")
        }
        for bad in ["evil.example:9461", "127.0.0.1.evil.example", "attacker.localhost.example"] {
            #expect(!ListenerHost.allows(bad, listenHost: "node1.internal"), "\(bad)")
        }
    }

    @Test func aViewTokenProvesItsClientKeyToItsNodeOnlyUntilItExpires() throws {
        let node = try Curve.generateKeyPair()
        let other = try Curve.generateKeyPair()
        let client = try Curve.generateKeyPair()
        let token = try ViewToken.make(client: client, serverPublicKey: node.publicKey, expires: Date() + 60)
        #expect(ViewToken.verify(token, serverSecretKey: node.secretKey) == client.publicKey)
        #expect(ViewToken.verify(token, serverSecretKey: other.secretKey) == nil, "made for another node")
        #expect(ViewToken.verify(token, serverSecretKey: node.secretKey, now: Date() + 120) == nil, "expired")
        // The refusal says why: a token for another node is that, not "expired", even once expired.
        #expect(ViewToken.check(token, serverSecretKey: other.secretKey) == .failure(.notForThisNode))
        #expect(
            ViewToken.check(token, serverSecretKey: other.secretKey, now: Date() + 120) == .failure(.notForThisNode))
        guard case .failure(.expired) = ViewToken.check(token, serverSecretKey: node.secretKey, now: Date() + 120)
        else {
            Issue.record("an expired token of this node is said to be expired")
            return
        }
        #expect(ViewToken.check("v1-abc", serverSecretKey: node.secretKey) == .failure(.malformed))
        // Any changed character (key, expiry or MAC) breaks it.
        for index in [5, 70, token.count - 1] {
            var characters = Array(token)
            characters[index] = characters[index] == "1" ? "2" : "1"
            #expect(ViewToken.verify(String(characters), serverSecretKey: node.secretKey) == nil, "changed at \(index)")
        }
        for junk in ["", "v1", "v1-zz-1-zz", "v2-" + token.dropFirst(3)] {
            #expect(ViewToken.verify(String(junk), serverSecretKey: node.secretKey) == nil)
        }
    }
}
