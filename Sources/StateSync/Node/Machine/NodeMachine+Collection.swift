/// The collection of deletions (docs/PROTOCOL.md 8.4): a tombstone, an expired value or the
/// deletion of a model is kept while a delta it must beat could still reach some member, and
/// forgotten once none can.
///
/// Every node says in its HEARTBEATs a **floor**: no delta it publishes from then on has a
/// timestamp at or below it. A floor is *stable* once every member reports holding every delta of
/// its sender up to the latest sequence the sender had published when it said it. The stable
/// time is the least stable floor over the members — every member but the forgotten, every peer
/// this node links to, every origin it knows of. Every delta with a timestamp at or below it is
/// held by every member, and none will be published any more: a deletion at or below it has
/// nothing left to beat. (A member that joins later follows the floors it hears before it
/// writes: its writes are above every deletion collected before it joined.)
extension NodeMachine {
    /// What one member's HEARTBEATs said, as far as collection needs.
    struct MemberReport: Sendable {
        /// Per origin, through which sequence number the member has every delta (for itself:
        /// what it has published).
        var progress: [String: UInt64] = [:]
        /// Its floors not yet known stable, oldest first, each with the latest sequence number
        /// it had published when it said it.
        var floors: [(latest: UInt64, floor: UInt64)] = []
        /// The newest of its floors known stable.
        var stable: UInt64?

        /// Records a floor said with `latest` published (a queue of bounded length: two old
        /// entries merge into one that asks for the later sequence number and promises the
        /// earlier floor, which is never more than the truth).
        mutating func add(floor: UInt64, latest: UInt64) {
            if let last = floors.last, last.latest >= latest {
                floors[floors.count - 1].floor = max(last.floor, floor)
                return
            }
            floors.append((latest, floor))
            if floors.count > NodeMachine.floorsPerMember {
                floors[1] = (floors[1].latest, floors[0].floor)
                floors.removeFirst()
            }
        }
    }

    /// The collection's state: the members' reports, and who holds collection back.
    struct CollectionState: Sendable {
        var reports: [String: MemberReport] = [:]
        /// The member (or unheard peer endpoint) whose floor is least, or that has not reported.
        var heldBy: String?
        /// The stable time last computed.
        var stableThrough: UInt64?
    }

    static let floorsPerMember = 64

    /// This node's floor: the clock's last timestamp, below every own write not yet published —
    /// staged here, held while settling, or stamped by a live model and not yet taken
    /// (``hostWriteFloor``).
    var ownFloor: UInt64 {
        var floor = min(clock.lastTimestamp, hostWriteFloor)
        if let oldest = durability.staged.lazy.map(\.version.timestamp).min() { floor = min(floor, oldest &- 1) }
        if let held = settling?.heldFloor, held != .max { floor = min(floor, held &- 1) }
        return floor
    }

    /// A HEARTBEAT of `node` said `floor` with `latest` published and `progress`. Its floor
    /// counts only when it carried the sender's member list (`withMembers`), which this node
    /// merges: so every member the sender knew when it said its floor is known here too, and
    /// holds collection back until it has a stable floor of its own — a member that joined through
    /// the sender is never missed.
    mutating func noteReport(
        of node: String, floor: UInt64, latest: UInt64, progress: [String: UInt64], withMembers: Bool
    ) {
        collection.reports[node, default: MemberReport()].progress = progress
        if withMembers { collection.reports[node, default: MemberReport()].add(floor: floor, latest: latest) }
    }

    /// Collects the deletions at or below the stable time (at every HEARTBEAT this node sends,
    /// after recording its own floor).
    mutating func collectDeletions(ownFloor floor: UInt64) {
        collection.reports[configuration.nodeID, default: MemberReport()].add(floor: floor, latest: published)
        guard let stable = faults.collectEarly ? floor : stableTime() else { return }
        collection.stableThrough = stable
        // And old enough: a writer the cluster does not know yet must have reached it by then.
        let grace = UInt64(max(configuration.tombstoneGraceMilliseconds, 0))
        let wall = clock.wallMilliseconds()
        let old = wall > grace ? (wall - grace) << 16 : 0
        let limit = faults.collectEarly ? stable : min(stable, old)
        let collected = store.collect(through: limit)
        counters.tombstonesCollected += collected
    }

    /// The stable time, or `nil` while a member has no stable floor (it never reported one, or
    /// some member lacks its deltas): then ``CollectionState/heldBy`` names it.
    mutating func stableTime() -> UInt64? {
        let forgotten = Set(membership.members.values.filter { $0.state == .forgotten }.map(\.id))
        var members = Set(membership.members.keys).subtracting(forgotten)
        members.insert(configuration.nodeID)
        for endpoint in peerEndpoints {
            guard let id = linkedID(of: endpoint) else {
                collection.heldBy = endpoint
                return nil
            }
            members.insert(id)
        }
        // Every origin whose deltas exist counts too, member entry or not (its entry may not
        // have reached this node): this node's own, and those its peers report.
        members.formUnion(Set(origins.keys).subtracting(forgotten))
        for report in collection.reports.values {
            members.formUnion(Set(report.progress.keys).subtracting(forgotten))
        }
        func mark(_ member: String, of origin: String) -> UInt64 {
            guard member == configuration.nodeID else { return collection.reports[member]?.progress[origin] ?? 0 }
            let contiguous = origins[origin]?.contiguous ?? 0
            return origin == configuration.nodeID ? min(contiguous, published) : contiguous
        }
        // Per member, its stable floor, and who lacks its next one: the member that has not
        // received all its deltas yet (a member that is away, usually).
        var least: (member: String, floor: UInt64, lacking: String?)?
        for member in members.sorted() {
            guard var report = collection.reports[member] else {
                collection.heldBy = member
                return nil
            }
            var lacking: String?
            while let first = report.floors.first {
                lacking = members.sorted().first { mark($0, of: member) < first.latest }
                guard lacking == nil else { break }
                report.stable = max(report.stable ?? 0, first.floor)
                report.floors.removeFirst()
            }
            collection.reports[member] = report
            guard let stable = report.stable else {
                collection.heldBy = lacking ?? member
                return nil
            }
            if least.map({ stable < $0.floor }) ?? true { least = (member, stable, lacking) }
        }
        collection.heldBy = least.map { $0.lacking ?? $0.member }
        return least?.floor
    }
}
