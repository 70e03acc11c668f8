import Foundation
import StateSyncClient
import Synchronization
import Testing
import ZeroMQ

@testable import StateSync

/// A watch the node holds and the client does not (its WATCH timed out at the client and was
/// registered after all, its UNWATCH was lost, the client ended it on an error) is ended at the
/// node: otherwise the node sends it every change of its channel, for the client to drop, for as
/// long as the connection lasts.
@Suite("Stray watches")
struct StrayWatchTests {
    @Test func aWatchTheClientDoesNotHoldIsEndedAtTheNode() async throws {
        let node = try ScriptedAPI()
        do {
            let client = try StateSyncClient(endpoint: node.endpoint, requestTimeout: .seconds(1))
            defer { client.close() }
            // A WATCH the node does not answer in time: the client gives up, and ends it at the
            // node too, which may register it yet.
            await #expect(throws: StateSyncError.self) { _ = try await client.watch(channel: "c") }
            try await waitUntil("the WATCH reached the node") { !node.requests(.watch).isEmpty }
            let timedOut = node.requests(.watch)[0].id
            try await waitUntil("an UNWATCH of the watch that timed out") { !node.unwatches(of: timedOut).isEmpty }

            // A watch the client holds (answered, with an empty initial state): its events
            // never bring an UNWATCH.
            node.answersWatches()
            let (events, _) = try await client.watch(channel: "c")
            let held = try #require(node.requests(.watch).last?.id)
            let markers = Mutex(0)
            let reading = Task {
                for try await event in events {
                    if case .caughtUp = event { markers.withLock { $0 += 1 } }
                }
            }
            defer { reading.cancel() }

            // A watch the client never held, which the node goes on sending events of (it
            // ignores the UNWATCHes: as if each were lost), among the held watch's: the client
            // ends it again, at most once a second, however many events come.
            let stray: UInt64 = 1 << 40
            try await waitUntil("two UNWATCHes of the stray watch", timeout: .seconds(20)) {
                node.send(ScriptedAPI.caughtUp(watch: stray))
                node.send(ScriptedAPI.caughtUp(watch: held))
                return node.unwatches(of: stray).count >= 2
            }
            let times = node.unwatches(of: stray).map(\.at)
            let sent = node.sentCount
            #expect(times.count == 2, "\(times.count) UNWATCHes for \(sent) events")
            #expect(
                times[0].duration(to: times[1]) >= .milliseconds(500),
                "the second UNWATCH came \(times[0].duration(to: times[1])) after the first, over \(sent) events")
            try await waitUntil("the held watch's markers arrived") { markers.withLock { $0 } > 0 }
            #expect(node.unwatches(of: held).isEmpty, "the watch the client holds was ended at the node")
        } catch {
            Issue.record(error)
        }
        node.stop()
    }
}

/// A node's client API played by a test: a ROUTER socket on loopback, on a thread of its own,
/// that records every request, answers UNWATCH with OK, PING with an incarnation and WATCH (once
/// told to: ``answersWatches()``) with OK and an empty initial state, and sends the client what
/// the test queues.
final class ScriptedAPI: Sendable {
    struct Request: Sendable {
        let command: ClientProtocol.Command?
        let id: UInt64
        let body: [UInt8]
        let at: ContinuousClock.Instant
    }

    private struct State {
        var requests: [Request] = []
        var outbox: [[[UInt8]]] = []
        var sent = 0
        var stopped = false
        var answersWatches = false
        var endpoint: Result<String, ZeroMQError>?
    }

    private let state = Mutex(State())
    private let exited = DispatchSemaphore(value: 0)

    init() throws {
        let started = DispatchSemaphore(value: 0)
        let thread = Thread { [self] in
            run(started: started)
            exited.signal()
        }
        thread.start()
        started.wait()
        if case .failure(let error)? = state.withLock({ $0.endpoint }) { throw error }
    }

    /// Where the client connects.
    var endpoint: String { state.withLock { (try? $0.endpoint?.get()) ?? "" } }

    func requests(_ command: ClientProtocol.Command) -> [Request] {
        state.withLock { $0.requests.filter { $0.command == command } }
    }

    /// The UNWATCH requests naming watch `id`.
    func unwatches(of id: UInt64) -> [Request] {
        requests(.unwatch).filter {
            var body = WireReader($0.body)
            return (try? body.uint64("watch id")) == id
        }
    }

    /// Queues a message (its frames after the routing id) for the client.
    func send(_ frames: [[UInt8]]) { state.withLock { $0.outbox.append(frames) } }

    var sentCount: Int { state.withLock { $0.sent } }

    /// From now on, answers a WATCH.
    func answersWatches() { state.withLock { $0.answersWatches = true } }

    /// A CAUGHT-UP event of watch `id`.
    static func caughtUp(watch id: UInt64) -> [[UInt8]] {
        ClientProtocol.encodeReply(
            .event, id: id,
            body: ClientProtocol.encodeWatchEvent(.caughtUp(cursor: WatchCursor(), latest: nil, missing: 0)))
    }

    func stop() {
        state.withLock { $0.stopped = true }
        exited.wait()
    }

    private func run(started: DispatchSemaphore) {
        let context: Context
        let router: Socket
        do {
            context = try Context()
            router = try context.socket(.router)
            try router.setReceiveTimeout(milliseconds: 5)
            try router.bind("tcp://127.0.0.1:*")
            let endpoint = try router.lastEndpoint()
            state.withLock { $0.endpoint = Result.success(endpoint) }
            started.signal()
        } catch {
            state.withLock { $0.endpoint = Result.failure(error) }
            started.signal()
            return
        }
        var client: [UInt8]?
        while true {
            let (outbox, stopped) = state.withLock { state in
                // Nothing can be sent before the client's first request names it.
                defer { if client != nil { state.outbox = [] } }
                return (client == nil ? [] : state.outbox, state.stopped)
            }
            if stopped { break }
            if let client {
                for frames in outbox where (try? router.send([client] + frames, dontWait: true)) == true {
                    state.withLock { $0.sent += 1 }
                }
            }
            guard let frames = try? router.receive(), frames.count == 3,
                let header = try? ClientProtocol.decodeRequestHeader(frames[1])
            else { continue }
            client = frames[0]
            let command = ClientProtocol.Command(rawValue: header.command)
            state.withLock {
                $0.requests.append(
                    Request(command: command, id: header.requestID, body: frames[2], at: ContinuousClock.now))
            }
            let id = header.requestID
            var replies: [[[UInt8]]] = []
            switch command {
            case .unwatch:
                replies = [ClientProtocol.encodeReply(.ok, id: id, body: [])]
            case .ping:
                let body = ClientProtocol.encodeValue(.map(["incarnation": .string("scripted")]))
                replies = [ClientProtocol.encodeReply(.ok, id: id, body: body)]
            case .watch where state.withLock({ $0.answersWatches }):
                let end = ClientProtocol.WatchEventBody.snapshotEnd(
                    records: 0, digest: RegisterDigest().value, cursor: WatchCursor())
                replies = [
                    ClientProtocol.encodeReply(.ok, id: id, body: []),
                    ClientProtocol.encodeReply(
                        .event, id: id, body: ClientProtocol.encodeWatchEvent(.snapshotBegin(.initial))),
                    ClientProtocol.encodeReply(.event, id: id, body: ClientProtocol.encodeWatchEvent(end)),
                ]
            default:
                break
            }
            for reply in replies { _ = try? router.send([frames[0]] + reply) }
        }
        router.close()
        withExtendedLifetime(context) {}
    }
}
