/// The order in which this node applied deltas, as (origin, sequence) references into the
/// history, bounded like it.
struct Journal: Sendable {
    struct Entry: Sendable {
        let delta: Delta
        var origin: String { delta.origin }
        var sequence: UInt64 { delta.sequence }
    }
    /// A ring buffer: dropping the oldest entries does not move the others (it was an array
    /// whose front drops moved every entry left: a memmove of the whole journal every few
    /// appends, ~4 % of a busy reader's I/O thread). Its own, not a `Deque`: `Deque.append`
    /// copies the entry it is given into its storage, and the caller's copy is released, where
    /// this one moves it in (an atomic reference count and a release per delta; issue #17).
    /// `ring.count` is zero or a power of two; the entries are `ring[(head + i) & mask]`.
    private var ring: [Entry?] = []
    /// Each entry's origin (as its number in ``originNames``) and sequence, at the same index as
    /// in `ring`: a walk over entries a watch's cursor covers reads these, 16 octets each in
    /// order, not each delta's storage (a resumed watch at the end of a full journal of 100,000
    /// deltas cost its node 16–19 ms of its I/O thread, about 170 ns an entry, until 2026-12-02).
    private var keys: [Key] = []
    private var head = 0
    /// How many entries are held.
    private(set) var count = 0
    private var mask: Int { ring.count - 1 }

    /// The entries held, oldest first (a copy: tests).
    var entries: [Entry] { (0..<count).map { ring[(head + $0) & mask]! } }
    /// The absolute position of `entries[0]`.
    private(set) var base = 0
    /// An entry's origin and sequence.
    struct Key: Sendable {
        /// The origin's index in ``originNames``.
        var origin: Int32
        var sequence: UInt64
    }
    /// Every origin an entry ever had, numbered in order of first appearance (a handful: the
    /// cluster's members).
    private(set) var originNames: [String] = []
    private var originNumbers: [String: Int32] = [:]
    /// The last origin numbered: appends come in runs of one origin, compared, not hashed.
    private var lastOrigin: (name: String, number: Int32)?

    /// Per origin, the highest sequence number whose entry was dropped, but for the run of
    /// ``pendingOrigin`` being dropped now.
    private var folded: [String: UInt64] = [:]
    /// The origin of the last entries dropped, and the highest of their sequence numbers: folded
    /// into the dictionary when another origin's entry goes (one look-up per run of an origin,
    /// not per entry).
    private var pendingOrigin: String?
    private var pendingThrough: UInt64 = 0

    /// Per origin, the highest sequence number whose entry was dropped (read when a watch falls
    /// behind the journal or resumes from a cursor: rarely).
    var droppedThrough: [String: UInt64] {
        guard let pendingOrigin else { return folded }
        var all = folded
        all[pendingOrigin] = max(all[pendingOrigin] ?? 0, pendingThrough)
        return all
    }

    var end: Int { base + count }

    /// The journal keeps at least this many entries, whatever the history keeps: live watches
    /// follow it (a watch further behind gets a resync snapshot).
    static let minimumEntries = 16

    /// Appends `delta`; past `limit` entries the oldest goes, one per append. The journal keeps
    /// the history's limit per origin, so it usually holds a delta's last reference: dropped in
    /// bursts of an eighth of the limit (until 2026-11-27), tens of thousands of deltas were
    /// freed at once; dropped steadily, one is freed as another comes. (`statesync bench --path
    /// single`, interleaved: 2.7 % less CPU per change, the writer's turn 5 % less.) `consuming`:
    /// the caller's copy is stored, not copied again (see ``OriginHistory/insert(_:limit:)``).
    mutating func append(_ delta: consuming Delta, limit: Int) {
        let limit = max(limit, Self.minimumEntries)
        if count == ring.count { grow() }
        keys[(head + count) & mask] = Key(origin: number(of: delta.origin), sequence: delta.sequence)
        ring[(head + count) & mask] = Entry(delta: delta)
        count += 1
        while count > limit { dropOldest() }
    }

    /// Doubles the ring (at least 16 slots), the entries moved to its front in order.
    private mutating func grow() {
        var larger = [Entry?](repeating: nil, count: max(16, 2 * ring.count))
        var largerKeys = [Key](repeating: Key(origin: 0, sequence: 0), count: larger.count)
        for index in 0..<count {
            larger[index] = ring[(head + index) & mask].take()
            largerKeys[index] = keys[(head + index) & mask]
        }
        ring = larger
        keys = largerKeys
        head = 0
    }

    /// `origin`'s number, given it on first sight.
    private mutating func number(of origin: String) -> Int32 {
        if let last = lastOrigin, last.name == origin { return last.number }
        let number =
            originNumbers[origin]
            ?? {
                let new = Int32(originNames.count)
                originNames.append(origin)
                originNumbers[origin] = new
                return new
            }()
        lastOrigin = (origin, number)
        return number
    }

    /// The number of `origin`, if an entry ever had it.
    func number(ifKnown origin: String) -> Int32? { originNumbers[origin] }

    /// From absolute position `index`, the first entry that `through` does not cover (its
    /// sequence above `through[its origin's number]`; an origin past the array's end is not
    /// covered), or that is `own`'s above `visible`; ``end`` when there is none. Reads only
    /// ``keys``.
    func firstNotCovered(from index: Int, through: [UInt64], own: Int32?, above visible: UInt64) -> Int {
        var position = max(index, base)
        let ownNumber = own ?? -1
        while position < end {
            let key = keys[(head + position - base) & mask]
            if key.origin == ownNumber, key.sequence > visible { return position }
            let origin = Int(key.origin)
            guard origin < through.count, key.sequence <= through[origin] else { return position }
            position += 1
        }
        return end
    }

    private mutating func dropOldest() {
        let dropped = ring[head].take()!
        head = (head + 1) & mask
        count -= 1
        base += 1
        if let origin = pendingOrigin, origin == dropped.origin {
            pendingThrough = max(pendingThrough, dropped.sequence)
            return
        }
        foldPending()
        pendingOrigin = dropped.origin
        pendingThrough = dropped.sequence
    }

    private mutating func foldPending() {
        guard let origin = pendingOrigin else { return }
        folded[origin] = max(folded[origin] ?? 0, pendingThrough)
        pendingOrigin = nil
    }

    /// Marks the deltas of `origin` through `sequence` as not held (they came from a snapshot).
    mutating func markAbsent(origin: String, through sequence: UInt64) {
        folded[origin] = max(folded[origin] ?? 0, sequence)
    }

    /// Drops every entry (the state they led to is gone): a watch that needs one gets a snapshot.
    mutating func dropAll() {
        foldPending()
        for index in 0..<count {
            let entry = ring[(head + index) & mask]!
            folded[entry.origin] = max(folded[entry.origin] ?? 0, entry.sequence)
        }
        base += count
        ring = []
        keys = []
        head = 0
        count = 0
    }

    /// The entry at absolute position `index`, if still held.
    func entry(at index: Int) -> Entry? {
        index >= base && index < end ? ring[(head + index - base) & mask] : nil
    }

    /// The origin number and sequence of the entry at absolute position `index`, if still held.
    func key(at index: Int) -> Key? {
        index >= base && index < end ? keys[(head + index - base) & mask] : nil
    }
}
