/// One page of a streamed SNAPSHOT (docs/PROTOCOL.md 10.9): the models after a cursor, in
/// (channel, model) order, up to a size the requester chose — so a state of any size moves in
/// bounded messages, and a transfer broken off resumes at its cursor.
///
/// The first page (no cursor) also carries the progress the whole transfer covers, taken when
/// it was served: every register a page holds was read at or after that moment, so once every
/// page is merged, the requester holds at least what the progress says (registers only grow
/// under last-writer-wins).
///
/// Asked for so, a page also carries the server's horizon of collection when it was read
/// (`SSPAGE2`): a register the requester holds at or below it that the page's range lacks was
/// deleted there, and the deletion collected.
package struct SnapshotPage: Sendable {
    /// The server's latest sequence when it served the first page (0 on later pages).
    package var latestSequence: UInt64
    /// Per origin, through which sequence number the transfer includes its deltas (first page
    /// only; empty on later pages).
    package var progress: [String: UInt64]
    /// The page's models, in (channel, model) order, with all their registers in ascending name
    /// order, each name once.
    package var models: [(ModelAddress, [(name: String, register: ReplicaStore.Register)])]
    /// The cursor of the next page (the last model of this one), or `nil` on the last page.
    package var next: ModelAddress?
    /// The server's horizon of collection when it read this page (docs/PROTOCOL.md 8.4; 0: it
    /// had collected nothing, or recovers its own deltas), or `nil` from a server that did not
    /// say (an `SSPAGE1` page).
    package var collectedThrough: UInt64?

    package init(
        latestSequence: UInt64, progress: [String: UInt64],
        models: [(ModelAddress, [(name: String, register: ReplicaStore.Register)])], next: ModelAddress?,
        collectedThrough: UInt64? = nil
    ) {
        self.latestSequence = latestSequence
        self.progress = progress
        self.models = models
        self.next = next
        self.collectedThrough = collectedThrough
    }

    /// A page's magic (a whole snapshot's is `SSNAP3`, Appendix A); `SSPAGE2` adds the horizon
    /// of collection after the progress, and is sent only to a requester that asked for it.
    static let magic: [UInt8] = Array("SSPAGE1\n".utf8)
    static let horizonMagic: [UInt8] = Array("SSPAGE2\n".utf8)

    /// The request's flag asking for `SSPAGE2` pages.
    static let wantsHorizon: UInt8 = 1

    /// The order of pages: channel, then model, as octets.
    package static func precedes(_ a: ModelAddress, _ b: ModelAddress) -> Bool {
        if !a.channel.hasSameUTF8(as: b.channel) { return a.channel.utf8Precedes(b.channel) }
        return a.model.utf8Precedes(b.model)
    }

    /// Whether `bytes` is a page (rather than a whole snapshot from a node that does not page).
    package static func isPage(_ bytes: [UInt8]) -> Bool {
        bytes.starts(with: magic) || bytes.starts(with: horizonMagic)
    }

    // MARK: - The request

    /// A paged SNAPSHOT request's body: `01`, then has-cursor (`00` or `01` and the cursor's
    /// channel and model), then the largest page wanted, in octets, then flags (appended: a
    /// server that predates them ignores them and sends `SSPAGE1` pages). (An empty body asks
    /// for the whole snapshot in one reply.)
    package static func encodeRequest(
        after cursor: ModelAddress?, maximumOctets: Int, withHorizon: Bool = true
    ) -> [UInt8] {
        var writer = WireWriter()
        writer.byte(1)
        writeCursor(cursor, to: &writer)
        writer.varint(UInt64(maximumOctets))
        if withHorizon { writer.byte(wantsHorizon) }
        return writer.bytes
    }

    /// The cursor, page size and whether pages are to carry the horizon (`SSPAGE2`), of a paged
    /// request; `nil` for an empty body (the whole snapshot).
    package static func decodeRequest(_ body: [UInt8]) throws(WireError) -> (
        after: ModelAddress?, maximumOctets: Int, withHorizon: Bool
    )? {
        guard !body.isEmpty else { return nil }
        var reader = WireReader(body)
        guard try reader.byte("paging") == 1 else {
            throw .invalid(field: "paging", reason: "expected 01 (a paged request) or an empty body")
        }
        let cursor = try readCursor(&reader, field: "has cursor")
        let octets = try reader.varint("maximum octets")
        // Flags it does not know are ignored, as trailing octets (section 13).
        let flags = reader.isAtEnd ? 0 : try reader.byte("flags")
        return (cursor, Int(clamping: octets), flags & wantsHorizon != 0)
    }

    // MARK: - The page

    /// Encodes a page, taking models from `source` (in page order, after the cursor) until the
    /// page holds at least `maximumOctets` octets of models (always at least one model); with a
    /// horizon, as `SSPAGE2`. Returns the page and its `next` cursor (`nil`: the last page).
    package static func encode(
        latestSequence: UInt64, progress: [String: UInt64], collectedThrough: UInt64? = nil, maximumOctets: Int,
        models source: some Sequence<(ModelAddress, [String: ReplicaStore.Register])>
    ) -> (bytes: [UInt8], next: ModelAddress?) {
        var header = WireWriter(capacity: 64)
        for byte in collectedThrough == nil ? magic : horizonMagic { header.byte(byte) }
        header.varint(latestSequence)
        StateSnapshot.writeProgress(progress, to: &header)
        if let collectedThrough { header.uint64(collectedThrough) }
        var body = WireWriter(capacity: min(maximumOctets, 1 << 20) + 1024)
        var count = 0
        var last: ModelAddress?
        var iterator = source.makeIterator()
        var more = false
        while let (address, registers) = iterator.next() {
            if count > 0 && body.bytes.count >= maximumOctets {
                more = true
                break
            }
            StateSnapshot.writeModel(address, registers, to: &body)
            count += 1
            last = address
        }
        var page = header
        page.varint(UInt64(count))
        page.bytes(body.bytes)
        let next = more ? last : nil
        writeCursor(next, to: &page)
        page.uint64(ReplicaStore.fnv1a(page.bytes))
        return (page.bytes, next)
    }

    /// Decodes a page; a damaged one (checksum, truncation) throws.
    package static func decode(_ bytes: [UInt8]) throws(WireError) -> SnapshotPage {
        var reader = try Reader(bytes)
        let models = try reader.models(registers: .max)
        return SnapshotPage(
            latestSequence: reader.latestSequence, progress: reader.progress, models: models, next: try reader.next(),
            collectedThrough: reader.collectedThrough)
    }

    /// A page read a few models at a time (a page is up to megabytes, its models are parsed as
    /// they are merged): the checksum and the header are checked when it is made, the models
    /// read by ``models(registers:)`` (whole), or register by register with ``nextModel()`` and
    /// ``nextRegister()``, then the cursor by ``next()``.
    package struct Reader: Sendable {
        package let latestSequence: UInt64
        package let progress: [String: UInt64]
        package let collectedThrough: UInt64?
        package let modelCount: Int
        package private(set) var modelsRead = 0
        /// The registers of the model begun by ``nextModel()`` not read yet.
        package private(set) var registersLeft = 0
        /// The writer of the register read last, within the current model.
        private var writer: String?
        /// Positioned at the next model, or at the current model's next register.
        private var reader: WireReader

        package init(_ bytes: [UInt8]) throws(WireError) {
            guard isPage(bytes) else { throw .invalid(field: "snapshot page", reason: "not a snapshot page") }
            let withHorizon = bytes.starts(with: horizonMagic)
            reader = try StateSnapshot.checkedBody(
                bytes, magic: withHorizon ? horizonMagic : magic, what: "snapshot page")
            latestSequence = try reader.varint("latest sequence")
            progress = try StateSnapshot.readProgress(&reader)
            collectedThrough = withHorizon ? try reader.uint64("collected through") : nil
            modelCount = try reader.count("model count", minimumItemSize: 3)
        }

        /// Whether every model was read, with all its registers.
        package var isAtModelsEnd: Bool { modelsRead == modelCount && registersLeft == 0 }

        /// Begins the next model (the one before read whole, and one left): its address and how
        /// many registers follow, each read by ``nextRegister()``, as they come (a server writes
        /// them in ascending name order, each name once; a reader must not rely on it).
        package mutating func nextModel() throws(WireError) -> (address: ModelAddress, registers: Int) {
            precondition(registersLeft == 0 && modelsRead < modelCount, "no model to begin")
            let (address, count) = try StateSnapshot.readModelHeader(&reader)
            modelsRead += 1
            registersLeft = count
            writer = nil
            return (address, count)
        }

        /// The next register of the model begun by ``nextModel()`` (one left).
        @inline(__always)
        package mutating func nextRegister() throws(WireError) -> (name: String, register: ReplicaStore.Register) {
            precondition(registersLeft > 0, "no register left in the model")
            registersLeft -= 1
            return try StateSnapshot.readRegister(&reader, writer: &writer)
        }

        /// The next models, whole, until they hold at least `budget` registers (at least one
        /// model while any is left), each model's registers in ascending name order, each name
        /// once.
        package mutating func models(registers budget: Int) throws(WireError) -> [(
            ModelAddress, [(name: String, register: ReplicaStore.Register)]
        )] {
            var models: [(ModelAddress, [(name: String, register: ReplicaStore.Register)])] = []
            var taken = 0
            while !isAtModelsEnd, taken < budget || models.isEmpty {
                let (address, _) = try nextModel()
                let registers = try registersInNameOrder()
                taken += registers.count
                models.append((address, registers))
            }
            return models
        }

        /// The registers left of the model begun by ``nextModel()``, in ascending name order, each
        /// name once: as they come when a server wrote them so; anything else is put in that
        /// order, of a name given twice the register that wins (the newer version; of two equal,
        /// the first), as merging each in turn would.
        package mutating func registersInNameOrder() throws(WireError) -> [(
            name: String, register: ReplicaStore.Register
        )] {
            var registers: [(name: String, register: ReplicaStore.Register)] = []
            registers.reserveCapacity(registersLeft)
            var ordered = true
            while registersLeft > 0 {
                let (name, register) = try nextRegister()
                // (The last name read in place: `registers.last` would copy its register.)
                if ordered, !registers.isEmpty, !(registers[registers.count - 1].name < name) { ordered = false }
                registers.append((name, register))
            }
            if !ordered {
                var byName: [String: ReplicaStore.Register] = [:]
                for (name, register) in registers where byName[name].map({ register.version > $0.version }) ?? true {
                    byName[name] = register
                }
                registers = byName.sorted { $0.key < $1.key }.map { (name: $0.key, register: $0.value) }
            }
            return registers
        }

        /// The cursor of the next page (`nil`: the last page), once every model was read; the
        /// page must end there.
        package mutating func next() throws(WireError) -> ModelAddress? {
            guard isAtModelsEnd else { throw .invalid(field: "snapshot page", reason: "models left unread") }
            let next = try readCursor(&reader, field: "more")
            try reader.expectEnd()
            return next
        }
    }

    /// A cursor: `00`, or `01` and the model's channel and model.
    private static func writeCursor(_ cursor: ModelAddress?, to writer: inout WireWriter) {
        guard let cursor else {
            writer.byte(0)
            return
        }
        writer.byte(1)
        writer.string(cursor.channel)
        writer.string(cursor.model)
    }

    private static func readCursor(_ reader: inout WireReader, field: String) throws(WireError) -> ModelAddress? {
        switch try reader.byte(field) {
        case 0: return nil
        case 1:
            return ModelAddress(channel: try reader.string("cursor channel"), model: try reader.string("cursor model"))
        case let other: throw .invalid(field: field, reason: "expected 00 or 01, got \(other)")
        }
    }
}
