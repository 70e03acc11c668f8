// libFuzzer entry point over every decoder of untrusted bytes: values, peer messages, client
// requests and replies, the snapshot file, snapshot pages and member entries. Built by `.ci/fuzz` with `swiftc -sanitize=fuzzer`
// from the wire sources directly (no package build), so it runs anywhere Swift does.
//
// The first input byte chooses the decoder; the rest is the input. A decoder may throw — that is
// the expected answer to garbage — but must never trap, hang or allocate without bound.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzDecoders(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let selector = data[0]
    let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    switch selector % 8 {
    case 0:
        var reader = WireReader(bytes)
        _ = try? reader.value()
    case 1:
        // A DELTA: split the input into topic and body at the first 0xFF (or the middle).
        let split = bytes.firstIndex(of: 0xFF) ?? bytes.count / 2
        _ = try? PeerMessage.decodeAll([[UInt8(ascii: "D")] + bytes[..<split], Array(bytes[split...].dropFirst())])
        _ = try? PeerMessage.decodeAll([
            [UInt8(ascii: "D")] + bytes[..<split], Array(bytes[split...].dropFirst()), bytes,
        ])
        // The same bytes as a channel batch (PROTOCOL.md 7.6): topic M<channel>\0, model-first frames.
        _ = try? PeerMessage.decodeDeltas([[UInt8(ascii: "M")] + bytes[..<split], Array(bytes[split...].dropFirst())])
        _ = try? PeerMessage.decodeDeltas([
            [UInt8(ascii: "M")] + bytes[..<split], Array(bytes[split...].dropFirst()), bytes,
        ])
        // And as a packed batch (PROTOCOL.md 7.7): topic P<channel>\0, one frame of entries.
        _ = try? PeerMessage.decodeDeltaMessage([
            [UInt8(ascii: "P")] + bytes[..<split], Array(bytes[split...].dropFirst()),
        ])
    case 2:
        _ = try? PeerMessage.decode([PeerMessage.heartbeatTopic, bytes])
    case 3:
        _ = try? ClientProtocol.decodeRequestHeader(bytes)
        _ = try? ClientProtocol.decodeSet(bytes)
        _ = try? ClientProtocol.decodeAddress(bytes)
        _ = try? ClientProtocol.decodeWatch(bytes)
        _ = try? ClientProtocol.decodeFetch(bytes)
        _ = try? ClientProtocol.decodeList(bytes)
    case 4:
        _ = try? ClientProtocol.decodeReplyHeader(bytes)
        _ = try? ClientProtocol.decodeWatchEvent(bytes)
        _ = try? ClientProtocol.decodeFetched(bytes)
        _ = try? ClientProtocol.decodeProperties(bytes)
        _ = try? ClientProtocol.decodeListReply(bytes)
        _ = try? ClientProtocol.decodeBatchedOKs(bytes)
    case 5:
        _ = try? ClientProtocol.decodeValue(bytes)
        _ = try? ClientProtocol.decodeError(bytes)
        _ = try? ClientProtocol.decodeVersion(bytes)
    case 6:
        _ = try? StateSnapshot.decode(StateSnapshot.magic + bytes)
        _ = try? SnapshotPage.decode(SnapshotPage.magic + bytes)
        _ = try? SnapshotPage.decodeRequest(bytes)
        _ = try? Membership.decodeAnnounce(bytes)
        // A watch state file with a valid checksum, so the decoder past it is what is fuzzed.
        var file = WireWriter()
        for byte in ChannelReplica.fileMagic + bytes { file.byte(byte) }
        file.uint64(StateSnapshot.fnv1a(file.bytes))
        _ = try? ChannelReplica(decoding: file.bytes)
    default:
        // Round trip: whatever decodes must re-encode and decode to the same value.
        var reader = WireReader(bytes)
        if let value = try? reader.value() {
            var writer = WireWriter()
            writer.value(value)
            var again = WireReader(writer.bytes)
            guard let decoded = try? again.value(), decoded == value || value.containsNaN else {
                fatalError("re-encoded value does not decode to itself: \(value)")
            }
        }
    }
    return 0
}

extension Value {
    /// NaN is not equal to itself, so a round trip of a NaN double cannot compare equal.
    var containsNaN: Bool {
        switch self {
        case .double(let d): d.isNaN
        case .array(let items): items.contains { $0.containsNaN }
        case .map(let map): map.values.contains { $0.containsNaN }
        default: false
        }
    }
}
