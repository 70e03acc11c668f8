/// A node's whole state and how far it includes each origin's deltas: what a data directory
/// keeps in `state.snapshot`, what a SNAPSHOT reply carries (docs/PROTOCOL.md, Appendix A).
package struct StateSnapshot: Sendable {
    package var store: ReplicaStore
    package var latestSequence: UInt64
    /// For each origin, the sequence number through which the store includes its deltas.
    package var progress: [String: UInt64] = [:]
    /// In a node's own file only (never sent): the recovery of its own deltas after it last
    /// dropped its state (it was forgotten, docs/PROTOCOL.md 7.5); once it ended (`recovered`
    /// is `through`), what remains is that reset's `through`, which resumed watches are
    /// compared with.
    package var ownRecovery: OwnRecovery?

    /// Own deltas 1...`through` were numbered before the node dropped its state; it holds them
    /// again through `recovered` (`nil`: it has merged no peer's snapshot since).
    package struct OwnRecovery: Sendable, Equatable {
        package var through: UInt64
        package var recovered: UInt64?

        package init(through: UInt64, recovered: UInt64?) {
            self.through = through
            self.recovered = recovered
        }
    }

    package init(
        store: ReplicaStore, latestSequence: UInt64, progress: [String: UInt64] = [:],
        ownRecovery: OwnRecovery? = nil
    ) {
        self.store = store
        self.latestSequence = latestSequence
        self.progress = progress
        self.ownRecovery = ownRecovery
    }
}

extension StateSnapshot {
    /// The snapshot file's magic: `SSNAP3` adds the horizon of collection after the latest
    /// sequence. A file of the previous layout (`SSNAP2`) is read too (an upgrade). `SSNAP4`
    /// adds the recovery of the node's own deltas after the horizon, and is written once the
    /// node has dropped its state (a node that predates it sets such a file aside; a SNAPSHOT
    /// reply never has it).
    static let magic: [UInt8] = Array("SSNAP3\n".utf8)
    static let previousMagic: [UInt8] = Array("SSNAP2\n".utf8)
    static let recoveringMagic: [UInt8] = Array("SSNAP4\n".utf8)

    /// The snapshot format of Appendix A: magic, latest sequence, the timestamp through which
    /// deletions were collected (uint64), with `SSNAP4` the own recovery (through, recovered + 1
    /// or 0: varints), progress, registers (sorted, so equal states write equal files; deletions
    /// included), checksum. `collectedThrough` replaces the store's horizon (a node recovering
    /// its own deltas serves 0: it lacks some that peers hold below its horizon).
    package static func encode(_ snapshot: StateSnapshot, collectedThrough: UInt64? = nil) -> [UInt8] {
        var w = WireWriter(capacity: 4096)
        for b in snapshot.ownRecovery == nil ? magic : recoveringMagic { w.byte(b) }
        w.varint(snapshot.latestSequence)
        w.uint64(collectedThrough ?? snapshot.store.collectedThrough)
        if let recovery = snapshot.ownRecovery {
            w.varint(recovery.through)
            // Recovered is at most through (equal: the recovery ended, the reset is remembered),
            // which stays below the greatest sequence number: no overflow.
            w.varint(recovery.recovered.map { $0 + 1 } ?? 0)
        }
        writeProgress(snapshot.progress, to: &w)
        // Sorted, so equal states write equal files.
        let models = snapshot.store.allModels.sorted {
            ($0.0.channel, $0.0.model) < ($1.0.channel, $1.0.model)
        }
        w.varint(UInt64(models.count))
        for (address, registers) in models { writeModel(address, registers, to: &w) }
        let checksum = fnv1a(w.bytes)
        w.uint64(checksum)
        return w.bytes
    }

    package static func decode(_ bytes: [UInt8]) throws(WireError) -> StateSnapshot {
        guard let layout = [magic, recoveringMagic, previousMagic].first(where: { bytes.starts(with: $0) }),
            bytes.count >= layout.count + 8
        else {
            throw .invalid(field: "snapshot", reason: "not a StateSync snapshot")
        }
        var r = try checkedBody(bytes, magic: layout, what: "snapshot")
        let sequence = try r.varint("latest sequence")
        let collectedThrough = layout == previousMagic ? 0 : try r.uint64("collected through")
        var ownRecovery: OwnRecovery?
        if layout == recoveringMagic {
            let through = try r.varint("own recovery through")
            let recovered = try r.varint("own recovery recovered")
            // recovered - 1 == through: the recovery ended, and `through` is the last reset.
            guard through > 0, through < .max, recovered <= through + 1 else {
                throw .invalid(
                    field: "own recovery", reason: "recovered \(recovered) - 1 is above through \(through)")
            }
            ownRecovery = OwnRecovery(through: through, recovered: recovered == 0 ? nil : recovered - 1)
        }
        let progress = try readProgress(&r)
        var store = ReplicaStore()
        store.markCollected(through: collectedThrough)
        for _ in 0..<(try r.count("model count", minimumItemSize: 3)) {
            try readModel(&r) { address, name, register in
                _ = store.merge(address, property: name, register: register)
            }
        }
        try r.expectEnd()
        return StateSnapshot(store: store, latestSequence: sequence, progress: progress, ownRecovery: ownRecovery)
    }

    // MARK: - Parts shared with snapshot pages (SnapshotPage)

    /// A reader over `bytes` past `magic`, once their trailing FNV-1a 64 checksum matched.
    static func checkedBody(_ bytes: [UInt8], magic: [UInt8], what: String) throws(WireError) -> WireReader {
        guard bytes.count >= magic.count + 8 else { throw .invalid(field: what, reason: "too short") }
        var tail = WireReader(Array(bytes.suffix(8)))
        // The body in place (a page is megabytes), and a reader that stops before the checksum.
        var fnv = StreamingFNV()
        fnv.bytes(bytes[..<(bytes.count - 8)])
        guard try tail.uint64("checksum") == fnv.hash else {
            throw .invalid(field: what, reason: "checksum mismatch")
        }
        var reader = WireReader(bytes)
        _ = reader.limit(to: bytes.count - 8)
        for _ in magic { _ = try reader.byte("magic") }
        return reader
    }

    /// A progress list: count, then (origin, contiguous mark) in origin order.
    static func writeProgress(_ progress: [String: UInt64], to writer: inout WireWriter) {
        writer.varint(UInt64(progress.count))
        for origin in progress.keys.sorted() {
            writer.string(origin)
            writer.varint(progress[origin]!)
        }
    }

    static func readProgress(_ reader: inout WireReader) throws(WireError) -> [String: UInt64] {
        var progress: [String: UInt64] = [:]
        for _ in 0..<(try reader.count("origin count", minimumItemSize: 2)) {
            let origin = try reader.string("origin")
            progress[origin] = try reader.varint("origin progress")
        }
        return progress
    }

    /// One model: channel, model, property count, then each register (name, value, version,
    /// writer) in name order.
    static func writeModel(
        _ address: ModelAddress, _ registers: [String: ReplicaStore.Register], to writer: inout WireWriter
    ) {
        writer.string(address.channel)
        writer.string(address.model)
        writer.varint(UInt64(registers.count))
        for (name, register) in registers.sorted(by: { $0.key < $1.key }) {
            writer.string(name)
            writer.propertyValue(register)
            writer.uint64(register.version.timestamp)
            writer.string(register.version.node)
        }
    }

    /// Reads one model, handing each of its registers to `take`; returns its address.
    @discardableResult
    static func readModel(
        _ reader: inout WireReader, _ take: (ModelAddress, String, ReplicaStore.Register) -> Void
    ) throws(WireError) -> ModelAddress {
        let (address, count) = try readModelHeader(&reader)
        var writer: String?
        for _ in 0..<count {
            let (name, register) = try readRegister(&reader, writer: &writer)
            take(address, name, register)
        }
        return address
    }

    /// Reads a model's address and how many registers follow it (each read by
    /// ``readRegister(_:writer:)``).
    static func readModelHeader(_ reader: inout WireReader) throws(WireError) -> (address: ModelAddress, count: Int) {
        let address = ModelAddress(channel: try reader.string("channel"), model: try reader.string("model"))
        // A register holds at least a name, a value, a version and a writer: 11 octets.
        return (address, try reader.count("property count", minimumItemSize: 11))
    }

    /// Reads one register of a model. `writer`: the writer of the model's register read before
    /// (`nil` at its first): a model's registers mostly share their writer, compared rather than
    /// decoded again.
    @inline(__always)
    static func readRegister(
        _ reader: inout WireReader, writer: inout String?
    ) throws(WireError) -> (name: String, register: ReplicaStore.Register) {
        let name = try reader.string("property")
        let value = try reader.propertyValue()
        let version = Version(
            timestamp: try reader.uint64("version"), node: try reader.string("version node", repeating: &writer))
        return (name, ReplicaStore.Register(value, version: version))
    }

    static func fnv1a(_ bytes: [UInt8]) -> UInt64 {
        ReplicaStore.fnv1a(bytes)
    }
}
