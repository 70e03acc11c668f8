/// Why a frame from the network could not be decoded. Such input is dropped and counted; it never
/// traps (docs/PROTOCOL.md, "Errors").
public enum WireError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The frame ended before the field `field` was complete.
    case truncated(field: String)
    /// A length or count larger than the bytes that remain, or than a limit.
    case tooLarge(field: String, count: UInt64)
    /// A value tag this version does not know.
    case unknownTag(UInt8)
    /// A string that is not valid UTF-8.
    case invalidUTF8(field: String)
    /// Values nested deeper than the limit.
    case tooDeep
    /// A varint longer than 10 bytes or overflowing 64 bits.
    case badVarint(field: String)
    /// Bytes left over after a complete message.
    case trailingBytes(Int)
    /// A message of a type or protocol version this node does not speak.
    case unsupported(String)
    /// A field with a value outside its domain.
    case invalid(field: String, reason: String)

    public var description: String {
        switch self {
        case .truncated(let field): "truncated frame in \(field)"
        case .tooLarge(let field, let count): "\(field) of \(count) exceeds what the frame can hold"
        case .unknownTag(let tag): "unknown value tag 0x\(String(tag, radix: 16))"
        case .invalidUTF8(let field): "\(field) is not valid UTF-8"
        case .tooDeep: "values nested deeper than \(WireReader.maximumDepth) levels"
        case .badVarint(let field): "malformed varint in \(field)"
        case .trailingBytes(let n): "\(n) unexpected bytes after the message"
        case .unsupported(let what): "unsupported \(what)"
        case .invalid(let field, let reason): "invalid \(field): \(reason)"
        }
    }
}
