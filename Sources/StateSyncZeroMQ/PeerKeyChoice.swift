/// Which of a peer's trusted public keys this node expects when it dials the peer (as a CURVE
/// client, the dialler must name the server's key).
///
/// A peer has two trusted keys while it rotates its key pair, and which one it runs with is not
/// known in advance: it may not have restarted with the new one yet. The node dials with one key;
/// a link that never got a message before the node gave up on it (``linkFailed(node:)``) is dialled
/// next time with the peer's next key, round the list. A key that worked stays chosen across
/// reloads as long as it stays trusted.
struct PeerKeyChoice: Sendable, Equatable {
    /// Every peer's trusted keys, in configuration order.
    private(set) var keys: [String: [[UInt8]]]
    private var chosen: [String: Int] = [:]

    init(keys: [String: [[UInt8]]]) {
        self.keys = keys
    }

    /// The key to dial `node` with; empty when no key of it is trusted (the handshake then fails
    /// rather than trusting anyone).
    func key(for node: String) -> [UInt8] {
        guard let candidates = keys[node], !candidates.isEmpty else { return [] }
        return candidates[(chosen[node] ?? 0) % candidates.count]
    }

    /// A link to `node` was given up before it delivered anything: the next dial tries its next
    /// key. Returns whether the key changed.
    @discardableResult
    mutating func linkFailed(node: String) -> Bool {
        guard let count = keys[node]?.count, count > 1 else { return false }
        chosen[node] = ((chosen[node] ?? 0) + 1) % count
        return true
    }

    /// Takes a reloaded set of trusted keys. Returns the peers whose dialled key changed (their
    /// links must be made again): the chosen key was removed, or the peer lost every key.
    mutating func reload(_ newKeys: [String: [[UInt8]]]) -> Set<String> {
        var changed: Set<String> = []
        var newChosen: [String: Int] = [:]
        for node in Set(keys.keys).union(newKeys.keys) {
            let current = key(for: node)
            let candidates = newKeys[node] ?? []
            if let index = candidates.firstIndex(of: current) {
                newChosen[node] = index
            } else {
                changed.insert(node)
            }
        }
        keys = newKeys
        chosen = newChosen
        return changed
    }
}
