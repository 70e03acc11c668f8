import Testing

@testable import StateSync

/// Streamed SNAPSHOTs (PROTOCOL.md 10.9) on the node machine alone: a state of any size moves in
/// pages of bounded size, in order, and a transfer broken off resumes at its cursor.
@Suite("Streamed snapshots on the node machine")
struct SnapshotStreamTests {
    /// A node holding `models` models of n2's (3 properties each), as a peer would serve them.
    static func server(models: Int) -> MachineRunner {
        var server = MachineRunner(MachineRunner.configuration("n1", peers: ["n2"]))
        for index in 1...models {
            let delta = Delta(
                channel: index % 3 == 0 ? "b" : "a", model: "m\(index)",
                version: Version(milliseconds: 1_800_000_000_000 + UInt64(index), counter: 0, node: "n2"),
                sequence: UInt64(index),
                properties: (0..<3).map { PropertyWrite(name: "p\($0)", value: .string("value-\(index)-\($0)")) })
            server.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(delta).encode()))
        }
        return server
    }

    static func page(_ server: inout MachineRunner, after: ModelAddress?, octets: Int, id: UInt64) throws -> [UInt8] {
        let answer = server.request(
            .snapshot, id: id, SnapshotPage.encodeRequest(after: after, maximumOctets: octets), client: [0x4C, 1])
        let reply = try #require(answer)
        #expect(reply.0.kind == .ok)
        return reply.1
    }

    /// Answers `node`'s repair request `request` with OK and `body` (a page).
    static func answer(
        _ request: (peer: String, frames: [[UInt8]]), with body: [UInt8], on node: inout MachineRunner
    ) throws {
        let header = try ClientProtocol.decodeRequestHeader(request.frames[0])
        node.handle(
            .repairReply(peer: request.peer, frames: ClientProtocol.encodeReply(.ok, id: header.requestID, body: body)))
    }

    /// The SNAPSHOT page requests `node` sent since `answered` (moved past them), with what each
    /// asks for.
    static func snapshotRequests(_ node: MachineRunner, since answered: inout Int) throws -> [(
        request: (peer: String, frames: [[UInt8]]), paged: (after: ModelAddress?, maximumOctets: Int)
    )] {
        var found: [(request: (peer: String, frames: [[UInt8]]), paged: (after: ModelAddress?, maximumOctets: Int))] =
            []
        while answered < node.repairRequests.count {
            let request = node.repairRequests[answered]
            answered += 1
            let header = try ClientProtocol.decodeRequestHeader(request.frames[0])
            guard header.command == ClientProtocol.Command.snapshot.rawValue,
                let paged = try SnapshotPage.decodeRequest(request.frames[1])
            else { continue }
            found.append((request, (paged.after, paged.maximumOctets)))
        }
        return found
    }

    @Test func pagesCoverEveryModelOnceInOrderWithinTheirSize() throws {
        var server = Self.server(models: 300)
        var seen: [ModelAddress] = []
        var cursor: ModelAddress?
        var pages: [SnapshotPage] = []
        var largest = 0
        repeat {
            let bytes = try Self.page(&server, after: cursor, octets: 1024, id: UInt64(pages.count + 1))
            largest = max(largest, bytes.count)
            let page = try SnapshotPage.decode(bytes)
            pages.append(page)
            seen += page.models.map(\.0)
            cursor = page.next
        } while cursor != nil && pages.count < 1000
        #expect(pages.count > 20, "\(pages.count) pages")
        #expect(largest < 1024 + 200, "a page is its size plus at most one model: \(largest) octets")
        #expect(seen.count == 300 && Set(seen).count == 300)
        #expect(zip(seen, seen.dropFirst()).allSatisfy { SnapshotPage.precedes($0, $1) }, "in page order")
        #expect(pages[0].progress == ["n2": 300] && pages[0].latestSequence == 0)
        #expect(pages.dropFirst().allSatisfy { $0.progress.isEmpty }, "progress on the first page only")
        #expect(server.machine.counters.snapshotPagesServed == pages.count)
        // An empty body still gets the whole snapshot in one reply (older requesters).
        let answer = server.request(.snapshot, id: 9999, [])
        let whole = try #require(answer)
        #expect(try StateSnapshot.decode(whole.1).store.digest == server.machine.store.digest)
        // A malformed paged request is refused.
        let malformed = server.request(.snapshot, id: 10_000, [7])
        #expect(malformed?.0.kind == .error)
    }

    /// The next page is encoded at the tick after a page is served (while the requester merges
    /// the one it got) and served as is when asked for with the same cursor: a write in between
    /// is not in it (it reaches the requester as a delta), and another requester, with no page
    /// ahead, gets it read now.
    @Test func theNextPageIsEncodedAheadAtTheTickAndServedAsIs() throws {
        var server = Self.server(models: 60)
        let first = try SnapshotPage.decode(try Self.page(&server, after: nil, octets: 1024, id: 1))
        let cursor = try #require(first.next)
        let ready = try #require(server.machine.repair.serving[[0x4C, 1]]?.prefetched)
        #expect(ready.after == cursor && ready.octets == 1024)
        let ahead = try SnapshotPage.decode(ready.bytes)
        let (address, _) = try #require(ahead.models.first)
        let newer = Delta(
            channel: address.channel, model: address.model,
            version: Version(milliseconds: 1_900_000_000_000, counter: 0, node: "n2"), sequence: 61,
            properties: [PropertyWrite(name: "p0", value: "newer")])
        server.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(newer).encode()))
        let second = try Self.page(&server, after: cursor, octets: 1024, id: 2)
        #expect(second == ready.bytes, "the page encoded ahead is served")
        #expect(try SnapshotPage.decode(second).models.first?.1.first { $0.name == "p0" }?.register.value != "newer")
        let answer = server.request(
            .snapshot, id: 3, SnapshotPage.encodeRequest(after: cursor, maximumOctets: 1024), client: [0x4C, 2])
        let other = try #require(answer)
        #expect(try SnapshotPage.decode(other.1).models.first?.1.first { $0.name == "p0" }?.register.value == "newer")
        // Asked with another size, the page is read anew too.
        let resized = try Self.page(&server, after: cursor, octets: 2048, id: 4)
        #expect(try SnapshotPage.decode(resized).models.first?.1.first { $0.name == "p0" }?.register.value == "newer")
    }

    /// The requester asks page after page; a page lost with its link is asked again of the same
    /// peer at the same cursor after the page timeout; at the end the state equals the peer's
    /// and the progress the first page carried is covered.
    @Test func aStreamResumesAtItsCursorAfterALostPage() throws {
        var server = Self.server(models: 200)
        var configuration = MachineRunner.configuration("n4", peers: ["n1", "n2", "n3"])
        configuration.snapshotPageOctets = 2048
        var node = MachineRunner(configuration)
        func beats() {
            for peer in ["n1", "n2", "n3"] {
                node.handle(
                    .peerMessage(peer: "inproc://\(peer)", frames: RepairMachineTests.heartbeat(peer, latest: 0)))
            }
        }
        beats()
        node.advance(50)
        node.machine.repair.needsSnapshot = true
        var answered = node.repairRequests.count
        var dropped = 0
        var cursors: [ModelAddress?] = []
        for _ in 0..<400 {
            beats()
            node.advance(100)
            for (request, paged) in try Self.snapshotRequests(node, since: &answered) {
                cursors.append(paged.after)
                // The third page is lost on the way back, once.
                if cursors.count == 3 && dropped == 0 {
                    dropped += 1
                    continue
                }
                let page = try Self.page(&server, after: paged.after, octets: paged.maximumOctets, id: 1)
                try Self.answer(request, with: page, on: &node)
            }
            if node.machine.counters.snapshotsApplied > 0 { break }
        }
        #expect(node.machine.counters.snapshotsApplied == 1)
        #expect(node.machine.store.digest == server.machine.store.digest)
        #expect(cursors.count >= 8, "\(cursors.count) pages asked")
        #expect(cursors[3] == cursors[2], "the lost page was asked again at its cursor")
        #expect(node.machine.origins["n2"]?.contiguous == 200, "the first page's progress is covered")
    }

    /// A streamed snapshot whose peer restarts (a HEARTBEAT of a new incarnation) starts over:
    /// the new run would serve the later pages from a fresh list, with the progress of now, not
    /// of the first page (PROTOCOL.md 11.3, step 1). Continued at its cursor, the stream would
    /// cover the first page's progress with pages of another state.
    @Test func aStreamWhosePeerRestartsStartsOver() throws {
        var server = Self.server(models: 200)
        var configuration = MachineRunner.configuration("n4", peers: ["n1", "n2", "n3"])
        configuration.snapshotPageOctets = 2048
        var node = MachineRunner(configuration)
        var incarnation: [String: UInt64] = ["n1": 1, "n2": 1, "n3": 1]
        func beats() {
            for peer in ["n1", "n2", "n3"] {
                node.handle(PromptRepairMachineTests.heartbeat(peer, incarnation: incarnation[peer]!))
            }
        }
        beats()
        node.advance(50)
        node.machine.repair.needsSnapshot = true
        var answered = node.repairRequests.count
        var asked: [(peer: String, after: ModelAddress?)] = []
        for _ in 0..<20 {
            beats()
            node.advance(100)
            for (request, paged) in try Self.snapshotRequests(node, since: &answered) {
                asked.append((request.peer, paged.after))
                guard asked.count == 1 else { continue }  // the second page stays unanswered
                let page = try Self.page(&server, after: paged.after, octets: paged.maximumOctets, id: 1)
                try Self.answer(request, with: page, on: &node)
            }
            if asked.count >= 3 { break }
            if asked.count == 2 {
                // The peer serving the stream restarts while the second page is asked of it.
                let serving = String(asked[1].peer.dropFirst("inproc://".count))
                incarnation[serving] = 2
            }
        }
        try #require(asked.count >= 3, "\(asked.count) pages asked")
        #expect(asked[1].after != nil, "the second page continues the stream")
        #expect(asked[2].after == nil, "the restarted peer's stream is given up: a new snapshot from its first page")
    }

    /// A page is merged a slice at a time, the first when it comes, one more at each tick
    /// (the deadline is "now" while one is left), whole models; what comes between slices is
    /// merged as usual and wins by its version, the repair round asks for nothing meanwhile, and
    /// the progress the stream carries is covered only once the last slice is merged.
    @Test func aPageIsMergedASliceAtATimeWithOtherInputsBetween() throws {
        var server = Self.server(models: 60)
        var configuration = MachineRunner.configuration("n4", peers: ["n1", "n2"])
        configuration.snapshotMergeSliceRegisters = 30  // ten models of three registers
        var node = MachineRunner(configuration)
        func beats() {
            for peer in ["n1", "n2"] {
                node.handle(
                    .peerMessage(peer: "inproc://\(peer)", frames: RepairMachineTests.heartbeat(peer, latest: 0)))
            }
        }
        beats()
        node.advance(50)
        node.machine.repair.needsSnapshot = true
        node.advance(NodeMachine.repairInterval)
        let request = try #require(node.repairRequests.last)
        let paged = try #require(try SnapshotPage.decodeRequest(request.frames[1]))
        let bytes = try Self.page(&server, after: paged.after, octets: paged.maximumOctets, id: 1)
        let page = try SnapshotPage.decode(bytes)
        #expect(page.models.count == 60 && page.next == nil, "one page")
        try Self.answer(request, with: bytes, on: &node)
        #expect(node.machine.store.allModels.count == 10, "the first slice, at once")
        #expect(node.machine.repair.stream?.merging?.page.modelsRead == 10)
        #expect(node.machine.nextDeadline() == node.now, "the next slice is due at once")
        #expect(node.machine.counters.snapshotsApplied == 0)
        // A newer write to a model of a later slice, and an older one, between slices.
        let later = page.models[45].0
        for (milliseconds, value, sequence) in [(1_900_000_000_000, "newer", 61), (1_000, "older", 62)] {
            let delta = Delta(
                channel: later.channel, model: later.model,
                version: Version(milliseconds: UInt64(milliseconds), counter: 0, node: "n2"),
                sequence: UInt64(sequence), properties: [PropertyWrite(name: "p0", value: .string(value))])
            node.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(delta).encode()))
            server.handle(.peerMessage(peer: "inproc://n2", frames: PeerMessage.delta(delta).encode()))
        }
        // A repair round falls due: the page being merged is not asked for again.
        let asked = node.repairRequests.count
        beats()
        node.advance(NodeMachine.repairInterval)
        #expect(node.machine.repair.stream?.merging?.page.modelsRead == 20, "one slice per tick")
        #expect(node.repairRequests.count == asked, "nothing asked while a page is merged")
        var ticks = 0
        while node.machine.repair.stream != nil, ticks < 20 {
            ticks += 1
            node.advance(0)
        }
        #expect(ticks == 4, "six slices in all")
        #expect(node.machine.counters.snapshotsApplied == 1)
        #expect(node.machine.store.digest == server.machine.store.digest, "the page and the writes between, merged")
        #expect(node.machine.store.records(of: later)["p0"]?.value == "newer")
        #expect(node.machine.origins["n2"]?.contiguous == 62, "the page's progress covered, then the writes above it")
        #expect(node.machine.nextDeadline() > node.now)
    }

    /// Pages merged in slices over a stream of many pages: each page is asked for once, the next
    /// only after the last slice of the one before, and the state ends equal to the server's.
    @Test func aStreamOfSlicedPagesAsksForEachPageOnce() throws {
        var server = Self.server(models: 60)
        var configuration = MachineRunner.configuration("n4", peers: ["n2"])
        configuration.snapshotPageOctets = 1024
        configuration.snapshotMergeSliceRegisters = 2
        var node = MachineRunner(configuration)
        node.handle(.peerMessage(peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0)))
        node.advance(50)
        node.machine.repair.needsSnapshot = true
        var answered = node.repairRequests.count
        var cursors: [ModelAddress?] = []
        var ticks = 0
        var slicedTicks = 0  // ticks that found a page being merged
        while node.machine.counters.snapshotsApplied == 0, ticks < 2000 {
            ticks += 1
            if node.machine.repair.stream?.merging != nil { slicedTicks += 1 }
            node.advance(1)
            while answered < node.repairRequests.count {
                let request = node.repairRequests[answered]
                answered += 1
                let paged = try #require(try SnapshotPage.decodeRequest(request.frames[1]))
                let merging = node.machine.repair.stream?.merging != nil
                #expect(!merging, "a page asked for while one is merged")
                cursors.append(paged.after)
                let page = try Self.page(&server, after: paged.after, octets: paged.maximumOctets, id: 1)
                try Self.answer(request, with: page, on: &node)
            }
        }
        #expect(node.machine.counters.snapshotsApplied == 1)
        #expect(cursors.count >= 4, "\(cursors.count) pages")
        #expect(Set(cursors.map { $0.map { "\($0)" } ?? "" }).count == cursors.count, "each page asked for once")
        #expect(
            slicedTicks == 60 - cursors.count, "a model a slice: one when its page comes, the others at a tick each")
        #expect(node.machine.store.digest == server.machine.store.digest)
        #expect(node.machine.origins["n2"]?.contiguous == 60)
    }

    /// A page read a slice at a time that turns out damaged past its first slices (its checksum
    /// held: a faulty server) is counted malformed and the snapshot starts over; what was merged
    /// of it stays, also of the model it breaks in (registers a peer served merge safely in any
    /// order), and a watch of its channel is resynced (those values reached no journal, and the
    /// next snapshot will not change them again).
    @Test func aPageDamagedPastItsFirstSlicesStartsTheSnapshotOver() throws {
        var page = WireWriter()
        for byte in SnapshotPage.magic { page.byte(byte) }
        page.varint(0)
        StateSnapshot.writeProgress(["n2": 3], to: &page)
        page.varint(3)
        for model in ["m1", "m2", "m3"] {
            page.string("c")
            page.string(model)
            page.varint(model == "m3" ? 2 : 1)
            if model == "m3" {  // a sound register before the damaged one
                page.string("o")
                page.propertyValue(PropertyWrite(name: "o", value: .string(model)))
                page.uint64(Version(milliseconds: 5, counter: 0, node: "n2").timestamp)
                page.string("n2")
            }
            page.string("p")
            if model == "m3" {
                page.byte(0xFF)  // no value has this tag
            } else {
                page.propertyValue(PropertyWrite(name: "p", value: .string(model)))
            }
            page.uint64(Version(milliseconds: 5, counter: 0, node: "n2").timestamp)
            page.string("n2")
        }
        page.byte(0)
        page.uint64(ReplicaStore.fnv1a(page.bytes))
        var configuration = MachineRunner.configuration("n4", peers: ["n2"])
        configuration.snapshotMergeSliceRegisters = 1
        var node = MachineRunner(configuration)
        node.handle(.peerMessage(peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0)))
        node.advance(50)
        _ = node.request(.watch, id: 7, ClientProtocol.encodeWatch(channel: "c", from: nil))
        node.advance(1)
        let watched = node.sent.count
        node.machine.repair.needsSnapshot = true
        node.advance(NodeMachine.repairInterval)
        let request = try #require(node.repairRequests.last)
        try Self.answer(request, with: page.bytes, on: &node)
        node.advance(0)
        #expect(node.machine.counters.malformedMessages == 0)
        node.advance(0)
        #expect(node.machine.counters.malformedMessages == 1)
        node.advance(1)
        let resync = node.events(watch: 7, from: watched)
        #expect(resync.contains { if case .snapshotBegin(.lagged) = $0 { true } else { false } }, "\(resync)")
        #expect(node.machine.repair.stream == nil && node.machine.repair.needsSnapshot, "the snapshot starts over")
        #expect(node.machine.counters.snapshotsApplied == 0)
        #expect(node.machine.origins["n2"]?.contiguous ?? 0 == 0, "the damaged page's progress is not covered")
        for model in ["m1", "m2"] {
            #expect(
                node.machine.store.properties(of: ModelAddress(channel: "c", model: model))["p"]?.value
                    == .string(model))
        }
        let partly = node.machine.store.properties(of: ModelAddress(channel: "c", model: "m3"))
        #expect(partly["o"]?.value == .string("m3") && partly["p"] == nil, "what was merged of m3 stays")
    }

    /// A page's model is merged as it is decoded, straight into the store, when no live model
    /// is attached to it, and read whole when one is (the live model gets what won in name
    /// order); either way the registers whose names a DELTA could not carry are left out and
    /// counted, the others are merged (section 5), of a name given twice the newer wins, and
    /// the clock observes the newest. The same page goes to a node with the model attached and
    /// to one without.
    @Test(arguments: [true, false])
    func aPagesModelIsMergedWithoutItsInvalidNamesAttachedOrNot(attached: Bool) throws {
        func version(_ milliseconds: UInt64) -> Version {
            Version(milliseconds: 1_800_000_000_000 + milliseconds, counter: 0, node: "n2")
        }
        var page = WireWriter()
        for byte in SnapshotPage.magic { page.byte(byte) }
        page.varint(0)
        StateSnapshot.writeProgress(["n2": 1], to: &page)
        // A value under the empty name (which may carry only the model's deletion), a name with
        // NUL, and "d" twice, the newer first (no server sends that), 30 s ahead of the wall.
        let registers: [(String, UInt64)] = [
            ("", 1), ("a", 1), ("b\u{0}", 1), ("c", 1), ("d", 30_000), ("d", 20_000),
        ]
        page.varint(2)
        for (channel, model) in [("c", "m"), ("bad/channel", "m")] {
            page.string(channel)
            page.string(model)
            page.varint(UInt64(registers.count))
            for (name, milliseconds) in registers {
                page.string(name)
                page.propertyValue(PropertyWrite(name: name, value: .string("\(name)@\(milliseconds)")))
                page.uint64(version(milliseconds).timestamp)
                page.string("n2")
            }
        }
        page.byte(0)  // the last page
        page.uint64(ReplicaStore.fnv1a(page.bytes))
        var node = MachineRunner(MachineRunner.configuration("n4", peers: ["n2"]))
        let address = ModelAddress(channel: "c", model: "m")
        if attached { node.machine.attachedModels[address] = 7 }
        node.handle(.peerMessage(peer: "inproc://n2", frames: RepairMachineTests.heartbeat("n2", latest: 0)))
        node.advance(50)
        node.machine.repair.needsSnapshot = true
        node.advance(NodeMachine.repairInterval)
        let request = try #require(node.repairRequests.last)
        let header = try ClientProtocol.decodeRequestHeader(request.frames[0])
        let actions = node.machine.handle(
            .repairReply(
                peer: request.peer, frames: ClientProtocol.encodeReply(.ok, id: header.requestID, body: page.bytes)),
            now: node.now)
        let held = node.machine.store.properties(of: address)
        #expect(held.keys.sorted() == ["a", "c", "d"], "\(held.keys.sorted())")
        #expect(held["d"]?.value == .string("d@30000"), "the newer of the two")
        #expect(node.machine.store.properties(of: ModelAddress(channel: "bad/channel", model: "m")).isEmpty)
        #expect(node.machine.counters.malformedMessages == 1, "the page counted once")
        #expect(node.machine.counters.snapshotsApplied == 1)
        #expect(node.machine.clock.next() > version(30_000), "the clock observed the newest merged")
        let delivered = actions.flatMap { action -> [ModelDelivery] in
            if case .deliver(let deliveries) = action { deliveries } else { [] }
        }
        #expect(delivered.map(\.address) == (attached ? [address] : []))
        if attached { #expect(delivered.first?.sets.flatMap(\.writes).map(\.name) == ["a", "c", "d"]) }
    }

    /// A page whose registers are out of name order, or that names one twice (not what a node
    /// sends), decodes in ascending name order, of a name given twice the newer kept: the merge
    /// relies on the order, and merging each in turn would keep the newer.
    @Test func aPageOutOfNameOrderIsPutInOrder() throws {
        var page = WireWriter()
        for byte in SnapshotPage.magic { page.byte(byte) }
        page.varint(0)
        StateSnapshot.writeProgress([:], to: &page)
        page.varint(1)
        page.string("c")
        page.string("m")
        page.varint(3)
        for (name, value, milliseconds) in [("b", "1", 3), ("a", "2", 2), ("b", "3", 1)] {
            let version = Version(milliseconds: UInt64(milliseconds), counter: 0, node: "n2")
            page.string(name)
            page.propertyValue(PropertyWrite(name: name, value: .string(value)))
            page.uint64(version.timestamp)
            page.string(version.node)
        }
        page.byte(0)  // the last page
        page.uint64(ReplicaStore.fnv1a(page.bytes))
        let decoded = try SnapshotPage.decode(page.bytes)
        #expect(decoded.models.count == 1)
        #expect(decoded.models.first?.1.map(\.name) == ["a", "b"])
        #expect(decoded.models.first?.1.last?.register.value == "1")
    }
}
