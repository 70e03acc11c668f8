/// The log payload of a local delta (channel · model · DELTA body, the bytes
/// ``DeltaLog/writePayload(_:to:)`` writes through the ``WireSink`` primitives), written in one
/// append.
///
/// Every local write is encoded once, into its log record, whose body is then the DELTA frame on
/// the wire. Through the primitives, each field was an append of its own, each paying the array's
/// uniqueness and capacity checks: a dozen per single set, most of the 7–8 % of a writer's
/// samples spent staging its records (issue #17). Here the size is added up first, the bytes are
/// written through a pointer into room of that size and appended in one go
/// (``WireWriter/appendBytes(count:_:)``). Values that nest (arrays and maps) are
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
        // The writes are read where they lie, by position (a `let` of them, or a `for … in`
        // over them, is a copy: an atomic reference count and its release per delta written).
        let count = delta.writes.count
        let version2 = delta.needsVersion2
        let channel = delta.channel
        let model = delta.model
        let node = delta.version.node
        // The body: version byte, timestamp, node, sequence, property count, then each property.
        var bodySize = 1 + 8 + stringSize(node) + varintSize(delta.sequence) + varintSize(UInt64(count))
        for position in 0..<count {
            guard let size = propertySize(delta.writes[position], version2: version2) else { return nil }
            bodySize += stringSize(delta.writes[position].name) + size
        }
        let channelSize = stringSize(channel)
        let modelSize = stringSize(model)
        let start = writer.bytes.count
        writer.appendBytes(count: channelSize + modelSize + bodySize) { out in
            var room = Room(out: out)
            room.string(channel)
            room.string(model)
            room.byte(version2 ? PeerMessage.deletionVersion : PeerMessage.protocolVersion)
            room.uint64(delta.version.timestamp)
            room.string(node)
            room.varint(delta.sequence)
            room.varint(UInt64(count))
            for position in 0..<count {
                room.string(delta.writes[position].name)
                if version2 {
                    if delta.writes[position].isDeletion {
                        room.byte(ValueTag.deleted)
                        continue
                    }
                    if delta.writes[position].timeToLive > 0 {
                        room.byte(ValueTag.expiring)
                        room.varint(delta.writes[position].timeToLive)
                    }
                }
                room.value(delta.writes[position].value)
            }
            precondition(room.at == out.count, "a delta's payload size was miscounted")
        }
        return Placement(model: start + channelSize, body: start + channelSize + modelSize)
    }

    // MARK: - Sizes

    private static func varintSize(_ value: UInt64) -> Int {
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
        case .int(let int): 1 + varintSize(zigzagEncoded(int))
        case .double: 9
        case .string(let string): 1 + stringSize(string)
        case .bytes(let bytes): 1 + varintSize(UInt64(bytes.count)) + bytes.count
        case .array, .map: nil
        }
    }

    // MARK: - Writing into counted room

    /// The counted room being filled. Every write checks that it stays inside: a raw buffer's
    /// subscripts are not checked in release builds, and a miscount must stop the process, not
    /// write past the room.
    private struct Room {
        let out: UnsafeMutableRawBufferPointer
        private(set) var at = 0

        init(out: UnsafeMutableRawBufferPointer) { self.out = out }

        mutating func byte(_ value: UInt8) {
            precondition(at < out.count, "a delta's payload size was miscounted")
            out[at] = value
            at += 1
        }

        mutating func uint64(_ value: UInt64) {
            precondition(at + 8 <= out.count, "a delta's payload size was miscounted")
            out.storeBytes(of: value.bigEndian, toByteOffset: at, as: UInt64.self)
            at += 8
        }

        mutating func varint(_ value: UInt64) {
            var rest = value
            while rest >= 0x80 {
                byte(UInt8(truncatingIfNeeded: rest) | 0x80)
                rest >>= 7
            }
            byte(UInt8(truncatingIfNeeded: rest))
        }

        mutating func bytes(_ bytes: UnsafeRawBufferPointer) {
            guard !bytes.isEmpty else { return }
            precondition(at + bytes.count <= out.count, "a delta's payload size was miscounted")
            UnsafeMutableRawBufferPointer(rebasing: out[at..<at + bytes.count]).copyMemory(from: bytes)
            at += bytes.count
        }

        mutating func string(_ string: String) {
            var string = string
            string.withUTF8 { utf8 in
                varint(UInt64(utf8.count))
                bytes(UnsafeRawBufferPointer(utf8))
            }
        }

        /// Only the cases ``valueSize(_:)`` counted: the caller checked there is no array or map.
        mutating func value(_ value: Value) {
            switch value {
            case .null: byte(ValueTag.null)
            case .bool(let bool): byte(bool ? ValueTag.true : ValueTag.false)
            case .int(let int):
                byte(ValueTag.int)
                varint(zigzagEncoded(int))
            case .double(let double):
                byte(ValueTag.double)
                uint64(double.bitPattern)
            case .string(let string):
                byte(ValueTag.string)
                self.string(string)
            case .bytes(let data):
                byte(ValueTag.bytes)
                varint(UInt64(data.count))
                data.withUnsafeBytes { bytes($0) }
            case .array, .map:
                preconditionFailure("a nested value has no counted size")
            }
        }
    }
}
