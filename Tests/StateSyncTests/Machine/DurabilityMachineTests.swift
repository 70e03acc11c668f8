import Logging
import Testing

@testable import StateSync

/// Durability on the node machine alone (PROTOCOL.md section 11.2): the order of log, sync,
/// publish and acknowledgement, seen action by action.
@Suite("Durability on the node machine")
struct DurabilityMachineTests {
    static func machine(
        _ fsync: NodeConfiguration.FsyncPolicy = .always, publishBeforeSync: Bool = false, compactBytes: Int = 64 << 20
    ) -> NodeMachine {
        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        configuration.fsync = fsync
        configuration.publishBeforeSync = publishBeforeSync
        configuration.fsyncIntervalMilliseconds = 50
        configuration.compactBytes = compactBytes
        let clock = HybridLogicalClock(node: "n1", wallClock: { 1_800_000_000_000 })
        return NodeMachine(
            configuration: configuration, clock: clock, incarnation: 1, recovery: .init(),
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
    }

    static let set = ClientProtocol.encodeRequest(
        .set, id: 1,
        body: ClientProtocol.encodeSet(ModelAddress(channel: "c", model: "m"), [PropertyWrite(name: "x", value: 1)]))

    static let set2 = ClientProtocol.encodeRequest(
        .set, id: 2,
        body: ClientProtocol.encodeSet(ModelAddress(channel: "c", model: "m"), [PropertyWrite(name: "x", value: 2)]))

    static func kinds(_ actions: [NodeAction]) -> [String] {
        actions.map { action in
            switch action {
            case .publish(let frames): frames[0] == PeerMessage.heartbeatTopic ? "heartbeat" : "publish"
            case .appendLog: "append"
            case .syncLog: "sync"
            case .reserveSequences: "reserve"
            case .compact: "compact"
            case .saveMembers: "members"
            case .logDamageSettled: "damage-settled"
            case .deliver: "deliver"
            case .connectRepairLink: "link"
            case .sendRepairRequest: "repair"
            case .reply: "reply"
            case .sendWatchEvents: "watch"
            case .pauseIntake: "pause"
            case .resetPeerLink: "reset"
            case .connectPeer: "subscribe"
            case .disconnectPeer: "unsubscribe"
            case .refuseToRun: "refuse"
            }
        }
    }

    /// With `always`, a SET is logged at once but published and acknowledged only after the log
    /// reported it durable — and the sync is asked for in the same round (no timer).
    @Test func alwaysPublishesAndAcknowledgesOnlyOnceDurable() {
        var machine = Self.machine()
        _ = machine.handle(.tick(observerBacklog: 0), now: 1)
        #expect(Self.kinds(machine.handle(.clientRequest(client: [1], frames: Self.set), now: 2)) == ["append"])
        let tick = machine.handle(.tick(observerBacklog: 0), now: 2)
        #expect(Self.kinds(tick).first == "sync")
        #expect(!Self.kinds(tick).contains("publish") && !Self.kinds(tick).contains("reply"))
        guard case .syncLog(let position, let atOnce) = tick.first else { return }
        #expect(!atOnce, "a running node lets a host sync in the background")
        #expect(Self.kinds(machine.handle(.logDurable(through: position), now: 3)) == ["publish", "reply"])
        #expect(machine.published == 1)
    }

    /// With `always` and `storage.publish: written`, a SET is logged at once and published when
    /// the driver's turn ends, before the sync that turn asks for (the write travels while the
    /// sync runs), within sequence numbers reserved durably ahead (the first write waits for the
    /// first reservation, not for its sync); it is acknowledged, and shown to this node's
    /// watches, only once the log reported it durable.
    @Test func publishWrittenPublishesBeforeTheSyncAndAcknowledgesAfterIt() {
        func syncPosition(_ actions: [NodeAction]) -> UInt64? {
            for action in actions { if case .syncLog(let position, _) = action { return position } }
            return nil
        }
        func kinds(_ actions: [NodeAction]) -> [String] { Self.kinds(actions).filter { $0 != "heartbeat" } }
        var machine = Self.machine(.always, publishBeforeSync: true)
        _ = machine.handle(.tick(observerBacklog: 0), now: 1)
        let first = machine.handle(.clientRequest(client: [1], frames: Self.set), now: 2)
        #expect(kinds(first) == ["append", "reserve"])
        guard case .reserveSequences(let through, _)? = first.last else { return }
        #expect(through == 1 + NodeMachine.reservationBlock)
        let firstTick = machine.handle(.tick(observerBacklog: 0), now: 2)
        #expect(kinds(firstTick) == ["sync"], "not published before its reservation is durable")
        #expect(kinds(machine.handle(.sequencesReserved(through: through), now: 3)) == ["publish"])
        #expect(machine.published == 1)
        #expect(machine.visibleToWatches == 0, "a watch here waits for the sync")
        guard let firstSync = syncPosition(firstTick) else { return }
        #expect(kinds(machine.handle(.logDurable(through: firstSync), now: 3)) == ["reply"])
        #expect(machine.visibleToWatches == 1)

        #expect(kinds(machine.handle(.clientRequest(client: [1], frames: Self.set2), now: 4)) == ["append"])
        let tick = machine.handle(.tick(observerBacklog: 0), now: 4)
        #expect(kinds(tick) == ["publish", "sync"], "published first, then synced; not acknowledged")
        #expect(machine.published == 2 && machine.visibleToWatches == 1)
        guard let sync = syncPosition(tick) else { return }
        #expect(kinds(machine.handle(.logDurable(through: sync), now: 5)) == ["reply"])
        #expect(machine.visibleToWatches == 2)
    }

    /// With `always` and `storage.publish: written`, a write's OK still goes after its DELTA
    /// (PROTOCOL.md 10.3) when a sync runs before the tick that would publish it: a snapshot a
    /// peer asks for forces one at once. The sync publishes what it made durable, which needs
    /// no reservation (the first write's is not back yet here), then answers.
    @Test func publishWrittenSendsAnOKAfterItsDeltaWhenASyncComesFirst() {
        var machine = Self.machine(.always, publishBeforeSync: true)
        _ = machine.handle(.tick(observerBacklog: 0), now: 1)
        #expect(
            Self.kinds(machine.handle(.clientRequest(client: [1], frames: Self.set), now: 2)) == ["append", "reserve"])
        let snapshot = ClientProtocol.encodeRequest(.snapshot, id: 7, body: [])
        let forced = machine.handle(.clientRequest(client: [2], frames: snapshot), now: 2)
        guard case .syncLog(let position, _)? = forced.first(where: { if case .syncLog = $0 { true } else { false } })
        else {
            Issue.record("no sync forced by the snapshot: \(Self.kinds(forced))")
            return
        }
        #expect(machine.published == 0)
        let durable = Self.kinds(machine.handle(.logDurable(through: position), now: 3))
        #expect(durable.first == "publish" && durable.filter { $0 == "reply" }.count == 2, "\(durable)")
        #expect(machine.published == 1)
    }

    /// A stopping node asks for its last sync at once: a host that syncs in the background must
    /// sync before the round ends, so that the node stops with every write durable and published.
    @Test func aStoppingNodeAsksForItsLastSyncAtOnce() {
        var machine = Self.machine(.interval)
        _ = machine.handle(.tick(observerBacklog: 0), now: 1)
        _ = machine.handle(.clientRequest(client: [1], frames: Self.set), now: 2)
        let stop = machine.handle(.stop, now: 3)
        guard let sync = stop.first(where: { if case .syncLog = $0 { true } else { false } }),
            case .syncLog(_, let atOnce) = sync
        else {
            Issue.record("no sync at stop: \(Self.kinds(stop))")
            return
        }
        #expect(atOnce)
    }

    /// With `interval`, a SET is acknowledged once logged (the OS has it) and published when the
    /// driver's turn ends (its tick: the writes of a busy turn share one message), within
    /// sequence numbers reserved durably ahead (the first write waits for the first
    /// reservation); the log is synced one interval later, and no reservation is asked for again
    /// until the block runs low.
    @Test func intervalAcknowledgesAndPublishesBeforeTheSync() {
        var machine = Self.machine(.interval)
        _ = machine.handle(.tick(observerBacklog: 0), now: 1)
        let first = machine.handle(.clientRequest(client: [1], frames: Self.set), now: 2)
        #expect(Self.kinds(first) == ["append", "reserve", "reply"])
        guard
            case .reserveSequences(let through, _)? = first.first(where: {
                if case .reserveSequences = $0 { true } else { false }
            })
        else { return }
        #expect(through == 1 + NodeMachine.reservationBlock)
        #expect(Self.kinds(machine.handle(.sequencesReserved(through: through), now: 3)) == ["publish"])
        #expect(
            Self.kinds(machine.handle(.clientRequest(client: [1], frames: Self.set2), now: 4)) == ["append", "reply"])
        let turnEnds = Self.kinds(machine.handle(.tick(observerBacklog: 0), now: 4))
        #expect(turnEnds.contains("publish") && !turnEnds.contains("sync") && !turnEnds.contains("reserve"))
        #expect(machine.published == 2)
        #expect(!Self.kinds(machine.handle(.tick(observerBacklog: 0), now: 10)).contains("sync"))
        let later = machine.handle(.tick(observerBacklog: 0), now: 60)
        #expect(Self.kinds(later).contains("sync"), "synced one interval after the last sync")
        #expect(!Self.kinds(later).contains("publish"), "nothing waited for it")
    }

    /// A driver ends a long turn early only while something waits for its tick
    /// (``NodeMachine/awaitsTick``): with `interval`, a SET taken and answered mid-turn waits for
    /// the tick to be published (a client with writes in flight would otherwise keep the turn
    /// going); with `always`, for its sync; a watch, for its events. A node with none of these
    /// keeps its long turns.
    @Test func aTurnIsAwaitedOnlyByWritesRepliesAndWatches() {
        var interval = Self.machine(.interval)
        _ = interval.handle(.tick(observerBacklog: 0), now: 1)
        #expect(!interval.awaitsTick)
        _ = interval.handle(.clientRequest(client: [1], frames: Self.set), now: 2)
        _ = interval.handle(.sequencesReserved(through: 1 + NodeMachine.reservationBlock), now: 2)
        _ = interval.handle(.clientRequest(client: [1], frames: Self.set2), now: 3)
        #expect(interval.awaitsTick, "an answered SET waits for the tick to be published")
        _ = interval.handle(.tick(observerBacklog: 0), now: 3)
        #expect(interval.published == 2)
        #expect(!interval.awaitsTick)

        var always = Self.machine()
        _ = always.handle(.tick(observerBacklog: 0), now: 1)
        _ = always.handle(.clientRequest(client: [1], frames: Self.set), now: 2)
        #expect(always.awaitsTick, "a SET waits for the tick's sync")
        let tick = always.handle(.tick(observerBacklog: 0), now: 2)
        guard case .syncLog(let position, _)? = tick.first(where: { if case .syncLog = $0 { true } else { false } })
        else {
            Issue.record("no sync asked for at the tick")
            return
        }
        _ = always.handle(.logDurable(through: position), now: 2)
        #expect(!always.awaitsTick)
        let watch = ClientProtocol.encodeRequest(
            .watch, id: 3, body: ClientProtocol.encodeWatch(channel: "c", from: nil))
        _ = always.handle(.clientRequest(client: [2], frames: watch), now: 3)
        #expect(always.awaitsTick, "a watch's events are sent at ticks")
    }

    /// With `interval`, a write beyond the reservation waits for the next one, and so does
    /// every write after it (deltas go out in sequence order); a stopping node that published
    /// everything releases its reservation (a later restart has nothing to settle).
    @Test func aWriteBeyondTheReservationWaitsForIt() {
        var machine = Self.machine(.interval)
        _ = machine.handle(.tick(observerBacklog: 0), now: 1)
        #expect(
            Self.kinds(machine.handle(.clientRequest(client: [1], frames: Self.set), now: 2)) == [
                "append", "reserve", "reply",
            ])
        #expect(
            Self.kinds(machine.handle(.clientRequest(client: [1], frames: Self.set2), now: 3)) == ["append", "reply"])
        #expect(machine.published == 0)
        let reserved = machine.handle(.sequencesReserved(through: 1 + NodeMachine.reservationBlock), now: 4)
        #expect(Self.kinds(reserved) == ["publish"], "both writes, in one DELTA batch")
        #expect(machine.published == 2)

        let stop = machine.handle(.stop, now: 5)
        guard case .syncLog(let position, _)? = stop.first(where: { if case .syncLog = $0 { true } else { false } })
        else {
            Issue.record("no sync at stop: \(Self.kinds(stop))")
            return
        }
        let released = machine.handle(.logDurable(through: position), now: 6)
        let releases = released.compactMap { action -> UInt64? in
            if case .reserveSequences(let through, _) = action { through } else { nil }
        }
        #expect(releases == [2], "released down to the last number used")
    }

    /// A full round of a model's local writes (a long queue, fed in rounds) is logged and its
    /// sync asked for at once, so it is published before the next round; a smaller round waits
    /// for the tick that ends the driver's turn (one sync per turn, not per peer message). With
    /// `interval`, even a full round waits for the interval.
    @Test func aFullRoundOfLocalWritesAsksForItsSyncAtOnce() {
        func writes(_ count: Int) -> [LocalWrite] {
            (1...count).map { value in
                LocalWrite(
                    address: ModelAddress(channel: "c", model: "m"),
                    version: Version(milliseconds: 1_800_000_000_000 + UInt64(value), counter: 0, node: "n1"),
                    writes: [PropertyWrite(name: "x", value: .int(Int64(value)))])
            }
        }
        let full = NodeMachine.localWritesPerRound
        var always = Self.machine()
        _ = always.handle(.tick(observerBacklog: 0), now: 1)
        #expect(Self.kinds(always.handle(.localWrites(writes(3)), now: 2)) == ["append"])
        let tick = always.handle(.tick(observerBacklog: 0), now: 2)
        #expect(Self.kinds(tick).first == "sync")
        guard case .syncLog(let first, _) = tick.first else { return }
        #expect(Self.kinds(always.handle(.logDurable(through: first), now: 2)) == ["publish"])
        #expect(always.published == 3)

        let round = always.handle(.localWrites(writes(full)), now: 3)
        #expect(Self.kinds(round) == ["append", "sync"])
        guard case .syncLog(let position, _) = round.last else { return }
        #expect(Self.kinds(always.handle(.logDurable(through: position), now: 3)).allSatisfy { $0 == "publish" })
        #expect(always.published == UInt64(3 + full))

        var interval = Self.machine(.interval)
        _ = interval.handle(.tick(observerBacklog: 0), now: 1)
        #expect(Self.kinds(interval.handle(.localWrites(writes(full)), now: 2)) == ["append", "reserve"])

        // Published while it may be (`storage.publish: written`): before the sync it asks for.
        var written = Self.machine(.always, publishBeforeSync: true)
        _ = written.handle(.tick(observerBacklog: 0), now: 1)
        #expect(Self.kinds(written.handle(.localWrites(writes(3)), now: 2)) == ["append", "reserve"])
        _ = written.handle(.sequencesReserved(through: 3 + NodeMachine.reservationBlock), now: 2)
        #expect(written.published == 3)
        let writtenRound = Self.kinds(written.handle(.localWrites(writes(full)), now: 3))
        #expect(writtenRound.first == "append" && writtenRound.last == "sync", "\(writtenRound)")
        #expect(writtenRound.count > 2 && writtenRound.dropFirst().dropLast().allSatisfy { $0 == "publish" })
        #expect(written.published == UInt64(3 + full))
    }

    /// `storage.compact_bytes`: once the log grows past it, the state is compacted.
    @Test func aLogPastCompactBytesIsCompacted() {
        var machine = Self.machine(compactBytes: 4096)
        var compacted = false
        for id in 1...300 as ClosedRange<UInt64> {
            compacted = Self.setAndSync(&machine, id).contains("compact") || compacted
        }
        #expect(compacted)
    }

    /// A SET of `x` to `id` (request `id`, at time `id`), its turn's sync asked for and reported
    /// done: the kinds of the actions the report made.
    static func setAndSync(_ machine: inout NodeMachine, _ id: UInt64) -> [String] {
        let request = ClientProtocol.encodeRequest(
            .set, id: id,
            body: ClientProtocol.encodeSet(
                ModelAddress(channel: "c", model: "m"), [PropertyWrite(name: "x", value: .int(Int64(id)))]))
        _ = machine.handle(.clientRequest(client: [1], frames: request), now: id)
        var kinds: [String] = []
        for action in machine.handle(.tick(observerBacklog: 0), now: id) {
            guard case .syncLog(let position, _) = action else { continue }
            kinds += Self.kinds(machine.handle(.logDurable(through: position), now: id))
        }
        return kinds
    }

    /// A host that writes compactions in the background (``BackgroundCompactingStorage``) puts
    /// the records appended during one after it in the new log: a second one asked for
    /// meanwhile (the log grew past `compact_bytes` again) is asked only once the first is
    /// answered, then at once, with the snapshot of that moment.
    @Test func aCompactionWaitsForTheOneNotYetAnswered() {
        var machine = Self.machine(compactBytes: 4096)
        var asked: [UInt64] = []  // the request ids at which a compaction was asked for
        for id in 1...600 as ClosedRange<UInt64> {
            asked += Self.setAndSync(&machine, id).filter { $0 == "compact" }.map { _ in id }
        }
        // Never answered: one compaction only, though the log grew past 4 KiB many times over.
        #expect(asked.count == 1, "\(asked)")
        // Answered: the deferred one at once, holding the last write.
        let answer = machine.handle(.compactionWritten, now: 601)
        let next = answer.compactMap { action -> StateSnapshot? in
            if case .compact(let snapshot, _, _) = action { snapshot } else { nil }
        }
        #expect(next.count == 1)
        let value = next.first?.store.properties(of: ModelAddress(channel: "c", model: "m"))["x"]?.value
        #expect(value == .int(600))
        // Answered with nothing grown since: none follows.
        #expect(!Self.kinds(machine.handle(.compactionWritten, now: 602)).contains("compact"))
    }

    /// 7.5: a reset's compaction is asked at once and to be written at once, even while another
    /// is under way (a host that writes compactions in the background writes that one first):
    /// writes the node takes after its reset must not land in a log a crash could bring back
    /// without the reset, where the forget, heard again, would drop them with the old state.
    /// And a node forgotten again before its first reset's compaction is answered is not alive
    /// again when that one is: only the compaction asked after the second reset holds it.
    @Test func aResetsCompactionIsAskedAtOnceAndAnsweredOnlyByItself() {
        var machine = Self.machine(compactBytes: 4096)
        _ = machine.handle(.tick(observerBacklog: 0), now: 1)
        machine.compact()  // an ordinary one, under way in the background
        #expect(machine.actions.contains { if case .compact(_, _, false) = $0 { true } else { false } })
        machine.resyncAfterForget(by: "n2")
        #expect(machine.durability.compactionsAsked == 2 && machine.resetUnwritten)
        #expect(machine.actions.contains { if case .compact(_, _, true) = $0 { true } else { false } })
        machine.resyncAfterForget(by: "n2")
        #expect(machine.durability.compactionsAsked == 3)
        _ = machine.handle(.compactionWritten, now: 2)
        _ = machine.handle(.compactionWritten, now: 3)
        #expect(machine.resetUnwritten, "the first reset's compaction holds the state the second dropped")
        _ = machine.handle(.compactionWritten, now: 4)
        #expect(!machine.resetUnwritten)
    }

    /// Recovery: the snapshot, then the log replayed over it; the next sequence number and the
    /// clock continue past everything recovered (7.2, 11.2).
    @Test func recoveryContinuesPastTheSnapshotAndTheLog() {
        var store = ReplicaStore()
        let old = Delta(
            channel: "c", model: "m", version: Version(milliseconds: 1_900_000_000_000, counter: 0, node: "n1"),
            sequence: 4,
            properties: [PropertyWrite(name: "x", value: 4)])
        _ = store.apply(old)
        let logged = Delta(
            channel: "c", model: "m", version: Version(milliseconds: 1_900_000_000_001, counter: 0, node: "n1"),
            sequence: 5,
            properties: [PropertyWrite(name: "x", value: 5)])
        let clock = HybridLogicalClock(node: "n1", wallClock: { 1_800_000_000_000 })
        let machine = NodeMachine(
            configuration: MachineRunner.configuration("n1"), clock: clock, incarnation: 1,
            recovery: .init(
                snapshot: StateSnapshot(store: store, latestSequence: 4, progress: ["n1": 4]), deltas: [logged]
            ),
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        #expect(machine.nextSequence == 6)
        #expect(machine.store.properties(of: ModelAddress(channel: "c", model: "m"))["x"]?.value == 5)
        #expect(clock.next() > logged.version, "never a version below one this node already wrote")
    }

    /// One sync at a time: SETs taken while a sync runs (a host that syncs in the background, as
    /// the simulator's slow disk does) ask for none; when it ends, its write is published and
    /// acknowledged and one sync is asked for at once for all of them. A stop does not wait for
    /// the sync in flight: it asks for its own, through everything logged.
    @Test func writesTakenWhileASyncRunsShareTheNextOne() {
        func set(_ id: UInt64) -> [[UInt8]] {
            ClientProtocol.encodeRequest(
                .set, id: id,
                body: ClientProtocol.encodeSet(
                    ModelAddress(channel: "c", model: "m"), [PropertyWrite(name: "x", value: .int(Int64(id)))]))
        }
        func syncs(_ actions: [NodeAction]) -> [UInt64] {
            actions.compactMap { if case .syncLog(let position, _) = $0 { position } else { nil } }
        }
        var machine = Self.machine()
        _ = machine.handle(.tick(observerBacklog: 0), now: 1)
        _ = machine.handle(.clientRequest(client: [1], frames: set(1)), now: 2)
        let first = syncs(machine.handle(.tick(observerBacklog: 0), now: 2))
        #expect(first.count == 1)
        for id in 2...3 as ClosedRange<UInt64> {
            #expect(Self.kinds(machine.handle(.clientRequest(client: [1], frames: set(id)), now: id + 1)) == ["append"])
            #expect(syncs(machine.handle(.tick(observerBacklog: 0), now: id + 1)).isEmpty, "a sync is running")
        }
        let ended = machine.handle(.logDurable(through: first[0]), now: 5)
        #expect(Self.kinds(ended).filter { $0 != "watch" } == ["publish", "reply", "sync"])
        #expect(machine.published == 1)
        let next = syncs(ended)
        #expect(next.count == 1 && next[0] > first[0])
        #expect(Self.kinds(machine.handle(.logDurable(through: next[0]), now: 9)) == ["publish", "reply", "reply"])
        #expect(machine.published == 3)

        // A stop while a sync runs syncs at once, through everything logged.
        _ = machine.handle(.clientRequest(client: [1], frames: set(4)), now: 10)
        let running = syncs(machine.handle(.tick(observerBacklog: 0), now: 10))
        #expect(running.count == 1)
        _ = machine.handle(.clientRequest(client: [1], frames: set(5)), now: 11)
        let stop = syncs(machine.handle(.stop, now: 11))
        #expect(stop.count == 1 && stop[0] > running[0], "the stop's own sync covers the last write")

        // Also when the running sync covers everything: the stop does not wait for it.
        var quiet = Self.machine()
        _ = quiet.handle(.tick(observerBacklog: 0), now: 1)
        _ = quiet.handle(.clientRequest(client: [1], frames: set(1)), now: 2)
        let covering = syncs(quiet.handle(.tick(observerBacklog: 0), now: 2))
        #expect(covering.count == 1)
        let stopped = quiet.handle(.stop, now: 3)
        #expect(syncs(stopped) == covering, "a sync of its own, through the same position")
    }

    /// PROTOCOL.md 10.9: a SNAPSHOT served while this node's own writes are not yet durable would let the peer
    /// hold them, covered by its progress list, while a power loss could still take them from
    /// this node — which would then number a new write the same, and the peer would drop it as
    /// a duplicate. So the reply waits for the sync, with either fsync policy, whole or paged;
    /// with nothing of its own waiting, it goes at once.
    @Test func aSnapshotWaitsUntilTheOwnWritesInItAreDurable() {
        let whole = ClientProtocol.encodeRequest(.snapshot, id: 7, body: [])
        let paged = ClientProtocol.encodeRequest(
            .snapshot, id: 8, body: SnapshotPage.encodeRequest(after: nil, maximumOctets: 4096))
        for (fsync, written) in [(NodeConfiguration.FsyncPolicy.always, false), (.always, true), (.interval, false)] {
            for request in [whole, paged] {
                var machine = Self.machine(fsync, publishBeforeSync: written)
                _ = machine.handle(.tick(observerBacklog: 0), now: 1)
                #expect(Self.kinds(machine.handle(.clientRequest(client: [2], frames: request), now: 1)) == ["reply"])
                _ = machine.handle(.clientRequest(client: [1], frames: Self.set), now: 2)
                let asked = machine.handle(.clientRequest(client: [2], frames: request), now: 2)
                #expect(!Self.kinds(asked).contains("reply"), "\(fsync): served before the write in it is durable")
                var actions = asked + machine.handle(.tick(observerBacklog: 0), now: 60)
                var replies: [[UInt8]] = []
                while let index = actions.firstIndex(where: { if case .syncLog = $0 { true } else { false } }),
                    case .syncLog(let position, _) = actions[index]
                {
                    actions.remove(at: index)
                    for case .reply(let client, _) in machine.handle(.logDurable(through: position), now: 61) {
                        replies.append(client)
                    }
                }
                #expect(replies.contains([2]), "\(fsync): the snapshot goes once the write is durable")
            }
        }

        // With `interval`, a snapshot asked for while a sync runs does not wait for the next
        // interval once that sync ends: the sync it needs is asked for at once.
        var machine = Self.machine(.interval)
        _ = machine.handle(.tick(observerBacklog: 0), now: 1)
        _ = machine.handle(.clientRequest(client: [1], frames: Self.set), now: 2)
        let running = machine.handle(.tick(observerBacklog: 0), now: 60).compactMap {
            if case .syncLog(let position, _) = $0 { position } else { nil }
        }
        #expect(running.count == 1)
        let second = ClientProtocol.encodeRequest(
            .set, id: 2,
            body: ClientProtocol.encodeSet(ModelAddress(channel: "c", model: "m"), [PropertyWrite(name: "x", value: 2)])
        )
        _ = machine.handle(.clientRequest(client: [1], frames: second), now: 61)
        #expect(!Self.kinds(machine.handle(.clientRequest(client: [2], frames: whole), now: 61)).contains("reply"))
        let ended = machine.handle(.logDurable(through: running[0]), now: 62)
        #expect(Self.kinds(ended).contains("sync"), "not one interval later")
    }

    /// With `interval`, a watch on the writing node is sent its own write only once the write is
    /// durable (a power loss could take it before), though peers have it at once.
    @Test func aWatchOnTheWritingNodeSeesItsOwnWriteOnceDurable() throws {
        var configuration = MachineRunner.configuration("n1", peers: ["n2"])
        configuration.fsync = .interval
        configuration.fsyncIntervalMilliseconds = 1000
        var node = MachineRunner(configuration)
        node.advance(1)
        _ = node.request(.watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: nil))
        let watched = node.sent.count
        func deltas() -> Int {
            node.events(watch: 7, from: watched).count { if case .delta = $0 { true } else { false } }
        }
        // The first write after a quiet start is synced at once (the interval has passed).
        _ = node.request(.set, id: 1, Array(Self.set[1]))
        node.advance(1)
        #expect(deltas() == 1)
        let published = node.published.count
        _ = node.request(.set, id: 2, Array(Self.set2[1]))
        #expect(node.published.count > published, "published at once")
        node.advance(10)
        #expect(deltas() == 1, "the second is not durable yet")
        node.advance(1000)
        #expect(deltas() == 2, "sent once the interval's sync made it durable")
    }
}

/// A nearly full disk (issue #13): writes are refused with ERROR 9, everything else goes on, and
/// writes are taken again when space returns — on the node machine alone.
@Suite("A full disk on the node machine")
struct DiskFullMachineTests {
    @Test func underTheReserveSetsAreRefusedAndReadsGoOn() {
        var configuration = MachineRunner.configuration("n1")
        configuration.reserveBytes = 1000
        var node = MachineRunner(configuration)
        let address = ModelAddress(channel: "c", model: "m")
        let set = ClientProtocol.encodeSet(address, [PropertyWrite(name: "x", value: 1)])
        node.handle(.diskSpace(availableBytes: 5_000_000))
        #expect(node.request(.set, id: 1, set)?.0.kind == .ok)
        node.handle(.diskSpace(availableBytes: 999))
        let refused = node.request(.set, id: 2, ClientProtocol.encodeSet(address, [PropertyWrite(name: "x", value: 2)]))
        #expect(refused?.0.kind == .error)
        let error = refused.flatMap { try? ClientProtocol.decodeError($0.1) }
        #expect(error?.code == ClientProtocol.ErrorCode.diskFull.rawValue)
        #expect(error?.message.contains("disk of node n1 is full") == true, "\(String(describing: error))")
        #expect(node.request(.get, id: 3, ClientProtocol.encodeAddress(address))?.0.kind == .ok, "reads go on")
        #expect(node.machine.store.properties(of: address)["x"]?.value == 1, "the refused write changed nothing")
        #expect(node.machine.status(now: node.now).diskFull)
        node.handle(.diskSpace(availableBytes: 999))
        #expect(node.machine.counters.diskFullEpisodes == 1, "one episode, however many measurements")
        node.handle(.diskSpace(availableBytes: 100_000_000))
        #expect(
            node.request(.set, id: 4, ClientProtocol.encodeSet(address, [PropertyWrite(name: "x", value: 3)]))?.0.kind
                == .ok)
        #expect(!node.machine.status(now: node.now).diskFull)
    }

    /// Above the reserve, a write the free space cannot hold with the log's next growth is
    /// refused (ERROR 9) rather than failing its append, which would stop the node; the writes
    /// taken since the last measurement count against it too, until the next measurement.
    @Test func aWriteTheFreeSpaceCannotHoldIsRefusedAboveTheReserve() {
        var configuration = MachineRunner.configuration("n1")
        configuration.reserveBytes = 1000
        var node = MachineRunner(configuration)
        let address = ModelAddress(channel: "c", model: "m")
        func set(_ id: UInt64, _ octets: Int) -> (ClientProtocol.ReplyKind, String?) {
            let body = ClientProtocol.encodeSet(
                address, [PropertyWrite(name: "p\(id)", value: .bytes([UInt8](repeating: 1, count: octets)))])
            let reply = node.request(.set, id: id, body)
            return (reply?.0.kind ?? .error, reply.flatMap { try? ClientProtocol.decodeError($0.1) }?.message)
        }
        node.handle(.diskSpace(availableBytes: 1000 + NodeMachine.logGrowthMargin + 10_000))
        let refused = set(1, 20_000)
        #expect(refused.0 == .error && refused.1?.contains("too few for this write") == true, "\(refused)")
        #expect(set(2, 6_000).0 == .ok)
        #expect(set(3, 6_000).0 == .error, "the first 6,000 octets count until the next measurement")
        #expect(!node.machine.status(now: node.now).diskFull && node.machine.counters.diskFullEpisodes == 0)
        node.handle(.diskSpace(availableBytes: 1000 + NodeMachine.logGrowthMargin + 10_000))
        #expect(set(4, 6_000).0 == .ok, "measured again")
        #expect(node.machine.counters.writesRefusedForSpace == 2, "counted (status, /metrics), the disk not full")
    }
}
