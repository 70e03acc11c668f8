import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Free TCP ports on 127.0.0.1 for tools that start nodes on loopback (the harness, the
/// benchmark, tests).
///
/// Ports are chosen below Linux's ephemeral range (32768–60999), where outgoing connections take
/// their local ports: a port probed free there can be taken by any `connect()` a moment later.
/// A port handed out by this process is not handed out again.
public enum LoopbackPorts {
    private static let handedOut = Mutex<Set<Int>>([])

    /// A port that is free now.
    public static func free() throws(StateSyncError) -> Int {
        for _ in 0..<2000 {
            let candidate = Int.random(in: 20_000...32_000)
            if handedOut.withLock({ $0.contains(candidate) }) { continue }
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            guard fd >= 0 else { throw StateSyncError(.transport, "cannot create a socket to probe ports") }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = in_port_t(UInt16(candidate).bigEndian)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            let ok = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
                }
            }
            close(fd)
            if ok, handedOut.withLock({ $0.insert(candidate).inserted }) { return candidate }
        }
        throw StateSyncError(.transport, "no free port on 127.0.0.1 in 20000...32000")
    }
}
