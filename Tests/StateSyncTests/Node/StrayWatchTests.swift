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
        let client = try StateSyncClient(endpoint: node.endpoint, requestTimeout: .seconds(1))
        do {
            // A WATCH the node does not answer in time: the client gives up, and ends it at the
            // node too, which may register it yet.
            await #expect(throws: StateSyncError.self) { _ = try await client.watch(channel: "c") }
            let watchID = try #require(node.requests(.watch).first?.id)
            try await waitUntil("an UNWATCH of the watch that timed out") { !node.unwatches(of: watchID).isEmpty }

            // A watch the client never held, which the node goes on sending events of (it
            // ignores the UNWATCHes: as if each were lost): the client ends it again, at most
            // once a second, however many events come.
            let stray: UInt64 = 1 << 40
            let event = ClientProtocol.encodeReply(
                .event, id: stray,
                body: ClientProtocol.encodeWatchEvent(.caughtUp(cursor: WatchCursor(), latest: nil, missing: 0)))
            try await waitUntil("two UNWATCHes of the stray watch", timeout: .seconds(20)) {
                node.send(event)
                return node.unwatches(of: stray).count >= 2
            }
            let times = node.unwatches(of: stray).map(\.at)
            let sent = node.sentCount
            #expect(times.count == 2, "\(times.count) UNWATCHes for \(sent) events")
            #expect(
                times[0].duration(to: times[1]) >= .milliseconds(500),
                "the second UNWATCH came \(times[0].duration(to: times[1])) after the first, over \(sent) events")
            // Requests are still answered meanwhile.
            _ = try await client.get(ModelAddress(channel: "c", model: "m"))
        } catch {
            Issue.record(error)
        }
        client.close()
        node.stop()
    }
}

/// A node's client API played by a test: a ROUTER socket on loopback, on a thread of its own,
/// that records every request, answers GET with an empty model and UNWATCH with OK (WATCH not
/// at all), and sends the client what the test queues.
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
            let answer: [UInt8]
            switch command {
            case .get: answer = ClientProtocol.encodeProperties([:])
            case .unwatch: answer = []
            default: continue
            }
            _ = try? router.send([frames[0]] + ClientProtocol.encodeReply(.ok, id: header.requestID, body: answer))
        }
        router.close()
        withExtendedLifetime(context) {}
    }
}
