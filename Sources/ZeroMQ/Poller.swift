import CZeroMQ

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
