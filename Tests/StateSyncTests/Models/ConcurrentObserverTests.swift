import Foundation
import Synchronization
import Testing

@testable import StateSync

/// Many threads writing one model at once: observers still see one unbroken chain.
@Suite("Concurrent writers", .serialized)  // 8 busy threads at a time is enough for 2 cores
struct ConcurrentObserverTests {
    static let threads = 8
    static let perThread = 10_000

    /// Runs `work(thread)` on `threads` real threads at once and waits for all of them without
    /// blocking a thread of the test's concurrency pool (on 2 cores that pool has 2 threads: a
    /// blocking wait there stalls every other test, and their deadlines pass unwatched).
    static func onThreads(_ threads: Int, _ work: @escaping @Sendable (Int) -> Void) async {
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            let group = DispatchGroup()
            for thread in 0..<threads {
                group.enter()
                Thread {
                    work(thread)
                    group.leave()
                }.start()
            }
            group.notify(queue: .global()) { done.resume() }
        }
    }

    @Test func plainSetsFromEightThreadsFormOneChain() async {
        let counter = Counter()
        let seen = Mutex<[(old: Int, new: Int)]>([])
        counter.observe(\.count) { change in seen.withLock { $0.append((change.old, change.new)) } }
        await Self.onThreads(Self.threads) { thread in
            for i in 1...Self.perThread {
                counter.count = thread * Self.perThread + i  // distinct values across all threads
            }
        }
        let chain = seen.withLock { $0 }
        #expect(chain.count == Self.threads * Self.perThread)
        #expect(chain.first?.old == 0)
        var broken = 0
        for index in chain.indices.dropFirst() where chain[index].old != chain[index - 1].new { broken += 1 }
        #expect(broken == 0, "each old must equal the previous new")
        #expect(Set(chain.map(\.new)).count == chain.count, "no duplicates")
        #expect(chain.last?.new == counter.count)
    }

    @Test func transactionsFromEightThreadsCountToEightyThousand() async {
        let counter = Counter()
        let seen = Mutex<[(old: Int, new: Int)]>([])
        counter.observe(\.count) { change in seen.withLock { $0.append((change.old, change.new)) } }
        await Self.onThreads(Self.threads) { _ in
            for _ in 0..<Self.perThread { counter.transaction { $0.count += 1 } }
        }
        let total = Self.threads * Self.perThread
        #expect(counter.count == total)
        let chain = seen.withLock { $0 }
        #expect(chain.count == total)
        #expect(chain.map(\.new) == Array(1...total))
        #expect(chain.map(\.old) == Array(0..<total))
    }
}
