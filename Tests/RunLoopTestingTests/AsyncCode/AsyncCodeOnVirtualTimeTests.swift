import RunLoopKit
import RunLoopTesting
import SharedTestSupport
import Dispatch
import Synchronization
import Testing

import class RunLoopKit.RunLoop

// Async code tested on virtual time as users write it: a debouncer and a throttler with an
// unstructured `Task` inside that sleeps on an injected `any Clock<Duration>`, unchanged
// (Debouncers.swift). 200 runs each must give the same answer, with no real waiting.

/// What a debouncer sends for the script "1, 2 at 0 ms; 3 at 200 ms; 4 at 700 ms", delay 300 ms:
/// 3 (at 500 ms) and 4 (at 1,000 ms); 1 and 2 are replaced before their delay ends.
private let debouncedScript: [(at: Duration, value: Int)] = [(.zero, 1), (.zero, 2), (.milliseconds(200), 3), (.milliseconds(700), 4)]
private let debouncedExpected = [Fire(value: 3, at: .milliseconds(500)), Fire(value: 4, at: .milliseconds(1_000))]

/// What a throttler (interval 100 ms, leading and trailing) sends for values every 30 ms from 0 to
/// 270 ms: the first at once, then the latest at each 100 ms boundary while values keep coming.
private let throttledExpected = [
    Fire(value: 0, at: .zero), Fire(value: 3, at: .milliseconds(100)), Fire(value: 6, at: .milliseconds(200)),
    Fire(value: 9, at: .milliseconds(300)),
]

/// How long a test waits for a task on the global pool: 30 s, or 180 s under a sanitizer, where the
/// suites running beside it hold the pool's two threads for long stretches (a deadlock still fails).
let poolPatience: Duration = TestThreads.sanitized ? .seconds(180) : .seconds(30)

struct Fire: Sendable, Equatable, CustomStringConvertible {
    let value: Int
    let at: Duration
    var description: String { "\(value)@\(at)" }
}

/// Records what an action received, with the virtual time it received it at.
final class Fires: Sendable {
    private let fires = Mutex<[Fire]>([])
    private let start: ContinuousClock.Instant
    private let clock: RunLoopClock
    init(_ time: VirtualTimeLoop) {
        start = time.start
        clock = time.clock
    }
    func record(_ value: Int) {
        let at = clock.now - start
        fires.locked { $0.append(Fire(value: value, at: at)) }
    }
    var all: [Fire] { fires.locked { $0 } }
}

@Suite struct AsyncCodeOnVirtualTimeTests {
    /// The synchronous scope: `Task {}` started in it runs on the virtual loop, and its sleeps on
    /// the scope's clock end in `advance(by:)`.
    @Test func aDebouncerWithAnUnstructuredTaskIsTestedUnchangedInTheSynchronousScope() throws {
        let started = ContinuousClock.now
        for _ in 0..<200 {
            let fires = try withVirtualTime { time in
                let fires = Fires(time)
                let debouncer = Debouncer<Int>(clock: time.clock, delay: .milliseconds(300)) { fires.record($0) }
                var now = Duration.zero
                for step in debouncedScript {
                    try time.advance(by: step.at - now)
                    now = step.at
                    debouncer.send(step.value)
                }
                try time.advance(by: .seconds(2))
                return fires.all
            }
            #expect(fires == debouncedExpected)
            guard fires == debouncedExpected else { return }
        }
        // 200 runs move 2.7 s of virtual time each; the real time is the work alone. 2 s is the
        // issue's bound; a sanitizer multiplies the work (up to 10x under ThreadSanitizer).
        #expect(ContinuousClock.now - started < (TestThreads.sanitized ? .seconds(20) : .seconds(2)))
    }

    /// The async scope: the body awaits, the tasks it starts run on the virtual loop.
    ///
    /// The bound is on the time spent inside the bodies, where virtual time does its work: the
    /// test's own task hops to the global pool between runs (into and out of each scope), and in a
    /// full `swift test` the pool's two threads are held by other suites for seconds at a time
    /// (measured: 400 runs took 40 s of wall time there, 0.35 s alone).
    @Test func aDebouncerAndAThrottlerAreTestedUnchangedInTheAsyncScope() async throws {
        let inside = Mutex(Duration.zero)
        // 200 runs each, or 20 under a sanitizer (the pool hops between runs; see above).
        let runs = TestThreads.sanitized ? 20 : 200
        for _ in 0..<runs {
            let fires = try await withVirtualTime { time in
                let entered = ContinuousClock.now
                defer { inside.locked { $0 += ContinuousClock.now - entered } }
                let fires = Fires(time)
                let debouncer = Debouncer<Int>(clock: time.clock, delay: .milliseconds(300)) { fires.record($0) }
                var now = Duration.zero
                for step in debouncedScript {
                    try await time.advance(by: step.at - now)
                    now = step.at
                    debouncer.send(step.value)
                }
                try await time.advance(by: .seconds(2))
                return fires.all
            }
            #expect(fires == debouncedExpected)
            guard fires == debouncedExpected else { return }
        }
        for _ in 0..<runs {
            let fires = try await withVirtualTime { time in
                let entered = ContinuousClock.now
                defer { inside.locked { $0 += ContinuousClock.now - entered } }
                let fires = Fires(time)
                let throttler = Throttler<Int>(clock: time.clock, interval: .milliseconds(100)) { fires.record($0) }
                for value in 0..<10 {
                    if value > 0 { try await time.advance(by: .milliseconds(30)) }
                    throttler.send(value)
                }
                try await time.advance(by: .seconds(1))
                return fires.all
            }
            #expect(fires == throttledExpected)
            guard fires == throttledExpected else { return }
        }
        // 400 runs: twice the 2 s for 200; a sanitizer multiplies the work.
        #expect(inside.locked { $0 } < (TestThreads.sanitized ? .seconds(40) : .seconds(4)))
    }

    /// In the async scope, the body runs on the scope's thread, and awaiting a task it started
    /// lets that task run at the current instant (virtual time does not move by itself).
    @Test func theAsyncBodyAwaitsTheTasksItStarts() async throws {
        try await withVirtualTime { time in
            #expect(RunLoop.current === time.runLoop)
            let task = Task { RunLoop.current === time.runLoop }
            #expect(await task.value)
            #expect(time.elapsed == .zero)
            // A sleep on the scope's clock waits for advance(by:).
            let sleeper = Task { try await time.clock.sleep(for: .seconds(60)) }
            try await time.runUntilIdle()
            try await time.advance(by: .seconds(60))
            try await sleeper.value
            #expect(time.elapsed == .seconds(60))
        }
    }

    /// A task started in a scope that ends before it ran is not lost: it runs on the global pool.
    @Test func aTaskTheScopeNeverRanRunsAfterTheScopeEnds() async throws {
        let ran = TestEvent()
        withVirtualTime { _ in
            _ = Task { ran.fire() }
        }
        #expect(await ran.waitAsync(timeout: poolPatience) { $0 })
    }

    /// Jobs enqueued from other threads are not taken: a task started off the scope's thread
    /// (here from a libdispatch worker) runs on the pool while the scope lasts.
    @Test func tasksOfOtherThreadsStayOnThePool() async throws {
        let ran = TestEvent()
        try await withVirtualTime { time in
            let loop = time.runLoop
            let onScopeThread = TestMonitor<Bool?>(nil)
            DispatchQueue.global().async {
                Task {
                    onScopeThread.update { $0 = loop.isCurrent }
                    ran.fire()
                }
            }
            #expect(await ran.waitAsync(timeout: poolPatience) { $0 })
            #expect(onScopeThread.read { $0 } == false)
        }
    }
}

/// The `.virtualTime` trait, written as a newcomer would from its docs.
@Suite struct VirtualTimeTraitTests {
    @Test(.virtualTime) func aTestWithTheTraitRunsOnVirtualTime() async throws {
        let time = try #require(VirtualTimeLoop.current)
        let fires = Fires(time)
        let debouncer = Debouncer<Int>(clock: time.clock, delay: .seconds(1)) { fires.record($0) }
        debouncer.send(7)
        try await time.advance(by: .seconds(5))
        #expect(fires.all == [Fire(value: 7, at: .seconds(1))])
    }

    /// Combined with a trait that runs the test on another thread, the scope refuses, saying why.
    @Test(.onLoopThread) func theTraitRefusesToNestInAnotherThreadTrait() async throws {
        let test = try #require(Test.current)
        await #expect {
            let trait: VirtualTimeTrait = .virtualTime
            try await trait.provideScope(for: test, testCase: Test.Case.current) {}
        } throws: { error in
            "\(error)".contains("has both .onLoopThread and .virtualTime")
        }
    }

    /// Called from main-actor code, the async scope refuses before its body runs.
    @Test @MainActor func theAsyncScopeRefusesAnIsolatedCaller() async throws {
        let ran = TestEvent()
        await #expect {
            try await withVirtualTime { _ async in ran.fire() }
        } throws: { error in
            "\(error)".contains("call it from a nonisolated function")
        }
        #expect(!ran.read { $0 })
    }

    /// Async scopes nest: the inner one has a loop and a clock of its own.
    @Test func asyncScopesNest() async throws {
        try await withVirtualTime { outer in
            try await outer.advance(by: .seconds(1))
            try await withVirtualTime { inner in
                #expect(inner.runLoop !== outer.runLoop)
                try await inner.advance(by: .seconds(3))
                #expect(inner.elapsed == .seconds(3))
            }
            #expect(outer.elapsed == .seconds(1))
        }
    }
}

/// The async forms refuse what the synchronous ones refuse, with the same errors.
@Suite struct AsyncVirtualTimeMisuseTests {
    @Test func aNegativeAdvanceThrowsAndLeavesTheClock() async throws {
        try await withVirtualTime { time in
            await #expect(throws: VirtualTimeError.negativeDuration(.seconds(-1))) {
                try await time.advance(by: .seconds(-1))
            }
            await #expect(throws: VirtualTimeError.invalidLimit(0)) {
                try await time.runUntilIdle(maxPasses: 0)
            }
            #expect(time.elapsed == .zero)
        }
    }
}
