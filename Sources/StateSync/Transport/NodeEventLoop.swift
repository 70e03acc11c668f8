import Foundation
import Logging
import Synchronization
import ZeroMQ

/// The node's I/O thread: owns every ZeroMQ socket of the node (czmq's actor pattern — one
/// thread, sockets never shared, other threads wake it through a pipe).
///
/// Sockets: one PUB bound to `network.publish`; one SUB per peer, connected to its publish
/// endpoint and subscribed to everything; one ROUTER bound to `network.api` for clients. Every
/// socket is created in ``SocketFactory`` with explicit linger and high-water marks.
final class NodeEventLoop: Sendable {
    private let configuration: NodeConfiguration
    let logger: Logger
    private let wakeUp: WakeUp
    private let stopRequested = Atomic<Bool>(false)
    private let bound = Mutex<(publish: String, api: String?)>(("", nil))
    private let watchers = Atomic<Int>(0)
    private let exit = Mutex<(exited: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))
    // Set once by the node's initialiser, before `start()`; only read afterwards.
    nonisolated(unsafe) weak var node: StateSyncNode?

    /// Events a client cannot take right now are dropped past this many queued messages.
    static let clientHighWaterMark: Int32 = 10_000
    static let peerHighWaterMark: Int32 = 100_000
    /// How many messages one socket may deliver before the loop looks at the others.
    static let batchLimit = 512

    init(configuration: NodeConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        // A pipe cannot fail to open short of descriptor exhaustion, where nothing else works.
        do {
            self.wakeUp = try WakeUp()
        } catch {
            fatalError("cannot create the node's wake-up pipe: \(error)")
        }
    }

    var boundPublishEndpoint: String { bound.withLock { $0.publish } }
    var boundAPIEndpoint: String? { bound.withLock { $0.api } }
    var watcherCount: Int { watchers.load(ordering: .relaxed) }

    func wake() { wakeUp.signal() }

    func setWatcherCount(_ count: Int) { watchers.store(count, ordering: .relaxed) }

    /// Starts the thread; returns once every socket is bound and connected, or throws why not.
    func start() async throws {
        try await withCheckedThrowingContinuation { (ready: CheckedContinuation<Void, any Error>) in
            let thread = Thread { [self] in self.main(ready: ready) }
            thread.name = "statesync-io"
            thread.stackSize = 8 << 20
            thread.start()
        }
    }

    /// Asks the thread to publish what is queued, close its sockets and exit; returns when it has.
    func stop() async {
        stopRequested.store(true, ordering: .releasing)
        wakeUp.signal()
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = exit.withLock { state -> Bool in
                if state.exited { return true }
                state.waiters.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
    }

    private func finish() {
        let waiters = exit.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.exited = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    // MARK: - The thread

    private struct Sockets {
        let context: Context
        let publisher: Socket
        let subscribers: [(endpoint: String, socket: Socket)]
        let api: Socket?
    }

    private func main(ready: CheckedContinuation<Void, any Error>) {
        let sockets: Sockets
        do {
            let made = try SocketFactory.makeNodeSockets(configuration: configuration)
            sockets = Sockets(context: made.context, publisher: made.publisher, subscribers: made.subscribers, api: made.api)
            let publish = (try? made.publisher.lastEndpoint()) ?? configuration.publishEndpoint
            let api = made.api.map { (try? $0.lastEndpoint()) ?? configuration.apiEndpoint ?? "" }
            bound.withLock { $0 = (publish, api) }
        } catch {
            finish()
            ready.resume(throwing: error)
            return
        }
        ready.resume()
        run(sockets)
        sockets.publisher.close()
        for (_, subscriber) in sockets.subscribers { subscriber.close() }
        sockets.api?.close()
        // Release the endpoints before reporting the stop: a restart may bind them at once.
        sockets.context.terminate()
        finish()
    }

    private func run(_ sockets: Sockets) {
        guard let node else { return }
        var state = LoopState()
        var items: [Poller.Item] = [.fileDescriptor(wakeUp.fileDescriptor, .readable)]
        for (_, subscriber) in sockets.subscribers { items.append(.socket(subscriber, .readable)) }
        if let api = sockets.api { items.append(.socket(api, .readable)) }
        var poller = Poller(items)
        let interval = UInt64(configuration.heartbeatIntervalMilliseconds)
        var lastHeartbeat: UInt64 = 0

        while true {
            let stopping = stopRequested.load(ordering: .acquiring)
            // Local writes first: they were acknowledged to their writers and must go out.
            for applied in node.takeLocalWrites() {
                publish(.delta(applied.delta), on: sockets.publisher)
                notifyWatchers(applied.changes, state: &state, api: sockets.api, node: node)
            }
            if stopping { break }

            let now = monotonicMilliseconds()
            if now &- lastHeartbeat >= interval {
                publish(node.heartbeat(), on: sockets.publisher)
                lastHeartbeat = now
            }
            let timeout = Int(interval &- min(interval, monotonicMilliseconds() &- lastHeartbeat))
            let ready: [PollEvents]
            do {
                ready = try poller.poll(timeoutMilliseconds: timeout)
            } catch {
                logger.error("zmq_poll failed; stopping the node's I/O", metadata: ["error": "\(error)"])
                break
            }
            if ready[0].contains(.readable) { wakeUp.drain() }
            for (index, (endpoint, subscriber)) in sockets.subscribers.enumerated()
            where ready[index + 1].contains(.readable) {
                for _ in 0..<Self.batchLimit {
                    guard let frames = receive(from: subscriber, what: "peer \(endpoint)") else { break }
                    let changes = node.receive(from: endpoint, frames: frames)
                    notifyWatchers(changes, state: &state, api: sockets.api, node: node)
                }
            }
            if let api = sockets.api, ready[ready.count - 1].contains(.readable) {
                for _ in 0..<Self.batchLimit {
                    guard let frames = receive(from: api, what: "client API") else { break }
                    handleClientMessage(frames, state: &state, api: api, publisher: sockets.publisher, node: node)
                }
            }
        }
    }

    private func receive(from socket: Socket, what: String) -> [[UInt8]]? {
        do {
            return try socket.receive(dontWait: true)
        } catch {
            logger.error("receive failed", metadata: ["socket": "\(what)", "error": "\(error)"])
            return nil
        }
    }

    func publish(_ message: PeerMessage, on publisher: Socket) {
        do {
            // PUB never blocks: past the high-water mark libzmq drops, and sequence numbers let
            // peers see the gap.
            try publisher.send(message.encode(), dontWait: true)
        } catch {
            logger.error("publish failed", metadata: ["error": "\(error)"])
        }
    }
}

/// The I/O thread's own state: the watches clients hold.
struct LoopState {
    struct Watch: Hashable {
        let client: [UInt8]
        let requestID: UInt64
    }
    var watchesByChannel: [String: Set<Watch>] = [:]
    var channelsByClient: [[UInt8]: [UInt64: String]] = [:]

    mutating func add(_ watch: Watch, channel: String) {
        remove(watch)  // a reused request id replaces the earlier watch
        watchesByChannel[channel, default: []].insert(watch)
        channelsByClient[watch.client, default: [:]][watch.requestID] = channel
    }

    mutating func remove(_ watch: Watch) {
        guard let channel = channelsByClient[watch.client]?.removeValue(forKey: watch.requestID) else { return }
        watchesByChannel[channel]?.remove(watch)
        if watchesByChannel[channel]?.isEmpty == true { watchesByChannel[channel] = nil }
        if channelsByClient[watch.client]?.isEmpty == true { channelsByClient[watch.client] = nil }
    }

    mutating func removeClient(_ client: [UInt8]) {
        for requestID in channelsByClient[client]?.keys.map({ $0 }) ?? [] {
            remove(Watch(client: client, requestID: requestID))
        }
    }

    var count: Int { channelsByClient.values.reduce(0) { $0 + $1.count } }
}
