/// A node's whole state and how far it includes each origin's deltas: what a data directory
/// keeps in `state.snapshot`, what a SNAPSHOT reply carries (docs/PROTOCOL.md, Appendix A).
package struct StateSnapshot: Sendable {
    package var store: ReplicaStore
    package var latestSequence: UInt64
    /// For each origin, the sequence number through which the store includes its deltas.
    package var progress: [String: UInt64] = [:]

    package init(store: ReplicaStore, latestSequence: UInt64, progress: [String: UInt64] = [:]) {
        self.store = store
        self.latestSequence = latestSequence
        self.progress = progress
    }
}

extension StateSnapshot {
    /// The snapshot file's magic.
    static let magic: [UInt8] = Array("SSNAP2\n".utf8)

    /// The snapshot format of Appendix A: magic, latest sequence, progress, registers (sorted,
    /// so equal states write equal files), checksum.
    package static func encode(_ snapshot: StateSnapshot) -> [UInt8] {
        var w = WireWriter(capacity: 4096)
        for b in magic { w.byte(b) }
        w.varint(snapshot.latestSequence)
        w.varint(UInt64(snapshot.progress.count))
        for origin in snapshot.progress.keys.sorted() {
            w.string(origin)
            w.varint(snapshot.progress[origin]!)
        }
        // Sorted, so equal states write equal files.
        let models = snapshot.store.allModels.sorted {
            ($0.0.channel, $0.0.model) < ($1.0.channel, $1.0.model)
        }
        w.varint(UInt64(models.count))
        for (address, registers) in models {
            w.string(address.channel)
            w.string(address.model)
            w.varint(UInt64(registers.count))
            for (name, register) in registers.sorted(by: { $0.key < $1.key }) {
                w.string(name)
                w.value(register.value)
                w.uint64(register.version.timestamp)
                w.string(register.version.node)
            }
        }
        let checksum = fnv1a(w.bytes)
        w.uint64(checksum)
        return w.bytes
    }

    package static func decode(_ bytes: [UInt8]) throws(WireError) -> StateSnapshot {
        guard bytes.count >= magic.count + 8, Array(bytes.prefix(magic.count)) == magic else {
            throw .invalid(field: "snapshot", reason: "not a StateSync snapshot")
        }
        let body = Array(bytes.dropLast(8))
        var tail = WireReader(Array(bytes.suffix(8)))
        guard try tail.uint64("checksum") == fnv1a(body) else {
            throw .invalid(field: "snapshot", reason: "checksum mismatch")
        }
        var r = WireReader(body)
        for _ in magic { _ = try r.byte("magic") }
        let sequence = try r.varint("latest sequence")
        var progress: [String: UInt64] = [:]
        let origins = try r.count("origin count", minimumItemSize: 2)
        for _ in 0..<origins {
            let origin = try r.string("origin")
            progress[origin] = try r.varint("origin progress")
        }
        var store = ReplicaStore()
        let modelCount = try r.count("model count")
        for _ in 0..<modelCount {
            let channel = try r.string("channel")
            let model = try r.string("model")
            let n = try r.count("property count")
            for _ in 0..<n {
                let name = try r.string("property")
                let value = try r.value()
                let version = Version(timestamp: try r.uint64("version"), node: try r.string("version node"))
                _ = store.merge(
                    ModelAddress(channel: channel, model: model), property: name,
                    register: ReplicaStore.Register(value: value, version: version))
            }
        }
        try r.expectEnd()
        return StateSnapshot(store: store, latestSequence: sequence, progress: progress)
    }

    static func fnv1a(_ bytes: [UInt8]) -> UInt64 {
        ReplicaStore.fnv1a(bytes)
    }
}
