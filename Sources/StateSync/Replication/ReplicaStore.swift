/// The replicated state of one node: for every model, every property's value and version.
///
/// Each property is a last-writer-wins register ordered by ``Version``. ``apply(_:)`` is
/// idempotent and commutative: replicas that applied the same deltas, in any order and any
/// number of times, hold the same state (docs/PROTOCOL.md, "Merge rules").
///
/// Thread safety: none; the owner serialises access (the node keeps it behind a lock).
public struct ReplicaStore: Sendable {
    /// One property's register.
    public struct Register: Sendable, Hashable {
        /// The property's value.
        public var value: Value
        /// The version of the write that set it.
        public var version: Version

        /// A register holding `value`, written at `version`.
        public init(value: Value, version: Version) {
            self.value = value
            self.version = version
        }
    }

    private(set) var channels: [String: [String: [String: Register]]] = [:]
    /// The highest version applied so far.
    public private(set) var latestVersion: Version = .zero
    /// The newest version that won in each channel (for LIST; kept as writes merge).
    private var channelLatest: [String: Version] = [:]
    private var digestSum: UInt64 = 0
    /// A planted bug (``NodeFaults/wrongTieBreak``), never set in production: equal timestamps
    /// are decided by node id the wrong way round.
    var plantedWrongTieBreak = false

    /// An empty store.
    public init() {}

    /// Whether a write at `version` wins over a register at `held` (last-writer-wins).
    @inline(__always)
    static func wins(_ version: Version, over held: Version, wrongTieBreak: Bool) -> Bool {
        if wrongTieBreak, version.timestamp == held.timestamp, version.node != held.node {
            return version.node < held.node
        }
        return version > held
    }

    /// Applies `delta`'s properties that win against what is held. Returns the changes, in the
    /// delta's property order, with the value each replaced; properties that lose or repeat
    /// the current value with the same version change nothing and are not returned.
    public mutating func apply(_ delta: Delta) -> [PropertyChange] {
        var changes = ChangeCollector(delta: delta)
        mergeWrites(of: delta, into: &changes)
        return changes.changes
    }

    /// Applies `delta` like ``apply(_:)``; returns only the writes that won, in order — the
    /// delta's own array when all of them did (the usual case: no allocation).
    mutating func applyWinning(_ delta: Delta) -> [PropertyWrite] {
        var winners = WinnerCollector()
        mergeWrites(of: delta, into: &winners)
        return winners.writes(of: delta.properties)
    }

    /// ``applyWinning(_:)`` for consecutive deltas of one model, with one look-up of the model
    /// for the whole run. Returns each delta's winning writes.
    mutating func applyWinning(run deltas: [Delta]) -> [[PropertyWrite]] {
        guard let first = deltas.first else { return [] }
        // Never create an empty model entry (a delta has at least one property on the wire).
        guard deltas.contains(where: { !$0.properties.isEmpty }) else { return deltas.map { _ in [] } }
        var prefix = StreamingFNV()
        prefix.registerAddress(channel: first.channel, model: first.model)
        var digestSum = self.digestSum
        var latest = latestVersion
        var runLatest = Version.zero
        var won: [[PropertyWrite]] = []
        won.reserveCapacity(deltas.count)
        func merge(into registers: inout [String: Register]) {
            for index in deltas.indices {
                precondition(deltas[index].channel == first.channel && deltas[index].model == first.model)
                var winners = WinnerCollector()
                let anyWon = Self.mergeWrites(
                    deltas[index].properties, version: deltas[index].version, into: &registers, prefix: prefix,
                    digestSum: &digestSum, wrongTieBreak: plantedWrongTieBreak, outcome: &winners)
                if anyWon, deltas[index].version > latest { latest = deltas[index].version }
                if anyWon, deltas[index].version > runLatest { runLatest = deltas[index].version }
                won.append(winners.writes(of: deltas[index].properties))
            }
        }
        merge(into: &channels[first.channel, default: [:]][first.model, default: [:]])
        self.digestSum = digestSum
        if runLatest > .zero { noteLatest(runLatest, in: first.channel) }
        latestVersion = latest
        return won
    }

    /// Told about each property of a delta that won, in the delta's order.
    private protocol MergeOutcome {
        mutating func won(_ index: Int, of properties: [PropertyWrite], replacing old: Register?)
    }

    private struct ChangeCollector: MergeOutcome {
        let channel: String, model: String, version: Version
        var changes: [PropertyChange] = []

        init(delta: Delta) {
            (channel, model, version) = (delta.channel, delta.model, delta.version)
            changes.reserveCapacity(delta.properties.count)
        }

        mutating func won(_ index: Int, of properties: [PropertyWrite], replacing old: Register?) {
            changes.append(
                PropertyChange(
                    channel: channel, model: model, property: properties[index].name, old: old?.value,
                    new: properties[index].value, version: version))
        }
    }

    /// Counts the leading run of winners; copies the winners out only once one lost.
    private struct WinnerCollector: MergeOutcome {
        var leading = 0
        var subset: [PropertyWrite]?

        mutating func won(_ index: Int, of properties: [PropertyWrite], replacing old: Register?) {
            if subset == nil, index == leading {
                leading += 1
            } else {
                if subset == nil { subset = Array(properties[..<leading]) }
                subset!.append(properties[index])
            }
        }

        func writes(of properties: [PropertyWrite]) -> [PropertyWrite] {
            if let subset { return subset }
            return leading == properties.count ? properties : Array(properties[..<leading])
        }
    }

    /// The merge itself: one look-up of the model's registers per delta and one per property,
    /// in place; the digest sum kept up to date.
    private mutating func mergeWrites<Outcome: MergeOutcome>(of delta: Delta, into outcome: inout Outcome) {
        guard !delta.properties.isEmpty else { return }  // never create an empty model entry
        // The digest hash of every register of this model starts with the same bytes.
        var prefix = StreamingFNV()
        prefix.registerAddress(channel: delta.channel, model: delta.model)
        var digestSum = self.digestSum
        // (A delta has at least one property and a model not held yet takes them all: the
        // default empty entry never stays empty.)
        let anyWon = Self.mergeWrites(
            delta.properties, version: delta.version,
            into: &channels[delta.channel, default: [:]][delta.model, default: [:]], prefix: prefix,
            digestSum: &digestSum, wrongTieBreak: plantedWrongTieBreak, outcome: &outcome)
        self.digestSum = digestSum
        if anyWon {
            noteLatest(delta.version, in: delta.channel)
            if delta.version > latestVersion { latestVersion = delta.version }
        }
    }

    private mutating func noteLatest(_ version: Version, in channel: String) {
        if let held = channelLatest[channel], held >= version { return }
        channelLatest[channel] = version
    }

    private static func mergeWrites<Outcome: MergeOutcome>(
        _ properties: [PropertyWrite], version: Version, into registers: inout [String: Register],
        prefix: StreamingFNV, digestSum: inout UInt64, wrongTieBreak: Bool, outcome: inout Outcome
    ) -> Bool {
        var anyWon = false
        for index in properties.indices {
            let name = properties[index].name
            let register = Register(value: properties[index].value, version: version)
            let current: Register?
            if let slot = registers.index(forKey: name) {
                current = registers.values[slot]
                if !Self.wins(version, over: current!.version, wrongTieBreak: wrongTieBreak) { continue }
                registers.values[slot] = register
            } else {
                current = nil
                registers[name] = register
            }
            if let current { digestSum &-= registerHash(prefix: prefix, property: name, register: current) }
            digestSum &+= registerHash(prefix: prefix, property: name, register: register)
            anyWon = true
            outcome.won(index, of: properties, replacing: current)
        }
        return anyWon
    }

    /// Merges one register (from a peer's snapshot) by last-writer-wins. Returns the change it
    /// made, if it won.
    public mutating func merge(_ address: ModelAddress, property: String, register: Register) -> PropertyChange? {
        let current = channels[address.channel]?[address.model]?[property]
        if let current, !Self.wins(register.version, over: current.version, wrongTieBreak: plantedWrongTieBreak) {
            return nil
        }
        channels[address.channel, default: [:]][address.model, default: [:]][property] = register
        account(address.channel, address.model, property, old: current, new: register)
        noteLatest(register.version, in: address.channel)
        if register.version > latestVersion { latestVersion = register.version }
        return PropertyChange(
            channel: address.channel, model: address.model, property: property, old: current?.value,
            new: register.value,
            version: register.version)
    }

    /// The properties of one model (empty when unknown).
    public func properties(of address: ModelAddress) -> [String: Register] {
        channels[address.channel]?[address.model] ?? [:]
    }

    /// The ids of the models of `channel`.
    public func models(in channel: String) -> [String] {
        channels[channel].map { Array($0.keys) } ?? []
    }

    /// The channels that hold at least one model, with their model counts.
    public var channelModelCounts: [String: Int] {
        channels.mapValues(\.count)
    }

    /// The models of `channel` (the channels, when `channel` is empty and `readable` allows
    /// them) whose names start with `prefix` and sort after `after`: the first `limit` in name
    /// order, and whether more follow. One pass over the channel's models, keeping the `limit`
    /// smallest names (the entries are built for those alone).
    public func list(
        channel: String, prefix: String, after: String, limit: Int, readable: (String) -> Bool = { _ in true }
    ) -> (entries: [ClientProtocol.ListEntry], more: Bool) {
        // Names compare by their UTF-8 octets (PROTOCOL.md 10.13), not by Swift's Unicode-aware
        // `<`, under which canonically equivalent names would be equal and one skipped.
        func precedes(_ a: String, _ b: String) -> Bool { a.utf8.lexicographicallyPrecedes(b.utf8) }
        var best: [String] = []
        var more = false
        func consider(_ name: String) {
            guard precedes(after, name), name.utf8.starts(with: prefix.utf8) else { return }
            if best.count == limit {
                more = true
                guard precedes(name, best[best.count - 1]) else { return }
                best.removeLast()
            }
            var low = 0
            var high = best.count
            while low < high {
                let middle = (low + high) / 2
                if precedes(best[middle], name) { low = middle + 1 } else { high = middle }
            }
            best.insert(name, at: low)
        }
        if channel.isEmpty {
            for name in channels.keys where readable(name) { consider(name) }
            return (
                best.map { .init(name: $0, count: channels[$0]?.count ?? 0, latest: channelLatest[$0] ?? .zero) }, more
            )
        }
        guard let models = channels[channel] else { return ([], false) }
        for name in models.keys { consider(name) }
        return (
            best.map { name in
                let registers = models[name] ?? [:]
                return .init(
                    name: name, count: registers.count, latest: registers.values.map(\.version).max() ?? .zero)
            }, more
        )
    }

    /// Every model's state, for snapshots.
    public var allModels: [(ModelAddress, [String: Register])] {
        channels.flatMap { channel, models in
            models.map { (ModelAddress(channel: channel, model: $0.key), $0.value) }
        }
    }

    /// A digest of the whole state, equal on replicas that hold equal state: the sum (mod 2^64)
    /// of every register's hash (FNV-1a 64 over channel, model, property, value, version), kept
    /// up to date on every change, so reading it costs nothing (docs/PROTOCOL.md, "Digest").
    public var digest: UInt64 { digestSum }

    /// A register's canonical bytes: channel, model, property, value, version (wire encodings).
    public static func canonicalBytes(channel: String, model: String, property: String, register: Register) -> [UInt8] {
        var writer = WireWriter()
        writer.register(channel: channel, model: model, property: property, register: register)
        return writer.bytes
    }

    /// FNV-1a 64 of `bytes`, continuing from `hash`.
    public static func fnv1a(_ bytes: [UInt8], from hash: UInt64 = StreamingFNV.offsetBasis) -> UInt64 {
        var fnv = StreamingFNV(hash: hash)
        fnv.bytes(bytes)
        return fnv.hash
    }

    /// The hash of one register, as summed into ``digest``: FNV-1a 64 of its canonical bytes,
    /// computed as they would be written, without building them.
    public static func registerHash(channel: String, model: String, property: String, register: Register) -> UInt64 {
        var fnv = StreamingFNV()
        fnv.register(channel: channel, model: model, property: property, register: register)
        return fnv.hash
    }

    /// ``registerHash(channel:model:property:register:)`` continued from a hash of the
    /// register's address (``WireSink/registerAddress(channel:model:)``), shared by a model's
    /// registers.
    static func registerHash(prefix: StreamingFNV, property: String, register: Register) -> UInt64 {
        var fnv = prefix
        fnv.registerFields(property: property, register: register)
        return fnv.hash
    }

    private mutating func account(_ channel: String, _ model: String, _ property: String, old: Register?, new: Register)
    {
        if let old {
            digestSum &-= Self.registerHash(channel: channel, model: model, property: property, register: old)
        }
        digestSum &+= Self.registerHash(channel: channel, model: model, property: property, register: new)
    }
}

/// FNV-1a 64 over the bytes ``WireWriter`` would write, fed as they are produced (no buffer).
public struct StreamingFNV: WireSink, Sendable {
    /// The FNV-1a 64 offset basis: the hash of nothing.
    public static let offsetBasis: UInt64 = 0xcbf2_9ce4_8422_2325
    /// The hash so far.
    public private(set) var hash: UInt64

    /// Starts from `hash` (the offset basis for a new digest, or an earlier digest to continue).
    public init(hash: UInt64 = StreamingFNV.offsetBasis) {
        self.hash = hash
    }

    @inline(__always)
    /// Adds one byte.
    public mutating func byte(_ b: UInt8) {
        hash ^= UInt64(b)
        hash &*= 0x100_0000_01b3
    }

    /// Adds bytes, in order.
    public mutating func bytes<C: Collection>(_ values: C) where C.Element == UInt8 {
        for b in values { byte(b) }
    }
}

extension WireSink {
    /// A register's canonical fields: channel, model, property, value, version timestamp and node
    /// (what digests hash).
    public mutating func register(channel: String, model: String, property: String, register: ReplicaStore.Register) {
        registerAddress(channel: channel, model: model)
        registerFields(property: property, register: register)
    }

    /// The first canonical fields of a register: the model's address.
    mutating func registerAddress(channel: String, model: String) {
        string(channel)
        string(model)
    }

    /// The canonical fields of a register after its address.
    mutating func registerFields(property: String, register: ReplicaStore.Register) {
        string(property)
        value(register.value)
        uint64(register.version.timestamp)
        string(register.version.node)
    }
}
