import Foundation
import StateSync
import Synchronization
import ZeroMQ

/// Plain libzmq PUB → SUB over tcp loopback with messages shaped like our deltas: the ceiling
/// StateSync is measured against, in the same run on the same machine.
///
/// Each side has a context of its own, as two nodes (two processes) do: a message then passes
/// two libzmq I/O threads, the sender's and the receiver's, as every delta between two nodes
/// does. With one context shared by both sides, one I/O thread carries the message from the
/// PUB's pipe to the SUB's, a path no two nodes have: on this VM (2026-11-27) 21–58 µs less
/// one-way at p50 at 1,000 messages a second, at 10,000 from 19 µs less to 8 µs more (within
/// the runs' swing), and 6–9 % fewer messages a second in three rounds. `statesync bench`
/// measured it that way until then; it still reports that latency as a reference
/// (`raw_latency_shared_context_*`).
enum RawBench {
    /// A DELTA-shaped message: the frames of a one-property delta of an Int.
    static func sampleFrames() -> [[UInt8]] {
        let delta = Delta(
            channel: "bench", model: "m", version: Version(milliseconds: 1_795_000_000_000, counter: 1, node: "writer"),
            sequence: 123_456, properties: [PropertyWrite(name: "value", value: .int(1_234_567))])
        return PeerMessage.delta(delta).encode()
    }

    /// Messages per second received by the SUB socket, lossless (unbounded queues).
    static func throughput(messages: Int) throws -> Double {
        let sending = try Context()
        let receiving = try Context()
        let pub = try sending.socket(.pub)
        try pub.setSendHighWaterMark(0)
        try pub.bind("tcp://127.0.0.1:*")
        let endpoint = try pub.lastEndpoint()
        let frames = sampleFrames()
        let result = Mutex<Double>(0)
        let ready = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        let receiver = Thread {
            do {
                let sub = try receiving.socket(.sub)
                try sub.setReceiveHighWaterMark(0)
                try sub.subscribe()
                try sub.connect(endpoint)
                ready.signal()
                var received = 0
                var start: UInt64 = 0
                try sub.setReceiveTimeout(milliseconds: 5000)
                while received < messages {
                    guard let frames = try sub.receive() else { break }
                    if frames[0] == probeTopic { continue }
                    if received == 0 { start = monotonicNanoseconds() }
                    received += 1
                }
                let seconds = Double(monotonicNanoseconds() - start) / 1e9
                result.withLock { $0 = Double(received - 1) / max(seconds, 1e-9) }
                sub.close()
            } catch {
                ready.signal()
            }
            done.signal()
        }
        receiver.start()
        ready.wait()
        // Slow joiner: wait until the subscription reached the PUB (a probe round trip).
        try primeSubscription(pub: pub, frames: frames)
        for _ in 0..<messages { try pub.send(frames) }
        done.wait()
        pub.close()
        sending.terminate()
        receiving.terminate()
        return result.withLock { $0 }
    }

    /// One-way latency at a fixed rate: each message carries its send time. `sharedContext`: both
    /// sides on one context (one I/O thread), the reference figure (see above).
    static func latency(rate: Int, seconds: Double, sharedContext: Bool = false) throws -> LatencySummary {
        let sending = try Context()
        let receiving = sharedContext ? sending : try Context()
        let pub = try sending.socket(.pub)
        try pub.bind("tcp://127.0.0.1:*")
        let endpoint = try pub.lastEndpoint()
        let total = Int(Double(rate) * seconds)
        let samples = Mutex<[UInt64]>([])
        let ready = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        let template = sampleFrames()
        let receiver = Thread {
            do {
                let sub = try receiving.socket(.sub)
                try sub.subscribe()
                try sub.connect(endpoint)
                try sub.setReceiveTimeout(milliseconds: 2000)
                ready.signal()
                var collected: [UInt64] = []
                collected.reserveCapacity(total)
                while collected.count < total {
                    guard let frames = try sub.receive() else { break }
                    let now = monotonicNanoseconds()
                    guard frames.count == 3 else { continue }  // skip the probes
                    var reader = WireReader(frames[2])
                    if let sent = try? reader.uint64("sent") { collected.append(now &- sent) }
                }
                samples.withLock { $0 = collected }
                sub.close()
            } catch {
                ready.signal()
            }
            done.signal()
        }
        receiver.start()
        ready.wait()
        try primeSubscription(pub: pub, frames: template)
        let interval = UInt64(1_000_000_000 / rate)
        var next = monotonicNanoseconds()
        for _ in 0..<total {
            waitUntilNanoseconds(next)
            var stamp = WireWriter()
            stamp.uint64(monotonicNanoseconds())
            try pub.send(template + [stamp.bytes])
            next += interval
        }
        done.wait()
        pub.close()
        sending.terminate()
        receiving.terminate()  // (the same context when shared: terminating twice is a no-op)
        return LatencySummary(nanoseconds: samples.withLock { $0 })
    }

    static let probeTopic: [UInt8] = Array("P".utf8)

    /// Publishes probes until a moment has passed for the subscription to arrive.
    private static func primeSubscription(pub: Socket, frames: [[UInt8]]) throws {
        _ = frames
        // libzmq gives no signal that a subscription arrived; 300 ms on loopback is ample and is
        // excluded from every measurement.
        let until = monotonicNanoseconds() + 300_000_000
        while monotonicNanoseconds() < until {
            try pub.send([probeTopic])
            usleep(1000)
        }
    }
}
