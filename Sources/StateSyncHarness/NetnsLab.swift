import ChildProcesses
import Foundation

/// `statesync harness --netns`: every node a separate host in its own network namespace, with its
/// own address on a private bridge, so faults are real network faults. Root only; needs `ip`
/// (iproute2).
///
/// Topology: a bridge in its own namespace; one veth pair per node (node side `eth0`, address
/// 10.231.S.i/24); one veth pair from the harness (the root namespace, 10.231.S.254) to the
/// bridge, so clients reach every node. A partition installs blackhole routes for the other
/// group's addresses in each node's namespace (both ways); loss takes a node's link down in short
/// bursts (this kernel has no netem). Everything is removed at the end.
final class NetnsLab: Sendable {
    let tag: String
    let subnet: Int
    let nodes: Int
    let ip: String

    init(nodes: Int, seed: UInt64) throws {
        guard getuid() == 0 else { throw HarnessError("--netns needs root (it creates network namespaces)") }
        guard
            let ip = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].first(
                where: FileManager.default.isExecutableFile)
        else {
            throw HarnessError("--netns needs the ip command (Debian: apt-get install iproute2)")
        }
        self.ip = ip
        self.nodes = nodes
        self.subnet = 100 + Int((seed &+ UInt64(getpid())) % 150)
        self.tag = "ss\(String(getpid() % 10000, radix: 36))"
        do {
            try setUp()
        } catch {
            tearDown()
            throw error
        }
    }

    var bridgeNamespace: String { "\(tag)-br" }
    func namespace(_ node: Int) -> String { "\(tag)-n\(node + 1)" }
    func address(_ node: Int) -> String { "10.231.\(subnet).\(node + 1)" }
    var harnessAddress: String { "10.231.\(subnet).254" }

    private func run(_ arguments: [String]) throws {
        let ran = try SpawnedProcess.run(ip, arguments, environment: ProcessInfo.processInfo.environment)
        guard ran.status == 0 else {
            throw HarnessError(
                "ip \(arguments.joined(separator: " ")) failed: \(ran.output.trimmingCharacters(in: .whitespacesAndNewlines))"
            )
        }
    }

    private func inside(_ namespace: String, _ arguments: [String]) throws {
        try run(["netns", "exec", namespace, ip] + arguments)
    }

    private func setUp() throws {
        try run(["netns", "add", bridgeNamespace])
        try inside(bridgeNamespace, ["link", "add", "br0", "type", "bridge"])
        try inside(bridgeNamespace, ["link", "set", "br0", "up"])
        for node in 0..<nodes {
            let ns = namespace(node)
            let outer = "\(tag)b\(node + 1)"
            let inner = "\(tag)e\(node + 1)"
            try run(["netns", "add", ns])
            try inside(ns, ["link", "set", "lo", "up"])
            try run(["link", "add", inner, "type", "veth", "peer", "name", outer])
            try run(["link", "set", inner, "netns", ns])
            try run(["link", "set", outer, "netns", bridgeNamespace])
            try inside(ns, ["link", "set", inner, "name", "eth0"])
            try inside(ns, ["addr", "add", "\(address(node))/24", "dev", "eth0"])
            try inside(ns, ["link", "set", "eth0", "up"])
            try inside(bridgeNamespace, ["link", "set", outer, "master", "br0"])
            try inside(bridgeNamespace, ["link", "set", outer, "up"])
        }
        let host = "\(tag)h"
        let hostPeer = "\(tag)hb"
        try run(["link", "add", host, "type", "veth", "peer", "name", hostPeer])
        try run(["link", "set", hostPeer, "netns", bridgeNamespace])
        try inside(bridgeNamespace, ["link", "set", hostPeer, "master", "br0"])
        try inside(bridgeNamespace, ["link", "set", hostPeer, "up"])
        try run(["addr", "add", "\(harnessAddress)/24", "dev", host])
        try run(["link", "set", host, "up"])
    }

    /// Removes every namespace and link the lab created (idempotent; errors ignored).
    func tearDown() {
        for node in 0..<nodes { try? run(["netns", "del", namespace(node)]) }
        try? run(["netns", "del", bridgeNamespace])
        try? run(["link", "del", "\(tag)h"])
    }

    /// The command line that runs `executable` inside node `node`'s namespace.
    func launcher(node: Int, executable: String) -> (executable: String, arguments: [String]) {
        (ip, ["netns", "exec", namespace(node), executable])
    }

    /// Cuts (or heals) every link between `group` and the other nodes, both ways.
    func setPartition(_ group: Set<Int>, cut: Bool) {
        for a in 0..<nodes {
            for b in 0..<nodes where group.contains(a) != group.contains(b) {
                try? inside(namespace(a), ["route", cut ? "add" : "del", "blackhole", "\(address(b))/32"])
            }
        }
    }

    /// Takes node `node`'s link down (or up).
    func setLink(node: Int, up: Bool) {
        try? inside(namespace(node), ["link", "set", "eth0", up ? "up" : "down"])
    }
}
