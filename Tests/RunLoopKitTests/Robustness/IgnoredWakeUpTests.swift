import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

// A thread that empties a running loop's mode and then calls wakeUp() so that the run ends
// (TCPEchoServer.stop does this) can lose the race with the loop: if it removes the last item
// just after the pass's "is the mode empty?" check, and its wakeUp() lands before the next pass
// begins, the wakeUp is ignored (CoreFoundation ignores wakeups from the end of a sleep until the
// next pass) and the pass, which looks at every source but not at emptiness, would sleep with an
// empty mode: `run()` never returns. Seen once in about 20 runs of the suite, in
// EchoServerTests. A pass that began by dropping an ignored wakeup looks at emptiness before it
// sleeps.
//
// The test places the two halves where the race does, in order: the wakeUp() in the ignore
// window (from another thread, during an afterWaiting callout), the removal in the next pass
// before its sleep (another thread again, during a beforeTimers callout).

@Suite(.serialized, .exclusive(.robustness)) struct IgnoredWakeUp {
    @Test func anIgnoredWakeUpStillEndsARunWhoseModeWasEmptied() {
        final class Shared: Sendable {
            let source = RunLoopSource {}
            let afterWaiting = Atomic<Int>(0)
            let beforeTimers = Atomic<Int>(0)
            let result = TestMonitor<RunLoop.RunResult?>(nil)
        }
        let shared = Shared()
        guard
            let host = TestThread.hostingLoop(
                name: "rlk-ignored-wake",
                setup: { loop in
                    loop.add(shared.source, forMode: .default)
                    let ignoreWindow = RunLoopObserver(activities: .afterWaiting) { _, _ in
                        guard shared.afterWaiting.add(1, ordering: .relaxed).newValue == 1 else { return }
                        let waker = TestThread(name: "rlk-ignored-waker") { loop.wakeUp() }
                        _ = waker.join(timeout: .seconds(10))
                    }
                    let nextPass = RunLoopObserver(activities: .beforeTimers) { _, _ in
                        // The second pass: the one that begins after the ignored wakeUp.
                        guard shared.afterWaiting.load(ordering: .relaxed) == 1,
                            shared.beforeTimers.add(1, ordering: .relaxed).newValue == 1
                        else { return }
                        let remover = TestThread(name: "rlk-ignored-remover") {
                            loop.remove(shared.source, forMode: .default)
                        }
                        _ = remover.join(timeout: .seconds(10))
                    }
                    loop.add(ignoreWindow, forMode: .default)
                    loop.add(nextPass, forMode: .default)
                },
                run: { loop in
                    let result = loop.run(mode: .default, for: .seconds(30))
                    shared.result.update { $0 = result }
                })
        else { return }
        let loop = host.loop
        // The first sleep ends with a wakeUp that is heard.
        #expect(waitUntil { loop.isWaiting })
        loop.wakeUp()
        // Bounded well below the run's 30 s: a loop that sleeps with its mode empty times out.
        #expect(shared.result.wait(timeout: .seconds(10)) { $0 != nil })
        #expect(shared.result.read { $0 } == .finished)
        #expect(shared.beforeTimers.load(ordering: .relaxed) == 1)
        if shared.result.read({ $0 }) == nil { loop.stop() }
        #expect(host.join(timeout: .seconds(40)))
    }
}
