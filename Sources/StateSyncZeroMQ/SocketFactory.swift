import StateSync
import Synchronization
import ZeroMQ

/// The one place where the node's sockets are created and configured: linger, high-water marks
/// and CURVE keys are set here and nowhere else.
enum SocketFactory {
    /// Inbound messages larger than this are refused by libzmq (the sender is disconnected).
    static let maximumMessageSize = Int64(ClientProtocol.maximumFrameOctets)

    static func makeNodeSockets(configuration: NodeConfiguration) throws(StateSyncError) -> (
        context: Context, publisher: Socket, subscribers: [(endpoint: String, socket: Socket)], router: Socket,
        zap: Socket?, keys: NodeKeys?, monitors: [Socket]
    ) {
        // Keys first: a bad key file stops the node before it binds anything.
        let keys = try configuration.security.map { (security) throws(StateSyncError) in try NodeKeys(security) }
        // The sockets monitored so far: on an error, their monitors stop before anything is
        // released (the readers could be released first, see `Socket.monitor`).
        var monitored: [Socket] = []
        defer { for socket in monitored { socket.stopMonitoring() } }
        do {
            let context = try Context()
            // With security, the ZAP handler is bound before any secured socket can accept a
            // connection: without one, libzmq admits every CURVE client.
            var zap: Socket?
            if keys != nil {
                let handler = try context.socket(.rep)
                try handler.setLinger(milliseconds: 0)
                try handler.bind(ZAP.endpoint)
                zap = handler
            }
            let publisher = try makePublisher(context: context, configuration: configuration, keys: keys)
            // Its connections, watched before it is bound: a new subscriber, which may be a node
            // this one does not hear, gets the member list on the next HEARTBEATs. With security,
            // handshakes that fail before ZAP (no CURVE at all) are counted too.
            var monitors = [try makePublisherMonitor(context: context, of: publisher, keyed: keys != nil)]
            monitored.append(publisher)
            try bindPublisher(publisher, configuration.publishEndpoint)

            var subscribers: [(String, Socket)] = []
            for peer in configuration.peers {
                subscribers.append(
                    (
                        peer,
                        try makeSubscriber(
                            context: context, endpoint: peer, configuration: configuration, keys: keys,
                            serverKey: configuration.peerNodeIDs[peer].flatMap { keys?.peers[$0]?.first } ?? [])
                    ))
            }

            // The client API, or without one the repair endpoint: every node serves its peers'
            // FETCH and SNAPSHOT, or a peer that missed deltas could never get them back.
            let router = try context.socket(.router)
            if let keys {
                try router.setZAPDomain(NodeKeys.apiDomain)
                try router.setCurveServer(secretKey: keys.pair.secretKey)
            }
            try router.setRouterMandatory(true)
            // Clients keep one routing id across reconnects, so their watches can be checked.
            try router.setRouterHandover(true)
            try router.setMaximumMessageSize(maximumMessageSize)
            try router.setSendHighWaterMark(Int32(clamping: configuration.clientHighWaterMark))
            // Watched before it is bound, like the publisher: an event with no reader would stop
            // libzmq's I/O thread (see `Socket.monitor`).
            if keys != nil {
                monitors.append(try makeMonitor(context: context, of: router, name: "api", kinds: .handshakeFailed))
                monitored.append(router)
            }
            try bind(
                router, configuration.repairServiceEndpoint,
                key: configuration.apiEndpoint != nil
                    ? "network.api" : configuration.repairEndpoint != nil ? "network.repair" : "the repair endpoint")
            monitored = []
            return (context, publisher, subscribers, router, zap, keys, monitors)
        } catch let error as StateSyncError {
            throw error
        } catch {
            throw StateSyncError(.transport, "cannot set up the node's sockets: \(error)")
        }
    }

    /// The PUB socket (not yet bound); with security a CURVE server admitting peers only.
    static func makePublisher(context: Context, configuration: NodeConfiguration, keys: NodeKeys?)
        throws(ZeroMQError) -> Socket
    {
        let publisher = try context.socket(.pub)
        if let keys {
            try publisher.setZAPDomain(NodeKeys.peerDomain)
            try publisher.setCurveServer(secretKey: keys.pair.secretKey)
        }
        try publisher.setSendHighWaterMark(Int32(clamping: configuration.highWaterMark))
        // On shutdown, give queued deltas a moment to reach connected peers.
        try publisher.setLinger(milliseconds: 200)
        return publisher
    }

    /// Binds the publish socket, naming the configuration key in the error.
    static func bindPublisher(_ publisher: Socket, _ endpoint: String) throws(StateSyncError) {
        try bind(publisher, endpoint, key: "network.publish")
    }

    /// A PAIR reading the publish socket's completed handshakes (a subscriber connected: the
    /// driver tells the machine, ``NodeInput/subscriberConnected``) and, with security, its
    /// failed ones.
    static func makePublisherMonitor(context: Context, of publisher: Socket, keyed: Bool) throws(ZeroMQError)
        -> Socket
    {
        try makeMonitor(
            context: context, of: publisher, name: "publish",
            kinds: keyed ? [.handshakeSucceeded, .handshakeFailed] : .handshakeSucceeded)
    }

    /// A PAIR reading `kinds` of `socket`'s connection events (failed handshakes are those that
    /// fail before ZAP: no CURVE at all). Each socket gets its own inproc endpoint, also when it
    /// is replaced. Call it before `socket` binds, and stop the monitor before closing the
    /// reader (``Socket/stopMonitoring()``): an event with no reader blocks libzmq's I/O thread.
    static func makeMonitor(context: Context, of socket: Socket, name: String, kinds: MonitorEvent.Kinds)
        throws(ZeroMQError) -> Socket
    {
        let endpoint = "inproc://statesync-monitor-\(name)-\(monitorSerial.add(1, ordering: .relaxed).newValue)"
        try socket.monitor(kinds, on: endpoint)
        do {
            let monitor = try context.socket(.pair)
            try monitor.setLinger(milliseconds: 0)
            // No high-water mark on the reader: an inproc pipe with none on one side has none, so
            // libzmq's blocking send of an event never waits, whatever arrives while the driver
            // does not read (a flood of failed handshakes during a socket's replacement), and
            // `stopMonitoring` never waits on the monitor's lock held by that send.
            try monitor.setReceiveHighWaterMark(0)
            try monitor.connect(endpoint)
            return monitor
        } catch {
            socket.stopMonitoring()
            throw error
        }
    }

    private static let monitorSerial = Atomic<Int>(0)

    /// A SUB connected to a peer's publish endpoint, subscribed to everything; with security it
    /// expects the peer to hold `serverKey`, and with no key (the peer is no longer trusted) it
    /// is not connected at all.
    static func makeSubscriber(
        context: Context, endpoint: String, configuration: NodeConfiguration, keys: NodeKeys?, serverKey: [UInt8]
    ) throws(ZeroMQError) -> Socket {
        let subscriber = try context.socket(.sub)
        if let keys {
            guard !serverKey.isEmpty else { return subscriber }
            try subscriber.setCurveClient(
                serverKey: serverKey, publicKey: keys.pair.publicKey, secretKey: keys.pair.secretKey)
        }
        try subscriber.setReceiveHighWaterMark(Int32(clamping: configuration.highWaterMark))
        try subscriber.setMaximumMessageSize(maximumMessageSize)
        try subscriber.setReconnectInterval(milliseconds: 100)
        try subscriber.subscribe()
        try subscriber.connect(endpoint)
        return subscriber
    }

    /// A DEALER to a peer's API (or repair endpoint), for repairs.
    static func makeRepairLink(context: Context, endpoint: String, serverKey: [UInt8]?, keys: NodeKeys?)
        throws(ZeroMQError) -> Socket
    {
        let dealer = try context.socket(.dealer)
        if let keys {
            // A peer no longer trusted is not dialled; its requests simply go unanswered.
            guard let serverKey, !serverKey.isEmpty else { return dealer }
            try dealer.setCurveClient(
                serverKey: serverKey, publicKey: keys.pair.publicKey, secretKey: keys.pair.secretKey)
        }
        try dealer.setSendHighWaterMark(1000)
        try dealer.setReceiveHighWaterMark(1000)
        try dealer.setMaximumMessageSize(maximumMessageSize)
        try dealer.setReconnectInterval(milliseconds: 100)
        try dealer.connect(endpoint)
        return dealer
    }

    private static func bind(_ socket: Socket, _ endpoint: String, key: String) throws(StateSyncError) {
        do {
            try socket.bind(endpoint)
        } catch {
            throw StateSyncError(.transport, "cannot bind \(key) \(endpoint): \(error.message)")
        }
    }
}
