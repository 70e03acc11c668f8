import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The node's write-ahead log: every delta the node applies, appended as a checksummed record.
///
/// Why an append-only log (and not SQLite): the node's access pattern is append + sequential
/// replay + occasional compaction into a snapshot; a log makes "acknowledged only once durable"
/// one `write` + one `fdatasync` per batch (group commit), adds no dependency, and its recovery
/// rule is simple enough to state and test: records are read in order and the first one that is
/// short, oversized or fails its checksum ends the log — that tail (a write torn by a crash) is
/// cut, never loaded as data (docs/PROTOCOL.md, Appendix B).
///
/// Record: `u32 length` · `u32 CRC-32C of payload` · payload (big-endian; payload = channel,
/// model, and a DELTA body). The file starts with the magic `SSLOG2\n`. A log of the first format
/// (`SSLOG1\n`, whose records are checksummed with CRC-32) is read, and converted when the node
/// opens it (``DataDirectory``); nothing writes that format any more.
///
/// Preallocation: the file is grown ahead of its records in steps of ``preallocationStep``, by
/// writing zeros, and records are written in place at the end of the last one. A write that
/// stays inside the allocated length changes no file size, so its `fdatasync` has no size to
/// commit: on ext4 here it takes ~85 µs instead of ~125 µs for an append. Zeros written, not
/// `posix_fallocate`d: ext4 marks fallocated blocks unwritten, and the first write into each
/// block converts its extent, which the next `fdatasync` must write too. With a group commit of
/// a kilobyte or two (a client's SETs) one sync in two or three reached a new block: 97–106 µs
/// p50 and 47–48 µs of CPU per sync against 88–94 µs and 37–39 µs into written zeros (a C probe
/// on this VM, 1,800-octet records, 2026-11-28; PERFORMANCE-LOG.md). The zeros of a step are written
/// back by the sync after them, once per step. A zero length field ends the log (a record's
/// payload is never empty), so the zero-filled tail is not data and not a torn write.
///
/// Thread safety: none. Recovered by the task starting the node, then owned by the node's I/O
/// thread alone (the hand-over happens before the thread starts).
package final class DeltaLog: @unchecked Sendable {
    // Unchecked: no lock; one thread at a time uses it (see above), handed over between them.
    package static let magic: [UInt8] = Array("SSLOG2\n".utf8)
    /// The magic of the first format, whose records are checksummed with CRC-32 (until
    /// 2026-11-28: CRC-32C has an instruction of its own; issue #17).
    package static let firstFormatMagic: [UInt8] = Array("SSLOG1\n".utf8)
    static let maximumRecord = 64 << 20

    let path: String
    private let descriptor: Int32
    /// The end of the last record: where the next one is written.
    private(set) var size: Int
    /// The file's length: `size`, or more when preallocated (zero-filled past `size`).
    private(set) var allocated: Int
    private(set) var unsyncedBytes = 0
    /// Whether recovery found a log of the first format: nothing is appended to it (CRC-32C
    /// records would be cut as corrupt by the next recovery); it is converted instead.
    private var isFirstFormat = false
    /// How far the file is grown ahead of its records at a time. The sync after a step also
    /// writes its zeros back, a quarter of a MiB (steps of 1 MiB and 64 KiB did no better for the
    /// p99 of durable writes here; PERFORMANCE-LOG.md, "Zeros, not fallocate").
    static let preallocationStep = 1 << 18
    /// One step of zeros, written to grow the file.
    private static let zeros = [UInt8](repeating: 0, count: preallocationStep)

    /// What recovery found.
    package struct Recovery {
        package var deltas: [Delta] = []
        /// Bytes cut from the end (a torn or corrupt tail), and why. A zero-filled tail
        /// (preallocated space) is not counted.
        package var cutBytes = 0
        package var cutReason: String?
        /// Whether what was cut holds an intact record after the first bad one: records were
        /// written after it, so it was damaged where the log had been durable (a bad disk, a
        /// flipped byte), not torn by a crash in the middle of the last write, and what was cut
        /// may hold acknowledged writes.
        package var damaged = false
        /// Where the intact records end.
        package var end = 0
        /// Whether the log is of the first format (`SSLOG1`, CRC-32): to be converted.
        package var isFirstFormat = false
    }

    /// Opens (creating when missing) the log at `path`, or the file at `location` that is about
    /// to be renamed to `path` (a compaction's new log).
    init(path: String, openingAt location: String? = nil) throws(StateSyncError) {
        self.path = path
        // Written at `size` with pwrite (not O_APPEND): the file may be preallocated past it.
        let fd = open(location ?? path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw Self.error("open", location ?? path) }
        descriptor = fd
        size = Int(lseek(fd, 0, SEEK_END))
        allocated = size
        if size == 0 {
            try write(Self.magic)
            try sync()
        }
    }

    deinit {
        close(descriptor)
    }

    /// Reads every intact record; cuts a torn or corrupt tail and the preallocated space after
    /// the records (truncate + fsync; it is allocated again as the log grows). Damage (not a
    /// torn tail: ``Recovery/damaged``) is given to `keepDamage` before it is cut.
    func recover(
        keepingDamage keepDamage: (ArraySlice<UInt8>) throws(StateSyncError) -> Void = { _ in }
    ) throws(StateSyncError) -> Recovery {
        guard let data = FileManager.default.contents(atPath: path) else { throw Self.error("read", path) }
        let bytes = [UInt8](data)
        let recovery = try Self.parse(bytes, path: path)
        isFirstFormat = recovery.isFirstFormat
        if recovery.damaged { try keepDamage(bytes[recovery.end..<(recovery.end + recovery.cutBytes)]) }
        if recovery.end < bytes.count {
            guard ftruncate(descriptor, off_t(recovery.end)) == 0 else { throw Self.error("truncate", path) }
            size = recovery.end
            allocated = recovery.end
        }
        // What a crashed process wrote is in the page cache only: durable before the node
        // builds on it (its watches are sent its own deltas as durable).
        unsyncedBytes = 1
        try sync()
        return recovery
    }

    /// The intact records of a log's bytes, and how many bytes at the end are torn or corrupt
    /// (to cut). The one definition of recovery, for a file and for a simulated disk.
    package static func parse(_ bytes: [UInt8], path: String) throws(StateSyncError) -> Recovery {
        var recovery = Recovery()
        recovery.isFirstFormat = bytes.starts(with: Self.firstFormatMagic)
        guard bytes.starts(with: Self.magic) || recovery.isFirstFormat else {
            throw StateSyncError(
                .dataDirectory,
                "\(path) is not a StateSync log of a format this version reads (its first bytes are not SSLOG2 or SSLOG1); run the version that wrote it, or move the data directory aside and start the node under a new id (docs/PROTOCOL.md 7.5)"
            )
        }
        let checksum: (ArraySlice<UInt8>) -> UInt32 =
            recovery.isFirstFormat ? { CRC32.checksum($0) } : { CRC32C.checksum($0) }
        var offset = Self.magic.count
        while offset < bytes.count {
            if Self.isZeroLength(bytes, at: offset) { break }  // the end of the records
            guard
                let (delta, next) = Self.record(
                    in: bytes, at: offset, checksum: checksum, reason: &recovery.cutReason)
            else { break }
            recovery.deltas.append(delta)
            offset = next
        }
        recovery.end = offset
        // Preallocated space is zero-filled: only a tail holding something else is torn, and
        // only through its last non-zero octet (the zeros after it are the preallocation).
        if let last = bytes[offset...].lastIndex(where: { $0 != 0 }) {
            recovery.cutBytes = last + 1 - offset
            if recovery.cutReason == nil { recovery.cutReason = "a record has a zero length" }
            // A torn write leaves the last record short, with nothing intact after it: an intact
            // record found past the bad one (its checksum holds) was written after it, so the
            // log was damaged where it had been durable. (Looked for byte by byte, since the bad
            // record's length may be what was damaged, over at most 4 MiB.)
            let limit = min(last + 1, offset + (4 << 20))
            var ignored: String?
            recovery.damaged = (offset + 1..<limit).contains { start in
                Self.record(in: bytes, at: start, checksum: checksum, reason: &ignored) != nil
            }
        }
        return recovery
    }

    /// The intact records of a log of the first format (`bytes`, through `end`: what
    /// ``parse(_:path:)`` found intact) in the current one: the same payloads, each with its
    /// CRC-32C, after the current magic.
    package static func converted(fromFirstFormat bytes: [UInt8], through end: Int) -> [UInt8] {
        var writer = WireWriter(capacity: end)
        writer.bytes(magic)
        var offset = firstFormatMagic.count
        while offset + 8 <= end {
            let length = Int(uint32(bytes, at: offset))
            guard length > 0, offset + 8 + length <= end else { break }
            _ = appendRecord(to: &writer) { $0.bytes(bytes[(offset + 8)..<(offset + 8 + length)]) }
            offset += 8 + length
        }
        return writer.bytes
    }

    /// Whether the record at `offset` has a zero length field (or the file ends inside it with
    /// zeros): no record's payload is empty, so this is where the records end.
    private static func isZeroLength(_ bytes: [UInt8], at offset: Int) -> Bool {
        bytes[offset..<min(offset + 4, bytes.count)].allSatisfy { $0 == 0 }
    }

    /// The big-endian `u32` at `offset` (a record header's length or checksum).
    private static func uint32(_ bytes: [UInt8], at offset: Int) -> UInt32 {
        UInt32(bytes[offset]) << 24 | UInt32(bytes[offset + 1]) << 16 | UInt32(bytes[offset + 2]) << 8
            | UInt32(bytes[offset + 3])
    }

    private static func record(
        in bytes: [UInt8], at offset: Int, checksum: (ArraySlice<UInt8>) -> UInt32, reason: inout String?
    ) -> (Delta, Int)? {
        guard bytes.count - offset >= 8 else {
            reason = "a record header is cut short"
            return nil
        }
        let length = Int(uint32(bytes, at: offset))
        let crc = uint32(bytes, at: offset + 4)
        guard length <= maximumRecord, bytes.count - offset - 8 >= length else {
            reason = "a record of \(length) bytes is cut short"
            return nil
        }
        let payload = bytes[(offset + 8)..<(offset + 8 + length)]
        guard checksum(payload) == crc else {
            reason = "a record fails its checksum"
            return nil
        }
        do {
            return (try decodePayload(Array(payload)), offset + 8 + length)
        } catch {
            reason = "a record does not decode: \(error)"
            return nil
        }
    }

    /// Records encoded and waiting to be appended together (one `write`).
    struct Batch {
        fileprivate var buffer: WireWriter

        /// A batch with room for `capacity` bytes of records before it grows. Size it by what it
        /// will hold: a request of a kilobyte or more is served from glibc's large bins, after
        /// it consolidates every freed small chunk (`malloc_consolidate`), and a client's SET
        /// logs one record, usually of a few dozen to a few hundred bytes.
        init(capacity: Int = 4096) {
            buffer = WireWriter(capacity: capacity)
        }

        /// Room for `count` records of a local write each (the usual one holds a few short
        /// properties; a larger one grows the buffer).
        static func capacity(localWrites count: Int) -> Int { min(max(count, 1) * 192, 4096) }

        /// Room for the records of `count` deltas received as `payloadBytes` of frames: each
        /// record adds its length, checksum and names to what came.
        static func capacity(received count: Int, payloadBytes: Int) -> Int { payloadBytes + count * 64 }

        /// How many deltas were offered.
        private(set) var offered = 0
        /// The positions (in the order deltas were offered) of those too large for a record
        /// (over ``DeltaLog/maximumRecord``): they are not in the batch.
        private(set) var tooLarge: [Int] = []

        var isEmpty: Bool { buffer.bytes.isEmpty }
        /// The encoded records.
        var bytes: [UInt8] { buffer.bytes }

        mutating func add(_ delta: Delta) {
            add { DeltaLog.writePayload(delta, to: &$0) }
        }

        /// Where a record's parts lie in ``bytes``.
        struct Placement: Sendable {
            /// The model id (with its length), the DELTA body, and the record's end.
            let model: Int
            let body: Int
            let end: Int
        }

        /// Adds the record of `delta` and returns where its model id and DELTA body lie in
        /// ``bytes``; `nil` when it is too large for a record (and is not in the batch).
        mutating func addPlaced(_ delta: Delta) -> Placement? {
            var model = 0
            var body = 0
            let start = buffer.bytes.count
            add { sink in
                if let placed = DeltaPayloadWriter.append(delta, to: &sink) {
                    (model, body) = (placed.model, placed.body)
                    return
                }
                sink.string(delta.channel)
                model = sink.bytes.count
                sink.string(delta.model)
                body = sink.bytes.count
                PeerMessage.writeDeltaBody(delta, to: &sink)
            }
            let end = buffer.bytes.count
            return end > start ? Placement(model: model, body: body, end: end) : nil
        }

        /// Adds the record of a delta that arrived as the DELTA body frame `body`: the payload
        /// holds those bytes as they came off the wire, not a re-encoding (recovery reads back
        /// what the peer sent, decoded by the same rules).
        mutating func add(channel: String, model: String, body: UnsafeBufferPointer<UInt8>) {
            add { sink in
                sink.string(channel)
                sink.string(model)
                sink.bytes(body)
            }
        }

        /// Adds the record of a delta of `channel` that arrived in a channel batch as the frame
        /// `modelAndBody` (its model id, then its DELTA body): the payload is the channel followed
        /// by those bytes as they came.
        mutating func add<Bytes: Collection<UInt8>>(channel: String, modelAndBody: Bytes) {
            add { sink in
                sink.string(channel)
                sink.bytes(modelAndBody)
            }
        }

        private mutating func add(_ payload: (inout WireWriter) -> Void) {
            if !DeltaLog.appendRecord(to: &buffer, payload: payload) { tooLarge.append(offered) }
            offered += 1
        }
    }

    /// Appends `deltas` as records (not yet durable: call ``sync()``), except those too large
    /// for a record: those are not logged, and their positions in `deltas` are returned.
    @discardableResult
    func append(_ deltas: [Delta]) throws(StateSyncError) -> [Int] {
        var batch = Batch()
        for index in deltas.indices { batch.add(deltas[index]) }
        try append(batch)
        return batch.tooLarge
    }

    /// Appends a batch of records in one `write` (not yet durable: call ``sync()``).
    func append(_ batch: Batch) throws(StateSyncError) {
        try append(encoded: batch.buffer.bytes)
    }

    /// Appends records already encoded (a ``Batch``'s bytes) in one `write`.
    func append(encoded bytes: [UInt8]) throws(StateSyncError) {
        if bytes.isEmpty { return }
        guard !isFirstFormat else {
            throw StateSyncError(
                .dataDirectory, "\(path) is a log of the first format: it is converted before it is appended to")
        }
        let start = size
        do {
            if start + bytes.count > allocated { preallocate(through: start + bytes.count) }
            try write(bytes)
        } catch {
            // Never leave half a record in the middle of the log: cut back to where it was.
            _ = ftruncate(descriptor, off_t(start))
            size = start
            allocated = start
            throw error
        }
    }

    /// Grows the file with zeros to hold at least `end` bytes, up to the next step. The new length
    /// becomes durable with the next sync. A failure (no space) gives back what it wrote and is
    /// left to the record's write, which then appends, and fails if it must.
    private func preallocate(through end: Int) {
        let step = Self.preallocationStep
        let target = (end / step + 1) * step
        // The record about to be written fills up to `end`: zeros only after it.
        var at = max(allocated, end)
        while at < target {
            let count = min(target - at, Self.zeros.count)
            let n = Self.zeros.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, count, off_t(at)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else {
                _ = ftruncate(descriptor, off_t(allocated))
                return
            }
            at += n
        }
        allocated = target
    }

    /// Makes everything appended durable (`fdatasync`).
    func sync() throws(StateSyncError) {
        guard unsyncedBytes > 0 else { return }
        #if canImport(Glibc)
            guard fdatasync(descriptor) == 0 else { throw Self.error("fdatasync", path) }
        #else
            guard fsync(descriptor) == 0 else { throw Self.error("fsync", path) }
        #endif
        unsyncedBytes = 0
    }

    /// Empties the log after its content went into a durable snapshot (the preallocated space
    /// is given back too).
    func reset() throws(StateSyncError) {
        guard ftruncate(descriptor, off_t(Self.magic.count)) == 0 else { throw Self.error("truncate", path) }
        size = Self.magic.count
        allocated = size
        unsyncedBytes = 1
        try sync()
    }

    private func write(_ bytes: [UInt8]) throws(StateSyncError) {
        var written = 0
        while written < bytes.count {
            let n = bytes[written...].withUnsafeBytes {
                pwrite(descriptor, $0.baseAddress, $0.count, off_t(size + written))
            }
            if n < 0 {
                if errno == EINTR { continue }
                throw Self.error("write", path)
            }
            written += n
        }
        size += bytes.count
        allocated = max(allocated, size)
        unsyncedBytes += bytes.count
    }

    /// Appends `delta`'s record to `writer`; returns `false` (and appends nothing) when its
    /// payload is larger than ``maximumRecord``.
    @discardableResult
    static func appendRecord(_ delta: Delta, to writer: inout WireWriter) -> Bool {
        appendRecord(to: &writer) { writePayload(delta, to: &$0) }
    }

    /// Appends a record whose payload `payload` writes; `false` (and nothing appended) when it is
    /// larger than ``maximumRecord``.
    @inline(__always)
    fileprivate static func appendRecord(to writer: inout WireWriter, payload: (inout WireWriter) -> Void) -> Bool {
        let start = writer.bytes.count
        writer.uint64(0)  // length and CRC, filled in below
        payload(&writer)
        let length = writer.bytes.count - start - 8
        guard length <= maximumRecord else {
            writer.cut(to: start)
            return false
        }
        // In place: a slice of the buffer was a retain and a release per record.
        let crc = writer.bytes.withUnsafeBytes { CRC32C.checksum(UnsafeRawBufferPointer(rebasing: $0[(start + 8)...])) }
        writer.overwrite(UInt64(length) << 32 | UInt64(crc), at: start)
        return true
    }

    /// channel · model · DELTA body (the same bytes as on the wire).
    static func writePayload<Sink: WireSink>(_ delta: Delta, to sink: inout Sink) {
        sink.string(delta.channel)
        sink.string(delta.model)
        PeerMessage.writeDeltaBody(delta, to: &sink)
    }

    static func encodePayload(_ delta: Delta) -> [UInt8] {
        var writer = WireWriter(capacity: 48 + delta.writes.count * 16)
        writePayload(delta, to: &writer)
        return writer.bytes
    }

    static func decodePayload(_ payload: [UInt8]) throws(WireError) -> Delta {
        var reader = WireReader(payload)
        let channel = try reader.string("channel")
        let model = try reader.string("model")
        let topic = [PeerMessage.deltaTopicPrefix] + Array(channel.utf8) + [0] + Array(model.utf8) + [0]
        guard case .delta(let delta) = try PeerMessage.decode([topic, reader.rest()]) else {
            throw .invalid(field: "log record", reason: "not a delta")
        }
        return delta
    }

    private static func error(_ op: String, _ path: String) -> StateSyncError {
        StateSyncError(.dataDirectory, "cannot \(op) \(path): \(String(cString: strerror(errno)))")
    }
}
