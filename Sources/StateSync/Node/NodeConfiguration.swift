/// Everything a node needs to run: who it is, where it publishes, whom it follows, where clients
/// reach it and where it keeps its data. Load it from YAML with ``load(file:environment:)``.
public struct NodeConfiguration: Sendable, Equatable {
    /// This node's id, unique in the cluster: stamped into every version it writes.
    public var nodeID: String
    /// Where this node keeps its state (created when missing).
    public var dataDirectory: String
    /// The endpoint this node's PUB socket binds, e.g. `tcp://127.0.0.1:7001`.
    public var publishEndpoint: String
    /// The publish endpoints of the other nodes, which this node's SUB sockets connect to.
    public var peers: [String]
    /// The endpoint of the client API (ROUTER), e.g. `tcp://127.0.0.1:7101`; `nil` for an
    /// embedded node that serves no clients.
    public var apiEndpoint: String?
    /// How often the node publishes a heartbeat.
    public var heartbeatIntervalMilliseconds: Int
    /// A peer whose clock is further ahead than this is not followed (and is logged and counted).
    public var maximumClockDriftMilliseconds: Int
    /// The log level of the daemon (`trace` … `critical`).
    public var logLevel: String

    public init(
        nodeID: String,
        dataDirectory: String,
        publishEndpoint: String,
        peers: [String] = [],
        apiEndpoint: String? = nil,
        heartbeatIntervalMilliseconds: Int = 500,
        maximumClockDriftMilliseconds: Int = 60_000,
        logLevel: String = "info"
    ) {
        self.nodeID = nodeID
        self.dataDirectory = dataDirectory
        self.publishEndpoint = publishEndpoint
        self.peers = peers
        self.apiEndpoint = apiEndpoint
        self.heartbeatIntervalMilliseconds = heartbeatIntervalMilliseconds
        self.maximumClockDriftMilliseconds = maximumClockDriftMilliseconds
        self.logLevel = logLevel
    }
}
