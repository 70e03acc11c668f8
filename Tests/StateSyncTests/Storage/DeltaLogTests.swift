import Foundation
import Testing

@testable import StateSync

@Suite("Write-ahead log (PROTOCOL.md Appendix B)")
struct DeltaLogTests {
    static func delta(_ sequence: UInt64, _ value: Value = "v") -> Delta {
        Delta(
            channel: "c", model: "m\(sequence)",
            version: Version(milliseconds: 1000 + sequence, counter: 0, node: "n1"),
            sequence: sequence, properties: [PropertyWrite(name: "p", value: value)])
    }

    static func path() -> String { temporaryDirectory("log") + "/deltas.log" }

    /// A new log holding `deltas`, synced and closed; its path.
    static func logged(_ deltas: [Delta]) throws -> String {
        let path = path()
        let log = try DeltaLog(path: path)
        try log.append(deltas)
        try log.sync()
        return path
    }

    /// The standard check value of CRC-32/ISO-HDLC, and agreement with the bitwise definition at
    /// every length around the 8-byte steps.
    /// A reflected CRC-32 of `polynomial`, bit by bit: the definition the tables are checked against.
    static func bitwiseCRC(_ bytes: [UInt8], polynomial: UInt32) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in bytes {
            crc ^= UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 != 0 ? polynomial ^ (crc >> 1) : crc >> 1 }
        }
        return crc ^ 0xFFFF_FFFF
    }

    /// Bytes to check a CRC with, at every length around its 8-byte steps.
    static let checkedBytes = (0..<100).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }

    @Test func crc32MatchesItsDefinition() {
        #expect(CRC32.checksum(Array("123456789".utf8)) == 0xCBF4_3926)
        #expect(CRC32.checksum([UInt8]()) == 0)
        let bytes = Self.checkedBytes
        for length in 0...bytes.count {
            #expect(
                CRC32.checksum(bytes.prefix(length))
                    == Self.bitwiseCRC(Array(bytes.prefix(length)), polynomial: 0xEDB8_8320), "length \(length)")
        }
    }

    /// CRC-32C, the records' checksum: the standard check value, agreement with the bitwise
    /// definition at every length around the 8-byte steps, and the processor's instruction (where
    /// there is one) agreeing with the tables at every length and alignment.
    @Test func crc32cMatchesItsDefinitionWithAndWithoutTheInstruction() {
        #expect(CRC32C.checksum(Array("123456789".utf8)) == 0xE306_9283)
        #expect(CRC32C.checksum([UInt8]()) == 0)
        let bytes = Self.checkedBytes
        for start in 0..<8 {
            for end in start...bytes.count {
                let part = Array(bytes[start..<end])
                let expected = Self.bitwiseCRC(part, polynomial: 0x82F6_3B78)
                #expect(CRC32C.checksum(bytes[start..<end]) == expected, "bytes \(start)..<\(end)")
                #expect(part.withUnsafeBytes { CRC32C.table.checksum($0) } == expected, "tables, \(start)..<\(end)")
            }
        }
        #if arch(x86_64)
            #expect(CRC32C.hardware, "every x86-64 processor this runs on in CI has SSE 4.2")
        #endif
    }

    /// PROTOCOL.md Appendix B: the worked example's delta as a log record, octet for octet.
    @Test func theWorkedExampleIsTheRecordOfAppendixB() {
        var writer = WireWriter()
        DeltaLog.appendRecord(PeerMessageTests.delta, to: &writer)
        let expected: [UInt8] = [
            0x00, 0x00, 0x00, 0x2f, 0x45, 0x09, 0xce, 0x46, 0x04, 0x64, 0x65, 0x6d, 0x6f, 0x08, 0x67, 0x72, 0x65,
            0x65, 0x74, 0x69, 0x6e, 0x67, 0x01, 0x01, 0x9a, 0xa8, 0xdc, 0x48, 0x7b, 0x00, 0x00, 0x05, 0x6e, 0x6f,
            0x64, 0x65, 0x31, 0x01, 0x02, 0x04, 0x74, 0x65, 0x78, 0x74, 0x05, 0x05, 0x68, 0x65, 0x6c, 0x6c, 0x6f,
            0x01, 0x6e, 0x03, 0x02,
        ]
        #expect(writer.bytes == expected)
        #expect(CRC32.checksum(expected[8...]) == 0x3b13_7fc9, "the first format's checksum of the same payload")
    }

    /// A log written before 2026-11-28 (magic `SSLOG1`, records checksummed with CRC-32) is read
    /// when its node starts, torn tail cut, and rewritten in the current format: the same
    /// deltas, read again after, and appended to.
    @Test func aLogOfTheFirstFormatIsReadAndConvertedWhenItsNodeStarts() throws {
        let directoryPath = temporaryDirectory("first-format")
        var file = DeltaLog.firstFormatMagic
        for sequence in UInt64(1)...3 {
            let payload = DeltaLog.encodePayload(Self.delta(sequence))
            var header = WireWriter()
            header.uint64(UInt64(payload.count) << 32 | UInt64(CRC32.checksum(payload)))
            file += header.bytes + payload
        }
        let intact = file.count
        file += [0, 0, 0, 40, 1, 2]  // a torn fourth record
        try Data(file).write(to: URL(fileURLWithPath: directoryPath + "/deltas.log"))

        do {
            let directory = try DataDirectory(path: directoryPath)
            defer { directory.close() }
            let recovery = try directory.recover(onCorruptSnapshot: { Issue.record("no snapshot to be damaged: \($0)") }
            )
            #expect(recovery.deltas == (1...3).map { Self.delta($0) })
            #expect(recovery.cutBytes == 6)
            #expect(recovery.logSize == intact)
            let converted = [UInt8](try Data(contentsOf: URL(fileURLWithPath: directoryPath + "/deltas.log")))
            #expect(converted.starts(with: DeltaLog.magic))
            #expect(converted.count == intact)
            #expect(!FileManager.default.fileExists(atPath: directoryPath + "/deltas.log.tmp"))
            var records = WireWriter()
            DeltaLog.appendRecord(Self.delta(4), to: &records)
            try directory.append(records.bytes)
            try directory.sync()
        }
        // The log alone (no data directory to convert it) is read, and refuses to be appended to.
        let alone = Self.path()
        try Data(file).write(to: URL(fileURLWithPath: alone))
        let firstFormat = try DeltaLog(path: alone)
        #expect(try firstFormat.recover().deltas == (1...3).map { Self.delta($0) })
        #expect(throws: StateSyncError.self) { try firstFormat.append([Self.delta(4)]) }
        #expect(try DeltaLog(path: alone).recover().deltas == (1...3).map { Self.delta($0) })

        let reopened = try DataDirectory(path: directoryPath)
        defer { reopened.close() }
        let again = try reopened.recover(onCorruptSnapshot: { Issue.record("no snapshot to be damaged: \($0)") })
        #expect(again.deltas == (1...4).map { Self.delta($0) })
        #expect(again.cutBytes == 0)
    }

    /// A file that is neither format is refused with what to do, and left as it is.
    @Test func aFileOfNeitherFormatIsRefusedAndKept() throws {
        let path = Self.path()
        let bytes = Array("SSLOG9\n".utf8) + [0, 0, 0, 1]
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        #expect {
            _ = try DeltaLog(path: path).recover()
        } throws: { error in
            "\(error)".contains("not a StateSync log of a format this version reads")
        }
        #expect([UInt8](try Data(contentsOf: URL(fileURLWithPath: path))) == bytes)
    }

    @Test func appendedDeltasAreRecoveredInOrder() throws {
        let path = try Self.logged((1...50).map { Self.delta($0) })
        let recovery = try DeltaLog(path: path).recover()
        #expect(recovery.deltas == (1...50).map { Self.delta($0) })
        #expect(recovery.cutBytes == 0)
    }

    /// A crash can leave any prefix of the last write on disk: every such prefix must recover the
    /// complete records and cut the rest.
    @Test func everyTornTailIsCutAndTheCompleteRecordsSurvive() throws {
        let path = try Self.logged([Self.delta(1), Self.delta(2)])
        // The records, without the preallocated space after them.
        let full = try Data(contentsOf: URL(fileURLWithPath: path)).prefix(try DeltaLog(path: path).recover().end)
        var writer = WireWriter()
        DeltaLog.appendRecord(Self.delta(2), to: &writer)
        let record = writer.bytes
        let secondStart = full.count - record.count
        for cut in secondStart..<full.count {
            try full.prefix(cut).write(to: URL(fileURLWithPath: path))
            let log = try DeltaLog(path: path)
            let recovery = try log.recover()
            #expect(recovery.deltas == [Self.delta(1)], "cut at \(cut)")
            // A torn part counts through its last non-zero octet: zeros after it are
            // indistinguishable from preallocated space (cut all the same, not counted).
            let torn = full[secondStart..<cut]
            #expect(recovery.cutBytes == torn.lastIndex { $0 != 0 }.map { $0 + 1 - secondStart } ?? 0, "cut at \(cut)")
            #expect(!recovery.damaged, "torn, not damaged: cut at \(cut)")
            #expect(log.size == secondStart)
            // The log goes on after the cut.
            try log.append([Self.delta(3)])
            try log.sync()
            #expect(try DeltaLog(path: path).recover().deltas == [Self.delta(1), Self.delta(3)])
        }
    }

    @Test func aCorruptRecordEndsTheLogAndIsNeverLoaded() throws {
        let path = try Self.logged([Self.delta(1), Self.delta(2, "original"), Self.delta(3)])
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        if let index = bytes.lastIndex(of: UInt8(ascii: "o")) { bytes[index] = UInt8(ascii: "O") }  // in "original"
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let recovery = try DeltaLog(path: path).recover()
        #expect(recovery.deltas == [Self.delta(1)])
        #expect(recovery.cutReason == "a record fails its checksum")
        #expect(recovery.damaged, "a record follows the bad one: damaged where it was durable")
        // The bad record's length field damaged: the intact record after it is still found.
        let lengthDamaged = try Self.logged([Self.delta(1), Self.delta(2, "original"), Self.delta(3)])
        var lengthBytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: lengthDamaged)))
        var writer = WireWriter()
        DeltaLog.appendRecord(Self.delta(1), to: &writer)
        lengthBytes[DeltaLog.magic.count + writer.bytes.count] ^= 0x40  // the second record's length
        try Data(lengthBytes).write(to: URL(fileURLWithPath: lengthDamaged))
        let lengthRecovery = try DeltaLog(path: lengthDamaged).recover()
        #expect(lengthRecovery.deltas == [Self.delta(1)] && lengthRecovery.damaged)
        // The last record corrupt, nothing after it: as a torn write leaves it.
        let last = try Self.logged([Self.delta(1), Self.delta(2, "original")])
        var lastBytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: last)))
        if let index = lastBytes.lastIndex(of: UInt8(ascii: "o")) { lastBytes[index] = UInt8(ascii: "O") }
        try Data(lastBytes).write(to: URL(fileURLWithPath: last))
        let torn = try DeltaLog(path: last).recover()
        #expect(torn.deltas == [Self.delta(1)] && torn.cutBytes > 0 && !torn.damaged)
    }

    /// The file is grown ahead of its records (zero-filled): the zeros are not data and not a
    /// torn write; a record torn inside them is cut and counted; the log goes on after both.
    @Test func preallocatedSpaceEndsTheLogAndATornRecordInItIsCut() throws {
        let path = try Self.logged([Self.delta(1), Self.delta(2)])
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        let recovered = try DeltaLog(path: path).recover()
        #expect(bytes.count == DeltaLog.preallocationStep, "grown a step ahead of its records")
        #expect(bytes[recovered.end...].allSatisfy { $0 == 0 })
        #expect(recovered.deltas == [Self.delta(1), Self.delta(2)])
        #expect(recovered.cutBytes == 0 && recovered.cutReason == nil)
        // A third record whose payload's second half never reached the disk, then zeros.
        var writer = WireWriter()
        DeltaLog.appendRecord(Self.delta(3), to: &writer)
        let end = recovered.end
        if bytes.count < end + writer.bytes.count + 64 { bytes += [UInt8](repeating: 0, count: 4096) }
        let torn = writer.bytes.count / 2
        bytes.replaceSubrange(end..<(end + torn), with: writer.bytes.prefix(torn))
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let log = try DeltaLog(path: path)
        let recovery = try log.recover()
        #expect(recovery.deltas == [Self.delta(1), Self.delta(2)])
        #expect(recovery.cutBytes == bytes.lastIndex { $0 != 0 }! + 1 - end, "the torn record, not the zeros after it")
        #expect(recovery.cutBytes <= torn)
        #expect(recovery.cutReason == "a record fails its checksum")
        #expect(!recovery.damaged)
        #expect(log.size == end)
        try log.append([Self.delta(4)])
        try log.sync()
        #expect(try DeltaLog(path: path).recover().deltas == [Self.delta(1), Self.delta(2), Self.delta(4)])
    }

    #if os(Linux)
        /// The log grows by writing zeros, not by `fallocate`: on ext4 a fallocated block is
        /// unwritten, and the first record written into it makes the next sync write the block's
        /// extent too, which a group commit of a client's SETs paid at nearly every sync
        /// (docs/PERFORMANCE-LOG.md, "Zeros, not fallocate"). Checked where it can be told apart: a
        /// file system with FIEMAP whose `fallocate` makes unwritten extents (ext4, XFS, btrfs).
        @Test(.enabled(if: Self.fallocateLeavesUnwrittenExtents(), "no FIEMAP or no unwritten extents here"))
        func theLogGrowsByWrittenZerosNotUnwrittenExtents() throws {
            let path = Self.path()
            let log = try DeltaLog(path: path)
            // Across a step's end: the second step is grown by the same rule as the first.
            var written = 0
            var sequence: UInt64 = 0
            while written <= DeltaLog.preallocationStep {
                let batch = (0..<200).map { _ in
                    sequence += 1
                    return Self.delta(sequence, .string(String(repeating: "x", count: 100)))
                }
                try log.append(batch)
                try log.sync()
                written = log.size
            }
            let extents = try #require(Self.extents(of: path, below: log.allocated))
            #expect(extents.count > 0)
            #expect(extents.unwritten == 0, "\(extents.unwritten) of \(extents.count) extents unwritten")
            #expect(log.allocated == 2 * DeltaLog.preallocationStep)
        }

        /// Whether this suite's temporary file system answers FIEMAP and marks fallocated space
        /// unwritten (where the log's way of growing makes a difference).
        static func fallocateLeavesUnwrittenExtents() -> Bool {
            let path = temporaryDirectory("fiemap") + "/probe"
            let fd = open(path, O_RDWR | O_CREAT, 0o600)
            guard fd >= 0 else { return false }
            defer {
                close(fd)
                unlink(path)
            }
            guard posix_fallocate(fd, 0, 1 << 16) == 0 else { return false }
            return (extents(of: path, below: 1 << 16)?.unwritten ?? 0) > 0
        }

        /// The file's extents that begin below `end`, and how many of them are unwritten (allocated,
        /// never written), by the FIEMAP ioctl after a sync; nil where the file system does not
        /// answer it. (Past the file's length a file system may hold speculative preallocation.)
        static func extents(of path: String, below end: Int) -> (count: Int, unwritten: Int)? {
            let fd = open(path, O_RDONLY)
            guard fd >= 0 else { return nil }
            defer { close(fd) }
            // struct fiemap (32 octets) and `capacity` struct fiemap_extent (56 octets each).
            let capacity = 256
            let extentSize = 56
            var map = [UInt8](repeating: 0, count: 32 + capacity * extentSize)
            return map.withUnsafeMutableBytes { raw -> (count: Int, unwritten: Int)? in
                raw.storeBytes(of: UInt64.max, toByteOffset: 8, as: UInt64.self)  // fm_length: all of it
                raw.storeBytes(of: UInt32(1), toByteOffset: 16, as: UInt32.self)  // FIEMAP_FLAG_SYNC
                raw.storeBytes(of: UInt32(capacity), toByteOffset: 24, as: UInt32.self)  // fm_extent_count
                let fsIocFiemap: UInt = 0xC020_660B  // _IOWR('f', 11, struct fiemap)
                guard ioctl(fd, fsIocFiemap, raw.baseAddress!) == 0 else { return nil }
                let mapped = Int(raw.load(fromByteOffset: 20, as: UInt32.self))  // fm_mapped_extents
                let inside = (0..<mapped).filter { index in
                    raw.load(fromByteOffset: 32 + index * extentSize, as: UInt64.self) < UInt64(end)  // fe_logical
                }
                let unwritten = inside.count { index in
                    raw.load(fromByteOffset: 32 + index * extentSize + 40, as: UInt32.self) & 0x800 != 0  // fe_flags
                }
                return (inside.count, unwritten)
            }
        }
    #endif

    /// A zero length field with something else after it is not preallocated space: damage.
    @Test func aZeroLengthRecordWithDataAfterItIsCutAndCounted() throws {
        let path = try Self.logged([Self.delta(1)])
        let recovered = try DeltaLog(path: path).recover()
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        bytes += [0, 0, 0, 0, 1, 2, 3, 4, 5]
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let recovery = try DeltaLog(path: path).recover()
        #expect(recovery.deltas == [Self.delta(1)])
        #expect(recovery.cutBytes == 9 && recovery.end == recovered.end)
        #expect(recovery.cutReason == "a record has a zero length")
        #expect(!recovery.damaged, "no intact record after it: nothing durable was cut")
    }

    @Test func aFileThatIsNotALogIsRefusedClearly() throws {
        let path = Self.path()
        try Data("hello world".utf8).write(to: URL(fileURLWithPath: path))
        let error = try #require(throws: StateSyncError.self) { _ = try DeltaLog(path: path).recover() }
        #expect(error.message.contains("is not a StateSync log"))
    }

    /// A delta too large for a record is left out of the batch (and reported by position); the
    /// others are logged and recovered.
    @Test func aRecordTooLargeIsLeftOutAndReported() throws {
        let path = Self.path()
        let huge = Delta(
            channel: "c", model: "big", version: Version(milliseconds: 2, counter: 0, node: "n1"), sequence: 2,
            properties: [PropertyWrite(name: "p", value: .bytes([UInt8](repeating: 7, count: DeltaLog.maximumRecord)))])
        do {
            let log = try DeltaLog(path: path)
            var batch = DeltaLog.Batch()
            batch.add(Self.delta(1))
            batch.add(huge)
            batch.add(Self.delta(3))
            #expect(batch.tooLarge == [1])
            try log.append(batch)
            try log.sync()
        }
        #expect(try DeltaLog(path: path).recover().deltas == [Self.delta(1), Self.delta(3)])
    }

    @Test func progressTracksGapsAndCovers() {
        var progress = OriginProgress()
        let received = [progress.receive(1), progress.receive(2), progress.receive(5), progress.receive(2)]
        #expect(received == [true, true, true, false])
        #expect(progress.contiguous == 2 && progress.firstGap == 3...4 && progress.hasGap)
        progress.announced = 9
        let filled = [progress.receive(3), progress.receive(4)]
        #expect(filled == [true, true])
        #expect(progress.contiguous == 5 && progress.firstGap == 6...9)
        progress.cover(through: 9)
        #expect(progress.firstGap == nil && !progress.hasGap && progress.above.isEmpty)
    }
}
