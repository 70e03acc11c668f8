import Testing

@testable import StateSyncHarness

/// Which node a harness fault hits: never a late joiner that has not started (a kill would start
/// it early and its join would never happen; a new user's trial saw `kill n3` at 269 ms, then
/// `join n3` as a restart), and not the node no fault may restart, for kill and leave.
@Suite("Harness fault targets")
struct FaultTargetTests {
    @Test func aFaultHitsOnlyRunningNodesAndAvoidsTheOneNeverRestarted() {
        for drawn in 0..<UInt64(200) {
            let beforeTheJoin = FaultController.target(drawn: drawn, among: [0, 1], avoiding: nil)
            #expect([0, 1].contains(beforeTheJoin), "drawn \(drawn)")
            #expect(FaultController.target(drawn: drawn, among: [0, 1, 2], avoiding: 1) != 1, "drawn \(drawn)")
            #expect(FaultController.target(drawn: drawn, among: [0, 1, 2], avoiding: nil) == Int(drawn % 3))
        }
        #expect(FaultController.target(drawn: 5, among: [2], avoiding: 2) == 2, "the only one left")
        let all = Set((0..<UInt64(30)).map { FaultController.target(drawn: $0, among: [0, 2], avoiding: nil) })
        #expect(all == [0, 2], "every running node is drawn")
    }
}
