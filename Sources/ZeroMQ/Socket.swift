import CZeroMQ

/// A libzmq socket.
///
/// Thread safety: none. A socket belongs to the thread that uses it (libzmq sockets are not
/// thread-safe), which is why this type is not `Sendable`. Other threads talk to the owner
/// through a command queue and a wake-up (see ``Poller`` and ``WakeUp``).
///
/// The socket closes when it is deinitialised or when ``close()`` is called. Its linger is set to
/// 0 ms at creation so that closing it and terminating its context never hang.
public final class Socket {
    private var handle: UnsafeMutableRawPointer?
    /// The socket's pattern.
    public let type: SocketType
    private let context: Context
    /// A reusable message for receives; `zmq_msg_t` must stay at a stable address while in use.
    private let message: UnsafeMutablePointer<zmq_msg_t>
    /// Whether a message may be waiting that ``fileDescriptor()`` will not signal. libzmq's
    /// descriptor signals commands to the socket (a pipe became readable, a peer connected),
    /// not messages: once a call has processed those commands — any call may — messages can wait
    /// with the descriptor quiet. Only a receive that found nothing, or ``events()`` without
    /// `.readable`, leaves every later message to be signalled; any other call of this type that
    /// reaches libzmq with the socket (send, receive, options, endpoints) sets this again.
    /// ``ReadPoller`` asks `ZMQ_EVENTS` only of sockets where this is set (`zmq_poll` asks every
    /// socket, twice per wait, two system calls each). The `zmq_poll` of ``Poller`` processes
    /// commands without setting it: poll one socket with one kind of poller, not both.
    public private(set) var mayHoldUnsignalledMessages = true
    /// Whether ``monitor(_:on:)`` started a monitor that ``stopMonitoring()`` has not stopped.
    private var isMonitored = false

    init(context: Context, type: SocketType) throws(ZeroMQError) {
        guard let handle = zmq_socket(context.handle, type.rawValue) else {
            throw ZeroMQError(code: zmq_errno(), operation: "zmq_socket(\(type))")
        }
        self.handle = handle
        self.type = type
        self.context = context
        self.message = .allocate(capacity: 1)
        try setLinger(milliseconds: 0)
    }

    deinit {
        close()
        message.deallocate()
    }

    /// Closes the socket (stopping its monitor first: see ``monitor(_:on:)``). Further calls
    /// throw `ENOTSOCK`; closing twice is harmless.
    public func close() {
        stopMonitoring()
        if let handle {
            zmq_close(handle)
            self.handle = nil
        }
    }

    var rawHandle: UnsafeMutableRawPointer {
        guard let handle else { preconditionFailure("ZeroMQ socket used after close()") }
        return handle
    }

    /// The handle for a call that may process the socket's commands (see
    /// ``mayHoldUnsignalledMessages``).
    private var handleForCommands: UnsafeMutableRawPointer {
        mayHoldUnsignalledMessages = true
        return rawHandle
    }

    // MARK: - Endpoints

    /// Binds to `endpoint` (`tcp://127.0.0.1:7001`, `tcp://127.0.0.1:*`, `inproc://name`, ...).
    public func bind(_ endpoint: String) throws(ZeroMQError) {
        let handle = handleForCommands
        try zmqCheck("zmq_bind(\(endpoint))") { zmq_bind(handle, endpoint) }
    }

    /// Connects to `endpoint`; libzmq reconnects by itself when the peer goes away.
    public func connect(_ endpoint: String) throws(ZeroMQError) {
        let handle = handleForCommands
        try zmqCheck("zmq_connect(\(endpoint))") { zmq_connect(handle, endpoint) }
    }

    /// Disconnects from an endpoint previously passed to ``connect(_:)``.
    public func disconnect(_ endpoint: String) throws(ZeroMQError) {
        let handle = handleForCommands
        try zmqCheck("zmq_disconnect(\(endpoint))") { zmq_disconnect(handle, endpoint) }
    }

    /// Stops listening on an endpoint previously passed to ``bind(_:)``.
    public func unbind(_ endpoint: String) throws(ZeroMQError) {
        let handle = handleForCommands
        try zmqCheck("zmq_unbind(\(endpoint))") { zmq_unbind(handle, endpoint) }
    }

    /// The endpoint the socket last bound to, with a wildcard port resolved (`ZMQ_LAST_ENDPOINT`).
    public func lastEndpoint() throws(ZeroMQError) -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        var size = buffer.count
        let handle = handleForCommands
        try zmqCheck("zmq_getsockopt(ZMQ_LAST_ENDPOINT)") {
            buffer.withUnsafeMutableBytes { raw in zmq_getsockopt(handle, ZMQ_LAST_ENDPOINT, raw.baseAddress, &size) }
        }
        return String(zeroTerminated: buffer)
    }

    // MARK: - Sending

    /// Sends one multipart message. Returns `false` when the message could not be queued without
    /// blocking (`dontWait` and the high-water mark reached, or no peer for ROUTER_MANDATORY).
    @discardableResult
    public func send(_ frames: [[UInt8]], dontWait: Bool = false) throws(ZeroMQError) -> Bool {
        precondition(!frames.isEmpty, "a ZeroMQ message has at least one frame")
        let handle = handleForCommands
        let last = frames.count - 1
        for (index, frame) in frames.enumerated() {
            var flags: Int32 = index < last ? ZMQ_SNDMORE : 0
            if dontWait { flags |= ZMQ_DONTWAIT }
            let result = try zmqCall("zmq_send(\(type))") {
                frame.withUnsafeBytes { bytes in zmq_send(handle, bytes.baseAddress, bytes.count, flags) }
            }
            if case .wouldBlock = result {
                // libzmq is atomic per multipart message: a refused first frame queues nothing;
                // later frames of a message cannot be refused once the first was accepted.
                precondition(index == 0, "libzmq refused a later frame of a multipart message")
                return false
            }
        }
        return true
    }

    /// Sends one single-frame message given as a string.
    @discardableResult
    public func send(_ text: String, dontWait: Bool = false) throws(ZeroMQError) -> Bool {
        try send([Array(text.utf8)], dontWait: dontWait)
    }

    // MARK: - Receiving

    /// Receives one whole multipart message. Returns `nil` when nothing is waiting and `dontWait`
    /// is set, or when the receive timeout (``setReceiveTimeout(milliseconds:)``) expires.
    public func receive(dontWait: Bool = false) throws(ZeroMQError) -> [[UInt8]]? {
        try receive(dontWait: dontWait, property: nil)?.frames
    }

    /// Receives one whole multipart message and the metadata `property` of its first frame that
    /// has it (`zmq_msg_gets`, e.g. `"User-Id"`: the user id a ZAP handler gave the sender), `nil` when
    /// the message has none.
    public func receive(dontWait: Bool = false, property: String?) throws(ZeroMQError) -> (
        frames: [[UInt8]], property: String?
    )? {
        let handle = handleForCommands
        let message = self.message
        var frames: [[UInt8]] = []
        var value: String?
        var flags: Int32 = dontWait ? ZMQ_DONTWAIT : 0
        repeat {
            zmq_msg_init(message)
            defer { zmq_msg_close(message) }
            let result = try zmqCall("zmq_msg_recv(\(type))") { zmq_msg_recv(message, handle, flags) }
            guard case .done(let size) = result else {
                // A would-block can only happen before the first frame: libzmq delivers
                // multipart messages atomically.
                precondition(frames.isEmpty, "libzmq delivered part of a multipart message")
                // Nothing waits: the next message into an emptied pipe is signalled.
                mayHoldUnsignalledMessages = false
                return nil
            }
            let data = zmq_msg_data(message)
            // (On a ROUTER the routing id frame is made locally and carries no metadata: take the
            // first frame that does.)
            if value == nil, let property, let text = zmq_msg_gets(message, property) {
                value = String(cString: text)
            }
            frames.append(Array(UnsafeRawBufferPointer(start: data, count: Int(size))))
            // Later frames are already here; never wait for them.
            flags = ZMQ_DONTWAIT
        } while zmq_msg_more(message) == 1
        return (frames, value)
    }

    // MARK: - Options

    private func setOption(_ name: Int32, _ label: String, int value: Int32) throws(ZeroMQError) {
        var value = value
        let handle = handleForCommands
        try zmqCheck("zmq_setsockopt(\(label))") {
            zmq_setsockopt(handle, name, &value, MemoryLayout<Int32>.size)
        }
    }

    private func setOption(_ name: Int32, _ label: String, bytes: [UInt8]) throws(ZeroMQError) {
        let handle = handleForCommands
        try zmqCheck("zmq_setsockopt(\(label))") {
            bytes.withUnsafeBytes { raw in zmq_setsockopt(handle, name, raw.baseAddress, raw.count) }
        }
    }

    private func intOption(_ name: Int32, _ label: String) throws(ZeroMQError) -> Int32 {
        var value: Int32 = 0
        var size = MemoryLayout<Int32>.size
        let handle = handleForCommands
        try zmqCheck("zmq_getsockopt(\(label))") { zmq_getsockopt(handle, name, &value, &size) }
        return value
    }

    /// How long pending outgoing messages are kept after close (`ZMQ_LINGER`); -1 = forever.
    public func setLinger(milliseconds: Int32) throws(ZeroMQError) {
        try setOption(ZMQ_LINGER, "ZMQ_LINGER", int: milliseconds)
    }

    /// The outgoing high-water mark in messages (`ZMQ_SNDHWM`); 0 = unbounded.
    public func setSendHighWaterMark(_ messages: Int32) throws(ZeroMQError) {
        try setOption(ZMQ_SNDHWM, "ZMQ_SNDHWM", int: messages)
    }

    /// The incoming high-water mark in messages (`ZMQ_RCVHWM`); 0 = unbounded.
    public func setReceiveHighWaterMark(_ messages: Int32) throws(ZeroMQError) {
        try setOption(ZMQ_RCVHWM, "ZMQ_RCVHWM", int: messages)
    }

    /// The kernel's receive buffer of the socket's connections, in bytes (`ZMQ_RCVBUF`,
    /// SO_RCVBUF); -1 = the OS default (which autotunes, on Linux up to `tcp_rmem`'s maximum).
    public func setReceiveBufferSize(bytes: Int32) throws(ZeroMQError) {
        try setOption(ZMQ_RCVBUF, "ZMQ_RCVBUF", int: bytes)
    }

    /// How long a blocking receive waits before returning `nil` (`ZMQ_RCVTIMEO`); -1 = forever.
    public func setReceiveTimeout(milliseconds: Int32) throws(ZeroMQError) {
        try setOption(ZMQ_RCVTIMEO, "ZMQ_RCVTIMEO", int: milliseconds)
    }

    /// How long a blocking send waits before reporting would-block (`ZMQ_SNDTIMEO`).
    public func setSendTimeout(milliseconds: Int32) throws(ZeroMQError) {
        try setOption(ZMQ_SNDTIMEO, "ZMQ_SNDTIMEO", int: milliseconds)
    }

    /// The identity a ROUTER peer sees for this socket (`ZMQ_ROUTING_ID`).
    public func setRoutingID(_ id: [UInt8]) throws(ZeroMQError) {
        try setOption(ZMQ_ROUTING_ID, "ZMQ_ROUTING_ID", bytes: id)
    }

    /// On a ROUTER socket: report unroutable messages as would-block instead of dropping them.
    public func setRouterMandatory(_ on: Bool) throws(ZeroMQError) {
        try setOption(ZMQ_ROUTER_MANDATORY, "ZMQ_ROUTER_MANDATORY", int: on ? 1 : 0)
    }

    /// On a ROUTER socket: a peer reconnecting with a routing id already in use takes it over
    /// (`ZMQ_ROUTER_HANDOVER`) instead of being refused.
    public func setRouterHandover(_ on: Bool) throws(ZeroMQError) {
        try setOption(ZMQ_ROUTER_HANDOVER, "ZMQ_ROUTER_HANDOVER", int: on ? 1 : 0)
    }

    /// Queue messages only to completed connections (`ZMQ_IMMEDIATE`).
    public func setImmediate(_ on: Bool) throws(ZeroMQError) {
        try setOption(ZMQ_IMMEDIATE, "ZMQ_IMMEDIATE", int: on ? 1 : 0)
    }

    /// The interval between reconnection attempts (`ZMQ_RECONNECT_IVL`).
    public func setReconnectInterval(milliseconds: Int32) throws(ZeroMQError) {
        try setOption(ZMQ_RECONNECT_IVL, "ZMQ_RECONNECT_IVL", int: milliseconds)
    }

    /// The largest inbound message accepted (`ZMQ_MAXMSGSIZE`); a peer sending a larger one is
    /// disconnected. -1 = no limit.
    public func setMaximumMessageSize(_ bytes: Int64) throws(ZeroMQError) {
        var value = bytes
        let handle = handleForCommands
        try zmqCheck("zmq_setsockopt(ZMQ_MAXMSGSIZE)") {
            zmq_setsockopt(handle, ZMQ_MAXMSGSIZE, &value, MemoryLayout<Int64>.size)
        }
    }

    /// On a SUB socket: receive messages whose first frame starts with `prefix` (empty = all).
    public func subscribe(_ prefix: [UInt8] = []) throws(ZeroMQError) {
        try setOption(ZMQ_SUBSCRIBE, "ZMQ_SUBSCRIBE", bytes: prefix)
    }

    /// On a SUB socket: undo one ``subscribe(_:)`` with the same prefix.
    public func unsubscribe(_ prefix: [UInt8] = []) throws(ZeroMQError) {
        try setOption(ZMQ_UNSUBSCRIBE, "ZMQ_UNSUBSCRIBE", bytes: prefix)
    }

    /// Publishes `kinds` of this socket's connection events as monitor events on `endpoint`
    /// (`inproc://…`), for a PAIR socket connected there (`zmq_socket_monitor`); decode them with
    /// ``MonitorEvent/init(frames:)``.
    ///
    /// Connect the reading PAIR before this socket can have events (before it binds or
    /// connects), and call ``stopMonitoring()`` before closing the reader. libzmq sends each
    /// event from its I/O thread with a blocking send: an event with no reader connected blocks
    /// that thread for good, and with it every connection of the context (nothing is sent or
    /// received any more, a closed socket never releases its port, terminating the context
    /// hangs). ``close()`` stops the monitor first, so events of a closing socket's last
    /// connections are dropped.
    public func monitor(_ kinds: MonitorEvent.Kinds, on endpoint: String) throws(ZeroMQError) {
        let handle = handleForCommands
        let events = Int32(kinds.rawValue)
        try zmqCheck("zmq_socket_monitor") { zmq_socket_monitor(handle, endpoint, events) }
        isMonitored = true
    }

    /// Stops the monitor started by ``monitor(_:on:)``: later events are dropped, so its reader
    /// may then be closed. Does nothing on a socket that is not monitored or is closed.
    public func stopMonitoring() {
        guard isMonitored, let handle else { return }
        // Fails only for a closed socket or a bad handle, neither of which is the case here.
        _ = zmq_socket_monitor(handle, nil, 0)
        isMonitored = false
    }

    /// Publishes this socket's failed security handshakes that never reach a ZAP handler as
    /// monitor events on `endpoint`.
    @available(*, deprecated, renamed: "monitor(_:on:)", message: "monitor(.handshakeFailed, on: endpoint)")
    public func monitorHandshakeFailures(on endpoint: String) throws(ZeroMQError) {
        try monitor(.handshakeFailed, on: endpoint)
    }

    /// The ZAP domain this socket's handshakes are authenticated in (`ZMQ_ZAP_DOMAIN`): the ZAP
    /// handler sees it in each request, so it can admit a key on one socket and not another.
    public func setZAPDomain(_ domain: String) throws(ZeroMQError) {
        try setOption(ZMQ_ZAP_DOMAIN, "ZMQ_ZAP_DOMAIN", bytes: Array(domain.utf8))
    }

    /// Makes this socket a CURVE server with `secretKey` (32 bytes).
    public func setCurveServer(secretKey: [UInt8]) throws(ZeroMQError) {
        try setOption(ZMQ_CURVE_SERVER, "ZMQ_CURVE_SERVER", int: 1)
        try setOption(ZMQ_CURVE_SECRETKEY, "ZMQ_CURVE_SECRETKEY", bytes: secretKey)
    }

    /// Makes this socket a CURVE client of the server with `serverKey`, using its own key pair.
    public func setCurveClient(serverKey: [UInt8], publicKey: [UInt8], secretKey: [UInt8]) throws(ZeroMQError) {
        try setOption(ZMQ_CURVE_SERVERKEY, "ZMQ_CURVE_SERVERKEY", bytes: serverKey)
        try setOption(ZMQ_CURVE_PUBLICKEY, "ZMQ_CURVE_PUBLICKEY", bytes: publicKey)
        try setOption(ZMQ_CURVE_SECRETKEY, "ZMQ_CURVE_SECRETKEY", bytes: secretKey)
    }

    /// The socket's events right now (`ZMQ_EVENTS`).
    public func events() throws(ZeroMQError) -> PollEvents {
        let events = PollEvents(rawValue: Int16(truncatingIfNeeded: try intOption(ZMQ_EVENTS, "ZMQ_EVENTS")))
        // Its commands are processed: without a message waiting, the descriptor signals the next.
        if !events.contains(.readable) { mayHoldUnsignalledMessages = false }
        return events
    }

    /// The descriptor libzmq signals the socket's commands on (`ZMQ_FD`): poll it for
    /// readability, then ask ``events()`` (see ``mayHoldUnsignalledMessages``).
    public func fileDescriptor() throws(ZeroMQError) -> Int32 {
        try intOption(ZMQ_FD, "ZMQ_FD")
    }
}
