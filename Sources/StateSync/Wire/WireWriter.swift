/// Anything protocol primitives can be written to: a byte buffer (``WireWriter``) or a running
/// hash of the same bytes. The encoding is defined once, here (docs/PROTOCOL.md, "Primitives").
public protocol WireSink {
    /// Takes one more byte of the encoding.
    mutating func byte(_ value: UInt8)
    /// Takes several bytes of the encoding, in order.
    mutating func bytes<C: Collection>(_ values: C) where C.Element == UInt8
    /// An unsigned LEB128 varint (a default writes it byte by byte).
    mutating func varint(_ value: UInt64)
    /// A big-endian 64-bit unsigned integer (a default writes it byte by byte).
    mutating func uint64(_ value: UInt64)
    /// A length-prefixed UTF-8 string (a default writes its UTF-8 view).
    mutating func string(_ value: String)
}

extension WireSink {
    /// An unsigned LEB128 varint.
    public mutating func varint(_ value: UInt64) {
        var value = value
        while value >= 0x80 {
            byte(UInt8(truncatingIfNeeded: value) | 0x80)
            value >>= 7
        }
        byte(UInt8(value))
    }

    /// A signed integer as a zigzag varint.
    public mutating func zigzag(_ value: Int64) {
        varint(zigzagEncoded(value))
    }

    /// A big-endian 64-bit unsigned integer.
    public mutating func uint64(_ value: UInt64) {
        for shift in stride(from: 56, through: 0, by: -8) {
            byte(UInt8(truncatingIfNeeded: value >> UInt64(shift)))
        }
    }

    /// A length-prefixed UTF-8 string.
    public mutating func string(_ value: String) {
        varint(UInt64(value.utf8.count))
        bytes(value.utf8)
    }

    /// Length-prefixed raw bytes.
    public mutating func blob(_ value: [UInt8]) {
        varint(UInt64(value.count))
        bytes(value)
    }

    /// A tagged ``Value`` (docs/PROTOCOL.md, "Values").
    public mutating func value(_ value: Value) {
        switch value {
        case .null: byte(ValueTag.null)
        case .bool(let b): byte(b ? ValueTag.true : ValueTag.false)
        case .int(let i):
            byte(ValueTag.int)
            zigzag(i)
        case .double(let d):
            byte(ValueTag.double)
            uint64(d.bitPattern)
        case .string(let s):
            byte(ValueTag.string)
            string(s)
        case .bytes(let b):
            byte(ValueTag.bytes)
            blob(b)
        case .array(let items):
            byte(ValueTag.array)
            varint(UInt64(items.count))
            for item in items { self.value(item) }
        case .map(let map):
            byte(ValueTag.map)
            varint(UInt64(map.count))
            // Sorted keys: equal maps encode to equal bytes, so digests agree across nodes.
            for key in map.keys.sorted() {
                string(key)
                self.value(map[key]!)
            }
        }
    }
}

extension WireSink {
    /// A property value (docs/PROTOCOL.md 4.3): a value, a deletion (`09`), or either preceded by
    /// a time to live (`0A`, milliseconds).
    public mutating func propertyValue(_ write: PropertyWrite) {
        if write.isDeletion {
            byte(ValueTag.deleted)
            return
        }
        if write.timeToLive > 0 {
            byte(ValueTag.expiring)
            varint(write.timeToLive)
        }
        value(write.value)
    }

    /// A register's property value: an expired value is its time to live and a deletion.
    public mutating func propertyValue(_ register: ReplicaStore.Register) {
        if register.timeToLive > 0 {
            byte(ValueTag.expiring)
            varint(register.timeToLive)
        }
        if register.isDeleted { byte(ValueTag.deleted) } else { value(register.value) }
    }
}

/// `value` zigzag-encoded (0, -1, 1, -2, … as 0, 1, 2, 3, …): the varint of a signed integer.
func zigzagEncoded(_ value: Int64) -> UInt64 {
    UInt64(bitPattern: (value << 1) ^ (value >> 63))
}

/// Appends protocol primitives to a byte buffer.
public struct WireWriter: WireSink, Sendable {
    /// What was written.
    public private(set) var bytes: [UInt8]

    /// An empty writer with room for `capacity` bytes.
    public init(capacity: Int = 64) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    /// Appends one byte.
    public mutating func byte(_ value: UInt8) { bytes.append(value) }

    /// Appends bytes, in order.
    public mutating func bytes<C: Collection>(_ values: C) where C.Element == UInt8 { bytes.append(contentsOf: values) }

    // The primitives below append their bytes at once: byte by byte, every byte paid the
    // array's uniqueness and capacity checks (a writer of single sets spent 4 % of its I/O
    // thread in `uint64` alone, encoding each delta's timestamp for its log record and frame).

    /// Appends a varint in one append.
    public mutating func varint(_ value: UInt64) {
        if value < 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: value))
            return
        }
        var encoded: (UInt64, UInt64) = (0, 0)  // room for the longest varint, 10 bytes
        withUnsafeMutableBytes(of: &encoded) { buffer in
            var rest = value
            var count = 0
            while rest >= 0x80 {
                buffer[count] = UInt8(truncatingIfNeeded: rest) | 0x80
                rest >>= 7
                count += 1
            }
            buffer[count] = UInt8(truncatingIfNeeded: rest)
            bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: buffer[...count]))
        }
    }

    /// Appends a big-endian 64-bit number in one append.
    public mutating func uint64(_ value: UInt64) {
        withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
    }

    /// Appends a length-prefixed string, its UTF-8 copied at once (a native string's bytes are
    /// contiguous; another is made native first).
    public mutating func string(_ value: String) {
        var value = value
        value.withUTF8 { utf8 in
            varint(UInt64(utf8.count))
            bytes.append(contentsOf: utf8)
        }
    }

    /// Appends `count` bytes, all of which `body` writes into the room it is given (not
    /// initialised before), in one append. (Zeroed room appended to ``bytes`` and written in
    /// place would save the copy, but the zeroing cost more: `bench --path single`, 6 pairs.)
    mutating func appendBytes(count: Int, _ body: (UnsafeMutableRawBufferPointer) -> Void) {
        withUnsafeTemporaryAllocation(byteCount: count, alignment: 1) { room in
            body(room)
            bytes.append(contentsOf: UnsafeRawBufferPointer(room))
        }
    }

    /// Removes everything written from `offset` on.
    mutating func cut(to offset: Int) {
        bytes.removeSubrange(offset...)
    }

    /// Replaces the 8 bytes at `offset` with `value`, big-endian (a length or checksum known
    /// only once what follows it is written).
    mutating func overwrite(_ value: UInt64, at offset: Int) {
        for index in 0..<8 { bytes[offset + index] = UInt8(truncatingIfNeeded: value >> UInt64(56 - 8 * index)) }
    }
}

/// The one-byte tags of ``Value`` on the wire.
enum ValueTag {
    static let null: UInt8 = 0x00
    static let `false`: UInt8 = 0x01
    static let `true`: UInt8 = 0x02
    static let int: UInt8 = 0x03
    static let double: UInt8 = 0x04
    static let string: UInt8 = 0x05
    static let bytes: UInt8 = 0x06
    static let array: UInt8 = 0x07
    static let map: UInt8 = 0x08
    /// Property values only (never inside an array or map): the property is deleted.
    static let deleted: UInt8 = 0x09
    /// Property values only: a time to live (varint milliseconds) precedes the value.
    static let expiring: UInt8 = 0x0A
}
