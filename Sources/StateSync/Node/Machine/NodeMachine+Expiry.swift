/// Values written with a time to live (docs/PROTOCOL.md 8.3): every replica deletes them once its
/// wall clock passes their expiry, which each computes alike from the write's version, so the
/// deletion needs no delta of its own and happens once, at one version, everywhere.
extension NodeMachine {
    /// Deletes the values that expired by the wall clock, tells their live models, and makes
    /// their channels' watches due a CAUGHT-UP, which carries the clock of expiry to the clients.
    mutating func expireValues() {
        if faults.neverExpire { return }
        let expired = store.expireDue(through: clock.wallMilliseconds())
        guard !expired.isEmpty else { return }
        counters.valuesExpired += expired.count
        noteExpiries(in: Set(expired.map(\.change.channel)))
        guard !attachedModels.isEmpty else { return }
        var deliveries: [ModelDelivery] = []
        for (change, written) in expired {
            let address = ModelAddress(channel: change.channel, model: change.model)
            guard attachedModels[address] != nil else { continue }
            let set = ModelRegistrar.RemoteWriteSet(
                writes: [.deletion(of: change.property)], version: written,
                isRemote: written.node != configuration.nodeID,
                expiredAt: change.version)
            if deliveries.last?.address == address {
                deliveries[deliveries.count - 1].sets.append(set)
            } else {
                deliveries.append(ModelDelivery(address: address, sets: [set]))
            }
        }
        if !deliveries.isEmpty { actions.append(.deliver(deliveries)) }
    }
}
