import Testing

@testable import StateSync

/// Deletion and expiry on the node machine alone (PROTOCOL.md 8.2, 8.3, 10.3, 10.5.5, 10.14):
/// DELETE and expiring SETs through the client API, what watches are sent, what a peer merges.
@Suite("Deletion and expiry on the node machine")
struct DeletionMachineTests {
    static let address = ModelAddress(channel: "c", model: "m")

    static func set(_ node: inout MachineRunner, _ id: UInt64, _ properties: [String: Value], ttl: UInt64 = 0) {
        let writes = properties.keys.sorted().map { PropertyWrite(name: $0, value: properties[$0]!, timeToLive: ttl) }
        let reply = node.request(.set, id: id, ClientProtocol.encodeSet(Self.address, writes))
        #expect(reply?.0.kind == .ok)
    }

    /// The outcome octet and version of a SET or DELETE reply.
    static func outcome(_ reply: (ClientProtocol.ReplyHeader, [UInt8])?) -> (Version?, UInt8?) {
        guard let reply, reply.0.kind == .ok else { return (nil, nil) }
        return (try? ClientProtocol.decodeVersion(Array(reply.1.dropLast())), reply.1.last)
    }

    /// A client that watched the channel on `node` (request `watch`), took what it was sent,
    /// and unwatched (request `unwatch`): its session holds the state and the cursor.
    static func watchedAndLeft(_ node: inout MachineRunner, watch: UInt64, unwatch: UInt64) throws -> WatchSession {
        _ = node.request(.watch, id: watch, ClientProtocol.encodeWatch(channel: "c", from: nil))
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        _ = try changes(&session, node.events(watch: watch))
        var body = WireWriter()
        body.uint64(watch)
        _ = node.request(.unwatch, id: unwatch, body.bytes)
        return session
    }

    static func changes(_ session: inout WatchSession, _ events: [ClientProtocol.WatchEventBody]) throws
        -> [PropertyChange]
    {
        var changes: [PropertyChange] = []
        for event in events {
            for case .change(let change, _, _) in try session.handle(event, from: "node") { changes.append(change) }
        }
        return changes
    }

    /// 10.14: DELETE of a property and of the model — a versioned write, answered with its
    /// version and outcome, published as a version-2 DELTA, sent to watches, gone from GET.
    @Test func deleteIsAVersionedWriteThatWatchesSeeWithTheOldValue() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        Self.set(&node, 1, ["a": 1, "b": "two"])
        _ = node.request(.watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: nil))
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        _ = try Self.changes(&session, node.events(watch: 7))

        let published = node.published.count
        let first = Self.outcome(
            node.request(.delete, id: 2, ClientProtocol.encodeDelete(Self.address, properties: ["a"])))
        #expect(first.1 == 1 && first.0 != nil)
        #expect(node.published[published...].contains { $0.count > 1 && $0[1].first == PeerMessage.deletionVersion })
        let again = Self.outcome(
            node.request(.delete, id: 3, ClientProtocol.encodeDelete(Self.address, properties: ["a"])))
        #expect(again.1 == 1, "a deletion is always written: an older write may still be on its way")
        #expect((again.0 ?? .zero) > (first.0 ?? .zero))
        #expect(node.machine.store.properties(of: Self.address).keys.sorted() == ["b"])

        let whole = Self.outcome(
            node.request(.delete, id: 4, ClientProtocol.encodeDelete(Self.address, properties: [])))
        #expect(whole.1 == 1)
        let get = node.request(.get, id: 5, ClientProtocol.encodeAddress(Self.address))
        #expect(try get.map { try ClientProtocol.decodeProperties($0.1) }?.isEmpty == true)

        let changes = try Self.changes(&session, node.events(watch: 7))
        #expect(changes.map(\.property) == ["a", "b"])
        #expect(changes.map(\.old) == [1, "two"])
        #expect(changes.allSatisfy { $0.kind == .deleted && $0.new == .null })
        #expect(changes[1].version == whole.0)
        #expect(!session.replica.models.contains("m"))
    }

    /// 10.14: a DELETE naming the empty property is refused (ERROR 3); so is a SET that mixes the
    /// model's deletion with other writes.
    @Test func anEmptyPropertyNameIsRefused() {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        let reply = node.request(.delete, id: 1, ClientProtocol.encodeDelete(Self.address, properties: ["", "x"]))
        #expect(reply?.0.kind == .error)
        #expect(reply.flatMap { try? ClientProtocol.decodeError($0.1).code } == 3)
        let mixed = node.request(
            .set, id: 2, ClientProtocol.encodeSet(Self.address, [.modelDeletion, PropertyWrite(name: "x", value: 1)]))
        #expect(mixed.flatMap { try? ClientProtocol.decodeError($0.1).code } == 3)
    }

    /// 8.3 and 10.5.5: a value set with a time to live is deleted when the node's wall clock
    /// passes its expiry — once, at the expiry version — and the watch's next CAUGHT-UP carries
    /// the node's clock of expiry, from which the client deletes it too, exactly once.
    @Test func anExpiringValueIsDeletedOnceOnTheNodeAndItsWatches() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        _ = node.request(.watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: nil))
        Self.set(&node, 1, ["session": "ann"], ttl: 2_000)
        let written = try #require(node.machine.store.properties(of: Self.address)["session"])
        #expect(written.expiresAt == written.version.milliseconds + 2_000)
        node.advance(1_000)
        #expect(node.machine.store.properties(of: Self.address)["session"] != nil)
        node.advance(1_100)
        #expect(node.machine.store.properties(of: Self.address).isEmpty)
        #expect(node.machine.counters.valuesExpired == 1)
        for _ in 0..<30 { node.advance(100) }  // markers keep coming: the expiry is told once
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        let changes = try Self.changes(&session, node.events(watch: 7))
        let expiries = changes.filter { $0.kind == .expired }
        #expect(expiries.count == 1)
        #expect(expiries.first?.old == "ann")
        #expect(expiries.first?.version == Version(milliseconds: written.expiresAt!, counter: 0, node: "n1"))
        #expect(session.replica.models.isEmpty)
    }

    /// 8.3: a replica that learns an expiring write late (a peer, past its expiry) deletes it at
    /// its next tick, at the same version as its writer did; a watch resumed there with the
    /// cursor of a watch of the writer reports the expiry once.
    @Test func everyReplicaExpiresAtTheSameVersionAndAResumedWatchTellsItOnce() throws {
        var writer = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        var other = MachineRunner(MachineRunner.configuration("n2", peers: ["n1"]))
        _ = writer.request(.watch, id: 1, ClientProtocol.encodeWatch(channel: "c", from: nil))
        Self.set(&writer, 1, ["token": "t"], ttl: 500)
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        _ = try Self.changes(&session, writer.events(watch: 1))
        writer.advance(600)
        other.wall.milliseconds = writer.wall.milliseconds
        for frames in writer.published { other.handle(.peerMessage(peer: "inproc://n1", frames: frames)) }
        other.advance(1)
        #expect(other.machine.store.records(of: Self.address) == writer.machine.store.records(of: Self.address))
        #expect(other.machine.store.digest == writer.machine.store.digest)
        // The watcher of n1 had not been told of the expiry: it resumes on n2.
        _ = other.request(.watch, id: 2, ClientProtocol.encodeWatch(channel: "c", from: session.replica.cursor))
        for _ in 0..<15 { other.advance(100) }
        let changes = try Self.changes(&session, other.events(watch: 2))
        #expect(changes.map(\.kind) == [.expired])
    }

    /// 10.5.8: a watch resumed after values expired and were written or deleted again gets the
    /// node's deltas replayed before any CAUGHT-UP: each expiry is told before the later write
    /// (old value, then null, then the new one), not after it — with exact old values (the
    /// client's replica held the values: `--state`), as a live watch tells it. (An operator
    /// trial saw `1 → 2` over an expired value, a deletion of an expired one, and the expiries
    /// after the later writes.)
    @Test func aResumedWatchTellsExpiriesBeforeTheWritesAfterThem() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        var session = try Self.watchedAndLeft(&node, watch: 1, unwatch: 2)
        Self.set(&node, 3, ["v": 1, "w": 1], ttl: 1000)
        node.advance(1500)  // both expired on the node
        Self.set(&node, 4, ["v": 2])
        _ = node.request(.delete, id: 5, ClientProtocol.encodeDelete(Self.address, properties: ["w"]))
        // The client resumes with what it held (the state before the writes).
        let from = node.sent.count
        _ = node.request(.watch, id: 6, ClientProtocol.encodeWatch(channel: "c", from: session.replica.cursor))
        for _ in 0..<3 { node.advance(100) }
        let told = try Self.changes(&session, node.events(watch: 6, from: from)).map {
            "\($0.property) \($0.kind) \($0.old?.jsonText() ?? "nil")→\($0.new.jsonText())"
        }
        #expect(
            told == [
                "v set nil→1", "w set nil→1", "v expired 1→null", "w expired 1→null", "v set nil→2",
            ], "\(told)")
        #expect(session.replica.properties(of: "m").mapValues(\.value) == ["v": 2])
    }

    /// 10.9 and 10.5.4: a peer's snapshot carries deletions, the model's included: the
    /// receiver deletes what it held, and a new watch's snapshot carries them to a client whose
    /// replica is behind.
    @Test func snapshotsCarryDeletionsToPeersAndWatches() throws {
        var holder = MachineRunner(MachineRunner.configuration("n1"))
        Self.set(&holder, 1, ["a": 1, "b": 2])
        var behind = try Self.watchedAndLeft(&holder, watch: 7, unwatch: 8)
        _ = holder.request(.delete, id: 2, ClientProtocol.encodeDelete(Self.address, properties: []))
        Self.set(&holder, 3, ["c": 3])
        _ = holder.request(.delete, id: 4, ClientProtocol.encodeDelete(Self.address, properties: ["c"]))

        // A receiver holding the old values merges the holder's snapshot.
        var receiver = MachineRunner(MachineRunner.configuration("n2"))
        let old = Delta(
            channel: "c", model: "m", version: Version(milliseconds: 1, counter: 0, node: "n3"), sequence: 1,
            properties: [PropertyWrite(name: "a", value: "ancient")])
        receiver.handle(.peerMessage(peer: "inproc://n3", frames: PeerMessage.delta(old).encode()))
        _ = receiver.machine.merge(holder.machine.snapshot)
        #expect(receiver.machine.store.properties(of: Self.address).isEmpty)
        #expect(receiver.machine.store.records(of: Self.address) == holder.machine.store.records(of: Self.address))

        // The client that was behind resumes past the history: its resync carries the deletions.
        let from = holder.sent.count
        _ = holder.request(.watch, id: 9, ClientProtocol.encodeWatch(channel: "c", from: nil))
        let changes = try Self.changes(&behind, holder.events(watch: 9, from: from))
        #expect(Set(changes.map(\.property)) == ["a", "b"])
        #expect(changes.allSatisfy { $0.kind == .deleted })
        #expect(behind.replica.models.isEmpty)
    }

    /// 10.5.1: a filtered watch gets the deletion of a model its prefix selects, whatever its
    /// properties.
    @Test func aFilteredWatchGetsTheDeletionOfAModelItSelects() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        Self.set(&node, 1, ["p0": 1, "p1": 2])
        _ = node.request(
            .watch, id: 7,
            ClientProtocol.encodeWatch(channel: "c", from: nil, filter: .init(prefix: "m", properties: ["p0"])))
        _ = node.request(.delete, id: 2, ClientProtocol.encodeDelete(Self.address, properties: []))
        var session = WatchSession(replica: ChannelReplica(channel: "c"))
        let changes = try Self.changes(&session, node.events(watch: 7))
        #expect(changes.map { "\($0.property) \($0.kind)" } == ["p0 set", "p0 deleted"])
    }

    /// Section 14: DELETE is a write; a key that may only read the channel gets ERROR 8.
    @Test func deleteNeedsTheRightToWrite() {
        var configuration = MachineRunner.configuration("n1")
        configuration.security = SecurityConfiguration(
            secretKeyFile: "unused", peerKeys: [:], clients: [.init(key: "reader", read: ["*"], write: [])])
        var node = MachineRunner(configuration)
        node.handle(.clientAccessChanged(["client:0": .init(key: "reader", read: ["*"], write: [])]))
        let reply = node.request(
            .delete, id: 1, ClientProtocol.encodeDelete(Self.address, properties: []), identity: "client:0")
        #expect(reply.flatMap { try? ClientProtocol.decodeError($0.1).code } == 8)
    }
}
