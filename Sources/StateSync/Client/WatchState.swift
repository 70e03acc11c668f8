import Foundation
import Synchronization

/// `statesync watch --state FILE`: what the watch has printed, kept in a file, so that a watch
/// started again with the same file resumes after the last line printed and prints exact old
/// values (the first change of each property included).
///
/// The file holds a replica of exactly what was printed: a change's register is recorded as its
/// line is printed; the cursor moves past a delta only once the next delta (or a marker) shows
/// that every line of the delta was printed. A watch resumed from the file is sent that delta
/// again, and the replica skips the properties already printed. What a delta or a snapshot
/// changed without a line (the deletion of a property or a model the watch never saw with a
/// value, a deletion a snapshot dropped) is recorded when the cursor moves past it (the commit
/// after its delta's lines, ``ChannelReplica/SilentRecord``), so that a resumed watch takes an older write that
/// lost to it as the live one did, without a line. A delta the node sent above a gap does not
/// move the cursor: once every line of it is printed, the file keeps its number as held above the
/// cursor until the cursor covers it, and a resumed watch names it (PROTOCOL.md 10.5.8), so the
/// file holds all of a delta it names or none. An expiry printed expires the value recorded (a
/// resumed watch does not print it again). A `reset` snapshot replaces the file's cursor as it
/// does the watch's, and its end (or the start of a snapshot that replaces it before its end)
/// replaces the copy with what the watch then held. The file is replaced atomically
/// (a new file renamed over it) at most every 200 ms while changes arrive, at the next marker
/// after a change (markers come about once a second), and on SIGINT or SIGTERM; after a crash
/// (kill -9) the lines printed since the last save (up to about a second) can print again, none
/// is skipped.
package final class WatchState: Sendable {
    package let path: String
    package let channel: String
    private struct Printed {
        var replica: ChannelReplica
        /// The cursor after the last change printed, not yet in the replica (its delta may have
        /// more properties to print).
        var pending: WatchCursor?
        /// A `reset` snapshot is being printed: its end replaces the cursor (backwards too), as it
        /// does the client's replica's; moved only forwards, the file's cursor would skip what
        /// the node no longer holds and sends again later.
        var resetting = false
        /// How many `reset` snapshots were printed to their end (``ChannelReplica/SilentRecord``).
        var resets = 0
        /// The numbers of the deltas the node sent above a gap whose lines are being printed: the
        /// copy holds them above its cursor at the commit, when every line of them is printed (a
        /// file that names one does not get it again, so it must hold all of it).
        var heldOnCommit: [(origin: String, sequence: UInt64)] = []
        /// When it was last saved (``milliseconds``).
        var lastSave: UInt64 = 0
        /// Printed since the last save.
        var dirty = false
    }

    private let printed: Mutex<Printed>

    /// The replica the client's watch applies its events to (empty when there is no file yet; else
    /// a copy of the printed one, read from the same bytes): the client's I/O thread updates it,
    /// the printed one moves only as lines are printed. At a `reset` snapshot's end the printed
    /// one takes what this one held then (see ``ChannelReplica/keepResetImages()``).
    package let liveReplica: ChannelReplica

    /// The clock the 200 ms between saves is measured with, in milliseconds.
    private let milliseconds: @Sendable () -> UInt64
    /// Writes the printed copy's bytes where they are kept, replacing what was there.
    private let write: @Sendable ([UInt8]) throws -> Void

    /// Opens `path` (a new file if it does not exist) for `channel`.
    package convenience init(path: String, channel: String) throws {
        try self.init(
            path: path, channel: channel, saved: try Self.read(path),
            milliseconds: { [opened = ContinuousClock.now] in
                let elapsed = opened.duration(to: .now).components
                return UInt64(elapsed.seconds) * 1000 + UInt64(elapsed.attoseconds / 1_000_000_000_000_000)
            },
            write: { try Data($0).write(to: URL(fileURLWithPath: path), options: .atomic) })
    }

    /// A watch state kept by `write` (the cluster simulator keeps it in memory), starting from
    /// `saved` (what `write` was last given; nil: nothing yet), with `milliseconds` for its clock.
    package init(
        path: String, channel: String, saved bytes: [UInt8]?, milliseconds: @escaping @Sendable () -> UInt64,
        write: @escaping @Sendable ([UInt8]) throws -> Void
    ) throws {
        self.path = path
        self.channel = channel
        self.milliseconds = milliseconds
        self.write = write
        printed = Mutex(
            Printed(replica: try bytes.map { try Self.decode($0, path, channel) } ?? ChannelReplica(channel: channel)))
        liveReplica = try bytes.map { try Self.decode($0, path, channel) } ?? ChannelReplica(channel: channel)
        liveReplica.keepResetImages()
        liveReplica.keepSilentRecords()
    }

    private static func read(_ path: String) throws -> [UInt8]? {
        guard let data = FileManager.default.contents(atPath: path) else {
            if FileManager.default.fileExists(atPath: path) {
                throw StateSyncError(.invalidConfiguration, "--state \(path): cannot read the file")
            }
            return nil
        }
        return Array(data)
    }

    private static func decode(_ bytes: [UInt8], _ path: String, _ channel: String) throws -> ChannelReplica {
        let replica: ChannelReplica
        do {
            replica = try ChannelReplica(decoding: bytes)
        } catch {
            throw StateSyncError(.invalidConfiguration, "--state \(path): \(error) (remove it to start afresh)")
        }
        guard replica.channel == channel else {
            throw StateSyncError(
                .invalidConfiguration, "--state \(path) holds a watch of channel '\(replica.channel)', not '\(channel)'"
            )
        }
        return replica
    }

    /// Prints with `print`, then records what it printed. Printing is outside the lock (a
    /// blocked stdout never holds up a signal's save); a line printed but not yet recorded when
    /// the process ends prints again next time, none is skipped.
    package func printing(_ event: WatchEvent, _ print: () -> Void) {
        print()
        printed.withLock { state in
            switch event {
            case .change(let change, let kind, let cursor):
                if let pending = state.pending, pending != cursor { commit(&state, through: pending) }
                // A reset's removal carries no version (it undoes what the node no longer
                // holds, whatever its version), a collected deletion's the horizon, no writer's:
                // recorded as a write, either could lose to the value. A reset's page line
                // replaces what the copy holds, as the watch dropped what it held first.
                if change.isRemoval, change.version.node.isEmpty {
                    state.replica.recordRemoval(change)
                } else if state.resetting, kind == .resync {
                    state.replica.recordReplacing(change)
                } else {
                    state.replica.record(change)
                }
                // Its delta's number is held above the cursor once all of its lines are printed.
                if let above = change.takenAbove { state.heldOnCommit.append(above) }
                state.pending = cursor
                state.dirty = true
                if milliseconds() &- state.lastSave >= 200 { save(&state) }
            case .initialStateComplete(_, let cursor), .resyncComplete(_, let cursor), .caughtUp(let cursor, _, _):
                if state.pending != nil || cursor != state.replica.cursor { state.dirty = true }
                commit(&state, through: cursor)
                if state.resetting, case .resyncComplete = event { endReset(&state, cursor: cursor) }
                state.pending = nil
                // Markers come about once a second: an idle watch does not rewrite its file.
                if state.dirty { save(&state) }
            case .resyncStarted(let reason):
                // Every line before the snapshot is printed.
                if let pending = state.pending {
                    commit(&state, through: pending)
                    state.pending = nil
                }
                // A snapshot begun replaces one the node had not ended (PROTOCOL.md 10.5.8): a
                // reset given up ends here.
                if state.resetting { endReset(&state, cursor: nil) }
                state.resetting = reason == .reset
            }
        }
    }

    /// Every line of a `reset` snapshot is printed (it ended at `cursor`, or was given up): the
    /// printed copy holds what the live one held then, including what the reset changed with no
    /// line to print (a deletion's record dropped, or one of its own the watch held over the
    /// node's older record). Without that image (a later reset replaced it, and brings its own),
    /// the cursor at least is the node's.
    private func endReset(_ state: inout Printed, cursor: WatchCursor?) {
        if let image = liveReplica.takeResetImage(number: state.resets + 1) {
            state.replica.replace(with: image)
            state.heldOnCommit = []
        } else if let cursor {
            state.replica.replaceCursor(with: cursor)
        }
        state.resetting = false
        state.resets += 1
    }

    /// Every line of the delta before `cursor` was printed: the replica moves past it, with what
    /// the deltas and snapshots it covers changed without a line (``ChannelReplica/SilentRecord``).
    private func commit(_ state: inout Printed, through cursor: WatchCursor) {
        for record in liveReplica.takeSilentRecords(coveredBy: cursor, resets: state.resets) {
            state.replica.record(record)
            if let above = record.above { state.heldOnCommit.append(above) }
        }
        for (origin, sequence) in state.heldOnCommit { state.replica.holdAbove(sequence, of: origin) }
        state.heldOnCommit = []
        state.replica.advance(to: cursor)
    }

    /// The copy of what was printed (for tests: the file holds it once saved).
    package var printedReplica: ChannelReplica { printed.withLock { $0.replica } }

    /// Saves what was printed (the end of the watch).
    package func saveNow() {
        printed.withLock { save(&$0) }
    }

    /// Saves what was printed and ends the process at once, holding the lock (nothing is
    /// recorded after the save): SIGINT and SIGTERM. `_exit`, not `exit`: the client's I/O thread
    /// and libzmq are still running, and their teardown must not race the process's end.
    package func saveAndExit() -> Never {
        printed.withLock { state -> Never in
            save(&state)
            _exit(0)
        }
    }

    private func save(_ state: inout Printed) {
        state.lastSave = milliseconds()
        state.dirty = false
        do {
            try write(state.replica.encoded())
        } catch {
            FileHandle.standardError.write(Data("statesync: --state \(path): cannot save: \(error)\n".utf8))
        }
    }
}
