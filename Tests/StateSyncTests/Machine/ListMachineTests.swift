import Testing

@testable import StateSync

/// LIST (docs/PROTOCOL.md 10.13) on the node machine: pages in name order, prefixes, bounds,
/// the channel list, and permissions.
@Suite("LIST on the node machine")
struct ListMachineTests {
    static func list(
        _ node: inout MachineRunner, _ request: ClientProtocol.ListRequest, id: UInt64, identity: String? = nil
    )
        -> (ClientProtocol.ReplyHeader, [UInt8])?
    {
        node.request(.list, id: id, ClientProtocol.encodeList(request), identity: identity)
    }

    @Test func pagesListEveryModelOnceInNameOrderWithCountsAndNewestVersions() throws {
        var node = MachineRunner(MachineRunner.configuration("n1"))
        var id: UInt64 = 1
        var newest: [String: Version] = [:]
        for (index, model) in ["b", "a2", "a10", "c", "a1", "z"].enumerated() {
            for property in 0...(index % 3) {
                id += 1
                let reply = node.request(
                    .set, id: id,
                    ClientProtocol.encodeSet(
                        ModelAddress(channel: "ch", model: model), [PropertyWrite(name: "p\(property)", value: .int(1))]
                    ))
                newest[model] = try ClientProtocol.decodeVersion(try #require(reply).1)
            }
            node.advance(1)
        }
        _ = node.request(
            .set, id: 99,
            ClientProtocol.encodeSet(
                ModelAddress(channel: "other", model: "m"), [PropertyWrite(name: "x", value: .int(1))]))

        var seen: [ClientProtocol.ListEntry] = []
        var after = ""
        for page in 1...10 {
            let (header, body) = try #require(
                Self.list(&node, .init(channel: "ch", after: after, limit: 4), id: 100 + UInt64(page)))
            #expect(header.kind == .ok)
            let (entries, more) = try ClientProtocol.decodeListReply(body)
            seen += entries
            guard more else { break }
            #expect(entries.count == 4, "a page with more after it is full")
            after = entries.last!.name
        }
        #expect(seen.map(\.name) == ["a1", "a10", "a2", "b", "c", "z"], "each model once, in name order")
        #expect(seen.first { $0.name == "b" }?.count == 1 && seen.first { $0.name == "a10" }?.count == 3)
        for entry in seen { #expect(entry.latest == newest[entry.name], "\(entry.name)'s newest version") }

        let prefixed = try ClientProtocol.decodeListReply(
            try #require(Self.list(&node, .init(channel: "ch", prefix: "a1"), id: 200)).1)
        #expect(prefixed.entries.map(\.name) == ["a1", "a10"] && !prefixed.more)
        let channels = try ClientProtocol.decodeListReply(try #require(Self.list(&node, .init(channel: ""), id: 201)).1)
        #expect(channels.entries.map(\.name) == ["ch", "other"])
        #expect(channels.entries[0].count == 6 && channels.entries[0].latest == newest.values.max())
        let unknown = try ClientProtocol.decodeListReply(
            try #require(Self.list(&node, .init(channel: "none"), id: 202)).1)
        #expect(unknown.entries.isEmpty && !unknown.more)

        // A limit of 0 is malformed; a huge one is capped at 1000 entries per reply.
        var zero = WireWriter()
        zero.string("ch")
        zero.string("")
        zero.string("")
        zero.varint(0)
        #expect(node.request(.list, id: 203, zero.bytes)?.0.kind == .error)
        #expect(
            try ClientProtocol.decodeList(ClientProtocol.encodeList(.init(channel: "ch", limit: 1 << 40))).limit == 1000
        )
    }

    /// Names sort by their UTF-8 octets, non-ASCII ones after ASCII; a prefix matches octets.
    @Test func namesSortByTheirOctets() throws {
        var store = ReplicaStore()
        for (index, model) in ["\u{E9}t\u{E9}", "zebra", "Zulu", "\u{65E5}\u{672C}", "e"].enumerated() {
            _ = store.merge(
                ModelAddress(channel: "c", model: model), property: "x",
                register: .init(
                    value: .int(1), version: Version(milliseconds: 1 + UInt64(index), counter: 0, node: "n")))
        }
        var names: [String] = []
        var after = ""
        while true {
            let page = store.list(channel: "c", prefix: "", after: after, limit: 2)
            names += page.entries.map(\.name)
            guard page.more, let last = page.entries.last else { break }
            after = last.name
        }
        #expect(names == ["Zulu", "e", "zebra", "\u{E9}t\u{E9}", "\u{65E5}\u{672C}"])
        #expect(
            store.list(channel: "c", prefix: "\u{E9}", after: "", limit: 10).entries.map(\.name) == ["\u{E9}t\u{E9}"])
    }

    @Test func withSecurityAClientListsOnlyWhatItMayRead() throws {
        var configuration = MachineRunner.configuration("n1")
        configuration.security = SecurityConfiguration(secretKeyFile: "unused", peerKeys: [:])
        var node = MachineRunner(configuration)
        node.handle(
            .clientAccessChanged([
                "client:all": .init(key: "all"), "client:sensors": .init(key: "sensors", read: ["sensors*"], write: []),
            ]))
        for (index, channel) in ["sensors", "sensors-eu", "secret"].enumerated() {
            _ = node.request(
                .set, id: UInt64(index + 1),
                ClientProtocol.encodeSet(
                    ModelAddress(channel: channel, model: "m"), [PropertyWrite(name: "x", value: .int(1))]),
                identity: "client:all")
        }
        let all = try ClientProtocol.decodeListReply(
            try #require(Self.list(&node, .init(channel: ""), id: 10, identity: "client:all")).1)
        #expect(all.entries.map(\.name) == ["secret", "sensors", "sensors-eu"])
        let limited = try ClientProtocol.decodeListReply(
            try #require(Self.list(&node, .init(channel: ""), id: 11, identity: "client:sensors")).1)
        #expect(limited.entries.map(\.name) == ["sensors", "sensors-eu"], "no name of a channel it may not read")
        let refused = try #require(Self.list(&node, .init(channel: "secret"), id: 12, identity: "client:sensors"))
        #expect(refused.0.kind == .error)
        // STATUS too names only the channels the client may read.
        let status = node.request(.status, id: 13, [], identity: "client:sensors")
        let statusValue = try ClientProtocol.decodeValue(status?.1 ?? [])
        #expect(NodeStatus(statusValue)?.channels.keys.sorted() == ["sensors", "sensors-eu"])
        // A later version's extra fields after a LIST body are ignored (section 13).
        var longer = ClientProtocol.encodeList(.init(channel: "sensors", limit: 5))
        longer += [0x01, 0x02]
        #expect(try ClientProtocol.decodeList(longer) == .init(channel: "sensors", limit: 5))
    }
}
