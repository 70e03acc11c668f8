import CChecksum

/// A reflected CRC-32 computed with tables (slicing-by-8: eight bytes per step through eight
/// 256-entry tables; table 0 is the classic byte-at-a-time table, table k advances a byte's
/// contribution by k more bytes).
struct SlicedCRC32: Sendable {
    /// The eight tables, one after the other.
    private let tables: [UInt32]

    /// The tables of the reflected polynomial `polynomial`.
    init(polynomial: UInt32) {
        var tables = [UInt32](repeating: 0, count: 8 * 256)
        for index in 0..<256 {
            var c = UInt32(index)
            for _ in 0..<8 { c = c & 1 != 0 ? polynomial ^ (c >> 1) : c >> 1 }
            tables[index] = c
        }
        for slice in 1..<8 {
            for index in 0..<256 {
                let previous = tables[(slice - 1) * 256 + index]
                tables[slice * 256 + index] = (previous >> 8) ^ tables[Int(previous & 0xFF)]
            }
        }
        self.tables = tables
    }

    func checksum(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
        tables.withUnsafeBufferPointer { t in
            var crc: UInt32 = 0xFFFF_FFFF
            var offset = 0
            let count = bytes.count
            while count - offset >= 8 {
                let one = UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt32.self)) ^ crc
                let two = UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self))
                crc =
                    t[7 * 256 + Int(one & 0xFF)] ^ t[6 * 256 + Int((one >> 8) & 0xFF)]
                    ^ t[5 * 256 + Int((one >> 16) & 0xFF)] ^ t[4 * 256 + Int(one >> 24)]
                    ^ t[3 * 256 + Int(two & 0xFF)] ^ t[2 * 256 + Int((two >> 8) & 0xFF)]
                    ^ t[1 * 256 + Int((two >> 16) & 0xFF)] ^ t[Int(two >> 24)]
                offset += 8
            }
            while offset < count {
                crc = t[Int((crc ^ UInt32(bytes[offset])) & 0xFF)] ^ (crc >> 8)
                offset += 1
            }
            return crc ^ 0xFFFF_FFFF
        }
    }
}

/// A 32-bit checksum of bytes in memory, and of any collection of bytes through it.
protocol Checksum32 {
    static func checksum(_ bytes: UnsafeRawBufferPointer) -> UInt32
}

extension Checksum32 {
    /// The checksum of `bytes`, read in place when they are contiguous.
    static func checksum<C: Collection>(_ bytes: C) -> UInt32 where C.Element == UInt8 {
        if let crc = bytes.withContiguousStorageIfAvailable({ checksum(UnsafeRawBufferPointer($0)) }) { return crc }
        return Array(bytes).withUnsafeBytes { checksum($0) }
    }
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320): the checksum of a sequence
/// reservation, and of every record of a log of the first format (`SSLOG1`).
enum CRC32: Checksum32 {
    private static let table = SlicedCRC32(polynomial: 0xEDB8_8320)

    static func checksum(_ bytes: UnsafeRawBufferPointer) -> UInt32 { table.checksum(bytes) }
}

/// CRC-32C (Castagnoli, reflected, polynomial 0x82F63B78): the checksum of every record of the
/// log (`SSLOG2`). The processor's `crc32` instruction (SSE 4.2) computes it where there is one,
/// eight bytes per instruction: the tables took 5–6 % of each I/O thread of a busy node, some
/// 20 ns per record of 40–60 bytes (issue #17). Tables elsewhere, and in tests to check one
/// against the other.
enum CRC32C: Checksum32 {
    static let table = SlicedCRC32(polynomial: 0x82F6_3B78)
    /// Whether this processor has the instruction (asked once).
    static let hardware = statesync_crc32c_hardware_available() != 0

    static func checksum(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
        guard hardware, let base = bytes.baseAddress else { return table.checksum(bytes) }
        return ~statesync_crc32c_hardware(0xFFFF_FFFF, base.assumingMemoryBound(to: UInt8.self), bytes.count)
    }
}
