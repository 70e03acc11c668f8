/// The replicated state of one node: for every model, every property's register (value and
/// version, or a deletion), the model's own deletion, and the expiry of values written with a
/// time to live.
///
/// Each property is a last-writer-wins register ordered by ``Version``; a deletion is a register
/// too (a tombstone), and the deletion of a whole model is a version below which every property
/// of the model counts as deleted. ``apply(_:)`` is idempotent and commutative: replicas that
/// applied the same deltas, in any order and any number of times, hold the same state
/// (docs/PROTOCOL.md, "Merge rules"). Expiry is a function of a register and the time:
/// ``expire(through:)`` turns the values whose time ran out into tombstones, at the version their
/// write gave them on every replica.
///
/// Thread safety: none; the owner serialises access (the node keeps it behind a lock).
public struct ReplicaStore: Sendable {
    /// One property's register: a value, or a deletion, at the version of the write that made it.
    public struct Register: Sendable, Hashable {
        /// The property's value (null for a deletion).
        public var value: Value
        /// The version of the write that set it.
        public var version: Version
        /// 0 for a plain value, ``PropertyWrite/maximumTimeToLive``-bounded milliseconds for an
        /// expiring one, with the top bit set once it is deleted (explicitly, or by its expiry).
        private var lifetime: UInt64

        private static let deletedBit: UInt64 = 1 << 63

        /// A register holding `value`, written at `version`.
        public init(value: Value, version: Version) {
            self.value = value
            self.version = version
            self.lifetime = 0
        }

        /// A register holding `value`, written at `version`, that expires `timeToLive` milliseconds
        /// later (0: never).
        public init(value: Value, version: Version, timeToLive: UInt64) {
            self.value = value
            self.version = version
            self.lifetime = min(timeToLive, PropertyWrite.maximumTimeToLive)
        }

        /// A deletion (tombstone) written at `version`.
        public static func tombstone(_ version: Version) -> Register {
            var register = Register(value: .null, version: version)
            register.lifetime = deletedBit
            return register
        }

        /// The register a decoded property value (``WireReader/propertyValue(_:)``) stands for,
        /// written at `version`: an expired value keeps its time to live.
        init(_ decoded: (value: Value, timeToLive: UInt64, deleted: Bool), version: Version) {
            if decoded.deleted {
                self =
                    decoded.timeToLive == 0
                    ? .tombstone(version)
                    : Register(value: .null, version: version, timeToLive: decoded.timeToLive).expired
            } else {
                self.init(value: decoded.value, version: version, timeToLive: decoded.timeToLive)
            }
        }

        /// The register `write` makes at `version`.
        init(_ write: PropertyWrite, version: Version) {
            if write.isDeletion {
                self = .tombstone(version)
            } else {
                self.init(value: write.value, version: version, timeToLive: write.timeToLive)
            }
        }

        /// Whether the property is deleted: by a deletion, or because its value expired.
        public var isDeleted: Bool { lifetime & Self.deletedBit != 0 }

        /// The milliseconds the value was written to live (also once it expired); 0: forever.
        public var timeToLive: UInt64 { lifetime & ~Self.deletedBit }

        /// When the value expires (milliseconds since 1970), if it was written with a time to live.
        public var expiresAt: UInt64? {
            let ttl = timeToLive
            return ttl == 0 ? nil : version.milliseconds &+ ttl
        }

        /// The version an expiry happens at: the expiry time, with the writer's node id, so that
        /// every replica reports it alike.
        public var expiryVersion: Version? {
            expiresAt.map { Version(milliseconds: $0, counter: 0, node: version.node) }
        }

        /// This register once its value expired: deleted, the value dropped, the version and time
        /// to live kept (a write between the value's version and its expiry still wins over it).
        package var expired: Register {
            var register = self
            register.value = .null
            register.lifetime |= Self.deletedBit
            return register
        }

        /// The live value, if any. (Not a `? nil :`: `Value` is `ExpressibleByNilLiteral`, and the
        /// literal would become `.null`.)
        var liveValue: Value? {
            if isDeleted { return Optional.none }
            return value
        }
    }

    /// The most registers ``merge(_:expected:from:won:)`` makes room for at once in a model new here
    /// (a model with more grows as they come).
    static let mergeReservationLimit = 1 << 14

    /// A register with the name of its property (a snapshot's, as it is decoded). A struct, not
    /// a pair: the profile of the pair showed an optional one copied and tested through the
    /// runtime's generic tuple witnesses (what the struct saves was within the noise).
    package struct NamedRegister: Sendable {
        package var name: String
        package var register: Register

        package init(_ name: String, _ register: Register) {
            self.name = name
            self.register = register
        }
    }

    /// One model: its property registers, the version of its last deletion, and how many of its
    /// properties have a value.
    struct Model: Sendable {
        var registers: [String: Register] = [:]
        /// Every property written at a lower version is deleted.
        var deletion: Version?
        var live: Int32 = 0
        /// How its share of ``ReplicaStore/digest`` is kept: ``ReplicaStore/staleDigest`` while
        /// it waits for the next fold (listed in `staleDigests`), else the store's
        /// `digestEpoch` when it last changed (its share up to date). (32 bits, with `live`, so
        /// that a model takes no more room than without it.)
        var digestState: UInt32 = 0

        /// The version a write must exceed to change `property`.
        @inline(__always)
        func floor(of property: String) -> Version? {
            guard let deletion else { return registers[property]?.version }
            guard let held = registers[property]?.version else { return deletion }
            return max(held, deletion)
        }
    }

    private(set) var channels: [String: [String: Model]] = [:]
    /// Per channel, how many models have at least one property with a value.
    private var liveModels: [String: Int] = [:]
    /// The highest version applied so far.
    public private(set) var latestVersion: Version = .zero
    /// The newest version that won in each channel (for LIST; kept as writes merge).
    private var channelLatest: [String: Version] = [:]
    /// The digest, but that it holds the listed share of each model in `staleDigests`.
    private var digestSum: UInt64 = 0
    /// Models whose share of the digest waits for the next fold (``foldDigests()``), with the
    /// share `digestSum` still holds for each. A model's share is kept up to date at its first
    /// change between two folds, hashing the registers that changed; at a second change it is
    /// listed here instead, and its changes cost nothing until the fold hashes it once: a model
    /// rewritten thousands of times between two folds is hashed about twice, and one written
    /// once costs what it did. A model of more than ``lazyDigestRegisters`` registers is always
    /// kept up to date, so that a fold never rehashes a big model for one write.
    private var staleDigests: [ModelAddress: UInt64] = [:]
    /// Counts folds (never 0 or ``staleDigest``): a model changed twice within one is listed.
    private var digestEpoch: UInt32 = 1
    /// A model's `digestState` while it is listed in `staleDigests`.
    static let staleDigest = UInt32.max
    /// The most registers a model may have for its share of the digest to wait for a fold.
    static let lazyDigestRegisters = 64
    /// The values written with a time to live, by expiry.
    private var expiries = TimedQueue()
    /// The deletions held (tombstones, expired values, deletions of models), by version
    /// timestamp: what ``collect(through:)`` takes.
    private var tombstoneQueue = TimedQueue()
    /// How many deletions are held: tombstones, expired values and deletions of models.
    public private(set) var tombstones = 0
    /// Runs merged with each register written once (``mergeRepeated(_:into:context:won:)``).
    package private(set) var repeatedRunsMerged = 0
    /// The timestamp through which deletions may have been collected (``collect(through:)``):
    /// a register at or below it that a replica lacks was deleted, not missed.
    public private(set) var collectedThrough: UInt64 = 0
    /// The time (milliseconds since 1970) through which expired values were deleted.
    public private(set) var expiredThrough: UInt64 = 0
    /// A planted bug (``NodeFaults/wrongTieBreak``), never set in production: equal timestamps
    /// are decided by node id the wrong way round.
    var plantedWrongTieBreak = false
    /// A planted bug (``NodeFaults/ignoreDeletions``), never set in production: a deletion never
    /// wins.
    var plantedIgnoreDeletions = false

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
    /// delta's property order, with the value each replaced; writes that lose, or that delete a
    /// property without a value, change nothing visible and are not returned. The deletion of a
    /// model returns one change per property it deleted.
    public mutating func apply(_ delta: Delta) -> [PropertyChange] {
        var changes = ChangeCollector(delta: delta)
        mergeWrites(of: delta, into: &changes)
        return changes.changes
    }

    /// Applies `delta` like ``apply(_:)``; returns only the writes that won, in order — the
    /// delta's own writes when all of them did (the usual case: no allocation).
    mutating func applyWinning(_ delta: Delta) -> PropertyWrites {
        var winners = WinnerCollector()
        mergeWrites(of: delta, into: &winners)
        return winners.writes(of: delta.writes)
    }

    /// ``applyWinning(_:)`` for consecutive deltas of one model, with one look-up of the model
    /// for the whole run: appends each delta's winning writes to `won`, `nil` when all of them
    /// won (the usual case: no copy of its writes, which is an atomic reference count on their
    /// array here and its release wherever the copy goes, for every delta merged; issue #17). A
    /// caller that merges a run per received batch keeps one buffer for them (a new array per
    /// run was a kilobyte-sized allocation per batch, and glibc consolidates its free lists at
    /// each).
    mutating func applyWinning(run deltas: [Delta], into won: inout [PropertyWrites?]) {
        guard let first = deltas.first else { return }
        // Never create an empty model entry (a delta has at least one property on the wire).
        guard deltas.contains(where: { !$0.writes.isEmpty }) else {
            won.append(contentsOf: repeatElement(nil, count: deltas.count))  // all of none
            return
        }
        var context = MergeContext(channel: first.channel, model: first.model, store: self)
        won.reserveCapacity(won.count + deltas.count)
        var runLatest = Version.zero
        var mergedOnce = false
        modify(first.address, &context) { model, context in
            if let latest = Self.mergeRepeated(deltas, into: &model, context: &context, won: &won) {
                runLatest = latest
                mergedOnce = true
                return
            }
            var slots = SlotHints(enabled: deltas.count > 1)
            for index in deltas.indices {
                precondition(deltas[index].channel == first.channel && deltas[index].model == first.model)
                var winners = WinnerCollector()
                if Self.merge(deltas[index], into: &model, context: &context, outcome: &winners, slots: &slots),
                    deltas[index].version > runLatest
                {
                    runLatest = deltas[index].version
                }
                won.append(winners.unlessAll(of: deltas[index].writes))
            }
        }
        if mergedOnce { repeatedRunsMerged += 1 }
        finish(context, newest: runLatest)
    }

    /// The most properties ``mergeRepeated(_:into:context:won:)`` takes in each delta.
    private static let repeatedShapeLimit = 16

    /// Merges a run whose deltas all write the same properties in the same order, with plain
    /// values (no deletion, no time to live), and whose properties the model holds already: a
    /// batch of single sets to one property, or of one transaction's shape. Each write is
    /// compared with its register as the one-by-one merge compares it (with what the writes
    /// before it in the run left there), but each register is written once, with the last write
    /// that won, and accounted once (its digest, liveness and tombstone count telescope from the
    /// first register to the last). Appends each delta's winning writes to `won` (`nil`: all of
    /// them) and returns the newest version that won anything (`.zero`: none); `nil`, having
    /// changed nothing, when the run is not of that shape. (The one-by-one merge wrote and
    /// accounted every register of every delta: issue #17.)
    private static func mergeRepeated(
        _ deltas: [Delta], into model: inout Model, context: inout MergeContext, won: inout [PropertyWrites?]
    ) -> Version? {
        guard deltas.count > 1 else { return nil }
        let shape = deltas[0].writes
        let width = shape.count
        guard width > 0, width <= repeatedShapeLimit else { return nil }
        for position in 0..<width {
            for earlier in 0..<position where shape[earlier].name.hasSameUTF8(as: shape[position].name) {
                return nil  // a property written twice in one delta
            }
        }
        // By index, each delta's properties borrowed where they lie, never bound to a `let` or
        // iterated (that is a copy): every copy of a delta or of its properties is an atomic
        // reference count and its release (issue #17), and this runs twice for every change (on
        // its writer and on each replica).
        for index in deltas.indices {
            precondition(deltas[index].channel == context.channel && deltas[index].model == context.model)
            guard deltas[index].writes.count == width else { return nil }
            for position in 0..<width {
                guard !deltas[index].writes[position].isDeletion, deltas[index].writes[position].timeToLive == 0,
                    deltas[index].writes[position].name.hasSameUTF8(as: shape[position].name)
                else { return nil }
            }
        }
        var slots: [Dictionary<String, Register>.Index] = []
        slots.reserveCapacity(width)
        for position in 0..<width {
            guard let slot = model.registers.index(forKey: shape[position].name) else { return nil }
            slots.append(slot)
        }
        // From here on the run is merged: nothing returns `nil`.
        var current = slots.map { model.registers.values[$0].version }
        var lastWinner = [Int](repeating: -1, count: width)
        var newest = Version.zero
        for index in deltas.indices {
            let version = deltas[index].version
            var winners = WinnerCollector()
            if model.deletion.map({ wins(version, over: $0, wrongTieBreak: context.wrongTieBreak) }) ?? true {
                for position in 0..<width
                where wins(version, over: current[position], wrongTieBreak: context.wrongTieBreak) {
                    current[position] = version
                    lastWinner[position] = index
                    winners.won(position, of: deltas[index].writes, replacing: nil)
                }
            }
            if winners.wonAny, version > newest { newest = version }
            won.append(winners.unlessAll(of: deltas[index].writes))
        }
        let liveBefore = model.live
        for position in 0..<width where lastWinner[position] >= 0 {
            let winner = deltas[lastWinner[position]]
            let register = Register(winner.writes[position], version: winner.version)
            var replaced = register
            swap(&model.registers.values[slots[position]], &replaced)
            context.account(shape[position].name, old: replaced, new: register)
            model.live += 1 - (replaced.isDeleted ? 0 : 1)
        }
        context.noteLiveness(before: liveBefore, after: model.live)
        return newest
    }

    /// Told about each write of a delta that won, in the delta's order, with the register it
    /// replaced; and about each property a model's deletion deleted.
    private protocol MergeOutcome {
        mutating func won(_ index: Int, of properties: PropertyWrites, replacing old: Register?)
        mutating func deleted(_ property: String, old: Value, by version: Version)
    }

    private struct ChangeCollector: MergeOutcome {
        let channel: String, model: String, version: Version
        var changes: [PropertyChange] = []

        init(delta: Delta) {
            (channel, model, version) = (delta.channel, delta.model, delta.version)
            changes.reserveCapacity(delta.writes.count)
        }

        mutating func won(_ index: Int, of properties: PropertyWrites, replacing old: Register?) {
            let write = properties[index]
            let old = old?.liveValue
            if write.isDeletion {
                // Deleting what has no value changes nothing anyone can see.
                guard let old, !write.isModelDeletion else { return }
                changes.append(
                    PropertyChange(
                        channel: channel, model: model, property: write.name, old: old, new: .null, version: version,
                        kind: .deleted))
            } else {
                changes.append(
                    PropertyChange(
                        channel: channel, model: model, property: write.name, old: old, new: write.value,
                        version: version,
                        expiresAt: write.timeToLive == 0 ? nil : version.milliseconds &+ write.timeToLive))
            }
        }

        mutating func deleted(_ property: String, old: Value, by version: Version) {
            var change = PropertyChange(
                channel: channel, model: model, property: property, old: old, new: .null, version: version,
                kind: .deleted)
            change.byModelDeletion = true
            changes.append(change)
        }
    }

    /// Counts the leading run of winners; copies the winners out only once one lost.
    private struct WinnerCollector: MergeOutcome {
        var leading = 0
        var subset: [PropertyWrite]?

        mutating func won(_ index: Int, of properties: PropertyWrites, replacing old: Register?) {
            if subset == nil, index == leading {
                leading += 1
            } else {
                if subset == nil { subset = Array(properties[..<leading]) }
                subset!.append(properties[index])
            }
        }

        mutating func deleted(_ property: String, old: Value, by version: Version) {}

        var wonAny: Bool { leading > 0 || subset != nil }

        func writes(of properties: PropertyWrites) -> PropertyWrites {
            if let subset { return PropertyWrites(subset) }
            return leading == properties.count ? properties : PropertyWrites(Array(properties[..<leading]))
        }

        /// ``writes(of:)`` when not all of `properties` won; `nil` when they all did.
        func unlessAll(of properties: PropertyWrites) -> PropertyWrites? {
            subset == nil && leading == properties.count ? nil : writes(of: properties)
        }
    }

    /// What a merge into one model updates besides the model: its share of the digest (when it
    /// is kept up to date at every change: the hash of every register of the model starts with
    /// the same bytes), the channel's count of live models, the expiries.
    private struct MergeContext {
        let channel: String
        let model: String
        /// Whether the model's share of the digest is kept up to date at every change.
        var eagerDigest = false
        /// The hash of the model's address, once needed.
        var prefix: StreamingFNV?
        /// What the changes add to the model's share of the digest (when eager).
        var digestDelta: UInt64 = 0
        var liveModelDelta = 0
        var tombstoneDelta = 0
        var expiries: [TimedQueue.Entry] = []
        var deletions: [TimedQueue.Entry] = []
        /// The latest expiry of a value that is now held expired (``ReplicaStore/latestExpired``).
        var latestExpired: UInt64 = 0
        let wrongTieBreak: Bool
        let ignoreDeletions: Bool

        init(channel: String, model: String, store: ReplicaStore) {
            self.channel = channel
            self.model = model
            self.wrongTieBreak = store.plantedWrongTieBreak
            self.ignoreDeletions = store.plantedIgnoreDeletions
        }

        /// A register of the model went from `old` to `new`: the digest counts registers with a
        /// value, and a new expiring value waits for its expiry.
        @inline(__always)
        mutating func account(_ property: String, old: Register?, new: Register?) {
            if let old {
                if old.isDeleted {
                    tombstoneDelta -= 1
                } else if eagerDigest {
                    digestDelta &-= ReplicaStore.registerHash(prefix: addressHash, property: property, register: old)
                }
            }
            guard let new else { return }
            if new.isDeleted {
                noteDeletion(property, at: new.version)
                if let expiresAt = new.expiresAt, expiresAt > latestExpired { latestExpired = expiresAt }
                return
            }
            if eagerDigest {
                digestDelta &+= ReplicaStore.registerHash(prefix: addressHash, property: property, register: new)
            }
            if let expiresAt = new.expiresAt {
                expiries.append(
                    TimedQueue.Entry(
                        time: expiresAt, channel: channel, model: model, property: property, version: new.version))
            }
        }

        /// The hash of the model's address, computed once.
        var addressHash: StreamingFNV {
            mutating get {
                if let prefix { return prefix }
                var hash = StreamingFNV()
                hash.registerAddress(channel: channel, model: model)
                prefix = hash
                return hash
            }
        }

        /// A deletion is now held at `version` (the empty property: the model's): it waits for
        /// collection.
        @inline(__always)
        mutating func noteDeletion(_ property: String, at version: Version) {
            tombstoneDelta += 1
            deletions.append(
                TimedQueue.Entry(
                    time: version.timestamp, channel: channel, model: model, property: property, version: version))
        }

        /// The model's count of live properties went from `before` to `after`: whether it has a
        /// value may have changed, and with it the channel's count of live models.
        @inline(__always)
        mutating func noteLiveness(before: Int32, after: Int32) {
            if before == 0, after > 0 {
                liveModelDelta += 1
            } else if before > 0, after == 0 {
                liveModelDelta -= 1
            }
        }
    }

    /// Runs `body` on the model at `address` in place, creating it when absent, and drops it again
    /// when it ends up holding nothing. Keeps the digest (see `staleDigests`).
    private mutating func modify(
        _ address: ModelAddress, _ context: inout MergeContext, _ body: (inout Model, inout MergeContext) -> Void
    ) {
        // One look-up of the channel and of the model on the hot path; the empty check rides on it.
        var emptied = false
        var wasStale = false
        var becameStale = false
        var sumDelta: UInt64 = 0
        var shareHeld: UInt64 = 0  // of a model that goes on the list now: what the sum holds of it
        let epoch = digestEpoch
        Self.withModel(&channels[address.channel, default: [:]][address.model, default: Model()]) { model in
            // Listed already: nothing to do. Changed before in this epoch, and small: listed now,
            // with its share as it stands. Else its share is kept up to date with the registers
            // that change.
            wasStale = model.digestState == Self.staleDigest
            if !wasStale, model.digestState == epoch, model.registers.count <= Self.lazyDigestRegisters {
                shareHeld = Self.digestPart(of: model, at: address)
                model.digestState = Self.staleDigest
                becameStale = true
            }
            context.eagerDigest = !wasStale && !becameStale
            context.digestDelta = 0
            body(&model, &context)
            emptied = model.registers.isEmpty && model.deletion == nil
            if context.eagerDigest {
                sumDelta = context.digestDelta
                model.digestState = epoch
            }
        }
        digestSum &+= sumDelta
        if emptied {
            // A model dropped takes its share with it: an up-to-date one's is 0 by now.
            if wasStale { digestSum &-= staleDigests.removeValue(forKey: address) ?? 0 }
            if becameStale { digestSum &-= shareHeld }
        } else if becameStale {
            staleDigests[address] = shareHeld
        }
        guard emptied else { return }
        channels[address.channel]?[address.model] = nil
        if channels[address.channel]?.isEmpty == true { channels[address.channel] = nil }
    }

    @inline(__always)
    private static func withModel(_ model: inout Model, _ body: (inout Model) -> Void) {
        body(&model)
    }

    /// Writes back what a merge into one model changed besides the model.
    private mutating func finish(_ context: MergeContext, newest: Version) {
        for entry in context.expiries { expiries.push(entry) }
        for entry in context.deletions { tombstoneQueue.push(entry) }
        if context.latestExpired > latestExpired { latestExpired = context.latestExpired }
        tombstones += context.tombstoneDelta
        if context.liveModelDelta != 0 {
            let count = liveModels[context.channel, default: 0] + context.liveModelDelta
            liveModels[context.channel] = count > 0 ? count : nil
        }
        if newest > .zero {
            noteLatest(newest, in: context.channel)
            if newest > latestVersion { latestVersion = newest }
        }
    }

    /// The merge of one delta: a model's deletion, or its writes one by one.
    private mutating func mergeWrites<Outcome: MergeOutcome>(of delta: Delta, into outcome: inout Outcome) {
        guard !delta.writes.isEmpty else { return }  // never create an empty model entry
        var context = MergeContext(channel: delta.channel, model: delta.model, store: self)
        var anyWon = false
        modify(delta.address, &context) { model, context in
            var slots = SlotHints(enabled: false)
            anyWon = Self.merge(delta, into: &model, context: &context, outcome: &outcome, slots: &slots)
        }
        finish(context, newest: anyWon ? delta.version : .zero)
    }

    /// Where the registers written by the last delta of a run were found in a model's
    /// dictionary, by the position of the write in that delta: the deltas of a run mostly write
    /// the same properties in the same order, and a register found where the last one was needs
    /// no hashing of its name. Valid while no register is added or removed (which clears it); a
    /// copy of the dictionary's storage (the run's first write, when a snapshot shares it) keeps
    /// every slot where it was. A slot is used only after its key is checked.
    struct SlotHints {
        private var slots: [Dictionary<String, Register>.Index?] = []
        /// Off for a lone delta, which has no delta before it: noting its slots would only
        /// allocate (off, nothing is noted, so no slot is ever given).
        private let enabled: Bool

        init(enabled: Bool = true) {
            self.enabled = enabled
        }

        func slot(at position: Int) -> Dictionary<String, Register>.Index? {
            position < slots.count ? slots[position] : nil
        }

        mutating func note(_ slot: Dictionary<String, Register>.Index, at position: Int) {
            guard enabled else { return }
            if position < slots.count {
                slots[position] = slot
            } else if position == slots.count, position < 64 {
                slots.append(slot)
            }
        }

        /// A register was added or removed: every slot may have moved.
        mutating func clear() { slots.removeAll(keepingCapacity: true) }
    }

    /// Merges `delta` into `model`; returns whether any part of it won.
    private static func merge<Outcome: MergeOutcome>(
        _ delta: Delta, into model: inout Model, context: inout MergeContext, outcome: inout Outcome,
        slots: inout SlotHints
    ) -> Bool {
        let liveBefore = model.live
        defer { context.noteLiveness(before: liveBefore, after: model.live) }
        if context.ignoreDeletions, delta.writes.contains(where: \.isDeletion) { return false }
        if delta.deletesModel {
            slots.clear()
            guard deleteModel(at: delta.version, in: &model, context: &context, outcome: &outcome) else {
                return false
            }
            outcome.won(0, of: delta.writes, replacing: nil)
            return true
        }
        var anyWon = false
        let version = delta.version
        let properties = delta.writes
        for index in properties.indices {
            let name = properties[index].name
            if let deletion = model.deletion, !wins(version, over: deletion, wrongTieBreak: context.wrongTieBreak) {
                continue
            }
            let register = Register(properties[index], version: version)
            let current: Register?
            let hinted = slots.slot(at: index).flatMap { model.registers.keys[$0] == name ? $0 : nil }
            if let slot = hinted ?? model.registers.index(forKey: name) {
                if hinted == nil { slots.note(slot, at: index) }
                if !wins(version, over: model.registers.values[slot].version, wrongTieBreak: context.wrongTieBreak) {
                    continue
                }
                // Swapped in: the register replaced comes out by move, not as a copy released
                // again when the assignment overwrote it (1 % of a reader's samples).
                var replaced = register
                swap(&model.registers.values[slot], &replaced)
                current = replaced
            } else {
                current = nil
                model.registers[name] = register
                slots.clear()
            }
            context.account(name, old: current, new: register)
            model.live += (register.isDeleted ? 0 : 1) - (current.map { $0.isDeleted ? 0 : 1 } ?? 0)
            anyWon = true
            outcome.won(index, of: properties, replacing: current)
        }
        return anyWon
    }

    /// The deletion of a whole model at `version`: every register below it goes (its value, if
    /// any, is reported deleted). Returns whether the deletion is newer than the model's last.
    private static func deleteModel<Outcome: MergeOutcome>(
        at version: Version, in model: inout Model, context: inout MergeContext, outcome: inout Outcome
    ) -> Bool {
        if let deletion = model.deletion, !wins(version, over: deletion, wrongTieBreak: context.wrongTieBreak) {
            return false
        }
        if model.deletion != nil { context.tombstoneDelta -= 1 }
        model.deletion = version
        context.noteDeletion("", at: version)
        for name in model.registers.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) {
            let register = model.registers[name]!
            guard register.version < version else { continue }
            model.registers[name] = nil
            context.account(name, old: register, new: nil)
            if let old = register.liveValue {
                model.live -= 1
                outcome.deleted(name, old: old, by: version)
            }
        }
        return true
    }

    private mutating func noteLatest(_ version: Version, in channel: String) {
        if let held = channelLatest[channel], held >= version { return }
        channelLatest[channel] = version
    }

    /// Merges one record of a peer's snapshot (a register; with the empty name, the model's
    /// deletion) by last-writer-wins. Returns `nil` when the record lost (or was held already),
    /// else the changes it made that anyone can see (none for a deletion of what had no value).
    @discardableResult
    public mutating func merge(_ address: ModelAddress, property: String, register: Register) -> [PropertyChange]? {
        if property.isEmpty {
            guard register.isDeleted else { return nil }
            var changes = ChangeCollector(
                delta: Delta(
                    channel: address.channel, model: address.model, version: register.version, sequence: 0,
                    properties: [.modelDeletion]))
            var context = MergeContext(channel: address.channel, model: address.model, store: self)
            var won = false
            modify(address, &context) { model, context in
                let liveBefore = model.live
                won = Self.deleteModel(at: register.version, in: &model, context: &context, outcome: &changes)
                context.noteLiveness(before: liveBefore, after: model.live)
            }
            finish(context, newest: won ? register.version : .zero)
            return won ? changes.changes : nil
        }
        var changes: [PropertyChange] = []
        var context = MergeContext(channel: address.channel, model: address.model, store: self)
        var won = false
        modify(address, &context) { model, context in
            let liveBefore = model.live
            defer { context.noteLiveness(before: liveBefore, after: model.live) }
            guard let current = Self.mergeRegister(property, register, into: &model, context: &context) else { return }
            won = true
            let old = current?.liveValue
            if let value = register.liveValue {
                changes.append(
                    PropertyChange(
                        channel: address.channel, model: address.model, property: property, old: old, new: value,
                        version: register.version, expiresAt: register.expiresAt))
            } else if let old {
                let expired = register.timeToLive > 0
                var change = PropertyChange(
                    channel: address.channel, model: address.model, property: property, old: old, new: .null,
                    version: expired ? register.expiryVersion! : register.version,
                    kind: expired ? .expired : .deleted)
                if expired { change.writtenVersion = register.version }
                changes.append(change)
            }
        }
        finish(context, newest: won ? register.version : .zero)
        return won ? changes : nil
    }

    /// Merges `register` into `model` at `property` when it wins over what the model holds there
    /// (its register, or the model's deletion). Returns `nil` when it lost, else the register it
    /// replaced (`.some(nil)`: none).
    @inline(__always)
    private static func mergeRegister(
        _ property: String, _ register: Register, into model: inout Model, context: inout MergeContext
    ) -> Register?? {
        if let floor = model.floor(of: property),
            !wins(register.version, over: floor, wrongTieBreak: context.wrongTieBreak)
        {
            return nil
        }
        let current = model.registers.updateValue(register, forKey: property)
        context.account(property, old: current, new: register)
        model.live += (register.isDeleted ? 0 : 1) - (current.map { $0.isDeleted ? 0 : 1 } ?? 0)
        return .some(current)
    }

    /// ``mergeRegister(_:_:into:context:)`` for a model that held no register and no deletion
    /// when the run of merges began: the write goes in first, and only a name merged earlier in
    /// the run has a register to compare with, put back when the new one does not win.
    @inline(__always)
    private static func mergeRegister(
        _ property: String, _ register: Register, intoFresh model: inout Model, context: inout MergeContext
    ) -> Register?? {
        let current = model.registers.updateValue(register, forKey: property)
        if let current, !wins(register.version, over: current.version, wrongTieBreak: context.wrongTieBreak) {
            model.registers[property] = current
            return nil
        }
        context.account(property, old: current, new: register)
        model.live += (register.isDeleted ? 0 : 1) - (current.map { $0.isDeleted ? 0 : 1 } ?? 0)
        return .some(current)
    }

    /// Merges registers of one model (a snapshot's), in the order given, exactly like
    /// ``merge(_:property:register:)`` one by one, with one look-up of the model for each run of
    /// properties (a snapshot merges a million registers), through
    /// ``merge(_:expected:from:won:)``. Returns, for each, whether it won. The model's deletion
    /// (the empty name) goes through ``merge(_:property:register:)``.
    public mutating func merge(
        _ address: ModelAddress, registers: [(name: String, register: Register)]
    ) -> [Bool] {
        var won = [Bool](repeating: false, count: registers.count)
        var index = 0
        _ = merge(address, expected: registers.count) {
            guard index < registers.count else { return nil }
            defer { index += 1 }
            return NamedRegister(registers[index].name, registers[index].register)
        } won: { position in
            won[position] = true
        }
        return won
    }

    /// Merges registers of one model as `next` gives them, until it gives `nil`: a snapshot
    /// page's, merged as they are decoded, each moved into the store rather than gathered into an
    /// array first and copied from it (a joiner merges a million). Exactly like
    /// ``merge(_:property:register:)`` for each, in the order given: a name given twice merges
    /// twice, last-writer-wins deciding. `expected`: how many registers `next` may give (room is
    /// made for them in a model new here, up to ``mergeReservationLimit``: the count is a peer's
    /// word, and a damaged page may hold fewer). `won` is told the position (from 0, in the
    /// order given) of each register that won. Returns the newest version that won, if any.
    package mutating func merge(
        _ address: ModelAddress, expected: Int, from next: () -> NamedRegister?, won: (Int) -> Void = { _ in }
    ) -> Version? {
        var newestWon: Version?
        var position = 0
        var entry = next()
        while let first = entry {
            if first.name.isEmpty {
                if merge(address, property: "", register: first.register) != nil {
                    newestWon = max(newestWon ?? first.register.version, first.register.version)
                    won(position)
                }
                position += 1
                entry = next()
                continue
            }
            // A run of properties up to the next deletion of the model (a snapshot has none after).
            var context = MergeContext(channel: address.channel, model: address.model, store: self)
            var newest: Version?
            modify(address, &context) { model, context in
                let liveBefore = model.live
                defer { context.noteLiveness(before: liveBefore, after: model.live) }
                // A model new here (a joiner's): room for all its registers at once, and no
                // floor to look up before each write (only a name given twice has one).
                let fresh = model.registers.isEmpty && model.deletion == nil
                if fresh { model.registers.reserveCapacity(Swift.min(expected, Self.mergeReservationLimit)) }
                while let named = entry.take() {
                    // The model's deletion ends the run; it is merged on its own.
                    guard !named.name.isEmpty else {
                        entry = named
                        return
                    }
                    let version = named.register.version
                    let merged =
                        fresh
                        ? Self.mergeRegister(named.name, named.register, intoFresh: &model, context: &context)
                        : Self.mergeRegister(named.name, named.register, into: &model, context: &context)
                    if merged != nil {
                        newest = max(newest ?? version, version)
                        won(position)
                    }
                    position += 1
                    entry = next()
                }
            }
            finish(context, newest: newest ?? .zero)
            if let newest { newestWon = max(newestWon ?? newest, newest) }
        }
        return newestWon
    }

    // MARK: - Expiry

    /// Deletes every value whose time to live ran out by `now` (milliseconds since 1970), in
    /// order of expiry, and returns the changes: kind ``PropertyChange/Kind/expired``, at each
    /// value's ``Register/expiryVersion``. The store's clock of expiry only moves forwards.
    public mutating func expire(through now: UInt64) -> [PropertyChange] {
        expireDue(through: now).map(\.change)
    }

    /// ``expire(through:)``, with the version each expired value was written at.
    mutating func expireDue(through now: UInt64) -> [(change: PropertyChange, written: Version)] {
        if now > expiredThrough { expiredThrough = now }
        var changes: [(change: PropertyChange, written: Version)] = []
        while let entry = expiries.popDue(through: expiredThrough) {
            // (An entry names the register its write made: one replaced since is not expired.)
            let address = ModelAddress(channel: entry.channel, model: entry.model)
            guard let register = expireValue(of: address, property: entry.property, writtenAt: entry.version) else {
                continue
            }
            var change = PropertyChange(
                channel: entry.channel, model: entry.model, property: entry.property, old: register.value,
                new: .null, version: register.expiryVersion!, kind: .expired)
            change.writtenVersion = register.version
            changes.append((change, register.version))
        }
        return changes
    }

    /// Expires the value `property` of `address` holds if it was written at `written` (one
    /// replaced since is not expired): ``expire(through:)`` when its time comes, and a copy that
    /// follows the expiries another replica reported (`statesync watch --state`), whose clock of
    /// expiry is that replica's. Returns the value's register as it was, if it held it.
    @discardableResult
    package mutating func expireValue(of address: ModelAddress, property: String, writtenAt written: Version)
        -> Register?
    {
        var expired: Register?
        var context = MergeContext(channel: address.channel, model: address.model, store: self)
        modify(address, &context) { model, context in
            guard let register = model.registers[property], register.version == written, !register.isDeleted,
                register.expiresAt != nil
            else { return }
            let liveBefore = model.live
            model.registers[property] = register.expired
            model.live -= 1
            context.account(property, old: register, new: register.expired)
            context.noteLiveness(before: liveBefore, after: model.live)
            expired = register
        }
        finish(context, newest: .zero)
        return expired
    }

    /// When the next value expires (milliseconds since 1970), if one is waiting.
    public var nextExpiry: UInt64? { expiries.earliest }

    /// The latest expiry (milliseconds since 1970) of a value this replica came to hold expired:
    /// expired here, or merged so from a peer's snapshot (0: none). Another replica's clock
    /// expires it a moment apart.
    package private(set) var latestExpired: UInt64 = 0

    // MARK: - Collection

    /// Forgets every deletion — tombstone, expired value, deletion of a model — whose version's
    /// timestamp is at or below `stable` (docs/PROTOCOL.md 8.4): the caller knows that every
    /// member has received every delta up to there, so no delta a deletion would have to beat can
    /// still arrive. Returns how many it forgot. Values and the digest do not change.
    @discardableResult
    public mutating func collect(through stable: UInt64) -> Int {
        var collected = 0
        while let entry = tombstoneQueue.popDue(through: stable) {
            var context = MergeContext(channel: entry.channel, model: entry.model, store: self)
            modify(ModelAddress(channel: entry.channel, model: entry.model), &context) { model, context in
                if entry.property.isEmpty {
                    guard model.deletion == entry.version else { return }
                    model.deletion = nil
                } else {
                    guard let register = model.registers[entry.property], register.isDeleted,
                        register.version == entry.version
                    else { return }
                    model.registers[entry.property] = nil
                }
                context.tombstoneDelta -= 1
                collected += 1
            }
            finish(context, newest: .zero)
        }
        collectedThrough = max(collectedThrough, stable)
        return collected
    }

    /// A record's place: its model and property (empty: the model's deletion).
    public struct RecordKey: Hashable, Sendable {
        public var model: String
        public var property: String

        public init(model: String, property: String) {
            self.model = model
            self.property = property
        }
    }

    /// Drops every record of `channel` whose version's timestamp is at or below `horizon` and
    /// that `keeping` does not keep: what a client does with a snapshot from a node that may have
    /// collected their deletions (PROTOCOL.md 10.5.8). Returns the changes for those that had a
    /// value (kind deleted, at a version of the horizon's timestamp and no node: the deletion's
    /// own is gone).
    mutating func drop(
        channel: String, through horizon: UInt64, keeping: (RecordKey) -> Bool
    ) -> [PropertyChange] {
        var changes: [PropertyChange] = []
        for model in models(in: channel).sorted() {
            changes +=
                drop(
                    ModelAddress(channel: channel, model: model), through: horizon,
                    keeping: { name, _ in keeping(RecordKey(model: model, property: name)) }
                ).changes
        }
        return changes
    }

    /// Drops every record of one model whose version's timestamp is at or below `horizon` and
    /// that `keeping` (given its name, empty for the model's deletion, and its version) does not
    /// keep. Returns the changes for those that had a value, as ``drop(channel:through:keeping:)``,
    /// and how many records it dropped.
    mutating func drop(
        _ address: ModelAddress, through horizon: UInt64, keeping: (String, Version) -> Bool
    ) -> (changes: [PropertyChange], dropped: Int) {
        var changes: [PropertyChange] = []
        var dropped = 0
        let collected = Version(timestamp: horizon, node: "")
        var context = MergeContext(channel: address.channel, model: address.model, store: self)
        modify(address, &context) { entry, context in
            let liveBefore = entry.live
            if let deletion = entry.deletion, deletion.timestamp <= horizon, !keeping("", deletion) {
                entry.deletion = nil
                context.tombstoneDelta -= 1
                dropped += 1
            }
            for name in entry.registers.keys.sorted() {
                let register = entry.registers[name]!
                guard register.version.timestamp <= horizon, !keeping(name, register.version) else { continue }
                entry.registers[name] = nil
                dropped += 1
                context.account(name, old: register, new: nil)
                if let old = register.liveValue {
                    entry.live -= 1
                    changes.append(
                        PropertyChange(
                            channel: address.channel, model: address.model, property: name, old: old, new: .null,
                            version: collected, kind: .deleted))
                }
            }
            context.noteLiveness(before: liveBefore, after: entry.live)
        }
        finish(context, newest: .zero)
        return (changes, dropped)
    }

    /// Marks `stable` as collected through (a snapshot that was: its horizon).
    mutating func markCollected(through stable: UInt64) {
        collectedThrough = max(collectedThrough, stable)
    }

    // MARK: - Reading

    /// The properties of one model that have a value (empty when unknown or deleted).
    public func properties(of address: ModelAddress) -> [String: Register] {
        guard let model = channels[address.channel]?[address.model] else { return [:] }
        if Int(model.live) == model.registers.count { return model.registers }
        return model.registers.filter { !$0.value.isDeleted }
    }

    /// One property of one model, when it has a value (`nil` when unknown or deleted): a client's
    /// single-property SET looks up only what it writes, with no copy of the model's registers.
    public func property(_ name: String, of address: ModelAddress) -> Register? {
        guard let register = channels[address.channel]?[address.model]?.registers[name], !register.isDeleted else {
            return nil
        }
        return register
    }

    /// Every record of one model as replicas exchange them: its registers, deletions included,
    /// and — under the empty name, as a deletion — the model's own deletion.
    public func records(of address: ModelAddress) -> [String: Register] {
        guard let model = channels[address.channel]?[address.model] else { return [:] }
        return Self.records(of: model)
    }

    private static func records(of model: Model) -> [String: Register] {
        guard let deletion = model.deletion else { return model.registers }
        var records = model.registers
        records[""] = .tombstone(deletion)
        return records
    }

    /// Whether the model has at least one property with a value.
    public func isLive(_ address: ModelAddress) -> Bool {
        (channels[address.channel]?[address.model]?.live ?? 0) > 0
    }

    /// The ids of the models of `channel` that hold any record (deleted ones too, until their
    /// records are collected).
    public func models(in channel: String) -> [String] {
        channels[channel].map { Array($0.keys) } ?? []
    }

    /// The channels that hold at least one model with a value, with the number of such models.
    public var channelModelCounts: [String: Int] {
        liveModels
    }

    /// The models of `channel` (the channels, when `channel` is empty and `readable` allows
    /// them) that have a value, whose names start with `prefix` and sort after `after`: the first
    /// `limit` in name order, and whether more follow. One pass over the channel's models,
    /// keeping the `limit` smallest names (the entries are built for those alone).
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
            for (name, count) in liveModels where count > 0 && readable(name) { consider(name) }
            return (
                best.map { .init(name: $0, count: liveModels[$0] ?? 0, latest: channelLatest[$0] ?? .zero) }, more
            )
        }
        guard let models = channels[channel] else { return ([], false) }
        for (name, model) in models where model.live > 0 { consider(name) }
        return (
            best.map { name in
                // What GET shows: the properties with a value, and the newest of their versions.
                let model = models[name]!
                let newest = model.registers.values.lazy.filter { !$0.isDeleted }.map(\.version).max() ?? .zero
                return .init(name: name, count: Int(model.live), latest: newest)
            }, more
        )
    }

    /// Every model's records (``records(of:)``), for snapshots.
    public var allModels: [(ModelAddress, [String: Register])] {
        channels.flatMap { channel, models in
            models.map { (ModelAddress(channel: channel, model: $0.key), Self.records(of: $0.value)) }
        }
    }

    /// A digest of the state that has a value, equal on replicas that hold equal state: the sum
    /// (mod 2^64) of the hash of every register with a value (FNV-1a 64 over channel, model,
    /// property, value, version) (docs/PROTOCOL.md, "Digest"). Deletions do not count: a replica
    /// that collected a tombstone and one that still holds it have the same digest.
    ///
    /// Reading it hashes the small models changed since ``foldDigests()`` last ran; a reader
    /// that reads it often (a node, at every status) folds them in first.
    public var digest: UInt64 {
        var sum = digestSum
        for (address, held) in staleDigests {
            guard let model = channels[address.channel]?[address.model] else { continue }
            sum = sum &- held &+ Self.digestPart(of: model, at: address)
        }
        return sum
    }

    /// How many models wait for the next ``foldDigests()``.
    package var staleDigestCount: Int { staleDigests.count }

    /// Sums the shares of the models listed since the last fold into the digest: reading
    /// ``digest`` then costs nothing until the next change.
    public mutating func foldDigests() {
        digestEpoch = digestEpoch &+ 1 == Self.staleDigest ? 1 : digestEpoch &+ 1
        guard !staleDigests.isEmpty else { return }
        digestSum = digest
        for address in staleDigests.keys { channels[address.channel]?[address.model]?.digestState = 0 }
        staleDigests.removeAll(keepingCapacity: staleDigests.count <= 1024)
    }

    /// The sum of the hashes of `model`'s registers with a value.
    private static func digestPart(of model: Model, at address: ModelAddress) -> UInt64 {
        var prefix = StreamingFNV()
        prefix.registerAddress(channel: address.channel, model: address.model)
        var sum: UInt64 = 0
        for (property, register) in model.registers where !register.isDeleted {
            sum &+= registerHash(prefix: prefix, property: property, register: register)
        }
        return sum
    }

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

    /// Adds bytes, in order. Contiguous bytes (arrays, a native string's UTF-8) go through a
    /// plain pointer loop: iterating a `String.UTF8View` element by element cost a reader of
    /// single sets 3.7 % of its samples, hashing names and values into the state digest.
    public mutating func bytes<C: Collection>(_ values: C) where C.Element == UInt8 {
        var running = hash
        let hashedInPlace: Bool? = values.withContiguousStorageIfAvailable { buffer in
            for b in buffer {
                running ^= UInt64(b)
                running &*= 0x100_0000_01b3
            }
            return true
        }
        guard hashedInPlace == nil else {
            hash = running
            return
        }
        for b in values { byte(b) }
    }
}

extension WireSink {
    /// A register's canonical fields: channel, model, property, value (as a property value:
    /// with its time to live, or a deletion), version timestamp and node (what digests hash).
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
        propertyValue(register)
        uint64(register.version.timestamp)
        string(register.version.node)
    }
}
