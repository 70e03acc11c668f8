#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Reads protocol primitives from a frame, never trusting a length or a count: every read is
/// bounds-checked and every count is checked against the bytes that remain before anything is
/// allocated (docs/PROTOCOL.md, "Errors").
public struct WireReader: Sendable {
    /// How deep arrays and maps may nest.
    public static let maximumDepth = 32

    private let bytes: [UInt8]
    /// Where reading stops: the end of `bytes`, or of the range the reader was made for (or is
    /// limited to: ``limit(to:)``).
    private var end: Int
    /// Where the next read starts (in `bytes`, from its start).
    public private(set) var offset: Int

    /// A reader at the start of `bytes`.
    public init(_ bytes: [UInt8]) {
        self.bytes = bytes
        self.offset = 0
        self.end = bytes.count
    }

    /// Reads no further than `newEnd` (at or after ``offset``, within what remains) until
    /// ``endLimit(restoring:)``; returns the end to restore. For an entry of a packed batch read
    /// by the batch's own reader: a reader of its own per entry held the batch's bytes, an atomic
    /// reference count and its release per delta (issue #17).
    package mutating func limit(to newEnd: Int) -> Int {
        precondition(newEnd >= offset && newEnd <= end, "a limit within what remains")
        let previous = end
        end = newEnd
        return previous
    }

    /// Ends a ``limit(to:)``: reading goes on after the limited part (what of it was not read is
    /// passed over), up to `previous`, the end ``limit(to:)`` returned.
    package mutating func endLimit(restoring previous: Int) {
        precondition(previous >= end, "the end before the limit")
        offset = end
        end = previous
    }

    /// Whether the octets of `one` and `other` (ranges of the frame, in ``offset``'s terms) are
    /// the same, compared in place.
    package func octets(_ one: Range<Int>, equal other: Range<Int>) -> Bool {
        guard one.count == other.count else { return false }
        precondition(
            one.lowerBound >= 0 && one.upperBound <= bytes.count && other.lowerBound >= 0
                && other.upperBound <= bytes.count, "ranges within the bytes")
        return bytes.withUnsafeBufferPointer { all in
            memcmp(all.baseAddress! + one.lowerBound, all.baseAddress! + other.lowerBound, one.count) == 0
        }
    }

    /// Bytes not yet read.
    public var remaining: Int { end - offset }
    /// Whether everything was read.
    public var isAtEnd: Bool { offset >= end }

    /// Passes over `count` bytes, which must remain (a length read with ``count(_:minimumItemSize:)``).
    package mutating func skip(_ count: Int) {
        precondition(count >= 0 && count <= remaining, "skipping past the end")
        offset += count
    }

    /// Reads one byte; `field` names it in errors.
    public mutating func byte(_ field: String) throws(WireError) -> UInt8 {
        guard offset < end else { throw .truncated(field: field) }
        defer { offset += 1 }
        return bytes[offset]
    }

    /// Reads a varint (section 4.1).
    public mutating func varint(_ field: String) throws(WireError) -> UInt64 {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let b = try byte(field)
            if shift == 63 && b > 1 { throw .badVarint(field: field) }
            result |= UInt64(b & 0x7f) << shift
            if b & 0x80 == 0 { return result }
            shift += 7
            if shift > 63 { throw .badVarint(field: field) }
        }
    }

    /// Reads a zigzag-encoded signed varint.
    public mutating func zigzag(_ field: String) throws(WireError) -> Int64 {
        let raw = try varint(field)
        return Int64(bitPattern: (raw >> 1) ^ (0 &- (raw & 1)))
    }

    /// Reads a big-endian 64-bit number.
    public mutating func uint64(_ field: String) throws(WireError) -> UInt64 {
        guard remaining >= 8 else { throw .truncated(field: field) }
        let start = offset
        offset += 8
        return bytes.withUnsafeBytes { UInt64(bigEndian: $0.loadUnaligned(fromByteOffset: start, as: UInt64.self)) }
    }

    /// The most items a decoder reserves room for up front, whatever a count says: a count is
    /// bounded by the bytes that remain, not by what the items take in memory (a 64 MiB map
    /// could name 32 million entries and have about 2.7 GB reserved before its first entry fails
    /// to decode). Past it, the collection grows as items are read.
    static let maximumReservation = 1024

    /// A count of items each at least `minimumItemSize` bytes long: bounded by what remains.
    public mutating func count(_ field: String, minimumItemSize: Int = 1) throws(WireError) -> Int {
        let raw = try varint(field)
        guard raw <= UInt64(remaining / max(minimumItemSize, 1)) else { throw .tooLarge(field: field, count: raw) }
        return Int(raw)
    }

    /// Reads a length-prefixed blob.
    public mutating func blob(_ field: String) throws(WireError) -> [UInt8] {
        let length = try count(field)
        defer { offset += length }
        return Array(bytes[offset..<offset + length])
    }

    /// Reads a length-prefixed UTF-8 string (invalid UTF-8 is an error).
    public mutating func string(_ field: String) throws(WireError) -> String {
        try utf8(field, count: try count(field))
    }

    /// The next `length` octets (which remain: a length read with ``count(_:minimumItemSize:)``)
    /// as UTF-8 text: the rest of a string whose length was read.
    @inline(__always)
    package mutating func utf8(_ field: String, count length: Int) throws(WireError) -> String {
        precondition(length >= 0 && length <= remaining, "a length within what remains")
        let slice = bytes[offset..<offset + length]
        offset += length
        guard let text = String(utf8Bytes: slice) else { throw .invalidUTF8(field: field) }
        return text
    }

    /// ``string(_:)``, except that when the bytes are those of `recent` it returns `recent`
    /// itself, compared, not decoded again (a batch's deltas repeat their origin and property
    /// names); `recent` becomes the string read.
    package mutating func string(_ field: String, repeating recent: inout String?) throws(WireError) -> String {
        let length = try count(field)
        if var last = recent, last.utf8.count == length {
            let start = offset
            let same =
                length == 0
                || last.withUTF8 { utf8 in
                    // Byte by byte: names are short, and a call to memcmp cost more than the loop.
                    bytes.withUnsafeBufferPointer { all in
                        var index = 0
                        while index < length, utf8[index] == all[start + index] { index += 1 }
                        return index == length
                    }
                }
            if same {
                offset += length
                return last
            }
        }
        let slice = bytes[offset..<offset + length]
        offset += length
        guard let text = String(utf8Bytes: slice) else { throw .invalidUTF8(field: field) }
        recent = text
        return text
    }

    /// The rest of the frame, unread.
    public mutating func rest() -> [UInt8] {
        defer { offset = end }
        return Array(bytes[offset..<end])
    }

    /// Throws unless everything was read.
    public func expectEnd() throws(WireError) {
        if remaining > 0 { throw .trailingBytes(remaining) }
    }

    /// Reads a property value (section 4.3): a value, a deletion or an expiring value. A time to
    /// live of 0 or over ``PropertyWrite/maximumTimeToLive`` is invalid.
    public mutating func propertyValue(_ field: String = "property value") throws(WireError) -> (
        value: Value, timeToLive: UInt64, deleted: Bool
    ) {
        var timeToLive: UInt64 = 0
        if offset < end, bytes[offset] == ValueTag.expiring {
            offset += 1
            timeToLive = try varint(field)
            guard timeToLive >= 1, timeToLive <= PropertyWrite.maximumTimeToLive else {
                throw .invalid(field: field, reason: "time to live \(timeToLive) ms is outside 1…2^48−1")
            }
        }
        if offset < end, bytes[offset] == ValueTag.deleted {
            offset += 1
            return (.null, timeToLive, true)
        }
        return (try value(field), timeToLive, false)
    }

    /// Reads a property value as the write of property `name`.
    mutating func propertyWrite(named name: String, _ field: String = "property value") throws(WireError)
        -> PropertyWrite
    {
        let (value, timeToLive, deleted) = try propertyValue(field)
        if deleted { return .deletion(of: name) }
        return PropertyWrite(name: name, value: value, timeToLive: timeToLive)
    }

    /// Reads a value (section 4.2).
    public mutating func value(_ field: String = "value") throws(WireError) -> Value {
        try value(field, depth: 0)
    }

    private mutating func value(_ field: String, depth: Int) throws(WireError) -> Value {
        guard depth < Self.maximumDepth else { throw .tooDeep }
        let tag = try byte(field)
        switch tag {
        case ValueTag.null: return .null
        case ValueTag.false: return .bool(false)
        case ValueTag.true: return .bool(true)
        case ValueTag.int: return .int(try zigzag(field))
        case ValueTag.double: return .double(Double(bitPattern: try uint64(field)))
        case ValueTag.string: return .string(try string(field))
        case ValueTag.bytes: return .bytes(try blob(field))
        case ValueTag.array:
            let n = try count(field)
            var items: [Value] = []
            items.reserveCapacity(Swift.min(n, Self.maximumReservation))
            for _ in 0..<n { items.append(try value(field, depth: depth + 1)) }
            return .array(items)
        case ValueTag.map:
            // A map entry is at least a 1-byte key length and a 1-byte value.
            let n = try count(field, minimumItemSize: 2)
            var map: [String: Value] = [:]
            map.reserveCapacity(Swift.min(n, Self.maximumReservation))
            for _ in 0..<n {
                let key = try string(field)
                map[key] = try value(field, depth: depth + 1)
            }
            return .map(map)
        default:
            throw .unknownTag(tag)
        }
    }
}

extension String {
    /// Decodes `bytes` as UTF-8; `nil` when they are not valid UTF-8. Names are nearly always
    /// ASCII: those skip the general validation, which is several times slower.
    init?(utf8Bytes bytes: ArraySlice<UInt8>) {
        let decoded = bytes.withUnsafeBufferPointer { buffer -> String? in
            var ascii = true
            for byte in buffer where byte >= 0x80 {
                ascii = false
                break
            }
            return ascii ? String(decoding: buffer, as: UTF8.self) : String(validating: buffer, as: UTF8.self)
        }
        guard let decoded else { return nil }
        self = decoded
    }
}

extension String {
    /// Whether both strings are the same UTF-8 bytes, as the wire, digests and versions compare
    /// names (`==` is canonical equivalence: it takes the NFD twin of a name for it). One pass
    /// over contiguous bytes: comparing the two UTF-8 views element by element was 2 % of a
    /// reader of single sets (checking that a channel batch's deltas name the model just
    /// checked).
    @inline(__always)
    package func hasSameUTF8(as other: String) -> Bool {
        // The same representation (a small string's bytes, held in place, or one storage with
        // one count) is the same bytes, without reading them: the usual case, a batch's deltas
        // naming one origin, channel and model. (A string is two words; `unsafeBitCast` traps
        // if that ever changes.)
        if unsafeBitCast(self, to: (UInt64, UInt64).self) == unsafeBitCast(other, to: (UInt64, UInt64).self) {
            return true
        }
        return withUTF8(alongside: other) { a, b in
            guard a.count == b.count else { return false }
            // Names are short: a loop costs less than a call to memcmp.
            guard a.count > 16 else {
                var index = 0
                while index < a.count, a[index] == b[index] { index += 1 }
                return index == a.count
            }
            return memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0
        }
    }

    /// Whether this string's UTF-8 bytes sort before `other`'s (bytewise, a prefix first): the
    /// order of versions' node ids and of snapshot pages. `utf8.lexicographicallyPrecedes`
    /// says the same a byte at a time, through the views' iterators: 8 % of a late joiner's
    /// I/O thread, comparing the versions of a model's registers (equal but for the node id).
    @inline(__always)
    package func utf8Precedes(_ other: String) -> Bool {
        // The same representation is the same bytes (``hasSameUTF8(as:)``), which do not precede
        // themselves: the usual case, a model's registers written by one node at one time.
        if unsafeBitCast(self, to: (UInt64, UInt64).self) == unsafeBitCast(other, to: (UInt64, UInt64).self) {
            return false
        }
        return withUTF8(alongside: other) { a, b in
            let common = min(a.count, b.count)
            let order = common == 0 ? 0 : memcmp(a.baseAddress!, b.baseAddress!, common)
            return order != 0 ? order < 0 : a.count < b.count
        }
    }

    /// `body` with both strings' UTF-8 bytes, contiguous (a native string's own; another's
    /// made native first).
    @inline(__always)
    private func withUTF8(
        alongside other: String, _ body: (UnsafeBufferPointer<UInt8>, UnsafeBufferPointer<UInt8>) -> Bool
    ) -> Bool {
        var lhs = self
        var rhs = other
        return lhs.withUTF8 { a in rhs.withUTF8 { b in body(a, b) } }
    }
}
