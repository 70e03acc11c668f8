public import StateSync
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
/// A port handed out by this process is not handed out again, nor one another live process has
/// claimed through this type (a claim is a file named after the port in a shared directory,
/// holding the claimant's pid; claims of dead processes are taken over).
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
            if ok, claim(candidate), handedOut.withLock({ $0.insert(candidate).inserted }) { return candidate }
        }
        throw StateSyncError(.transport, "no free port on 127.0.0.1 in 20000...32000")
    }

    private static let claims = "/tmp/statesync-loopback-ports"

    /// Claims `port` for this process across processes; `false` when a live process holds it.
    private static func claim(_ port: Int) -> Bool {
        mkdir(claims, 0o777)
        let path = "\(claims)/\(port)"
        let me = getpid()
        for _ in 0..<2 {
            let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o666)
            if fd >= 0 {
                let text = Array("\(me)".utf8)
                _ = text.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                close(fd)
                return true
            }
            guard errno == EEXIST else { return true }  // no shared directory: rely on the probe
            var buffer = [UInt8](repeating: 0, count: 32)
            let reader = open(path, O_RDONLY | O_CLOEXEC)
            guard reader >= 0 else { return false }
            let count = buffer.withUnsafeMutableBytes { read(reader, $0.baseAddress, $0.count) }
            close(reader)
            let owner = Int32(String(decoding: buffer.prefix(max(count, 0)), as: UTF8.self)) ?? 0
            if owner == me { return true }
            if owner > 0 && kill(owner, 0) == 0 { return false }  // a live process holds it
            unlink(path)  // a dead process's claim: take it over
        }
        return false
    }
}
