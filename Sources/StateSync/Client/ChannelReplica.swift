import Synchronization

/// A client's copy of one channel's state, kept up to date by a watch: every model's properties
/// with their versions, and the ``WatchCursor`` of what it has seen.
///
/// The replica is what makes a watch's old and new values exact across interruptions: changes
/// are computed against it (last-writer-wins, as on the nodes), so a delta seen twice changes
/// nothing, and a watch resumed with it (`StateSyncClient.watch(channel:replica:)`) on any node
/// continues the same chains: old is always the previous new.
///
/// Thread safety: all members may be used from any thread.
public final class ChannelReplica: Sendable {
    /// The channel this replica holds.
    public let channel: String
    /// The channel's registers (a store of one channel: the nodes' merge rules, deletions and
    /// expiry included), the cursor, and the deltas it took above the cursor (``heldAbove``).
    private let state: Mutex<(store: ReplicaStore, cursor: WatchCursor, above: [String: Set<UInt64>])>

    /// At most this many deltas above the cursor are remembered per origin (the first taken):
    /// enough for the gaps a watch sees.
    package static let heldAboveLimit = 1024

    /// What the replica held at the end of a `reset` snapshot (``keepResetImages()``).
    package struct ResetImage: Sendable {
        fileprivate var store: ReplicaStore
        package var cursor: WatchCursor
        fileprivate var above: [String: Set<UInt64>]
        /// How many resets had ended (or were given up, ``WatchSession``) with this one.
        package var number: Int
    }

    /// Whether a reset's end keeps a ``ResetImage`` for ``takeResetImage(number:)``, and the last
    /// one kept and not yet taken.
    private let resetImages = Mutex<(keep: Bool, last: ResetImage?)>((false, nil))

    /// A record the replica took or dropped without a change to report: the deletion of a
    /// property or of a whole model it held no value of, from a delta or a snapshot, or a deletion
    /// a snapshot dropped (``keepSilentRecords()``).
    package struct SilentRecord: Sendable {
        package let model: String
        /// The empty name: the model's own deletion.
        package let property: String
        /// The record the replica took, or the one it dropped (``removed``).
        package let register: ReplicaStore.Register
        /// Whether the replica dropped the record (a `reset` snapshot's page, or a deletion
        /// collected): a copy drops it too if it holds the same.
        package let removed: Bool
        /// How many `reset` snapshots had ended when it was taken: a reset's end replaces what the
        /// copy that takes these holds with the replica's image (``ResetImage``), which holds
        /// those taken before it, and only those taken after it may be taken after it.
        fileprivate let resets: Int
        /// The replica's cursor once its delta or snapshot was applied (nil until then).
        fileprivate var cursor: WatchCursor?
        /// Its delta's own number when the node sent it above a gap: a copy that takes the record
        /// holds that number above its cursor, as it does for a change of that delta.
        package let above: (origin: String, sequence: UInt64)?
    }

    /// Whether ``apply(_:)`` and snapshot records keep what they take without a change to report.
    private let keepsSilentRecords = Atomic<Bool>(false)
    /// The silent records not yet taken, in the order taken, and how many `reset` snapshots have
    /// ended.
    private let silentRecords = Mutex<(records: [SilentRecord], resets: Int)>(([], 0))

    /// Whether the replica lacks the state at its cursor: made from a cursor alone (a watch
    /// resumed without the replica it had, as `statesync watch --from` resumes), until a snapshot
    /// fills it. A deletion of a property or model it holds no value of then still happened after
    /// the cursor, and is reported (with no old value) instead of being taken for a no-op.
    private let lacksStateAtCursor: Atomic<Bool>

    /// An empty replica; with `cursor`, a watch resumes after it: old values of the first changes
    /// of each property are then unknown (the replica does not hold them), and a deletion of a
    /// property or model it holds no record of is reported with no old value (a whole model's,
    /// whose properties it cannot all name, also as one change with the empty property name),
    /// until a snapshot (a resync) gives it the whole state. Such a replica cannot tell a write
    /// that lost on the node to one made before the cursor: that deletion is reported too (as a
    /// set that lost is). A replica written with ``encoded()`` and read back is taken to hold its
    /// state.
    public init(channel: String, cursor: WatchCursor = WatchCursor()) {
        self.channel = channel
        self.state = Mutex((ReplicaStore(), cursor, [:]))
        self.lacksStateAtCursor = Atomic(!cursor.positions.isEmpty)
    }

    /// The sequence numbers of the deltas this replica took above its cursor (the node sent them
    /// above a gap it had), per origin: a resumed watch names them (PROTOCOL.md 10.5.1), so that a
    /// node that lost one sends a `reset` snapshot should it come to cover it without it.
    public var heldAbove: [String: [UInt64]] {
        state.withLock { $0.above.mapValues { $0.sorted() } }
    }

    /// What the replica has seen: resume a watch from here on any node.
    public var cursor: WatchCursor { state.withLock { $0.cursor } }

    /// The ids of the models that have a property with a value.
    public var models: [String] {
        state.withLock { state in
            state.store.models(in: channel).filter { state.store.isLive(ModelAddress(channel: channel, model: $0)) }
        }
    }

    /// The ids of the models that hold any record, deletions too (``models``: a value).
    package var modelsHoldingRecords: [String] { state.withLock { $0.store.models(in: channel) } }

    /// A model's properties that have a value, as held.
    public func properties(of model: String) -> [String: ReplicaStore.Register] {
        state.withLock { $0.store.properties(of: ModelAddress(channel: channel, model: model)) }
    }

    /// Every record of a model: its properties' registers, deletions and expired values
    /// included, and the model's own deletion under the empty name.
    package func records(of model: String) -> [String: ReplicaStore.Register] {
        state.withLock { $0.store.records(of: ModelAddress(channel: channel, model: model)) }
    }

    /// Whether the replica holds nothing at all (no register, no deletion, no cursor).
    package var isEmpty: Bool {
        state.withLock { $0.store.models(in: channel).isEmpty && $0.cursor.positions.isEmpty }
    }

    /// The time through which the replica has deleted expired values (the node's, as its
    /// CAUGHT-UP events told it).
    public var expiredThrough: UInt64 { state.withLock { $0.store.expiredThrough } }

    /// Applies a delta; returns the changes it made (old from this replica), after those of the
    /// values that expired at or before its version: they had expired when it was written (a
    /// value lives its time to live from its own version, PROTOCOL.md 8.3). The node's
    /// CAUGHT-UPs tell expiries live; a resumed watch, whose deltas the node replays at once,
    /// gets them only after the last, and would otherwise print a later write over an expired
    /// value as if it were still there, and the expiry after it. The cursor is moved by the
    /// node's own account of the watch's position (``advance(to:)``), not from the delta: deltas
    /// come in apply order, not in each origin's sequence order.
    package func apply(_ delta: Delta) -> (expired: [PropertyChange], changes: [PropertyChange]) {
        let keepSilent = keepsSilentRecords.load(ordering: .relaxed)
        let (expired, changes, silent, above) = state.withLock {
            state -> ([PropertyChange], [PropertyChange], [(String, ReplicaStore.Register)], Bool) in
            guard delta.channel == channel else { return ([], [], [], false) }
            let expired = state.store.expire(through: delta.version.milliseconds)
            // Lacking the state at its cursor, the replica reports the deletions of what it
            // holds no record of: what it held before the delta tells them. Keeping silent
            // records, it tells what a deletion took without a change.
            let lacks = lacksStateAtCursor.load(ordering: .relaxed)
            let before =
                (lacks || keepSilent) && delta.writes.contains(where: \.isDeletion)
                ? state.store.records(of: delta.address) : nil
            // Not the next one: the node's position after it covers that (no set to touch on the
            // usual path); one further up may lie above a gap the node has.
            let above = delta.sequence > state.cursor[delta.origin] &+ 1
            if above { Self.hold(delta.sequence, of: delta.origin, in: &state.above) }
            var changes = state.store.apply(delta)
            if lacks, let before { Self.addDeletionsNotHeld(of: delta, before: before, after: state.store, &changes) }
            if above {
                for index in changes.indices { changes[index].takenAbove = (delta.origin, delta.sequence) }
            }
            let silent =
                keepSilent && before != nil
                ? Self.silentDeletions(of: delta, before: before ?? [:], after: state.store, reported: changes) : []
            return (expired, changes, silent, above)
        }
        if !silent.isEmpty {
            noteSilent(silent, model: delta.model, above: above ? (delta.origin, delta.sequence) : nil)
        }
        return (expired, changes)
    }

    /// The deletions of `delta` that won in `after` (the store, `delta` just applied) and changed
    /// a record without a change in `reported`: a property's deletion where there was no value,
    /// and always the model's own deletion record: the changes of its properties record theirs,
    /// not the model's (which only this way reaches a copy that follows printed changes).
    private static func silentDeletions(
        of delta: Delta, before: [String: ReplicaStore.Register], after store: ReplicaStore,
        reported: [PropertyChange]
    ) -> [(String, ReplicaStore.Register)] {
        let records = store.records(of: delta.address)
        var silent: [(String, ReplicaStore.Register)] = []
        for write in delta.writes where write.isDeletion {
            guard let record = records[write.name], record.version == delta.version, before[write.name] != record else {
                continue
            }
            if !write.isModelDeletion,
                reported.contains(where: { $0.property == write.name && !$0.byModelDeletion })
            {
                continue
            }
            silent.append((write.name, record))
        }
        return silent
    }

    /// Keeps `records` of `model` as silent records, to be sealed with the cursor at the next
    /// ``advance(to:)``.
    private func noteSilent(
        _ records: [(String, ReplicaStore.Register)], model: String, above: (origin: String, sequence: UInt64)?,
        removed: Bool = false
    ) {
        silentRecords.withLock { silent in
            for (property, register) in records {
                silent.records.append(
                    SilentRecord(
                        model: model, property: property, register: register, removed: removed, resets: silent.resets,
                        cursor: nil, above: above))
            }
        }
    }

    /// From now on, what the replica takes without a change to report (the deletion of a
    /// property or a model it held no value of, from a delta or a snapshot) is kept, until
    /// ``takeSilentRecords(coveredBy:resets:)`` takes it: for a copy of the replica that follows the
    /// printed changes (`statesync watch --state`), which would otherwise lack those records,
    /// and, resumed from that copy, take an older write that lost to one of them for a change.
    package func keepSilentRecords() {
        keepsSilentRecords.store(true, ordering: .relaxed)
    }

    /// Takes the silent records whose delta or snapshot `cursor` covers, among those taken after
    /// the first `resets` `reset` snapshots ended and before the next one ended: applied at a
    /// cursor it covers (a delta the node sent above a gap does not move the cursor: its records
    /// come with the delta before it, and name its number, ``SilentRecord/above``). (A reset
    /// moves the cursor back: one taken after it may lie below a cursor printed before it.) Those
    /// taken before the `resets`th reset ended are dropped: its image holds them.
    package func takeSilentRecords(coveredBy cursor: WatchCursor, resets: Int) -> [SilentRecord] {
        silentRecords.withLock { silent in
            guard !silent.records.isEmpty else { return [] }
            var taken: [SilentRecord] = []
            silent.records.removeAll { record in
                if record.resets < resets { return true }
                guard record.resets == resets, let at = record.cursor else { return false }
                var covered = true
                at.forEachPosition { origin, sequence in
                    if sequence > cursor[origin] { covered = false }
                }
                if covered { taken.append(record) }
                return covered
            }
            return taken
        }
    }

    /// Adds to `changes` the deletions of `delta` that won in `after` (the store, `delta` just
    /// applied) of records `before` did not hold: in a replica that lacks the state at its
    /// cursor, they deleted what was there before it. A record it held was reported already (as
    /// the store reports, or here, once: a delta seen again changes nothing). A whole model's
    /// deletion is always one change with the empty property name too: the properties the
    /// replica never held are named by nothing else.
    private static func addDeletionsNotHeld(
        of delta: Delta, before: [String: ReplicaStore.Register], after store: ReplicaStore,
        _ changes: inout [PropertyChange]
    ) {
        let records = store.records(of: delta.address)
        let reportedBefore = changes.count
        for write in delta.writes where write.isDeletion {
            guard before[write.name] == nil, records[write.name]?.version == delta.version else { continue }
            var change = PropertyChange(
                channel: delta.channel, model: delta.model, property: write.name, old: nil, new: .null,
                version: delta.version, kind: .deleted)
            change.byModelDeletion = write.isModelDeletion
            changes.append(change)
        }
        guard changes.count > reportedBefore else { return }
        // In the delta's order of writes, as the store reports changes.
        let names = delta.writes.map(\.name)
        func position(_ change: PropertyChange) -> Int {
            names.firstIndex(of: change.byModelDeletion ? "" : change.property) ?? names.count
        }
        changes = changes.enumerated().sorted { (position($0.element), $0.offset) < (position($1.element), $1.offset) }
            .map(\.element)
    }

    /// The replica holds the whole state now (a snapshot ended): a deletion of what it holds no
    /// value of changes nothing any more.
    package func holdsTheWholeState() {
        lacksStateAtCursor.store(false, ordering: .relaxed)
    }

    /// Notes `sequence` of `origin` as taken above the cursor, unless the limit is reached.
    private static func hold(_ sequence: UInt64, of origin: String, in above: inout [String: Set<UInt64>]) {
        var held = above[origin, default: []]
        if held.count < heldAboveLimit { held.insert(sequence) }
        above[origin] = held
    }

    /// Applies one snapshot record; returns the changes it made. In a replica that lacks the
    /// state at its cursor (a watch resumed with a cursor alone), a deletion or an expired value
    /// it held no record of is a change too, with no old value: it may have removed what the
    /// client holds from before the cursor (a resync would otherwise leave a deleted model with
    /// the client for good). A whole model's deletion is one change with the empty property name.
    package func apply(model: String, property: String, register: ReplicaStore.Register) -> [PropertyChange] {
        let (changes, taken) = state.withLock { state -> ([PropertyChange], Bool) in
            let address = ModelAddress(channel: channel, model: model)
            let unheld =
                register.isDeleted && lacksStateAtCursor.load(ordering: .relaxed)
                && state.store.records(of: address)[property] == nil
            // nil: the record lost, or was held already (a record seen twice is not taken twice).
            let merged = state.store.merge(address, property: property, register: register)
            let taken = merged != nil
            var changes = merged ?? []
            if unheld, changes.isEmpty, state.store.records(of: address)[property]?.version == register.version {
                let expired = register.timeToLive > 0
                var change = PropertyChange(
                    channel: channel, model: model, property: property, old: nil, new: .null,
                    version: expired ? register.expiryVersion ?? register.version : register.version,
                    kind: expired ? .expired : .deleted)
                change.byModelDeletion = property.isEmpty
                changes.append(change)
            }
            return (changes, taken)
        }
        // A model's own deletion is kept whatever it deleted, as a delta's is (``silentDeletions``).
        if keepsSilentRecords.load(ordering: .relaxed), changes.isEmpty || property.isEmpty, register.isDeleted, taken {
            noteSilent([(property, register)], model: model, above: nil)
        }
        return changes
    }

    /// Records a change as the register it left (``PropertyChange/register``): what a copy of a
    /// replica that follows printed changes one by one needs (`statesync watch --state`). The
    /// deletion of a whole model is recorded per property here; the model's own deletion comes
    /// with the silent records (``takeSilentRecords(coveredBy:resets:)``) once all its changes
    /// are.
    package func record(_ change: PropertyChange) {
        // An expiry keeps its write's version: merged, it would not win over the value it expired.
        if change.kind == .expired, let written = change.writtenVersion,
            state.withLock({
                $0.store.expireValue(
                    of: ModelAddress(channel: channel, model: change.model), property: change.property,
                    writtenAt: written) != nil
            })
        {
            return
        }
        _ = apply(model: change.model, property: change.property, register: change.register)
    }

    /// Notes `sequence` of `origin` as taken above the cursor (unless the cursor covers it): for
    /// a copy that follows printed changes, once every line of that delta was printed.
    package func holdAbove(_ sequence: UInt64, of origin: String) {
        state.withLock { state in
            if sequence > state.cursor[origin] { Self.hold(sequence, of: origin, in: &state.above) }
        }
    }

    /// Records a silent record (``SilentRecord``): what the replica it came from took, or dropped
    /// (where this one holds the same: a later line may have replaced it here already).
    package func record(_ silent: SilentRecord) {
        guard silent.removed else {
            _ = apply(model: silent.model, property: silent.property, register: silent.register)
            // A model's deletion: the deletions of its properties it covers (a copy records a
            // model's deletion per property as its lines are printed) say nothing more.
            if silent.property.isEmpty, silent.register.isDeleted {
                for (name, register) in records(of: silent.model)
                where !name.isEmpty && register.isDeleted && register.version <= silent.register.version {
                    removeRecord(of: silent.model, property: name)
                }
            }
            return
        }
        guard records(of: silent.model)[silent.property] == silent.register else { return }
        removeRecord(of: silent.model, property: silent.property)
    }

    /// Records a change of a `reset` snapshot's page: the replica it came from dropped what it held
    /// of that property first (``WatchSession``), so the register replaces what this one holds,
    /// whatever its version.
    package func recordReplacing(_ change: PropertyChange) {
        removeRecord(of: change.model, property: change.property)
        record(change)
    }

    /// Drops every record (a deletion of a model included) whose version's timestamp is at or
    /// below `horizon` and that `keeping` does not keep; returns the changes (kind deleted) for
    /// those that had a value.
    package func drop(through horizon: UInt64, keeping: (ReplicaStore.RecordKey) -> Bool) -> [PropertyChange] {
        let keepSilent = keepsSilentRecords.load(ordering: .relaxed)
        let (changes, dropped) = state.withLock {
            state -> ([PropertyChange], [(model: String, property: String, register: ReplicaStore.Register)]) in
            // The deletions it drops change nothing anyone sees: kept as silent records.
            var dropped: [(model: String, property: String, register: ReplicaStore.Register)] = []
            if keepSilent {
                for model in state.store.models(in: channel) {
                    for (name, register) in state.store.records(of: ModelAddress(channel: channel, model: model))
                    where register.isDeleted && register.version.timestamp <= horizon
                        && !keeping(ReplicaStore.RecordKey(model: model, property: name))
                    {
                        dropped.append((model, name, register))
                    }
                }
            }
            return (state.store.drop(channel: channel, through: horizon, keeping: keeping), dropped)
        }
        for record in dropped {
            noteSilent([(record.property, record.register)], model: record.model, above: nil, removed: true)
        }
        return changes
    }

    /// Drops the records `keys` names, whatever their versions (a `reset` snapshot's page drops
    /// what it does not say the same); returns the changes for those that had a value, by model.
    package func drop(_ keys: Set<ReplicaStore.RecordKey>) -> [PropertyChange] {
        let keepSilent = keepsSilentRecords.load(ordering: .relaxed)
        let byModel = Dictionary(grouping: keys, by: \.model)
        var changes: [PropertyChange] = []
        for model in byModel.keys.sorted() {
            let names = Set(byModel[model, default: []].map(\.property))
            let address = ModelAddress(channel: channel, model: model)
            let (dropped, silent) = state.withLock { state -> ([PropertyChange], [(String, ReplicaStore.Register)]) in
                let silent =
                    keepSilent
                    ? state.store.records(of: address).filter { names.contains($0.key) && $0.value.isDeleted }
                        .map { ($0.key, $0.value) } : []
                return (
                    state.store.drop(address, through: .max, keeping: { name, _ in !names.contains(name) }).changes,
                    silent
                )
            }
            changes += dropped
            if !silent.isEmpty { noteSilent(silent, model: model, above: nil, removed: true) }
        }
        return changes
    }

    /// Drops the record of the change's property, whatever its version: what a removal no write
    /// made did to the replica that printed it (a `reset` snapshot's, ``WatchSession/resetRemoval(_:)``,
    /// version zero; a collected deletion's, with the horizon as version and no writer), recorded
    /// by a copy that follows printed changes one by one.
    package func recordRemoval(_ change: PropertyChange) {
        removeRecord(of: change.model, property: change.property)
    }

    /// Drops the record of `property` (empty: the model's deletion) of `model`, whatever its
    /// version.
    private func removeRecord(of model: String, property: String) {
        state.withLock { state in
            _ = state.store.drop(
                ModelAddress(channel: channel, model: model), through: .max, keeping: { name, _ in name != property })
        }
    }

    /// Deletes the values that expired by `time` (the node's clock of expiry); returns the changes.
    package func expire(through time: UInt64) -> [PropertyChange] {
        state.withLock { $0.store.expire(through: time) }
    }

    /// From now on, the end of every `reset` snapshot keeps what the replica then holds, until
    /// ``takeResetImage(number:)`` takes it: for a copy of the replica that follows the printed
    /// changes (`statesync watch --state`), which cannot tell from them what a reset dropped
    /// without a change to print (a deletion's record, a model's own deletion) or kept of its own
    /// over the node's older record.
    package func keepResetImages() {
        resetImages.withLock { $0.keep = true }
    }

    /// The end of a `reset` snapshot, or a reset given up (another snapshot began before its end):
    /// counted for the silent records, and what the replica holds kept, if asked to.
    func keepResetImageIfAsked() {
        let number = silentRecords.withLock { silent in
            silent.resets += 1
            return silent.resets
        }
        resetImages.withLock { images in
            guard images.keep else { return }
            // A copy on write: the store is copied once, when the replica next changes.
            images.last = state.withLock {
                ResetImage(store: $0.store, cursor: $0.cursor, above: $0.above, number: number)
            }
        }
    }

    /// What the replica held at the end of its `number`th reset (or when it gave it up); nil if
    /// none was kept or a later reset's replaced it (whose end then gives its own).
    package func takeResetImage(number: Int) -> ResetImage? {
        resetImages.withLock { images in
            guard let image = images.last, image.number == number else { return nil }
            images.last = nil
            return image
        }
    }

    /// Holds exactly what `image` holds (records, cursor, what is held above it).
    package func replace(with image: ResetImage) {
        state.withLock { $0 = (image.store, image.cursor, image.above) }
    }

    /// Sets the cursor to `cursor` (a reset snapshot's: per origin, backwards too).
    package func replaceCursor(with cursor: WatchCursor) {
        state.withLock {
            $0.cursor = cursor
            $0.above = [:]
        }
    }

    /// Moves the cursor to cover `cursor` (per origin, never backwards); what it took above the
    /// cursor and the cursor now covers is no longer held above it.
    package func advance(to cursor: WatchCursor) {
        let moved = state.withLock { state -> WatchCursor in
            cursor.forEachPosition { origin, sequence in
                state.cursor[origin] = max(state.cursor[origin], sequence)
                if !state.above.isEmpty, let above = state.above[origin] {
                    let through = state.cursor[origin]
                    if above.contains(where: { $0 <= through }) {
                        let kept = above.filter { $0 > through }
                        state.above[origin] = kept.isEmpty ? nil : kept
                    }
                }
            }
            return state.cursor
        }
        // What the delta or snapshot before this took in silence is sealed with the cursor after it.
        guard keepsSilentRecords.load(ordering: .relaxed) else { return }
        silentRecords.withLock { silent in
            for index in silent.records.indices.reversed() {
                guard silent.records[index].cursor == nil else { break }
                silent.records[index].cursor = moved
            }
        }
    }
}

/// What a watch reports.
public enum WatchEvent: Sendable {
    /// How a change came to the watch.
    public enum Kind: Sendable, Equatable {
        /// Applied live, in the order the node delivered it.
        case live
        /// Part of the initial state of a new watch (old is `nil`).
        case initial
        /// Part of a resynchronisation (the watch lagged, or resumed past the node's history):
        /// old → new computed from the replica, so chains stay exact across the gap.
        case resync
    }

    /// Why a resynchronisation happens.
    public enum ResyncReason: Sendable, Equatable {
        /// The client fell further behind than the node's retained history.
        case lagged
        /// The resume cursor is older than the node's retained history.
        case historyGone
        /// The node dropped its state and took a peer's (it was forgotten, PROTOCOL.md 7.5):
        /// the snapshot replaces what the replica held, so values it held can go back to older
        /// ones or away.
        case reset
    }

    /// One property changed. `cursor` is the position after the delta that made it.
    case change(PropertyChange, kind: Kind, cursor: WatchCursor)
    /// The snapshot that starts a watch arrived whole (its record count and digest verified).
    case initialStateComplete(records: Int, cursor: WatchCursor)
    /// A snapshot replaces the missed deltas; `change` events of kind `.resync` follow.
    case resyncStarted(ResyncReason)
    /// The resync snapshot arrived whole.
    case resyncComplete(records: Int, cursor: WatchCursor)
    /// The watch holds everything the node has applied. `nodeMissing` is how many deltas the node
    /// itself still lacks (0 = the node is fully synced): "nothing changed" versus "not yet synced".
    case caughtUp(cursor: WatchCursor, latest: Version?, nodeMissing: Int)
}

/// The client side of one watch (docs/PROTOCOL.md section 10.5.8): applies the node's EVENTs to
/// the watch's replica, verifies every snapshot whole, and says what each event means. Shared by
/// `StateSyncClient` and the cluster simulator's watchers.
package struct WatchSession: Sendable {
    package let replica: ChannelReplica
    /// What the watch asked for: a record it holds that the filter excludes is not the node's to
    /// drop.
    package let filter: ClientProtocol.WatchFilter?
    private var snapshotReason: ClientProtocol.SnapshotReason?
    private var digest = RegisterDigest()
    /// The records (model, property) of the snapshot being received.
    private var received: Set<ReplicaStore.RecordKey> = []

    package init(replica: ChannelReplica, filter: ClientProtocol.WatchFilter? = nil) {
        self.replica = replica
        self.filter = filter
    }

    /// Whether a snapshot is being received (its begin came, its end not yet): the replica then
    /// holds part of it, and the watch cannot be resumed from the replica's cursor.
    package var receivingSnapshot: Bool { snapshotReason != nil }

    /// A removal a reset made: no write of the node's made it (the node no longer holds the
    /// value), so it carries no version (``Version/zero``).
    static func resetRemoval(_ change: PropertyChange) -> PropertyChange {
        PropertyChange(
            channel: change.channel, model: change.model, property: change.property, old: change.old, new: change.new,
            version: .zero, kind: change.kind)
    }

    /// Applies one event; returns what it means, in order. Throws when the watch must end (a
    /// snapshot that arrived incomplete).
    package mutating func handle(_ event: ClientProtocol.WatchEventBody, from endpoint: String) throws(StateSyncError)
        -> [WatchEvent]
    {
        switch event {
        case .delta(let delta, let position):
            // What expired before the delta was written is told first, at the cursor before it.
            let before = replica.cursor
            let (expired, changes) = replica.apply(delta)
            replica.advance(to: position)
            let cursor = replica.cursor
            return expired.map { .change($0, kind: .live, cursor: before) }
                + changes.map { .change($0, kind: .live, cursor: cursor) }
        case .snapshotBegin(let reason):
            // A reset given up: what the replica holds now is what it holds, as at a reset's end.
            if snapshotReason == .reset { replica.keepResetImageIfAsked() }
            snapshotReason = reason
            digest = RegisterDigest()
            received = []
            switch reason {
            case .initial: return []
            case .lagged: return [.resyncStarted(.lagged)]
            case .historyGone: return [.resyncStarted(.historyGone)]
            case .reset: return [.resyncStarted(.reset)]
            }
        case .records(let models):
            let kind: WatchEvent.Kind = snapshotReason == .initial ? .initial : .resync
            let cursor = replica.cursor
            var events: [WatchEvent] = []
            if snapshotReason == .reset {
                // What the replica holds of these models that the node's records do not say
                // the same (a newer register, the model's own deletion, a property the node no
                // longer has) goes first: merged, a newer one would keep the node's out. (A
                // model's records that a later page brings are applied again from there.)
                var replaced: Set<ReplicaStore.RecordKey> = []
                for (model, properties) in models {
                    let theirs = Dictionary(properties.map { ($0.0, $0.1) }, uniquingKeysWith: { first, _ in first })
                    for (name, mine) in replica.records(of: model) where theirs[name] != mine {
                        replaced.insert(ReplicaStore.RecordKey(model: model, property: name))
                    }
                }
                if !replaced.isEmpty {
                    events += replica.drop(replaced).map {
                        .change(Self.resetRemoval($0), kind: kind, cursor: cursor)
                    }
                }
            }
            for (model, properties) in models {
                for (name, register) in properties {
                    digest.add(channel: replica.channel, model: model, property: name, register: register)
                    received.insert(ReplicaStore.RecordKey(model: model, property: name))
                    for change in replica.apply(model: model, property: name, register: register) {
                        events.append(.change(change, kind: kind, cursor: cursor))
                    }
                }
            }
            return events
        case .snapshotEnd(let records, let expected, let cursor, let collectedThrough):
            guard digest.count == records, digest.value == expected else {
                throw StateSyncError(
                    .protocolError,
                    "the snapshot from \(endpoint) is incomplete: \(digest.count) of \(records) records, digest mismatch; watch again"
                )
            }
            // What the replica holds at or below the node's horizon of collection that the
            // snapshot lacks was deleted there, and the deletion collected: it goes here too.
            let kind: WatchEvent.Kind = snapshotReason == .initial ? .initial : .resync
            var events: [WatchEvent] = []
            // After a reset, whatever the snapshot lacks is gone from the node (but what the
            // filter keeps from this watch), at any version.
            let reset = snapshotReason == .reset
            if reset || collectedThrough > 0 {
                let filter = self.filter
                let received = self.received
                let dropped = replica.drop(
                    through: reset ? .max : collectedThrough,
                    keeping: { key in
                        received.contains(key) || !(filter?.passes(model: key.model, property: key.property) ?? true)
                    })
                events =
                    reset
                    ? dropped.map { .change(Self.resetRemoval($0), kind: kind, cursor: cursor) }
                    : dropped.map { .change($0, kind: kind, cursor: replica.cursor) }
            }
            if reset { replica.replaceCursor(with: cursor) }
            replica.holdsTheWholeState()
            received = []
            replica.advance(to: cursor)
            if reset { replica.keepResetImageIfAsked() }
            let reason = snapshotReason
            snapshotReason = nil
            return events
                + (reason == .initial
                    ? [.initialStateComplete(records: records, cursor: replica.cursor)]
                    : [.resyncComplete(records: records, cursor: replica.cursor)])
        case .caughtUp(let cursor, let latest, let missing, let expiredThrough):
            replica.advance(to: cursor)
            let position = replica.cursor
            // The node deleted what expired by its clock; the replica does the same, in the same
            // order, after everything before the marker.
            let expired = replica.expire(through: expiredThrough).map {
                WatchEvent.change($0, kind: .live, cursor: position)
            }
            return expired + [.caughtUp(cursor: position, latest: latest, nodeMissing: missing)]
        }
    }
}

extension ChannelReplica {
    /// The replica file's magic (`statesync watch --state FILE`): with what the replica holds
    /// above its cursor. ``legacyFileMagic`` files (written before 2026-11-29) lack it and are
    /// still read.
    static let fileMagic: [UInt8] = Array("SSREPL2\n".utf8)
    static let legacyFileMagic: [UInt8] = Array("SSREPL1\n".utf8)

    /// The replica as bytes: magic, channel, cursor (as a snapshot's progress list), models (as a
    /// snapshot's, deletions included), what it holds above the cursor (count of origins, then
    /// per origin in ascending order of its UTF-8 bytes: origin, count, each sequence number ascending; all
    /// varints but the origin, a string), FNV-1a 64 checksum. ``init(decoding:)`` reads it back
    /// exactly: values keep their types, registers their versions.
    public func encoded() -> [UInt8] {
        state.withLock { state in
            var w = WireWriter(capacity: 4096)
            for b in Self.fileMagic { w.byte(b) }
            w.string(channel)
            StateSnapshot.writeProgress(state.cursor.positions, to: &w)
            let models = state.store.models(in: channel).sorted()
            w.varint(UInt64(models.count))
            for model in models {
                let address = ModelAddress(channel: channel, model: model)
                StateSnapshot.writeModel(address, state.store.records(of: address), to: &w)
            }
            ClientProtocol.writeHeldAbove(state.above, to: &w)
            w.uint64(StateSnapshot.fnv1a(w.bytes))
            return w.bytes
        }
    }

    /// A replica read back from ``encoded()``.
    ///
    /// - Throws: ``WireError`` when `bytes` are not a whole replica file (torn, corrupt, another
    ///   file).
    public convenience init(decoding bytes: [UInt8]) throws(WireError) {
        let legacy = bytes.starts(with: Self.legacyFileMagic)
        guard bytes.count >= Self.fileMagic.count + 8, legacy || bytes.starts(with: Self.fileMagic) else {
            throw .invalid(field: "replica", reason: "not a StateSync watch state file")
        }
        var r = try StateSnapshot.checkedBody(
            bytes, magic: legacy ? Self.legacyFileMagic : Self.fileMagic, what: "replica")
        let channel = try r.string("channel")
        let cursor = WatchCursor(try StateSnapshot.readProgress(&r))
        var store = ReplicaStore()
        for _ in 0..<(try r.count("model count", minimumItemSize: 3)) {
            var failure: WireError?
            try StateSnapshot.readModel(&r) { address, name, register in
                if address.channel != channel {
                    failure = .invalid(field: "replica", reason: "a model of channel '\(address.channel)'")
                }
                store.merge(address, property: name, register: register)
            }
            if let failure { throw failure }
        }
        // As written: origins ascending, each with 1…1,024 numbers, ascending, above the cursor.
        var above: [String: Set<UInt64>] = [:]
        if !legacy {
            var lastOrigin: String?
            for _ in 0..<(try r.count("held-above origin count", minimumItemSize: 2)) {
                let origin = try r.string("held-above origin")
                guard lastOrigin.map({ $0.utf8Precedes(origin) }) ?? true else {
                    throw .invalid(field: "replica", reason: "held above the cursor: origin '\(origin)' out of order")
                }
                lastOrigin = origin
                let count = try r.count("held-above count", minimumItemSize: 1)
                guard count > 0, count <= Self.heldAboveLimit else {
                    throw .invalid(
                        field: "replica", reason: "held above the cursor: \(count) numbers of origin '\(origin)'")
                }
                var held = Set<UInt64>(minimumCapacity: count)
                var last = cursor[origin]
                for _ in 0..<count {
                    let sequence = try r.varint("held-above sequence")
                    guard sequence > last else {
                        throw .invalid(
                            field: "replica",
                            reason:
                                "held above the cursor: \(origin) \(sequence) is not above \(last) (the cursor, or the number before)"
                        )
                    }
                    held.insert(sequence)
                    last = sequence
                }
                above[origin] = held
            }
        }
        try r.expectEnd()
        // Values that expired after the file was written are deleted (and reported) at the first
        // CAUGHT-UP of the resumed watch, which carries the node's clock of expiry.
        self.init(channel: channel, cursor: cursor)
        state.withLock {
            $0.store = store
            $0.above = above
        }
        holdsTheWholeState()
    }
}
