import CAllocationCounter
import Foundation
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit

/// A steady-state pass of the loop allocates nothing (BENCHMARKS.md, allocations). Counted by interposing malloc
/// in the test binary (Tests/CAllocationCounter); skipped under the sanitizers, which own malloc.
@Suite(.enabled(if: alloc_counter_available())) struct AllocationTests {
    /// A Source0 that re-signals itself, with an all-activities observer: 10,000 passes after a
    /// warm-up, counted on the loop thread.
    @Test func sourcePassesAllocateNothing() {
        let allocations = TestThreads.runBlocking(timeout: .seconds(10), stackSize: 1 << 20) { () -> Int in
            let loop = RunLoop.current
            let passes = Mutex(0)
            let counted = Mutex(-1)
            let sourceBox = Mutex<RunLoopSource?>(nil)
            let source = RunLoopSource {
                let pass = passes.locked { value -> Int in
                    value += 1
                    return value
                }
                if pass == 1_000 { alloc_counter_start() }
                if pass == 11_000 {
                    let allocations = alloc_counter_stop()
                    counted.locked { $0 = allocations }
                    RunLoop.current.stop()
                    return
                }
                sourceBox.locked { $0?.signal() }
            }
            sourceBox.locked { $0 = source }
            let observer = RunLoopObserver(activities: .allActivities) { _, _ in }
            loop.add(source, forMode: .default)
            loop.add(observer, forMode: .default)
            source.signal()
            loop.run(mode: .default, for: .seconds(30))
            source.invalidate()
            return counted.locked { $0 }
        }
        #expect(allocations == 0)
    }

    /// A 200 µs repeating timer: 100 fires after a warm-up, each a real sleep in epoll_wait and a
    /// timerfd re-arm, counted on the loop thread.
    @Test func timerPassesAllocateNothing() {
        let allocations = TestThreads.runBlocking(timeout: .seconds(10), stackSize: 1 << 20) { () -> Int in
            let loop = RunLoop.current
            let fires = Mutex(0)
            let counted = Mutex(-1)
            let timer = RunLoopTimer(after: .microseconds(200), repeating: .microseconds(200)) { timer in
                let fire = fires.locked { value -> Int in
                    value += 1
                    return value
                }
                if fire == 50 { alloc_counter_start() }
                if fire == 150 {
                    let allocations = alloc_counter_stop()
                    counted.locked { $0 = allocations }
                    timer.invalidate()
                }
            }
            let observer = RunLoopObserver(activities: .allActivities) { _, _ in }
            loop.add(timer, forMode: .default)
            loop.add(observer, forMode: .default)
            loop.run(mode: .default, for: .seconds(30))
            return counted.locked { $0 }
        }
        #expect(allocations == 0)
    }

    /// A port delivering batches of 8 messages, each batch sent by the handler of the last one:
    /// 1,000 batches after a warm-up, counted on the loop thread. Taking a batch exchanges the
    /// port's queue for the emptied storage of the batch before, so nothing is allocated.
    @Test func portBatchesAllocateNothing() {
        let allocations = TestThreads.runBlocking(timeout: .seconds(10), stackSize: 1 << 20) { () -> Int in
            let loop = RunLoop.current
            let delivered = Mutex(0)
            let counted = Mutex(-1)
            let portBox = Mutex<MessagePort<Int>?>(nil)
            let port = MessagePort<Int> { _ in
                let count = delivered.locked { value -> Int in
                    value += 1
                    return value
                }
                guard count % 8 == 0 else { return }
                let batch = count / 8
                if batch == 100 { alloc_counter_start() }
                if batch == 1_100 {
                    let allocations = alloc_counter_stop()
                    counted.locked { $0 = allocations }
                    RunLoop.current.stop()
                    return
                }
                guard let port = portBox.locked({ $0 }) else { return }
                for message in 0..<8 { try? port.send(message) }
            }
            portBox.locked { $0 = port }
            loop.add(port, forMode: .default)
            for message in 0..<8 { try? port.send(message) }
            loop.run(mode: .default, for: .seconds(30))
            port.invalidate()
            portBox.locked { $0 = nil }
            return counted.locked { $0 }
        }
        #expect(allocations == 0)
    }
}
