import DequeModule

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
    /// appends, ~4 % of a busy reader's I/O thread).
    private(set) var entries = Deque<Entry>()
    /// The absolute position of `entries[0]`.
    private(set) var base = 0
    /// Per origin, the highest sequence number whose entry was dropped.
    private(set) var droppedThrough: [String: UInt64] = [:]

    var end: Int { base + entries.count }

    /// The journal keeps at least this many entries, whatever the history keeps: live watches
    /// follow it (a watch further behind gets a resync snapshot).
    static let minimumEntries = 16

    mutating func append(_ delta: Delta, limit: Int) {
        let limit = max(limit, Self.minimumEntries)
        entries.append(Entry(delta: delta))
        if entries.count > limit &+ limit / 8 {
            let drop = entries.count - limit
            // Runs of one origin are common: one dictionary update per run, not per entry.
            var origin = entries[0].origin
            var through: UInt64 = 0
            for entry in entries.prefix(drop) {
                if entry.origin != origin {
                    droppedThrough[origin] = max(droppedThrough[origin] ?? 0, through)
                    origin = entry.origin
                    through = 0
                }
                through = max(through, entry.sequence)
            }
            droppedThrough[origin] = max(droppedThrough[origin] ?? 0, through)
            entries.removeFirst(drop)
            base += drop
        }
    }

    /// Marks the deltas of `origin` through `sequence` as not held (they came from a snapshot).
    mutating func markAbsent(origin: String, through sequence: UInt64) {
        droppedThrough[origin] = max(droppedThrough[origin] ?? 0, sequence)
    }

    /// Drops every entry (the state they led to is gone): a watch that needs one gets a snapshot.
    mutating func dropAll() {
        for entry in entries { droppedThrough[entry.origin] = max(droppedThrough[entry.origin] ?? 0, entry.sequence) }
        base += entries.count
        entries = []
    }

    /// The entry at absolute position `index`, if still held.
    func entry(at index: Int) -> Entry? {
        index >= base && index < end ? entries[index - base] : nil
    }
}
