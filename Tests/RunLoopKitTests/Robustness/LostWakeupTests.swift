import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

// No lost wakeup: every cross-thread submission is processed, with bounded waits.
//
// A lost wakeup shows where a submitter stops submitting and waits: if the loop slept through
// the last submission, nothing else wakes it. So each submitter works in bursts of random length
// and, after each burst, waits (bounded) until the loop has processed the burst's last item. The
// loop runs with a 30 s timeout, so a lost wakeup is not rescued by a timeout either (only, at
// times, by another submitter's wakeup); a wait that times out fails the test.

@Suite(.serialized, .exclusive(.robustness)) struct LostWakeup {
    static let submitters = 4
    static let burstWait: Duration = .seconds(10)

    /// 1,000,000 blocks performed from 4 threads (250,000 each) all run, exactly once, in
    /// order per submitter.
    @Test func aMillionCrossThreadPerformsAllRunExactlyOnce() async {
        let total = TestThreads.scaled(1_000_000, minimum: 4_000)
        let perSubmitter = total / Self.submitters
        let seed = stressSeed()

        final class Shared: @unchecked Sendable {
            let executed = Atomic<Int>(0)
            let outOfOrder = Atomic<Int>(0)
            let done = Atomic<Bool>(false)
            /// The sequence number of the last burst-ending block that ran, per submitter.
            let progress = TestMonitor<[Int]>(Array(repeating: 0, count: LostWakeup.submitters))
            let lostWakeups = Mutex<[String]>([])
            /// Loop-thread only: the next sequence number expected from each submitter.
            var expected = Array(repeating: 1, count: LostWakeup.submitters)
        }
        let shared = Shared()
        let start = ContinuousClock.now
        guard
            let host = TestThread.hostingLoop(
                name: "rlk-perform-loop",
                setup: { loop in loop.add(RunLoopSource {}, forMode: .default) },
                run: { loop in
                    while !shared.done.load(ordering: .acquiring) { loop.run(mode: .default, for: .seconds(30)) }
                })
        else { return }
        let loop = host.loop

        let threads = (0..<Self.submitters).map { index in
            TestThread(name: "rlk-performer-\(index)") {
                var random = SplitMix(seed: seed &+ UInt64(index))
                var sequence = 0
                while sequence < perSubmitter {
                    let burst = min(1 + random.below(4096), perSubmitter - sequence)
                    for position in 0..<burst {
                        sequence += 1
                        let mine = sequence
                        let last = position == burst - 1
                        loop.perform {
                            if shared.expected[index] == mine {
                                shared.expected[index] = mine + 1
                            } else {
                                shared.outOfOrder.add(1, ordering: .relaxed)
                            }
                            shared.executed.add(1, ordering: .relaxed)
                            if last { shared.progress.update { $0[index] = mine } }
                        }
                    }
                    let target = sequence
                    if !shared.progress.wait(timeout: LostWakeup.burstWait, until: { $0[index] >= target }) {
                        shared.lostWakeups.locked {
                            $0.append(
                                "submitter \(index): block \(target) not run after \(LostWakeup.burstWait); loop: \(loop.description)"
                            )
                        }
                        loop.wakeUp()  // rescue, so that the test can end
                        _ = shared.progress.wait(timeout: LostWakeup.burstWait, until: { $0[index] >= target })
                    }
                }
            }
        }
        var joined = true
        for thread in threads { joined = await thread.joinAsync(timeout: .seconds(120)) && joined }
        loop.perform {
            shared.done.store(true, ordering: .releasing)
            RunLoop.current.stop()
        }
        let loopExited = await host.joinAsync(timeout: .seconds(30))
        let elapsed = secondsSince(start)

        #expect(joined, "the submitters finished")
        #expect(loopExited, "the loop thread finished")
        #expect(shared.lostWakeups.locked { $0 } == [])
        #expect(shared.executed.load(ordering: .relaxed) == perSubmitter * Self.submitters)
        #expect(shared.outOfOrder.load(ordering: .relaxed) == 0, "blocks run FIFO per submitter")
        #expect(shared.expected == Array(repeating: perSubmitter + 1, count: Self.submitters))
        print("LostWakeup.perform: \(perSubmitter * Self.submitters) blocks in \(elapsed) s (seed \(seed))")
    }

    /// 1,000,000 `signal()` + `wakeUp()` from 4 threads (250,000 each) on one source: signals
    /// coalesce, but none is left unprocessed. Each submitter takes a ticket before it signals;
    /// the source's perform, which clears the signal before it runs, records the highest ticket
    /// taken so far. A submitter's signal is processed once the recorded ticket reaches its own.
    @Test func aMillionCrossThreadSignalsAreNeverLeftUnprocessed() async {
        let total = TestThreads.scaled(1_000_000, minimum: 4_000)
        let perSubmitter = total / Self.submitters
        let seed = stressSeed()

        final class Shared: Sendable {
            let tickets = Atomic<Int>(0)
            let performs = Atomic<Int>(0)
            let regressions = Atomic<Int>(0)
            let done = Atomic<Bool>(false)
            /// The highest ticket seen by a perform.
            let processed = TestMonitor<Int>(0)
            let lostWakeups = Mutex<[String]>([])
        }
        let shared = Shared()
        let source = RunLoopSource {
            shared.performs.add(1, ordering: .relaxed)
            let seen = shared.tickets.load(ordering: .sequentiallyConsistent)
            shared.processed.update { processed in
                if seen < processed { shared.regressions.add(1, ordering: .relaxed) }
                processed = max(processed, seen)
            }
        }
        let start = ContinuousClock.now
        guard
            let host = TestThread.hostingLoop(
                name: "rlk-signal-loop",
                setup: { loop in loop.add(source, forMode: .default) },
                run: { loop in
                    while !shared.done.load(ordering: .acquiring) { loop.run(mode: .default, for: .seconds(30)) }
                })
        else { return }
        let loop = host.loop

        let threads = (0..<Self.submitters).map { index in
            TestThread(name: "rlk-signaller-\(index)") {
                var random = SplitMix(seed: seed &+ UInt64(index))
                var sent = 0
                while sent < perSubmitter {
                    let burst = min(1 + random.below(4096), perSubmitter - sent)
                    var ticket = 0
                    for _ in 0..<burst {
                        ticket = shared.tickets.wrappingAdd(1, ordering: .sequentiallyConsistent).newValue
                        source.signal()
                        loop.wakeUp()
                    }
                    sent += burst
                    let target = ticket
                    if !shared.processed.wait(timeout: LostWakeup.burstWait, until: { $0 >= target }) {
                        shared.lostWakeups.locked {
                            $0.append(
                                "submitter \(index): ticket \(target) not processed after \(LostWakeup.burstWait); signalled \(source.isSignalled); loop: \(loop.description)"
                            )
                        }
                        loop.wakeUp()
                        _ = shared.processed.wait(timeout: LostWakeup.burstWait, until: { $0 >= target })
                    }
                }
            }
        }
        var joined = true
        for thread in threads { joined = await thread.joinAsync(timeout: .seconds(120)) && joined }
        loop.perform {
            shared.done.store(true, ordering: .releasing)
            RunLoop.current.stop()
        }
        let loopExited = await host.joinAsync(timeout: .seconds(30))
        let elapsed = secondsSince(start)

        let submitted = perSubmitter * Self.submitters
        #expect(joined, "the submitters finished")
        #expect(loopExited, "the loop thread finished")
        #expect(shared.lostWakeups.locked { $0 } == [])
        #expect(shared.tickets.load(ordering: .relaxed) == submitted)
        #expect(shared.processed.read { $0 } == submitted, "the last signal was processed")
        #expect(shared.regressions.load(ordering: .relaxed) == 0)
        let performs = shared.performs.load(ordering: .relaxed)
        #expect(performs >= 1 && performs <= submitted, "signals coalesce: \(performs) performs")
        print("LostWakeup.signal: \(submitted) signals, \(performs) performs in \(elapsed) s (seed \(seed))")
    }
}
