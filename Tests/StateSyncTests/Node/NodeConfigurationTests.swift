import Foundation
import Testing

@testable import StateSync

@Suite("Node configuration")
struct NodeConfigurationTests {
    /// Writes `yaml` to a file in a temporary directory (removed when the tests end).
    static func write(_ yaml: String) throws -> String {
        let path = temporaryDirectory("config") + "/node.yaml"
        try yaml.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    static let valid = """
        node:
          id: n1
          data_dir: /tmp/x
        network:
          publish: tcp://127.0.0.1:7001
          api: tcp://127.0.0.1:7101
          peers:
            - tcp://127.0.0.1:7002
        """

    @Test func theExampleClusterConfigsLoad() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../../Config")
        for i in 1...3 {
            let config = try NodeConfiguration.load(
                file: root.appendingPathComponent("node\(i).yaml").path, environment: [:])
            #expect(config.nodeID == "node\(i)")
            #expect(config.apiEndpoint == "tcp://127.0.0.1:710\(i)")
            #expect(config.peers.count == 2)
            #expect(!config.peers.contains(config.publishEndpoint))
            #expect(config.fsync == .always && config.highWaterMark == 100_000 && config.clientHighWaterMark == 10_000)
            #expect(config.historyDeltas == 100_000 && config.compactBytes == 64 << 20)
            #expect(config.batchMaximumDeltas == 4096)
        }
    }

    @Test func readsEveryKeyWithDefaults() throws {
        let config = try NodeConfiguration.load(file: try Self.write(Self.valid), environment: [:])
        #expect(
            config
                == NodeConfiguration(
                    nodeID: "n1", dataDirectory: "/tmp/x", publishEndpoint: "tcp://127.0.0.1:7001",
                    peers: ["tcp://127.0.0.1:7002"], apiEndpoint: "tcp://127.0.0.1:7101"))
    }

    /// Quoted, a word YAML would read as a boolean is text: `'true'` is a node id.
    @Test func aQuotedBooleanWordIsText() throws {
        let config = try NodeConfiguration.load(
            file: try Self.write(Self.valid.replacingOccurrences(of: "id: n1", with: "id: 'true'")), environment: [:])
        #expect(config.nodeID == "true")
    }

    /// A reload names the keys that changed; the peers compare as a set.
    @Test func theKeysThatDifferAreNamed() throws {
        let running = try NodeConfiguration.load(file: try Self.write(Self.valid), environment: [:])
        var reloaded = running
        reloaded.peers = running.peers.reversed()
        #expect(reloaded.keysDiffering(from: running).isEmpty)
        reloaded.heartbeatIntervalMilliseconds = 250
        reloaded.peers.append("tcp://127.0.0.1:7003")
        reloaded.publishBeforeSync = true
        #expect(reloaded.keysDiffering(from: running) == [.peers, .heartbeat, .publishAt])
    }

    @Test func environmentVariablesOverrideTheFile() throws {
        let config = try NodeConfiguration.load(
            file: try Self.write(Self.valid),
            environment: [
                "STATESYNC_NODE_ID": "other", "STATESYNC_NETWORK_PEERS": "tcp://127.0.0.1:9001,tcp://127.0.0.1:9002",
                "STATESYNC_NETWORK_HEARTBEAT_MS": "250",
            ])
        #expect(config.nodeID == "other")
        #expect(config.peers == ["tcp://127.0.0.1:9001", "tcp://127.0.0.1:9002"])
        #expect(config.heartbeatIntervalMilliseconds == 250)
    }

    @Test func storageSettingsAreReadAndChecked() throws {
        let config = try NodeConfiguration.load(
            file: try Self.write(Self.valid),
            environment: ["STATESYNC_STORAGE_FSYNC": "interval", "STATESYNC_STORAGE_FSYNC_INTERVAL_MS": "20"])
        #expect(config.fsync == .interval && config.fsyncIntervalMilliseconds == 20)
        let error = try #require(throws: StateSyncError.self) {
            try NodeConfiguration.load(
                file: try Self.write(Self.valid), environment: ["STATESYNC_STORAGE_FSYNC": "sometimes"])
        }
        #expect(
            error.message.hasPrefix(
                "environment variable STATESYNC_STORAGE_FSYNC: storage.fsync: 'sometimes' is not one of"))
    }

    /// `storage.publish`: `synced` by default with `always`; `written` publishes while the sync
    /// runs; `synced` does not go with `interval`, which always publishes once written.
    @Test func whenWritesArePublishedIsReadAndChecked() throws {
        let file = try Self.write(Self.valid)
        #expect(try !NodeConfiguration.load(file: file, environment: [:]).publishesBeforeSync)
        let written = try NodeConfiguration.load(file: file, environment: ["STATESYNC_STORAGE_PUBLISH": "written"])
        #expect(written.fsync == .always && written.publishBeforeSync && written.publishesBeforeSync)
        let interval = try NodeConfiguration.load(file: file, environment: ["STATESYNC_STORAGE_FSYNC": "interval"])
        #expect(interval.publishesBeforeSync && !interval.publishBeforeSync)
        let mismatch = try #require(throws: StateSyncError.self) {
            try NodeConfiguration.load(
                file: file, environment: ["STATESYNC_STORAGE_FSYNC": "interval", "STATESYNC_STORAGE_PUBLISH": "synced"])
        }
        #expect(
            mismatch.message
                == "environment variable STATESYNC_STORAGE_PUBLISH: storage.publish: 'synced' does not go with storage.fsync: interval (from environment variable STATESYNC_STORAGE_FSYNC), which publishes writes once written (unset STATESYNC_STORAGE_PUBLISH or set it to written, or set storage.fsync: always)"
        )
        let unknown = try #require(throws: StateSyncError.self) {
            try NodeConfiguration.load(file: file, environment: ["STATESYNC_STORAGE_PUBLISH": "early"])
        }
        #expect(unknown.message.hasSuffix("storage.publish: 'early' is not one of synced, written"))
    }

    @Test func builtInDefaultsLoad() throws {
        let config = try NodeConfiguration.loadDefaults(environment: ["STATESYNC_NODE_ID": "solo"])
        #expect(config.nodeID == "solo" && config.apiEndpoint == "tcp://127.0.0.1:7101" && config.peers.isEmpty)
    }

    /// Each broken config must name the file (or variable), the key and the reason.
    @Test(arguments: [
        ("node:\n  data_dir: /tmp\nnetwork:\n  publish: tcp://127.0.0.1:1", "node.id: missing"),
        (
            valid.replacingOccurrences(of: "tcp://127.0.0.1:7001", with: "tpc://127.0.0.1:7001"),
            "network.publish: 'tpc://127.0.0.1:7001' is not a ZeroMQ endpoint"
        ),
        (
            valid.replacingOccurrences(of: "127.0.0.1:7002", with: "127.0.0.1:99999"),
            "network.peers: 'tcp://127.0.0.1:99999' has no valid port"
        ),
        (valid.replacingOccurrences(of: "id: n1", with: "id: 'bad id!'"), "node.id: 'bad id!' must be"),
        (valid + "\n  heartbeat_ms: fast", "network.heartbeat_ms: expected an integer, not 'fast'"),
        (
            valid.replacingOccurrences(of: "  peers:\n    - tcp://127.0.0.1:7002", with: "  peers: 7"),
            "network.peers: expected a list of strings, not '7'"
        ),
        (valid + "\n  heartbeat_ms: 0", "network.heartbeat_ms: 0 is outside"),
        (valid + "\nlog:\n  level: loud", "log.level: 'loud' is not one of"),
        (valid + "\n  batch_max_deltas: 0", "network.batch_max_deltas: 0 is outside 1…65536"),
        ("node: [unclosed", "not a valid YAML mapping"),
        (valid + "\n  repair: tcp://127.0.0.1:7201", "network.repair: is for nodes without network.api"),
        (
            valid.replacingOccurrences(of: "  api: tcp://127.0.0.1:7101\n", with: "")
                + "\n  repair: tcp://127.0.0.1:7001",
            "network.repair: is the same endpoint as network.publish"
        ),
        // A misspelt key is refused, not ignored with its default used: a misspelt `security:`
        // would run the node without CurveZMQ.
        (
            valid + "\nsecurty:\n  secret_key: /etc/statesync/node1.key",
            "'securty' is not a configuration section (did you mean 'security'?)"
        ),
        (valid + "\n  hartbeat_ms: 100", "network.hartbeat_ms: unknown key (did you mean 'network.heartbeat_ms'?)"),
        // A key written without its unit is matched to the one with it (a trial's `hearbeat`).
        (valid + "\n  hearbeat: 100", "network.hearbeat: unknown key (did you mean 'network.heartbeat_ms'?)"),
        (
            valid + "\nstorage:\n  fsnc: interval",
            "storage.fsnc: unknown key (did you mean 'storage.fsync'?) (storage has: fsync,"
        ),
        (valid + "\nextras:\n  a: 1", "'extras' is not a configuration section (the sections: node, network,"),
        (valid + "\nlog: debug", "log: expected a mapping of its keys"),
        // A YAML boolean where text goes is refused, not taken as the text "true" (a trial's).
        (
            valid.replacingOccurrences(of: "id: n1", with: "id: true"),
            "node.id: expected a string, not true (a YAML boolean); quote it ('true')"
        ),
        (valid + "\nstorage:\n  fsync: off", "storage.fsync: expected a string, not off (a YAML boolean)"),
        (
            valid.replacingOccurrences(of: "data_dir: /tmp/x", with: "data_dir: ~"),
            "node.data_dir: expected a string, not ~"
        ),
        (
            "x-peer: &peer tcp://127.0.0.1:7002\n" + valid + "\nlog:\n  <<: {level: debug}",
            "a merge key (<<) in log: merged values are not read"
        ),
    ])
    func invalidConfigNamesFileKeyAndReason(yaml: String, expected: String) throws {
        let path = try Self.write(yaml)
        let error = try #require(throws: StateSyncError.self) {
            try NodeConfiguration.load(file: path, environment: [:])
        }
        #expect(error.code == .invalidConfiguration)
        #expect(error.message.hasPrefix(path + ": "), "\(error.message)")
        #expect(error.message.contains(expected), "\(error.message)")
        #expect(!error.message.contains("\n"))
    }

    /// Without an API a node still serves its peers' repairs: on `network.repair`, else on a
    /// free port of its publish host (or the publish path + `.repair`).
    @Test func theRepairEndpointIsTheAPIOrDerivedFromThePublishEndpoint() throws {
        var config = try NodeConfiguration.load(file: try Self.write(Self.valid), environment: [:])
        #expect(config.repairServiceEndpoint == "tcp://127.0.0.1:7101")
        config.apiEndpoint = nil
        #expect(config.repairServiceEndpoint == "tcp://127.0.0.1:*")
        config.publishEndpoint = "ipc:///tmp/n1.pub"
        #expect(config.repairServiceEndpoint == "ipc:///tmp/n1.pub.repair")
        config.repairEndpoint = "tcp://10.0.0.1:7201"
        #expect(config.repairServiceEndpoint == "tcp://10.0.0.1:7201")
        let loaded = try NodeConfiguration.load(
            file: try Self.write(Self.valid.replacingOccurrences(of: "  api: tcp://127.0.0.1:7101\n", with: "")),
            environment: ["STATESYNC_NETWORK_REPAIR": "tcp://127.0.0.1:7201"])
        #expect(loaded.repairEndpoint == "tcp://127.0.0.1:7201" && loaded.apiEndpoint == nil)
    }

    /// An override that names no key is refused (it would be ignored); other `STATESYNC_`
    /// variables (the CLI's, the test hooks) and an empty section (`http:`) are left alone.
    @Test func aMisspeltEnvironmentOverrideIsRefused() throws {
        let error = try #require(throws: StateSyncError.self) {
            try NodeConfiguration.load(
                file: try Self.write(Self.valid), environment: ["STATESYNC_NETWORK_HEARTBAET_MS": "100"])
        }
        #expect(error.code == .invalidConfiguration)
        #expect(
            error.message
                == "environment variable STATESYNC_NETWORK_HEARTBAET_MS: not a configuration key (did you mean 'STATESYNC_NETWORK_HEARTBEAT_MS'?)"
        )
        let config = try NodeConfiguration.load(
            file: try Self.write("x-anchors:\n  hb: &hb 250\n" + Self.valid + "\n  heartbeat_ms: *hb\nhttp: \"\"\n"),
            environment: [
                "STATESYNC_DAEMON": "tcp://127.0.0.1:7101", "STATESYNC_KEY": "/k", "STATESYNC_TEST_NEVER_EXPIRE": "1",
            ])
        #expect(config.nodeID == "n1" && config.httpListen == nil && config.heartbeatIntervalMilliseconds == 250)
        // A misspelt section in a variable is refused too when the name is that near a key's: a
        // misspelt STATESYNC_SECURITY_SECRET_KEY would run the node without CurveZMQ (a trial's).
        let section = try #require(throws: StateSyncError.self) {
            try NodeConfiguration.load(
                file: try Self.write(Self.valid), environment: ["STATESYNC_SECURTY_SECRET_KEY": "/k"])
        }
        #expect(
            section.message
                == "environment variable STATESYNC_SECURTY_SECRET_KEY: not a configuration key (did you mean 'STATESYNC_SECURITY_SECRET_KEY'?)"
        )
        // A variable of the operator's own, far from every key, is still left alone.
        _ = try NodeConfiguration.load(
            file: try Self.write(Self.valid), environment: ["STATESYNC_LOGS_DIR": "/var/log/x", "STATESYNC_NODES": "3"])
    }

    @Test func badEnvironmentOverrideNamesTheVariable() throws {
        let error = try #require(throws: StateSyncError.self) {
            try NodeConfiguration.load(
                file: try Self.write(Self.valid), environment: ["STATESYNC_NETWORK_HEARTBEAT_MS": "soon"])
        }
        #expect(
            error.message.contains(
                "environment variable STATESYNC_NETWORK_HEARTBEAT_MS: network.heartbeat_ms: expected an integer, not 'soon'"
            ), "\(error.message)")
    }

    @Test func missingFileIsAClearError() {
        let error = #expect(throws: StateSyncError.self) {
            try NodeConfiguration.load(file: "/nonexistent/x.yaml", environment: [:])
        }
        #expect(error?.message == "/nonexistent/x.yaml: cannot read the file: No such file or directory")
        // A directory named as the file said "NSCocoaErrorDomain error 256" (a trial's).
        let directory = temporaryDirectory("config-dir")
        let notAFile = #expect(throws: StateSyncError.self) {
            try NodeConfiguration.load(file: directory, environment: [:])
        }
        #expect(notAFile?.message == "\(directory): cannot read the file: Is a directory")
    }
}

/// The `security.*` keys: all or nothing, every peer named and keyed (PROTOCOL.md section 14).
@Suite("Security configuration")
struct SecurityConfigurationTests {
    static func load(_ yaml: String) throws(StateSyncError) -> NodeConfiguration {
        try NodeConfiguration.load(yaml: Array(yaml.utf8), source: "node1.yaml", environment: [:])
    }

    static let base = """
        node:
          id: node1
          data_dir: /tmp/x
        network:
          publish: tcp://127.0.0.1:7001
          api: tcp://127.0.0.1:7101
        """

    @Test func aCompleteSecurityConfigurationLoads() throws {
        let configuration = try Self.load(
            Self.base + """

                  peers:
                    - node2=tcp://127.0.0.1:7002
                security:
                  secret_key: keys/node1.key
                  peer_keys:
                    - node2=keys/node2.key.pub
                  client_keys:
                    - keys/cli.key.pub
                """)
        let scoped = try Self.load(
            Self.base + """

                  peers:
                    - node2=tcp://127.0.0.1:7002
                security:
                  secret_key: keys/node1.key
                  peer_keys: [node2=K, node2=NEW]
                  client_keys:
                    - keys/dash.key.pub read=*
                    - keys/sensor.key.pub read=sensors/*|alerts write=sensors/*
                """)
        #expect(
            scoped.security?.clients == [
                .init(key: "keys/dash.key.pub", read: ["*"], write: []),
                .init(key: "keys/sensor.key.pub", read: ["sensors/*", "alerts"], write: ["sensors/*"]),
            ])
        // A node named twice has two trusted keys (it is rotating); the same entry twice is a slip.
        #expect(scoped.security?.peerKeys == ["node2": ["K", "NEW"]])
        #expect(throws: StateSyncError.self) {
            try Self.load(
                Self.base
                    + "\n  peers:\n    - node2=tcp://127.0.0.1:7002\nsecurity:\n  secret_key: k\n  peer_keys: [node2=K, node2=K]\n"
            )
        }
        #expect(configuration.peers == ["tcp://127.0.0.1:7002"])
        #expect(configuration.peerNodeIDs == ["tcp://127.0.0.1:7002": "node2"])
        #expect(configuration.security?.peerKeys == ["node2": ["keys/node2.key.pub"]])
        #expect(configuration.security?.clients == [.init(key: "keys/cli.key.pub", read: ["*"], write: ["*"])])
        // Without security, NODE_ID= is optional and plain endpoints still load.
        let plain = try Self.load(Self.base + "\n  peers:\n    - tcp://127.0.0.1:7002\n")
        #expect(plain.security == nil && plain.peerNodeIDs.isEmpty)
    }

    @Test func theSecuredExampleConfigLoads() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../../Config")
        let config = try NodeConfiguration.load(
            file: root.appendingPathComponent("node1-secure.yaml").path, environment: [:])
        #expect(config.security?.secretKeyFile == "keys/node1.key")
        #expect(Set(config.peerNodeIDs.values) == ["node2", "node3"] && config.security?.peerKeys.count == 2)
    }

    @Test func halfOnSecurityIsRefusedNamingTheFileTheKeyAndTheFix() {
        func problem(_ yaml: String) -> String {
            do {
                _ = try Self.load(Self.base + yaml)
                return "loaded"
            } catch {
                return error.message
            }
        }
        let noSecret = problem("\n  peers:\n    - node2=tcp://127.0.0.1:7002\nsecurity:\n  peer_keys:\n    - node2=K\n")
        #expect(noSecret.hasPrefix("node1.yaml: security.peer_keys:") && noSecret.contains("secret_key"), "\(noSecret)")
        let noID = problem(
            "\n  peers:\n    - tcp://127.0.0.1:7002\nsecurity:\n  secret_key: k\n  peer_keys:\n    - node2=K\n")
        #expect(noID.contains("network.peers") && noID.contains("node2=tcp://127.0.0.1:7002"), "\(noID)")
        let noKey = problem("\n  peers:\n    - node2=tcp://127.0.0.1:7002\nsecurity:\n  secret_key: k\n")
        #expect(noKey.contains("security.peer_keys") && noKey.contains("no key for node2"), "\(noKey)")
        let badEntry = problem(
            "\n  peers:\n    - node2=tcp://127.0.0.1:7002\nsecurity:\n  secret_key: k\n  peer_keys:\n    - K\n")
        #expect(badEntry.contains("NODE_ID=KEY"), "\(badEntry)")
    }
}
