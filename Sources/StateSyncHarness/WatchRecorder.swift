import Foundation
import StateSync
import StateSyncClient
import Synchronization

/// A watcher on one node that records every change it is told of. When the watch breaks (the
/// node was killed, paused too long...) it resumes with its replica, so one chain runs through
/// the whole run; a new session is recorded only if a resume was impossible.
final class WatchRecorder: Sendable {
    let node: String
    let endpoint: String
    /// Its credentials with `--secure`.
    let security: StateSyncClient.Security?
    let replica = ChannelReplica(channel: Harness.channel)
    private let state = Mutex<(sessions: [[PropertyChange]], watching: Bool, last: Date, caughtUp: Version?)>(
        ([], false, Date(), nil))
    private let stopped = Atomic<Bool>(false)

    init(node: String, endpoint: String, security: StateSyncClient.Security? = nil) {
        self.node = node
        self.endpoint = endpoint
        self.security = security
    }

    var sessions: [[PropertyChange]] { state.withLock { $0.sessions.filter { !$0.isEmpty } } }
    var isWatching: Bool { state.withLock { $0.watching } }
    var idleMilliseconds: Int { state.withLock { Int(Date().timeIntervalSince($0.last) * 1000) } }
    /// The newest version of the last caught-up marker whose node missed nothing: the watcher
    /// holds everything up to it.
    var caughtUpTo: Version? { state.withLock { $0.caughtUp } }

    func stop() { stopped.store(true, ordering: .releasing) }

    func run() async {
        while !stopped.load(ordering: .acquiring) && !Task.isCancelled {
            guard let client = try? StateSyncClient(endpoint: endpoint, requestTimeout: .seconds(2), security: security)
            else { return }
            defer { client.close() }
            do {
                let (events, _) = try await client.watch(channel: Harness.channel, replica: replica)
                state.withLock {
                    if $0.sessions.isEmpty { $0.sessions.append([]) }
                    $0.watching = true
                }
                for try await event in events {
                    if case .caughtUp(_, let latest, let missing) = event, missing == 0 {
                        state.withLock { $0.caughtUp = latest }
                    }
                    guard case .change(let change, _, _) = event else { continue }
                    state.withLock {
                        $0.sessions[$0.sessions.count - 1].append(change)
                        $0.last = Date()
                    }
                    if stopped.load(ordering: .acquiring) { return }
                }
            } catch {
                state.withLock { $0.watching = false }
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
    }
}

/// The faults injected so far, for the report.
final class FaultLog: Sendable {
    private let state = Mutex<(events: [HarnessReport.FaultEvent], active: String)>(([], "-"))

    func record(kind: String, target: String, detail: String, at: Int, healed: Int?) {
        state.withLock {
            $0.events.append(
                .init(kind: kind, target: target, detail: detail, startMilliseconds: at, healMilliseconds: healed))
        }
    }

    func setActive(_ text: String) { state.withLock { $0.active = text } }
    var active: String { state.withLock { $0.active } }
    var count: Int { state.withLock { $0.events.count } }
    var events: [HarnessReport.FaultEvent] { state.withLock { $0.events } }
}

/// Injects the requested faults, one at a time, on a seeded schedule, until the workload ends
/// (and at least once each).
struct FaultController {
    /// The node a fault hits: the one `drawn` picks among `running` (indices), or the next of
    /// them when that is `avoiding`.
    static func target(drawn: UInt64, among running: [Int], avoiding: Int?) -> Int {
        let index = Int(drawn % UInt64(running.count))
        guard running[index] == avoiding, running.count > 1 else { return running[index] }
        return running[(index + 1) % running.count]
    }

    let nodes: [NodeProcess]
    let relays: [String: LinkProxy]
    let lab: NetnsLab?
    let names: [String]
    let seed: UInt64
    let log: FaultLog
    /// The node that starts late (`--faults join`), if any.
    var joiner: Int?
    /// A node no fault restarts (kill, leave): the one with the planted `drop-deltas`. It marks
    /// the deltas it drops received in memory only, so after a restart it finds them missing,
    /// and the repair (or the snapshot it then asks for) mends what the check must see broken.
    var neverRestarted: Int?

    func run(faults: [HarnessOptions.Fault], until done: @Sendable () -> Bool, start: Date) async {
        guard !faults.isEmpty else { return }
        var rng = SeededGenerator(seed: seed)
        var round = 0
        while round == 0 || !done() {
            for fault in faults {
                try? await Task.sleep(for: .milliseconds(150 + Int(rng.next() % 250)))
                let at = Int(Date().timeIntervalSince(start) * 1000)
                let hold = 300 + Int(rng.next() % 500)
                // A late joiner that has not started is no target: a kill would start it early
                // (and the join would never happen), a cut or a loss would hit nothing.
                let running = nodes.indices.filter { $0 != joiner || nodes[$0].wasStarted }
                let target = Self.target(
                    drawn: rng.next(), among: running,
                    avoiding: [.kill, .leave].contains(fault) ? neverRestarted : nil)
                switch fault {
                case .kill:
                    log.setActive("kill -9 \(names[target])")
                    nodes[target].killHard()
                    try? await Task.sleep(for: .milliseconds(hold))
                    try? nodes[target].start()
                    log.record(
                        kind: "kill", target: names[target], detail: "kill -9, restarted after \(hold) ms", at: at,
                        healed: elapsed(start))
                case .pause:
                    log.setActive("pause \(names[target])")
                    nodes[target].pause()
                    try? await Task.sleep(for: .milliseconds(hold))
                    nodes[target].resume()
                    log.record(
                        kind: "pause", target: names[target], detail: "SIGSTOP for \(hold) ms", at: at,
                        healed: elapsed(start))
                case .partition:
                    var group = Set([target])
                    let extra = nodes.count > 3 ? Int(rng.next() % UInt64(nodes.count / 2)) : 0
                    for _ in 0..<extra { group.insert(running[Int(rng.next() % UInt64(running.count))]) }
                    if group.count == running.count { group.remove(running.first { $0 != target } ?? target) }
                    let side = group.sorted().map { names[$0] }.joined(separator: ",")
                    let other = running.filter { !group.contains($0) }.map { names[$0] }.joined(separator: ",")
                    log.setActive("partition \(side) | \(other)")
                    setCut(group: group, true)
                    lab?.setPartition(group, cut: true)
                    try? await Task.sleep(for: .milliseconds(hold))
                    setCut(group: group, false)
                    lab?.setPartition(group, cut: false)
                    log.record(
                        kind: "partition", target: "\(side) | \(other)",
                        detail: lab == nil
                            ? "links cut both ways for \(hold) ms" : "blackhole routes both ways for \(hold) ms",
                        at: at, healed: elapsed(start))
                case .loss where lab != nil:
                    // A real link, going down in bursts: packets dropped, TCP retransmits.
                    log.setActive("loss at \(names[target])")
                    let steps = max(1, hold / 150)
                    for _ in 0..<steps {
                        lab?.setLink(node: target, up: false)
                        try? await Task.sleep(for: .milliseconds(30 + Int(rng.next() % 70)))
                        lab?.setLink(node: target, up: true)
                        try? await Task.sleep(for: .milliseconds(50))
                    }
                    log.record(
                        kind: "loss", target: names[target], detail: "link down in \(steps) bursts over \(hold) ms",
                        at: at, healed: elapsed(start))
                case .loss:
                    log.setActive("loss at \(names[target])")
                    let delay = 10 + Int(rng.next() % 40)
                    let inbound = relays.filter { $0.key.hasPrefix("\(target)>") }.map(\.value)
                    for relay in inbound { relay.setDelay(milliseconds: delay) }
                    let steps = max(1, hold / 100)
                    for _ in 0..<steps {
                        try? await Task.sleep(for: .milliseconds(100))
                        if let relay = inbound.randomElement(using: &rng) { relay.reset() }  // in-flight data lost
                    }
                    for relay in inbound { relay.setDelay(milliseconds: 0) }
                    log.record(
                        kind: "loss", target: names[target],
                        detail: "inbound delay \(delay) ms and connection resets for \(hold) ms",
                        at: at, healed: elapsed(start))
                case .join:
                    guard let joiner else { break }
                    if !nodes[joiner].wasStarted {
                        log.setActive("join \(names[joiner])")
                        try? nodes[joiner].start()
                        log.record(
                            kind: "join", target: names[joiner],
                            detail: "started knowing only \(names[0]); no node knew it", at: at, healed: elapsed(start))
                    } else {
                        log.setActive("rejoin \(names[joiner])")
                        _ = nodes[joiner].stop()
                        try? await Task.sleep(for: .milliseconds(hold))
                        try? nodes[joiner].start()
                        log.record(
                            kind: "join", target: names[joiner],
                            detail: "stopped cleanly, started again after \(hold) ms knowing only \(names[0])", at: at,
                            healed: elapsed(start))
                    }
                case .leave:
                    // A node that has not joined yet cannot leave: take another.
                    let node = nodes[target].isRunning ? target : 0
                    log.setActive("leave \(names[node])")
                    let status = nodes[node].stop()
                    try? await Task.sleep(for: .milliseconds(hold))
                    try? nodes[node].start()
                    log.record(
                        kind: "leave", target: names[node],
                        detail: "SIGTERM (exit \(status.map(String.init) ?? "?")), started again after \(hold) ms",
                        at: at,
                        healed: elapsed(start))
                case .clock:
                    break  // applied at start (one node runs skewed)
                }
                log.setActive("-")
            }
            round += 1
        }
    }

    private func setCut(group: Set<Int>, _ cut: Bool) {
        for (key, relay) in relays {
            let parts = key.split(separator: ">").compactMap { Int($0) }
            if group.contains(parts[0]) != group.contains(parts[1]) { relay.setCut(cut) }
        }
    }

    private func elapsed(_ start: Date) -> Int { Int(Date().timeIntervalSince(start) * 1000) }
}
