/// What `statesync harness` runs.
public struct HarnessOptions: Sendable {
    /// The faults the harness can inject.
    public enum Fault: String, Sendable, CaseIterable {
        /// `kill -9` a node, then restart it on its data directory.
        case kill
        /// SIGSTOP a node, then SIGCONT.
        case pause
        /// Cut every link between two groups of nodes, both ways, then heal.
        case partition
        /// Delay a node's inbound links and reset their connections (in-flight data lost).
        case loss
        /// Run one node with its wall clock skewed.
        case clock
        /// The last node is not in the cluster at the start: it knows only the first node, and
        /// no one knows it. The first join starts it (it must learn the members and be learned,
        /// docs/PROTOCOL.md 7.5); later joins stop it cleanly and start it again.
        case join
        /// Stop a node cleanly (SIGTERM: it says it leaves, its peers drop their links to it),
        /// then start it again on its data directory.
        case leave
    }

    /// Faults planted in a node to prove the checker can fail (test only).
    public enum PlantedBug: String, Sendable, CaseIterable {
        /// One node silently discards a share of the remote deltas it should apply, and never
        /// repairs them (`STATESYNC_TEST_DROP_REMOTE_DELTAS`). No fault restarts that node: a
        /// restart forgets which deltas it dropped, and repair would then mend them.
        case dropDeltas = "drop-deltas"
        /// One node never deletes the values whose time to live ran out
        /// (`STATESYNC_TEST_NEVER_EXPIRE`).
        case neverExpire = "never-expire"
    }

    public var nodes = 3
    public var operations = 2000
    public var seed: UInt64 = 1
    public var faults: [Fault] = []
    public var plantedBug: PlantedBug?
    /// Concurrent writer clients.
    public var clients = 4
    /// Distinct models written (in channel `harness`).
    public var models = 16
    /// Run every node in its own network namespace (root only).
    public var netns = false
    /// Key every node and client (CurveZMQ on every socket, docs/PROTOCOL.md section 14).
    public var secure = false
    /// Keep the nodes' logs and data even when every check passes.
    public var keep = false
    /// Where to put the nodes' data and logs (a fresh temporary directory by default).
    public var workDirectory: String?
    /// The `statesyncd` executable.
    public var daemonPath: String
    /// How long the cluster may take to converge after the last fault heals.
    public var convergenceTimeoutSeconds = 60

    public init(daemonPath: String) {
        self.daemonPath = daemonPath
    }
}
