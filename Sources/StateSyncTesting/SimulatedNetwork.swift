/// A network where nothing moves until it is told: messages between named endpoints wait in a
/// queue with the time each is due, and the owner takes them out (``deliverDue(at:)``,
/// ``deliverNext()``) when it decides time has come.
///
/// Every directed link has conditions drawn by the owner — a delay range, and the chances that a
/// message is lost, duplicated, or held back long enough to be overtaken — and links can be cut
/// (a partition). Like a TCP connection, a link keeps its messages in order despite the jitter of
/// its delay; only a message chosen to be held back arrives out of order.
/// A cut link drops what is sent on it and what was in flight on it when it arrives. Randomness comes only from the ``SeededRandom`` given at creation.
///
/// Not thread-safe: a simulation runs on one thread.
public final class SimulatedNetwork<Payload> {
    /// How one directed link treats the messages sent on it.
    public struct LinkConditions: Sendable, Equatable {
        /// The delay of every message, in milliseconds (drawn uniformly).
        public var delay: ClosedRange<UInt64>
        /// The chance a message is lost.
        public var loss: Double
        /// The chance a message arrives twice.
        public var duplicate: Double
        /// The chance a message is held back by up to ``reorderDelay`` more, so that later ones
        /// overtake it.
        public var reorder: Double
        /// The most a held-back message is delayed further, in milliseconds.
        public var reorderDelay: UInt64

        /// Conditions with these delays and chances.
        public init(
            delay: ClosedRange<UInt64> = 1...1, loss: Double = 0, duplicate: Double = 0, reorder: Double = 0,
            reorderDelay: UInt64 = 50
        ) {
            self.delay = delay
            self.loss = loss
            self.duplicate = duplicate
            self.reorder = reorder
            self.reorderDelay = reorderDelay
        }

        /// In order, on time, nothing lost: a TCP connection while it holds.
        public static func reliable(delay: UInt64 = 1) -> LinkConditions { LinkConditions(delay: delay...delay) }
    }

    /// A message on its way.
    public struct Message {
        /// The sender.
        public let from: String
        /// The receiver.
        public let to: String
        /// What it carries.
        public let payload: Payload
        /// When it was sent and when it is due.
        public let sentAt: UInt64
        /// When it is due.
        public let dueAt: UInt64
    }

    private var random: SeededRandom
    private var queue = EventQueue<Message>()
    private var conditions: [Link: LinkConditions] = [:]
    private var cut: Set<Link> = []
    /// Per link, when its latest in-order message is due: the next one is not due earlier.
    private var lastDue: [Link: UInt64] = [:]
    /// Used for links without conditions of their own.
    public var defaultConditions: LinkConditions
    /// Messages dropped (lost, or on a cut link), duplicated, and delivered.
    public private(set) var dropped = 0
    /// Messages sent twice.
    public private(set) var duplicated = 0
    /// Messages delivered.
    public private(set) var delivered = 0

    private struct Link: Hashable {
        let from: String
        let to: String
    }

    /// A network drawing its randomness from `random`, with `defaultConditions` on every link.
    public init(random: SeededRandom, defaultConditions: LinkConditions = .reliable()) {
        self.random = random
        self.defaultConditions = defaultConditions
    }

    /// Sets the conditions of the link `from` → `to`; `nil` returns it to the default.
    public func setConditions(_ link: LinkConditions?, from: String, to: String) {
        conditions[Link(from: from, to: to)] = link
    }

    /// The conditions of the link `from` → `to`.
    public func conditions(from: String, to: String) -> LinkConditions {
        conditions[Link(from: from, to: to)] ?? defaultConditions
    }

    /// Cuts (or restores) the link `from` → `to`.
    public func setCut(_ isCut: Bool, from: String, to: String) {
        if isCut { cut.insert(Link(from: from, to: to)) } else { cut.remove(Link(from: from, to: to)) }
    }

    /// Whether the link `from` → `to` is cut.
    public func isCut(from: String, to: String) -> Bool { cut.contains(Link(from: from, to: to)) }

    /// Restores every cut link.
    public func healAll() { cut = [] }

    /// Sends `payload` at `now`: it is queued with a due time drawn from the link's conditions
    /// (or dropped, or queued twice).
    public func send(_ payload: Payload, from: String, to: String, at now: UInt64) {
        if !cut.isEmpty, cut.contains(Link(from: from, to: to)) {
            dropped += 1
            return
        }
        let conditions =
            self.conditions.isEmpty ? defaultConditions : self.conditions[Link(from: from, to: to)] ?? defaultConditions
        if random.chance(conditions.loss) {
            dropped += 1
            return
        }
        let copies = random.chance(conditions.duplicate) ? 2 : 1
        if copies == 2 { duplicated += 1 }
        for _ in 0..<copies {
            let span = conditions.delay.upperBound - conditions.delay.lowerBound
            var due = now + conditions.delay.lowerBound + (span == 0 ? 0 : random.next() % (span + 1))
            if random.chance(conditions.reorder) {
                due += random.next() % (conditions.reorderDelay + 1)  // held back: later ones overtake it
            } else if span > 0 {
                let link = Link(from: from, to: to)
                due = max(due, lastDue[link] ?? 0)
                lastDue[link] = due
            }
            queue.schedule(Message(from: from, to: to, payload: payload, sentAt: now, dueAt: due), at: due)
        }
    }

    /// When the next message is due, if any is on its way.
    public var nextDueTime: UInt64? { queue.nextTime }

    /// How many messages are on their way.
    public var inFlight: Int { queue.count }

    /// Takes the next message out, whatever its due time; `nil` when none is on its way. A
    /// message on a link cut since it was sent is dropped (and the next one taken).
    public func deliverNext() -> Message? {
        take(notAfter: .max)
    }

    /// Takes out every message due at or before `time`, in due order.
    public func deliverDue(at time: UInt64) -> [Message] {
        var due: [Message] = []
        while let message = take(notAfter: time) { due.append(message) }
        return due
    }

    private func take(notAfter time: UInt64) -> Message? {
        while let next = queue.nextTime, next <= time, let (_, message) = queue.pop() {
            if !cut.isEmpty, cut.contains(Link(from: message.from, to: message.to)) {
                dropped += 1
                continue
            }
            delivered += 1
            return message
        }
        return nil
    }
}
