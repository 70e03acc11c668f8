/// The sequence numbers a node may publish before they are durable (`storage.fsync: interval`),
/// and the boot of the OS in which it reserved them: the file `sequence.reserved` of the data
/// directory (docs/PROTOCOL.md Appendix A).
///
/// Encoding, in order: the magic `SSRV`, format version `01`, the reserved sequence number
/// (uint64), the boot id (string: the OS's `/proc/sys/kernel/random/boot_id`, empty when
/// unknown), then the CRC-32 of everything before it (4 octets, big-endian).
package struct SequenceReservation: Sendable, Equatable {
    /// The greatest own sequence number that may have been published.
    package var through: UInt64
    /// The boot id of the OS when the reservation was made ("" when unknown).
    package var bootID: String

    package init(through: UInt64, bootID: String) {
        self.through = through
        self.bootID = bootID
    }

    static let magic: [UInt8] = Array("SSRV".utf8)

    package func encode() -> [UInt8] {
        var writer = WireWriter(capacity: 64)
        writer.bytes(Self.magic)
        writer.byte(1)
        writer.uint64(through)
        writer.string(bootID)
        let checksum = CRC32.checksum(writer.bytes)
        for shift in stride(from: 24, through: 0, by: -8) {
            writer.byte(UInt8(truncatingIfNeeded: checksum >> UInt32(shift)))
        }
        return writer.bytes
    }

    package static func decode(_ bytes: [UInt8]) throws(WireError) -> SequenceReservation {
        guard bytes.count > magic.count + 4, Array(bytes.prefix(magic.count)) == magic else {
            throw WireError.invalid(field: "magic", reason: "not a sequence reservation")
        }
        let body = bytes.dropLast(4)
        let stored = bytes.suffix(4).reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        guard CRC32.checksum(body) == stored else {
            throw WireError.invalid(field: "checksum", reason: "does not match the contents")
        }
        var reader = WireReader(Array(body.dropFirst(magic.count)))
        let version = try reader.byte("version")
        guard version == 1 else { throw WireError.unsupported("sequence reservation version \(version)") }
        let through = try reader.uint64("reserved sequence")
        let bootID = try reader.string("boot id")
        return SequenceReservation(through: through, bootID: bootID)
    }

    /// Whether a reservation read at start was made in the running boot: only then can the node
    /// rely on its log holding every delta it published (a process crash loses nothing it wrote).
    /// An unknown boot id is never the same boot.
    package func isOfBoot(_ current: String) -> Bool {
        !current.isEmpty && bootID == current
    }
}
