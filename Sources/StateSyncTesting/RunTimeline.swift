import Synchronization

/// What happened over a harness or simulator run, for its pictures (`--report run.html`): writes
/// and their acknowledgements over time, each node's lag (deltas it knows of but has not
/// received), the heal and the moment of convergence. Times are milliseconds on the run's clock,
/// the fault schedule's (the harness: since the workload started; the simulator: simulated time).
public struct RunTimeline: Sendable {
    /// Writes attempted and acknowledged in one bin of ``binMilliseconds``.
    public struct WriteBin: Sendable, Equatable {
        public var startMilliseconds: Int
        public var attempted: Int
        public var acknowledged: Int
    }

    /// One reading of a node's `missing_deltas`; `nil`: it did not answer (down, paused, cut).
    public struct LagSample: Sendable, Equatable {
        public var milliseconds: Int
        public var missing: Int?
    }

    public var binMilliseconds: Int
    public var writes: [WriteBin]
    /// Per node, in time order.
    public var lag: [String: [LagSample]]
    /// When every fault was healed (the convergence clock starts).
    public var healedMilliseconds: Int
    /// When every node held the same state with nothing missing (`nil`: never).
    public var convergedMilliseconds: Int?
    public var endMilliseconds: Int
}

/// Collects a ``RunTimeline`` from the writers and the lag sampler, from any thread.
package final class TimelineRecorder: Sendable {
    private struct State {
        var attempted: [Int: Int] = [:]
        var acknowledged: [Int: Int] = [:]
        var lag: [String: [RunTimeline.LagSample]] = [:]
        var counted = (attempted: 0, acknowledged: 0)
    }

    package let binMilliseconds: Int
    private let state = Mutex(State())

    package init(binMilliseconds: Int = 250) {
        self.binMilliseconds = binMilliseconds
    }

    /// Writes counted so far (`attempted`, `acknowledged`, both cumulative) at `milliseconds`:
    /// those since the last count go into that time's bin.
    package func counted(at milliseconds: Int, attempted: Int, acknowledged: Int) {
        let bin = milliseconds / binMilliseconds
        state.withLock { state in
            state.attempted[bin, default: 0] += max(0, attempted - state.counted.attempted)
            state.acknowledged[bin, default: 0] += max(0, acknowledged - state.counted.acknowledged)
            state.counted = (max(attempted, state.counted.attempted), max(acknowledged, state.counted.acknowledged))
        }
    }

    package func write(at milliseconds: Int, acknowledged: Bool) {
        let bin = milliseconds / binMilliseconds
        state.withLock { state in
            state.attempted[bin, default: 0] += 1
            if acknowledged { state.acknowledged[bin, default: 0] += 1 }
        }
    }

    package func lag(of node: String, at milliseconds: Int, missing: Int?) {
        state.withLock { $0.lag[node, default: []].append(.init(milliseconds: milliseconds, missing: missing)) }
    }

    package func timeline(healed: Int, converged: Int?, end: Int) -> RunTimeline {
        state.withLock { state in
            let first = min(
                state.attempted.keys.min() ?? 0,
                (state.lag.values.compactMap(\.first?.milliseconds).min() ?? 0) / binMilliseconds)
            let last = max(state.attempted.keys.max() ?? 0, end / binMilliseconds)
            let bins = (first...max(first, last)).map { bin in
                RunTimeline.WriteBin(
                    startMilliseconds: bin * binMilliseconds, attempted: state.attempted[bin] ?? 0,
                    acknowledged: state.acknowledged[bin] ?? 0)
            }
            return RunTimeline(
                binMilliseconds: binMilliseconds, writes: bins,
                lag: state.lag.mapValues { $0.sorted { $0.milliseconds < $1.milliseconds } },
                healedMilliseconds: healed, convergedMilliseconds: converged, endMilliseconds: end)
        }
    }
}
