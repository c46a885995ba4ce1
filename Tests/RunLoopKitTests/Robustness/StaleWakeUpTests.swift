import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

// A waker that sees the loop's `sleeping` flag just as the loop takes its request without
// sleeping writes the eventfd after that pass is under way. The write is late: its request was
// handled. The next sleep must not end on it (a spurious pass, seen as an extra
// beforeWaiting/afterWaiting pair under AddressSanitizer's slower timing), and a real request
// must still end the sleep.

@Suite(.serialized, .exclusive(.robustness)) struct StaleWakeUp {
    @Test func aLateEventfdWriteDoesNotEndTheSleep() {
        final class Shared: Sendable {
            let afterWaiting = Atomic<Int>(0)
            let result = TestMonitor<RunLoop.RunResult?>(nil)
        }
        let shared = Shared()
        guard
            let host = TestThread.hostingLoop(
                name: "rlk-stale-wake",
                setup: { loop in
                    loop.add(RunLoopSource {}, forMode: .default)
                    let observer = RunLoopObserver(activities: .afterWaiting) { _, _ in
                        shared.afterWaiting.add(1, ordering: .relaxed)
                    }
                    loop.add(observer, forMode: .default)
                },
                run: { loop in
                    let result = loop.run(mode: .default, for: .milliseconds(400))
                    shared.result.update { $0 = result }
                })
        else { return }
        let loop = host.loop
        #expect(waitUntil { loop.isWaiting })
        // The late write, with no request pending: what the racing waker leaves behind.
        loop.backend?.signal()
        // The loop sleeps on to its timeout: one sleep, one afterWaiting, `timedOut`.
        #expect(shared.result.wait(timeout: .seconds(10)) { $0 != nil })
        #expect(shared.result.read { $0 } == .timedOut)
        #expect(shared.afterWaiting.load(ordering: .relaxed) == 1)
        #expect(host.join(timeout: .seconds(10)))
    }

    @Test func aRequestAfterALateWriteStillWakesTheLoop() {
        final class Shared: Sendable {
            let ran = TestMonitor<Bool>(false)
        }
        let shared = Shared()
        guard
            let host = TestThread.hostingLoop(
                name: "rlk-stale-then-real",
                setup: { loop in loop.add(RunLoopSource {}, forMode: .default) },
                run: { loop in _ = loop.run(mode: .default, for: .seconds(30)) })
        else { return }
        let loop = host.loop
        #expect(waitUntil { loop.isWaiting })
        loop.backend?.signal()
        // Bounded well below the run's 30 s: the block runs only if its request woke the loop.
        loop.perform {
            shared.ran.update { $0 = true }
            RunLoop.current.stop()
        }
        #expect(shared.ran.wait(timeout: .seconds(10)))
        #expect(host.join(timeout: .seconds(10)))
    }
}
