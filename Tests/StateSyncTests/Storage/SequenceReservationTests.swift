import Foundation
import Testing

@testable import StateSync

/// The sequence reservation file of a data directory (PROTOCOL.md section 11.2, Appendix A).
@Suite("Sequence reservation file")
struct SequenceReservationTests {
    /// Opens the data directory at `path`, recovers it, lets `body` act on it, closes it, and
    /// returns what was recovered.
    @discardableResult
    static func reopened(
        _ path: String, warnings: inout [String], _ body: (DataDirectory) throws -> Void = { _ in }
    ) throws -> NodeMachine.Recovery {
        let directory = try DataDirectory(path: path)
        defer { directory.close() }
        let recovery = try directory.recover { warnings.append($0) }
        try body(directory)
        return recovery
    }

    /// A reservation written durably is read back at the next start, made in this boot; one made
    /// in another boot (a power loss since) says so.
    @Test func aReservationIsReadBackWithItsBoot() throws {
        let path = temporaryDirectory("reservation")
        defer { try? FileManager.default.removeItem(atPath: path) }
        var ignored: [String] = []
        try Self.reopened(path, warnings: &ignored) { try $0.reserveSequences(through: 40_000, void: []) }
        var warnings: [String] = []
        let recovery = try Self.reopened(path, warnings: &warnings)
        #expect(recovery.reservedSequence == 40_000)
        #expect(recovery.reservedInThisBoot == !DataDirectory.currentBootID.isEmpty)
        #expect(warnings.isEmpty)

        let earlier = SequenceReservation(through: 7, bootID: "an earlier boot").encode()
        try Data(earlier).write(to: URL(fileURLWithPath: path + "/sequence.reserved"))
        let afterPowerLoss = try Self.reopened(path, warnings: &warnings)
        #expect(afterPowerLoss.reservedSequence == 7 && !afterPowerLoss.reservedInThisBoot)
    }

    /// A damaged file is reported, with its path, and taken as no reservation.
    @Test func aDamagedReservationIsReportedAndIgnored() throws {
        let path = temporaryDirectory("reservation")
        defer { try? FileManager.default.removeItem(atPath: path) }
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        var bytes = SequenceReservation(through: 9, bootID: "b").encode()
        bytes[6] ^= 0xFF
        try Data(bytes).write(to: URL(fileURLWithPath: path + "/sequence.reserved"))
        var warnings: [String] = []
        let recovery = try Self.reopened(path, warnings: &warnings)
        #expect(recovery.reservedSequence == 0)
        #expect(warnings.count == 1 && warnings[0].contains("sequence.reserved") && warnings[0].contains("checksum"))
    }

    /// The encoding round-trips, and an unknown boot id is never "this boot".
    @Test func theEncodingRoundTrips() throws {
        let reservation = SequenceReservation(through: .max, bootID: "1f2e-boot")
        #expect(try SequenceReservation.decode(reservation.encode()) == reservation)
        #expect(Array(reservation.encode().prefix(4)) == Array("SSRV".utf8))
        #expect(!SequenceReservation(through: 1, bootID: "").isOfBoot(""))
        #expect(reservation.isOfBoot("1f2e-boot") && !reservation.isOfBoot("other"))
    }

    /// Void numbers (PROTOCOL.md 11.2) are kept with the reservation, version 2, and read back
    /// at the next start; without them the file is version 1, as before, octet for octet; void
    /// ranges out of order are a damaged file.
    @Test func voidNumbersAreKeptAcrossARestart() throws {
        let path = temporaryDirectory("reservation")
        defer { try? FileManager.default.removeItem(atPath: path) }
        var warnings: [String] = []
        try Self.reopened(path, warnings: &warnings) { directory in
            try directory.reserveSequences(through: 40_000, void: [5...5, 9...12])
            directory.markReservationUnsafe()
        }
        let recovery = try Self.reopened(path, warnings: &warnings)
        #expect(recovery.voidSequences == [5...5, 9...12], "kept, also when the reservation was marked unsafe")
        #expect(recovery.reservedSequence == 40_000 && !recovery.reservedInThisBoot)

        let plain = SequenceReservation(through: 3, bootID: "b").encode()
        #expect(plain[4] == 1 && SequenceReservation(through: 3, bootID: "b", void: [1...2]).encode()[4] == 2)
        #expect(SequenceReservation(through: 30, bootID: "b", void: [9...9, 6...7, 5...5]).void == [5...7, 9...9])
        // A file whose ranges are out of order is damaged.
        var writer = WireWriter()
        writer.bytes(Array("SSRV".utf8))
        writer.byte(2)
        writer.uint64(30)
        writer.string("b")
        writer.varint(2)
        for (first, last): (UInt64, UInt64) in [(9, 9), (5, 5)] {
            writer.varint(first)
            writer.varint(last)
        }
        let checksum = CRC32.checksum(writer.bytes)
        let disordered =
            writer.bytes + (0..<4).reversed().map { UInt8(truncatingIfNeeded: checksum >> (8 * UInt32($0))) }
        #expect(throws: WireError.self) { try SequenceReservation.decode(disordered) }
    }

    /// A file written aside and never renamed into place (a stop on a full disk: the snapshot's
    /// write failed) is removed when a node takes the directory; the files it was to replace stay.
    @Test func filesWrittenAsideAndNeverRenamedAreRemovedAtStart() throws {
        let path = temporaryDirectory("aside")
        defer { try? FileManager.default.removeItem(atPath: path) }
        var warnings: [String] = []
        _ = try Self.reopened(path, warnings: &warnings)
        for name in ["state.snapshot.tmp", "members.tmp", "sequence.reserved.tmp"] {
            #expect(FileManager.default.createFile(atPath: path + "/" + name, contents: Data(count: 4096)))
        }
        _ = try Self.reopened(path, warnings: &warnings)
        for name in ["state.snapshot.tmp", "members.tmp", "sequence.reserved.tmp"] {
            #expect(!FileManager.default.fileExists(atPath: path + "/" + name), "\(name)")
        }
        #expect(FileManager.default.fileExists(atPath: path + "/deltas.log"))
        #expect(warnings.isEmpty)
    }
}
