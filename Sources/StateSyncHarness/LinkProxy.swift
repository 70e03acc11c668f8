import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A TCP relay for one directed link between two nodes on loopback: the harness's wire cutter.
///
/// Node A subscribes to node B through the relay; the harness can cut the link (every
/// connection closed, new ones refused), add delay, and reset connections (in-flight bytes are
/// lost, as with packet loss severe enough to break a connection). Real sockets, real faults, no
/// cooperation from the daemons.
///
/// Thread safety: the relay runs on its own thread; its controls may be called from any thread.
package final class LinkProxy: Sendable {
    struct Controls: Sendable {
        var cut = false
        var delayMilliseconds = 0
        var resetRequested = false
    }

    let name: String
    let target: (host: String, port: Int)
    let listenPort: Int
    private let controls = Mutex(Controls())
    /// With `capture`, every byte relayed from the target to the subscriber (up to 64 MiB): what
    /// an eavesdropper on the wire would see.
    private let captured: Mutex<[UInt8]>?
    private let stopped = Atomic<Bool>(false)
    private let listener: Int32

    /// Binds a listener on 127.0.0.1 (a free port) relaying to `target`.
    package init(name: String, targetPort: Int, capture: Bool = false) throws {
        self.name = name
        self.captured = capture ? Mutex([]) : nil
        self.target = ("127.0.0.1", targetPort)
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("cannot create a relay socket: \(String(cString: strerror(errno)))") }
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, length) == 0 && listen(fd, 16) == 0 && getsockname(fd, $0, &length) == 0
            }
        }
        guard ok else {
            Glibc.close(fd)
            throw HarnessError("cannot bind a relay on 127.0.0.1: \(String(cString: strerror(errno)))")
        }
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        listener = fd
        listenPort = Int(UInt16(bigEndian: address.sin_port))
        let thread = Thread { [self] in self.run() }
        thread.name = "harness-relay-\(name)"
        thread.start()
    }

    package var endpoint: String { "tcp://127.0.0.1:\(listenPort)" }

    /// The bytes relayed from the target so far (empty without `capture`).
    package var capturedBytes: [UInt8] { captured?.withLock { $0 } ?? [] }

    func setCut(_ cut: Bool) { controls.withLock { $0.cut = cut } }
    func setDelay(milliseconds: Int) { controls.withLock { $0.delayMilliseconds = milliseconds } }
    func reset() { controls.withLock { $0.resetRequested = true } }
    package func stop() { stopped.store(true, ordering: .releasing) }

    // MARK: - The relay thread

    private struct Chunk {
        let due: UInt64
        var bytes: [UInt8]
    }

    private final class Pair {
        let inbound: Int32
        let outbound: Int32
        var toTarget: [Chunk] = []
        var toClient: [Chunk] = []
        var closed = false
        init(inbound: Int32, outbound: Int32) {
            self.inbound = inbound
            self.outbound = outbound
        }
    }

    private func run() {
        var pairs: [Pair] = []
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while !stopped.load(ordering: .acquiring) {
            let now = Self.milliseconds()
            let (cut, delay, reset) = controls.withLock { c -> (Bool, Int, Bool) in
                defer { c.resetRequested = false }
                return (c.cut, c.delayMilliseconds, c.resetRequested)
            }
            if cut || reset {
                for pair in pairs { close(pair) }
                pairs.removeAll()
            }
            // Accept (and, while cut, refuse) new connections.
            while true {
                let client = accept(listener, nil, nil)
                if client < 0 { break }
                if cut {
                    Glibc.close(client)
                    continue
                }
                guard let upstream = connectTarget() else {
                    Glibc.close(client)
                    continue
                }
                _ = fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK)
                pairs.append(Pair(inbound: client, outbound: upstream))
            }
            var fds: [pollfd] = [pollfd(fd: listener, events: Int16(POLLIN), revents: 0)]
            for pair in pairs {
                fds.append(pollfd(fd: pair.inbound, events: Int16(POLLIN), revents: 0))
                fds.append(pollfd(fd: pair.outbound, events: Int16(POLLIN), revents: 0))
            }
            let hasPending = pairs.contains { !$0.toTarget.isEmpty || !$0.toClient.isEmpty }
            _ = poll(&fds, nfds_t(fds.count), hasPending ? 2 : 20)
            for (index, pair) in pairs.enumerated() {
                let inEvents = fds[1 + 2 * index].revents
                let outEvents = fds[2 + 2 * index].revents
                if inEvents != 0 {
                    pump(from: pair.inbound, into: &pair.toTarget, pair: pair, buffer: &buffer, delay: delay, now: now)
                }
                if outEvents != 0 {
                    let queued = pair.toClient.count
                    pump(from: pair.outbound, into: &pair.toClient, pair: pair, buffer: &buffer, delay: delay, now: now)
                    if pair.toClient.count > queued, let chunk = pair.toClient.last {
                        captured?.withLock { if $0.count < 64 << 20 { $0 += chunk.bytes } }
                    }
                }
                flush(&pair.toTarget, to: pair.outbound, pair: pair)
                flush(&pair.toClient, to: pair.inbound, pair: pair)
            }
            for pair in pairs where pair.closed { close(pair) }
            pairs.removeAll { $0.closed }
        }
        for pair in pairs { close(pair) }
        Glibc.close(listener)
    }

    private func pump(
        from fd: Int32, into queue: inout [Chunk], pair: Pair, buffer: inout [UInt8], delay: Int, now: UInt64
    ) {
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n > 0 {
            queue.append(Chunk(due: now + UInt64(delay), bytes: Array(buffer[0..<n])))
        } else if n == 0 || (errno != EAGAIN && errno != EINTR) {
            pair.closed = true
        }
    }

    private func flush(_ queue: inout [Chunk], to fd: Int32, pair: Pair) {
        let now = Self.milliseconds()
        while let first = queue.first, first.due <= now, !pair.closed {
            // `send` with MSG_NOSIGNAL, not `write`: a node the run killed leaves its end reset,
            // and a `write` to it raised SIGPIPE, which ended the whole harness (exit status 13,
            // nothing printed; seen once in CI). EPIPE closes the pair like any other error.
            let n = first.bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EAGAIN || errno == EINTR { return }
                pair.closed = true
                return
            }
            if n < first.bytes.count {
                queue[0].bytes.removeFirst(n)
                return
            }
            queue.removeFirst()
        }
    }

    private func close(_ pair: Pair) {
        Glibc.close(pair.inbound)
        Glibc.close(pair.outbound)
        pair.closed = true
    }

    private func connectTarget() -> Int32? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(target.port).bigEndian)
        address.sin_addr.s_addr = inet_addr(target.host)
        let ok = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
        guard ok else {
            Glibc.close(fd)
            return nil
        }
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        return fd
    }

    static func milliseconds() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return UInt64(spec.tv_sec) * 1000 + UInt64(spec.tv_nsec) / 1_000_000
    }
}

/// An error of the harness itself (not a verdict): one line a person can act on.
struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
