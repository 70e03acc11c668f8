/// The sequence numbers a node may publish before they are durable (`storage.fsync: interval`, or
/// `storage.publish: written`), and the boot of the OS in which it reserved them: the file
/// `sequence.reserved` of the data directory (docs/PROTOCOL.md Appendix A).
///
/// Encoding, in order: the magic `SSRV`, format version (`01`, or `02` when it lists void
/// numbers), the reserved sequence number (uint64), the boot id (string: the OS's
/// `/proc/sys/kernel/random/boot_id`, empty when unknown), with version `02` the void ranges
/// (count, then first and last of each as varints, ascending), then the CRC-32 of everything
/// before it (4 octets, big-endian).
package struct SequenceReservation: Sendable, Equatable {
    /// The greatest own sequence number that may have been published.
    package var through: UInt64
    /// The boot id of the OS when the reservation was made ("" when unknown).
    package var bootID: String
    /// Own sequence numbers settling declared void (docs/PROTOCOL.md 11.2): they survive a
    /// restart here, with the reservation that ended the settling.
    package var void: [ClosedRange<UInt64>]

    /// The most void ranges a reservation keeps.
    static let maximumVoidRanges = 65_536

    /// `void` is kept sorted, with overlapping and adjacent ranges merged (the form the file
    /// must have).
    package init(through: UInt64, bootID: String, void: [ClosedRange<UInt64>] = []) {
        self.through = through
        self.bootID = bootID
        self.void = void.merged()
    }

    static let magic: [UInt8] = Array("SSRV".utf8)

    package func encode() -> [UInt8] {
        var writer = WireWriter(capacity: 64 + 20 * void.count)
        writer.bytes(Self.magic)
        // Version 1 when there is nothing void: the file an older node reads.
        writer.byte(void.isEmpty ? 1 : 2)
        writer.uint64(through)
        writer.string(bootID)
        if !void.isEmpty {
            writer.varint(UInt64(void.count))
            for range in void {
                writer.varint(range.lowerBound)
                writer.varint(range.upperBound)
            }
        }
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
        guard version == 1 || version == 2 else {
            throw WireError.unsupported("sequence reservation version \(version)")
        }
        let through = try reader.uint64("reserved sequence")
        let bootID = try reader.string("boot id")
        var void: [ClosedRange<UInt64>] = []
        if version == 2 {
            let count = try reader.count("void range count", minimumItemSize: 2)
            guard count <= maximumVoidRanges else {
                throw WireError.invalid(field: "void range count", reason: "\(count) is more than \(maximumVoidRanges)")
            }
            for _ in 0..<count {
                let first = try reader.varint("void first")
                let last = try reader.varint("void last")
                guard first >= 1, first <= last, first > (void.last?.upperBound ?? 0) else {
                    throw WireError.invalid(
                        field: "void range", reason: "\(first)...\(last) is empty, starts at 0 or is out of order")
                }
                void.append(first...last)
            }
        }
        return SequenceReservation(through: through, bootID: bootID, void: void)
    }

    /// Whether a reservation read at start was made in the running boot: only then can the node
    /// rely on its log holding every delta it published (a process crash loses nothing it wrote).
    /// An unknown boot id is never the same boot.
    package func isOfBoot(_ current: String) -> Bool {
        !current.isEmpty && bootID == current
    }
}

extension [ClosedRange<UInt64>] {
    /// These sequence-number ranges with `sequences` added: sorted, overlapping and adjacent
    /// ranges merged, ranges starting at 0 left out, at most `limit` of them (the lowest go
    /// first). The form void numbers are kept in (``SequenceReservation/void``, a node's known
    /// void numbers).
    func merged(adding sequences: [UInt64] = [], keepingAtMost limit: Int = .max) -> [ClosedRange<UInt64>] {
        let all = (self + sequences.map { $0...$0 }).sorted { $0.lowerBound < $1.lowerBound }
        var merged: [ClosedRange<UInt64>] = []
        for range in all where range.lowerBound >= 1 {
            if let last = merged.last, last.upperBound == .max || range.lowerBound <= last.upperBound + 1 {
                merged[merged.count - 1] = last.lowerBound...Swift.max(last.upperBound, range.upperBound)
            } else {
                merged.append(range)
            }
        }
        return merged.count > limit ? Array(merged.suffix(limit)) : merged
    }
}
