/// The log payload of a local delta (channel · model · DELTA body, the bytes
/// ``DeltaLog/writePayload(_:to:)`` writes through the ``WireSink`` primitives), written in one
/// append.
///
/// Every local write is encoded once, into its log record, whose body is then the DELTA frame on
/// the wire. Through the primitives, each field was an append of its own, each paying the array's
/// uniqueness and capacity checks: a dozen per single set, most of the 7–8 % of a writer's
/// samples spent staging its records (issue #17). Here the size is added up first and the bytes
/// are written through a pointer into room taken at once. Values that nest (arrays and maps) are
/// left to the primitives: ``append(_:to:)`` returns `nil` and writes nothing.
enum DeltaPayloadWriter {
    /// Where the parts of an appended payload lie in the writer's bytes.
    struct Placement {
        /// The model id (with its length) starts here.
        let model: Int
        /// The DELTA body starts here.
        let body: Int
    }

    /// Appends the payload of `delta` to `writer`; `nil` (nothing appended) when one of its values
    /// is an array or a map.
    static func append(_ delta: Delta, to writer: inout WireWriter) -> Placement? {
        let properties = delta.properties
        let version2 = delta.needsVersion2
        let channel = delta.channel
        let model = delta.model
        let node = delta.version.node
        // The body: version byte, timestamp, node, sequence, property count, then each property.
        var bodySize = 1 + 8 + stringSize(node) + varintSize(delta.sequence) + varintSize(UInt64(properties.count))
        for property in properties {
            guard let size = propertySize(property, version2: version2) else { return nil }
            bodySize += stringSize(property.name) + size
        }
        let channelSize = stringSize(channel)
        let modelSize = stringSize(model)
        let start = writer.bytes.count
        writer.appendBytes(count: channelSize + modelSize + bodySize) { out in
            var at = 0
            put(channel, into: out, at: &at)
            put(model, into: out, at: &at)
            out[at] = version2 ? PeerMessage.deletionVersion : PeerMessage.protocolVersion
            at += 1
            out.storeBytes(of: delta.version.timestamp.bigEndian, toByteOffset: at, as: UInt64.self)
            at += 8
            put(node, into: out, at: &at)
            put(varint: delta.sequence, into: out, at: &at)
            put(varint: UInt64(properties.count), into: out, at: &at)
            for property in properties {
                put(property.name, into: out, at: &at)
                if version2 {
                    if property.isDeletion {
                        out[at] = ValueTag.deleted
                        at += 1
                        continue
                    }
                    if property.timeToLive > 0 {
                        out[at] = ValueTag.expiring
                        at += 1
                        put(varint: property.timeToLive, into: out, at: &at)
                    }
                }
                put(property.value, into: out, at: &at)
            }
            precondition(at == out.count, "a delta's payload size was miscounted")
        }
        return Placement(model: start + channelSize, body: start + channelSize + modelSize)
    }

    // MARK: - Sizes

    static func varintSize(_ value: UInt64) -> Int {
        value < 0x80 ? 1 : (64 - value.leadingZeroBitCount + 6) / 7
    }

    private static func stringSize(_ string: String) -> Int {
        let count = string.utf8.count
        return varintSize(UInt64(count)) + count
    }

    /// A property value's size: its value's, after a deletion or time-to-live tag in a version-2
    /// body; `nil` for a value that nests.
    private static func propertySize(_ property: PropertyWrite, version2: Bool) -> Int? {
        if version2 {
            if property.isDeletion { return 1 }
            if property.timeToLive > 0 {
                return valueSize(property.value).map { $0 + 1 + varintSize(property.timeToLive) }
            }
        }
        return valueSize(property.value)
    }

    private static func valueSize(_ value: Value) -> Int? {
        switch value {
        case .null, .bool: 1
        case .int(let int): 1 + varintSize(zigzag(int))
        case .double: 9
        case .string(let string): 1 + stringSize(string)
        case .bytes(let bytes): 1 + varintSize(UInt64(bytes.count)) + bytes.count
        case .array, .map: nil
        }
    }

    private static func zigzag(_ value: Int64) -> UInt64 {
        UInt64(bitPattern: (value << 1) ^ (value >> 63))
    }

    // MARK: - Writing into counted room

    private static func put(varint value: UInt64, into out: UnsafeMutableRawBufferPointer, at: inout Int) {
        var rest = value
        while rest >= 0x80 {
            out[at] = UInt8(truncatingIfNeeded: rest) | 0x80
            rest >>= 7
            at += 1
        }
        out[at] = UInt8(truncatingIfNeeded: rest)
        at += 1
    }

    private static func put(_ string: String, into out: UnsafeMutableRawBufferPointer, at: inout Int) {
        var string = string
        string.withUTF8 { utf8 in
            put(varint: UInt64(utf8.count), into: out, at: &at)
            put(UnsafeRawBufferPointer(utf8), into: out, at: &at)
        }
    }

    private static func put(_ bytes: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer, at: inout Int) {
        guard !bytes.isEmpty else { return }
        UnsafeMutableRawBufferPointer(rebasing: out[at..<at + bytes.count]).copyMemory(from: bytes)
        at += bytes.count
    }

    /// Only the cases ``valueSize(_:)`` counted: the caller checked there is no array or map.
    private static func put(_ value: Value, into out: UnsafeMutableRawBufferPointer, at: inout Int) {
        switch value {
        case .null:
            out[at] = ValueTag.null
            at += 1
        case .bool(let bool):
            out[at] = bool ? ValueTag.true : ValueTag.false
            at += 1
        case .int(let int):
            out[at] = ValueTag.int
            at += 1
            put(varint: zigzag(int), into: out, at: &at)
        case .double(let double):
            out[at] = ValueTag.double
            out.storeBytes(of: double.bitPattern.bigEndian, toByteOffset: at + 1, as: UInt64.self)
            at += 9
        case .string(let string):
            out[at] = ValueTag.string
            at += 1
            put(string, into: out, at: &at)
        case .bytes(let bytes):
            out[at] = ValueTag.bytes
            at += 1
            put(varint: UInt64(bytes.count), into: out, at: &at)
            bytes.withUnsafeBytes { put($0, into: out, at: &at) }
        case .array, .map:
            preconditionFailure("a nested value has no counted size")
        }
    }
}
