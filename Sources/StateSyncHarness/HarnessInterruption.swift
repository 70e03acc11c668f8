import Foundation
import Synchronization

/// What a harness run leaves if its process is stopped before the run ends: its nodes, its link
/// relays, its network namespaces (`--netns`) and its work directory. `statesync harness` undoes
/// it on SIGINT and SIGTERM (``undoRunsInProgress()``) before it exits, as a finished run is
/// undone. (A SIGKILL leaves the directory and the namespaces; the nodes stop by themselves once
/// their end of the harness's pipe on their standard input closes.)
public enum HarnessInterruption {
    private static let undo = Mutex<[UInt64: @Sendable () -> Void]>([:])
    private static let lastID = Atomic<UInt64>(0)

    /// Keeps `action` to undo a run in progress; returns its id for ``unregister(_:)``.
    static func register(_ action: @escaping @Sendable () -> Void) -> UInt64 {
        let id = lastID.add(1, ordering: .relaxed).newValue
        undo.withLock { $0[id] = action }
        return id
    }

    /// The run ended (it undoes itself).
    static func unregister(_ id: UInt64) {
        _ = undo.withLock { $0.removeValue(forKey: id) }
    }

    /// Stops the nodes and relays of every run in progress, removes its namespaces and (unless
    /// it is to be kept) its work directory; returns once done.
    public static func undoRunsInProgress() {
        let actions = undo.withLock { actions in
            defer { actions = [:] }
            return Array(actions.values)
        }
        for action in actions { action() }
    }
}
