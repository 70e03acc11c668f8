import Foundation
import StateSync
import Synchronization

/// `statesync watch --state FILE`: what the watch has printed, kept in a file, so that a watch
/// started again with the same file resumes after the last line printed and prints exact old
/// values (the first change of each property included).
///
/// The file holds a replica of exactly what was printed: a change's register is recorded as its
/// line is printed; the cursor moves past a delta only once the next delta (or a marker) shows
/// that every line of the delta was printed. A watch resumed from the file is sent that delta
/// again, and the replica skips the properties already printed. A change of a delta the node sent
/// above a gap is recorded with the delta's number, which the file keeps as held above its cursor
/// until the cursor covers it, and a resumed watch names (PROTOCOL.md 10.5.8); what a delta or a
/// snapshot changed without a line (the deletion of a property or a model the watch never saw with
/// a value) is recorded once the cursor covers it, so that a resumed watch takes an older write that
/// lost to it as the live one did, without a line; a `reset` snapshot
/// replaces the file's cursor as it does the watch's. The file is replaced atomically
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
        /// The deletion of a model whose changes are being printed: recorded with the cursor, once
        /// every property it deleted was printed.
        var pendingModelDeletion: (model: String, version: Version)?
        /// A `reset` snapshot is being printed: its end replaces the cursor (backwards too), as it
        /// does the client's replica's; moved only forwards, the file's cursor would skip what
        /// the node no longer holds and sends again later.
        var resetting = false
        var lastSave = ContinuousClock.now
        /// Printed since the last save.
        var dirty = false
    }

    private let printed: Mutex<Printed>

    /// The replica the client's watch applies its events to (empty when there is no file yet; else
    /// a copy of the printed one, read from the same bytes): the client's I/O thread updates it,
    /// the printed one moves only as lines are printed. At a `reset` snapshot's end the printed
    /// one takes what this one held then (see ``ChannelReplica/keepResetImages()``).
    package let liveReplica: ChannelReplica

    /// Opens `path` (a new file if it does not exist) for `channel`.
    package init(path: String, channel: String) throws {
        self.path = path
        self.channel = channel
        let bytes = try Self.read(path)
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
            case .change(let change, _, let cursor):
                if let pending = state.pending, pending != cursor { commit(&state, through: pending) }
                // A reset's removal carries no version (it undoes what the node no longer
                // holds, whatever its version): recorded as a write, it would lose to the value.
                if state.resetting, change.isRemoval, change.version == .zero {
                    state.replica.recordResetRemoval(change)
                } else {
                    state.replica.record(change)
                }
                if change.byModelDeletion { state.pendingModelDeletion = (change.model, change.version) }
                state.pending = cursor
                state.dirty = true
                if ContinuousClock.now - state.lastSave >= .milliseconds(200) { save(&state) }
            case .initialStateComplete(_, let cursor), .resyncComplete(_, let cursor), .caughtUp(let cursor, _, _):
                if state.pending != nil || cursor != state.replica.cursor { state.dirty = true }
                commit(&state, through: cursor)
                if state.resetting, case .resyncComplete = event {
                    // Every line of the reset is printed: the printed copy holds what the live
                    // one held at its end, including what the reset changed with no line to
                    // print (a deletion's record dropped, or one of its own the watch held over
                    // the node's older record). Without that image (a later reset replaced it,
                    // and brings its own), the cursor at least is the node's.
                    if let image = liveReplica.takeResetImage(at: cursor) {
                        state.replica.replace(with: image)
                        liveReplica.dropSilentRecords(through: image.silentSerial)
                    } else {
                        state.replica.replaceCursor(with: cursor)
                        // A later reset's image, which will replace this copy, holds them.
                        liveReplica.dropSilentRecords(through: liveReplica.silentSerialAtLastReset)
                    }
                    state.resetting = false
                }
                state.pending = nil
                // Markers come about once a second: an idle watch does not rewrite its file.
                if state.dirty { save(&state) }
            case .resyncStarted(let reason):
                if reason == .reset { state.resetting = true }
            }
        }
    }

    /// Every line of the delta before `cursor` was printed: the replica moves past it, with what
    /// the deltas and snapshots it covers changed without a line (``ChannelReplica/SilentRecord``).
    private func commit(_ state: inout Printed, through cursor: WatchCursor) {
        if let deletion = state.pendingModelDeletion {
            state.replica.recordModelDeletion(of: deletion.model, at: deletion.version)
            state.pendingModelDeletion = nil
        }
        for record in liveReplica.takeSilentRecords(coveredBy: cursor) {
            _ = state.replica.apply(model: record.model, property: record.property, register: record.register)
        }
        state.replica.advance(to: cursor)
    }

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
        state.lastSave = .now
        state.dirty = false
        do {
            try Data(state.replica.encoded()).write(to: URL(fileURLWithPath: path), options: .atomic)
        } catch {
            FileHandle.standardError.write(Data("statesync: --state \(path): cannot save: \(error)\n".utf8))
        }
    }
}
