import CZeroMQ

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The events a socket or file descriptor is polled for, or has ready.
public struct PollEvents: OptionSet, Sendable {
    public let rawValue: Int16
    public init(rawValue: Int16) { self.rawValue = rawValue }

    /// At least one message can be received without blocking.
    public static let readable = PollEvents(rawValue: Int16(ZMQ_POLLIN))
    /// At least one message can be sent without blocking.
    public static let writable = PollEvents(rawValue: Int16(ZMQ_POLLOUT))
}

/// Waits for any of several sockets or file descriptors to become ready (`zmq_poll`).
///
/// Thread safety: the sockets it polls must belong to the calling thread.
public struct Poller {
    /// One thing to poll: a socket or a plain file descriptor (such as a ``WakeUp``).
    public enum Item {
        case socket(Socket, PollEvents)
        case fileDescriptor(Int32, PollEvents)
    }

    private var items: [zmq_pollitem_t] = []

    public init(_ items: [Item]) {
        for item in items {
            switch item {
            case .socket(let socket, let events):
                self.items.append(zmq_pollitem_t(socket: socket.rawHandle, fd: -1, events: events.rawValue, revents: 0))
            case .fileDescriptor(let fd, let events):
                self.items.append(zmq_pollitem_t(socket: nil, fd: fd, events: events.rawValue, revents: 0))
            }
        }
    }

    /// Waits up to `timeoutMilliseconds` (-1 = forever) and returns the ready events of each item,
    /// in the order the items were given. `EINTR` returns early with nothing ready.
    public mutating func poll(timeoutMilliseconds: Int) throws(ZeroMQError) -> [PollEvents] {
        for index in items.indices { items[index].revents = 0 }
        let count = Int32(items.count)
        let rc = items.withUnsafeMutableBufferPointer { buffer in
            zmq_poll(buffer.baseAddress, count, timeoutMilliseconds)
        }
        if rc < 0 {
            let code = zmq_errno()
            if code == EINTR { return items.map { _ in PollEvents() } }
            throw ZeroMQError(code: code, operation: "zmq_poll")
        }
        return items.map { PollEvents(rawValue: $0.revents) }
    }
}

/// Waits for any of several sockets or file descriptors to have something to read, with fewer
/// system calls than `zmq_poll`.
///
/// `zmq_poll` asks every socket for `ZMQ_EVENTS` before it waits and again after — each a
/// `getpid` and a `poll` of that socket's descriptor inside libzmq — so a wait on four sockets
/// made eighteen system calls, most of an idle node's wake-up. This poller asks only the sockets
/// that may hold messages their descriptor will not signal
/// (``Socket/mayHoldUnsignalledMessages``: one not read until empty, or used since), then waits
/// on every descriptor at once, then asks the sockets whose descriptor fired. A socket read
/// until it had nothing, and not used since, costs nothing until its descriptor fires.
///
/// Thread safety: the sockets it polls must belong to the calling thread.
public struct ReadPoller {
    /// One thing to poll for readability: a socket or a plain file descriptor (a ``WakeUp``).
    public enum Item {
        case socket(Socket)
        case fileDescriptor(Int32)
    }

    /// Per item, its socket (`nil` for a plain descriptor).
    private let sockets: [Socket?]
    private var descriptors: [pollfd]
    /// Per item, in the order given: whether it has something to read, as of the last ``poll(timeoutMilliseconds:)``.
    public private(set) var readable: [Bool]

    public init(_ items: [Item]) throws(ZeroMQError) {
        var sockets: [Socket?] = []
        var descriptors: [pollfd] = []
        for item in items {
            switch item {
            case .socket(let socket):
                sockets.append(socket)
                descriptors.append(pollfd(fd: try socket.fileDescriptor(), events: Int16(POLLIN), revents: 0))
            case .fileDescriptor(let fd):
                sockets.append(nil)
                descriptors.append(pollfd(fd: fd, events: Int16(POLLIN), revents: 0))
            }
        }
        self.sockets = sockets
        self.descriptors = descriptors
        readable = Array(repeating: false, count: items.count)
    }

    /// Waits up to `timeoutMilliseconds` (-1 = forever) for something to read, then sets
    /// ``readable``. Returns at once when a socket already holds a message. `EINTR` returns
    /// early with what was found before the wait.
    public mutating func poll(timeoutMilliseconds: Int) throws(ZeroMQError) {
        var found = false
        for index in sockets.indices {
            readable[index] = false
            guard let socket = sockets[index], socket.mayHoldUnsignalledMessages else { continue }
            if try socket.events().contains(.readable) {
                readable[index] = true
                found = true
            }
        }
        for index in descriptors.indices { descriptors[index].revents = 0 }
        let count = nfds_t(descriptors.count)
        let timeout = found ? 0 : Int32(clamping: timeoutMilliseconds)
        let rc = descriptors.withUnsafeMutableBufferPointer { buffer in systemPoll(buffer.baseAddress, count, timeout) }
        if rc < 0 {
            let code = errno
            if code == EINTR { return }
            throw ZeroMQError(code: code, operation: "poll")
        }
        guard rc > 0 else { return }
        for index in descriptors.indices where descriptors[index].revents != 0 && !readable[index] {
            if let socket = sockets[index] {
                // The descriptor says commands arrived; whether a message came with them, only
                // ZMQ_EVENTS tells (asking it also quiets the descriptor).
                readable[index] = try socket.events().contains(.readable)
            } else {
                readable[index] = true
            }
        }
    }
}

/// `poll(2)` (inside ``ReadPoller``, the name is its own method's).
private func systemPoll(_ descriptors: UnsafeMutablePointer<pollfd>?, _ count: nfds_t, _ timeout: Int32) -> Int32 {
    poll(descriptors, count, timeout)
}
