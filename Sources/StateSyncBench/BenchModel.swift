import StateSync

/// The model the node benchmarks replicate: one counter, one timestamp, eight fields for
/// transactions, and an end marker.
@Replicated
final class BenchModel {
    var value = 0
    var stamp: UInt64 = 0
    var f0 = 0
    var f1 = 0
    var f2 = 0
    var f3 = 0
    var f4 = 0
    var f5 = 0
    var f6 = 0
    var f7 = 0
    var done = 0
}

extension BenchModel {
    /// The benches' 8-property transaction: `f0` to `f7` set to `value`, one version, one delta.
    func writeAllFields(_ value: Int) {
        transaction { m in
            m.f0 = value
            m.f1 = value
            m.f2 = value
            m.f3 = value
            m.f4 = value
            m.f5 = value
            m.f6 = value
            m.f7 = value
        }
    }
}
