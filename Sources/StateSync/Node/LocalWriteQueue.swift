import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Where the live models of one node leave their writes for its driver: the outbox, the
/// timestamps stamped for writes not handed over yet, and the bound on how far writers may run
/// ahead of the driver.
///
/// Its own object, held strongly by the node and by every model attached to it: a model's write
/// reaches it without loading a weak reference to the node (three per write, with their retains
/// and releases, were a tenth of a writer thread's samples). A node that stops detaches its
/// models (their writes no longer reach it), and once the node begins to stop no writer waits
/// for room: the driver takes what is queued once more, and no more. Once the node is gone the
/// queue is closed: writes made after that stamp from the clock and go nowhere, as they did when
/// the weak reference came back empty.
///
/// Thread safety: every method may be called from any thread. A model calls ``stamp()``,
/// ``enqueue(_:)``, ``stampAndEnqueue(_:floor:write:emitter:)`` and ``release(_:)`` with its
/// lock held (they only take the queue's lock and wake the driver); ``pace()`` with no lock of
/// that model held.
final class LocalWriteQueue: Sendable {
    let clock: HybridLogicalClock
    private let outbox = Mutex<Outbox>(Outbox())
    /// How many rounds the outbox holds (written under its lock; read without it by writers).
    private let queuedRounds = Atomic<Int>(0)
    /// The most rounds of local writes (``NodeMachine/localWritesPerRound`` each) the outbox
    /// holds before a writing thread waits for the driver to take them (``pace()``).
    private let queuedRoundsLimit = Atomic<Int>(StateSyncNode.defaultQueuedRoundsLimit)
    /// How many times a writing thread waited for room in the outbox.
    private let writerWaits = Atomic<Int>(0)
    /// The driver to wake when a write is queued, once attached.
    private let driver = Mutex<(any NodeDriver)?>(nil)
    /// Takes writes until the node is gone (a model may outlive it).
    private let open = Atomic<Bool>(true)
    /// Writers may wait for room until the node begins to stop.
    private let writersMayWait = Atomic<Bool>(true)

    init(clock: HybridLogicalClock) {
        self.clock = clock
    }

    /// The driver that takes the writes (and is woken for them). It is woken now: writes queued
    /// before it was attached woke no one, and the writes after them wake it only once it has
    /// taken those (see ``wakeDriver()``).
    func attach(driver: any NodeDriver) {
        self.driver.withLock {
            $0 = driver
            $0?.wake()
        }
    }

    /// The node is gone: writes are no longer taken, and no writer waits.
    func close() {
        writersMayWait.store(false, ordering: .releasing)
        open.store(false, ordering: .releasing)
    }

    /// The node begins to stop: no writer waits for room from now on (its driver takes what is
    /// queued once more, then stops taking).
    func stopPacing() {
        writersMayWait.store(false, ordering: .releasing)
    }

    var isOpen: Bool { open.load(ordering: .acquiring) }

    /// A version for a local write, held as in flight until ``enqueue(_:)`` or ``release(_:)``.
    func stamp() -> Version {
        guard isOpen else { return clock.next() }
        return outbox.withLock { pending in
            let version = clock.next()
            pending.stamped.append(version.timestamp)
            return version
        }
    }

    /// Queues a local write for the driver and wakes it (if the outbox was empty).
    func enqueue(_ write: LocalWrite) {
        guard isOpen else { return }
        let wasEmpty = outbox.withLock { pending in
            let wasEmpty = pending.isEmpty
            Self.release(write.version, from: &pending.stamped)
            pending.append(write)
            queuedRounds.store(pending.rounds.count, ordering: .relaxed)
            return wasEmpty
        }
        if wasEmpty { wakeDriver() }
    }

    /// Wakes the driver, if attached: in place, under its lock. Copied out, the driver (an
    /// existential) was an outlined copy of its box and its release per local write, some 6 % of
    /// a writing thread's samples in the two-process bench (issue #17). A wake-up is an atomic
    /// exchange, and a one-byte write only when the driver has taken the last one.
    ///
    /// Called only by the write that found the outbox empty: the writes queued after it, until
    /// the driver takes the outbox, are taken with it. That write wakes the driver after queueing
    /// (so the driver, woken, takes it), and the driver takes the whole outbox at once, so a
    /// write that found another before it is taken no later than that one. Every write woke the
    /// driver before: its lock, the copy of the existential and an atomic exchange per set, an
    /// eighth of a writing thread's samples in the two-process bench (issue #17).
    private func wakeDriver() {
        driver.withLock { $0?.wake() }
    }

    /// ``stamp()`` and ``enqueue(_:)`` under one lock, for a write whose values are encoded
    /// already: a version above `floor` (`nil`, and nothing queued, when the clock cannot pass
    /// it), with the write at that version queued. The version is never in flight: the outbox
    /// holds the write from the moment it has one. Once the queue is closed (the node is gone)
    /// the version comes from the clock and nothing is queued, as ``stamp()`` and
    /// ``enqueue(_:)`` do then. Called with the model's lock held.
    func stampAndEnqueue(_ address: ModelAddress, floor: Version?, write: PropertyWrite, emitter: UInt64)
        -> Version?
    {
        guard isOpen else {
            let version = clock.next()
            if let floor, floor >= version { return nil }
            return version
        }
        let (version, wasEmpty) = outbox.withLock { pending -> (Version?, Bool) in
            let version = clock.next()
            if let floor, floor >= version { return (nil, false) }
            let wasEmpty = pending.isEmpty
            pending.append(address: address, version: version, property: write, emitter: emitter)
            queuedRounds.store(pending.rounds.count, ordering: .relaxed)
            return (version, wasEmpty)
        }
        if wasEmpty { wakeDriver() }
        return version
    }

    /// A stamped version makes no write after all.
    func release(_ version: Version) {
        outbox.withLock { Self.release(version, from: &$0.stamped) }
    }

    /// Every round waiting, in order, and the highest timestamp below every write not in them
    /// (stamped and in flight, or not stamped yet): the outbox is empty after.
    func take() -> (rounds: [LocalWriteRound], writeFloor: UInt64) {
        // Under the outbox lock, where models stamp: every write stamped so far is in this batch,
        // still in flight, or above the clock's last timestamp read here.
        outbox.withLock { pending in
            let inFlight = pending.stamped.min().map { $0 &- 1 } ?? .max
            queuedRounds.store(0, ordering: .relaxed)
            return (pending.take(), min(clock.lastTimestamp, inFlight))
        }
    }

    /// Called by a thread that made a local write, holding no lock of that model: while the
    /// outbox holds more than its limit of rounds, waits (sleeping 50 µs, doubling up to 1 ms)
    /// for the driver to take them. Writes are never refused or dropped, only held back; not on
    /// the driver's own thread (which takes them), not while the thread holds another model's
    /// lock (a write inside a transaction on another model: the I/O thread may be waiting for
    /// that lock to apply a peer's write), nor once the node begins to stop.
    func pace() {
        let limit = queuedRoundsLimit.load(ordering: .relaxed)
        guard queuedRounds.load(ordering: .relaxed) > limit, HeldModelLocks.count == 0 else { return }
        guard let driver = driver.withLock({ $0 }), driver.mayWaitForOutbox() else { return }
        writerWaits.add(1, ordering: .relaxed)
        var pause: UInt32 = 50
        while queuedRounds.load(ordering: .relaxed) > limit, writersMayWait.load(ordering: .acquiring) {
            usleep(pause)
            pause = min(pause * 2, 1_000)
        }
    }

    /// Whether the outbox holds more rounds than its limit now (a writer then calls ``pace()``).
    var isOverLimit: Bool {
        queuedRounds.load(ordering: .relaxed) > queuedRoundsLimit.load(ordering: .relaxed)
    }

    /// Rounds of local writes waiting for the driver now.
    var queuedLocalWriteRounds: Int { queuedRounds.load(ordering: .relaxed) }
    /// How many times a writing thread waited for room in the outbox.
    var writerWaitCount: Int { writerWaits.load(ordering: .relaxed) }
    /// Sets how many rounds the outbox holds before writers wait.
    func setQueuedRoundsLimit(_ rounds: Int) { queuedRoundsLimit.store(rounds, ordering: .relaxed) }

    /// A stamped version is no longer in flight. (At most one per writing thread is: a short
    /// array, searched from its end, where the write just stamped is; no hashing per write.)
    private static func release(_ version: Version, from stamped: inout [UInt64]) {
        guard let index = stamped.lastIndex(of: version.timestamp) else { return }
        stamped.remove(at: index)
    }
}

/// Live models' local writes on their way to the node's driver, in rounds of at most
/// ``NodeMachine/localWritesPerRound``: a long queue grows by a round at a time, each allocated
/// at that capacity once (the first of a take sized by the last take that held writes: small
/// for the usual few, a busy writer's whole turn at once), never copying what it holds (one
/// growing array moved everything at each doubling and faulted in fresh pages), and the driver
/// hands each round to the machine as it is.
struct Outbox: Sendable {
    private(set) var rounds: [LocalWriteRound] = []
    /// The timestamps stamped for writes not handed over yet (at most one per writing thread).
    var stamped: [UInt64] = []

    /// How many writes the last ``take()`` that held any held: the next first round starts with
    /// room for as many, and at least 64 (a busy writer's round started at 64 and grew one
    /// doubling at a time, five allocations and copies per turn, the last of 80 KB). The driver
    /// takes at every input, so empty takes leave it as it is.
    private var lastTaken = 0

    /// Whether no write waits (the driver took the last).
    var isEmpty: Bool { rounds.isEmpty }

    mutating func append(_ write: LocalWrite) {
        makeRoom()
        rounds[rounds.count - 1].append(write)
    }

    /// Appends a write of one property (a model's set): into the round's array of properties.
    mutating func append(address: ModelAddress, version: Version, property: PropertyWrite, emitter: UInt64) {
        makeRoom()
        rounds[rounds.count - 1].append(address: address, version: version, property: property, emitter: emitter)
    }

    /// Starts a round when there is none or the last is full.
    private mutating func makeRoom() {
        guard rounds.isEmpty || rounds[rounds.count - 1].count == NodeMachine.localWritesPerRound else { return }
        rounds.append(
            LocalWriteRound(
                capacity: rounds.isEmpty
                    ? min(max(64, lastTaken), NodeMachine.localWritesPerRound) : NodeMachine.localWritesPerRound))
    }

    /// Every round waiting, in order; the outbox is empty after.
    mutating func take() -> [LocalWriteRound] {
        guard !rounds.isEmpty else { return [] }
        lastTaken = (rounds.count - 1) * NodeMachine.localWritesPerRound + rounds[rounds.count - 1].count
        defer { rounds = [] }
        return rounds
    }
}
