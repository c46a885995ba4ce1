import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

// Thread exit tears the thread's loop down (the DocC article FailureModes): its items leave (sources get their cancel
// callbacks) and its kernel descriptors are closed.

@Suite(.serialized, .exclusive(.robustness)) struct ThreadExit {
    /// 1,000 threads each make a loop, add a timer and a source, run briefly and exit; once all
    /// are joined, the process has the descriptors it started with. Runs in a child process so
    /// that tests running in parallel in this process cannot disturb the count.
    @Test func aThousandLoopThreadsLeaveNoDescriptorsBehind() async {
        // The child reports a failure on stderr and still exits 0: the expectation returns the
        // observed output only when its exit condition holds, and the message is what tells
        // what went wrong. A crash still fails the exit condition.
        let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            if let failure = loopThreadChurn(threads: 1000, concurrently: 4) {
                writeToStandardError("RLK-CHURN-FAILURE \(failure)\n")
            }
        }
        if let result {
            let text = String(decoding: result.standardErrorContent, as: UTF8.self)
            #expect(!text.contains("RLK-CHURN-FAILURE"), Comment(rawValue: text))
        }
    }

    /// The same churn in this process, counting only what must hold whatever else runs: every
    /// timer fired, every source performed, and every source's cancel callback ran.
    @Test func loopThreadChurnInProcessCallsEveryCancel() async {
        let failure = await TestThreads.run(name: "rlk-churn-main", timeout: .seconds(120)) {
            loopThreadChurn(threads: TestThreads.scaled(200, minimum: 20), concurrently: 4, checkDescriptors: false)
        }
        #expect(failure == .some(nil))
    }

    @Test func aSourceIsCancelledOnItsLoopsThreadWhenThatThreadExits() async {
        _ = TestLog.recorder
        struct Event: Sendable, Hashable {
            let tid: Int32
            let mode: String
        }
        let schedules = Mutex<[Event]>([])
        let cancels = Mutex<[Event]>([])
        let exitMode: RunLoop.Mode = "RobustnessExit"
        let source = RunLoopSource(
            onSchedule: { _, mode in schedules.locked { $0.append(Event(tid: crlk_gettid(), mode: mode.rawValue)) }
            },
            onCancel: { _, mode in cancels.locked { $0.append(Event(tid: crlk_gettid(), mode: mode.rawValue)) } },
            perform: {})
        let commonSource = RunLoopSource(onCancel: { _, mode in
            cancels.locked { $0.append(Event(tid: crlk_gettid(), mode: "common:" + mode.rawValue)) }
        }) {}
        let timer = RunLoopTimer(after: .seconds(3600), repeating: .seconds(3600)) { _ in }
        let observer = RunLoopObserver(activities: .allActivities) { _, _ in }

        let published = TestMonitor<RunLoop?>(nil)
        let thread = TestThread(name: "rlk-exit") {
            let loop = RunLoop.current
            loop.add(source, forMode: .default)
            loop.add(source, forMode: exitMode)
            loop.add(commonSource, forMode: .common)
            loop.add(timer, forMode: .common)
            loop.add(observer, forMode: .default)
            loop.perform(inModes: [exitMode]) {}  // stays queued: dropped at teardown
            loop.run(mode: .default, for: .milliseconds(1))
            published.update { $0 = loop }
        }
        guard await thread.joinAsync(timeout: .seconds(10)), let loop = published.read({ $0 }),
            let tid = thread.started.read({ $0 })
        else {
            Issue.record("the loop thread did not exit")
            return
        }
        let scheduled = Set(schedules.locked { $0 })
        let cancelled = cancels.locked { $0 }
        #expect(
            scheduled == [
                Event(tid: tid, mode: RunLoop.Mode.default.rawValue), Event(tid: tid, mode: exitMode.rawValue),
            ])
        #expect(
            Set(cancelled)
                == [
                    Event(tid: tid, mode: RunLoop.Mode.default.rawValue), Event(tid: tid, mode: exitMode.rawValue),
                    Event(tid: tid, mode: "common:" + RunLoop.Mode.default.rawValue),
                ], "every mode a source was in is cancelled once, on the exiting thread")
        #expect(cancelled.count == 3)
        for mode in [RunLoop.Mode.default, exitMode, .common] {
            #expect(!loop.contains(source, inMode: mode))
            #expect(!loop.contains(commonSource, inMode: mode))
            #expect(!loop.contains(timer, inMode: mode))
            #expect(!loop.contains(observer, inMode: mode))
        }
        #expect(loop.nextTimerFireDate(forMode: .default) == nil)

        // The dead loop stays safe to use from any thread: adds do nothing, performs are
        // dropped (and logged), wakeUp and stop do nothing.
        let late = RunLoopSource {}
        loop.add(late, forMode: .default)
        #expect(!loop.contains(late, inMode: .default))
        let lateTimer = RunLoopTimer(after: .zero) { _ in }
        loop.add(lateTimer, forMode: .default)
        #expect(!loop.contains(lateTimer, inMode: .default))
        loop.perform {}
        loop.wakeUp()
        loop.stop()
        #expect(!loop.isWaiting)
        #expect(loop.currentMode == nil)
        #expect(!TestLog.messages(containing: loop.shortDescription, "after its thread exited").isEmpty)

        // Items the dead loop released can join another loop.
        let fired = TestEvent()
        let rejoined = await TestThreads.run(name: "rlk-rejoin") { () -> (Bool, Bool, Bool) in
            let other = RunLoop.current
            other.add(source, forMode: .default)
            other.add(observer, forMode: .default)
            let probe = RunLoopTimer(after: .zero) { _ in fired.fire() }
            other.add(timer, forMode: .default)
            other.add(probe, forMode: .default)
            other.run(mode: .default, for: .seconds(-1))
            return (
                other.contains(source, inMode: .default), other.contains(timer, inMode: .default),
                other.contains(observer, inMode: .default)
            )
        }
        #expect(rejoined.map { [$0.0, $0.1, $0.2] } == [true, true, true])
        #expect(fired.wait(timeout: .seconds(5)))
    }
}

/// Runs `threads` short-lived loop threads, `concurrently` at a time, each making a loop, adding a
/// one-shot timer, a repeating timer, a signalled source and a queued block for a mode it never
/// runs, running 1 ms, then exiting. Returns a description of what went wrong, or nil.
func loopThreadChurn(threads: Int, concurrently: Int, checkDescriptors: Bool = true) -> String? {
    final class Tally: Sendable {
        let fired = Atomic<Int>(0)
        let performed = Atomic<Int>(0)
        let scheduled = Atomic<Int>(0)
        let cancelled = Atomic<Int>(0)
        let results = Mutex<[RunLoop.RunResult: Int]>([:])
    }
    let tally = Tally()
    @Sendable func body() {
        let loop = RunLoop.current
        let timer = RunLoopTimer(after: .zero) { _ in tally.fired.add(1, ordering: .relaxed) }
        let repeating = RunLoopTimer(after: .seconds(3600), repeating: .seconds(3600)) { _ in }
        let source = RunLoopSource(
            onSchedule: { _, _ in tally.scheduled.add(1, ordering: .relaxed) },
            onCancel: { _, _ in tally.cancelled.add(1, ordering: .relaxed) },
            perform: { tally.performed.add(1, ordering: .relaxed) })
        loop.add(timer, forMode: .default)
        loop.add(repeating, forMode: .common)
        loop.add(source, forMode: .default)
        loop.perform(inModes: ["RobustnessNeverRun"]) {}
        source.signal()
        let result = loop.run(mode: .default, for: .milliseconds(1))
        tally.results.locked { $0[result, default: 0] += 1 }
    }
    func churn(_ count: Int) -> String? {
        var started = 0
        while started < count {
            let batch = (0..<min(concurrently, count - started)).map { _ in TestThread(name: "rlk-churn", body) }
            started += batch.count
            for thread in batch where !thread.join(timeout: .seconds(20)) {
                return "a loop thread did not exit within 20 s"
            }
        }
        return nil
    }
    // Warm up once so that lazily made process-wide state (the thread-key, the clock anchor) is
    // in place before counting.
    if let failure = churn(1) { return failure }
    let warmup = 1
    let before = TestThreads.openFileDescriptors()
    let loopKindsBefore = loopDescriptorKinds()
    if let failure = churn(threads) { return failure }
    var after = TestThreads.openFileDescriptors()
    // The test runner's own threads may open or close a descriptor meanwhile (seen under CPU load:
    // +1 that is not a loop's); give the count a moment to settle before judging it.
    _ = waitUntil(timeout: .milliseconds(500)) {
        after = TestThreads.openFileDescriptors()
        return after == before
    }
    let loopKindsAfter = loopDescriptorKinds()
    let total = threads + warmup
    var problems: [String] = []
    // What a loop owns (an epoll instance, an eventfd, a timerfd) must all be back where it was;
    // the total count is checked too, once it has settled.
    if checkDescriptors && (loopKindsAfter != loopKindsBefore || after != before) {
        problems.append(
            "open descriptors before \(before), after \(after); loop descriptors before \(loopKindsBefore), after \(loopKindsAfter): \(describeOpenDescriptors())"
        )
    }
    let fired = tally.fired.load(ordering: .relaxed)
    let performed = tally.performed.load(ordering: .relaxed)
    let scheduled = tally.scheduled.load(ordering: .relaxed)
    let cancelled = tally.cancelled.load(ordering: .relaxed)
    if fired != total { problems.append("\(fired) of \(total) one-shot timers fired") }
    if performed != total { problems.append("\(performed) of \(total) sources performed") }
    if scheduled != total { problems.append("\(scheduled) of \(total) sources were scheduled") }
    if cancelled != total { problems.append("\(cancelled) of \(total) sources were cancelled at thread exit") }
    let results = tally.results.locked { $0 }
    if results != [.timedOut: total] { problems.append("run results \(results), expected all .timedOut") }
    return problems.isEmpty ? nil : problems.joined(separator: "; ")
}

/// How many of each kind of descriptor a loop owns are open: `[eventpoll]`, `[eventfd]`, `[timerfd]`.
func loopDescriptorKinds() -> [String: Int] {
    var kinds: [String: Int] = [:]
    for target in openDescriptorTargets() {
        for kind in ["[eventpoll]", "[eventfd]", "[timerfd]"] where target.hasSuffix(kind) {
            kinds[kind, default: 0] += 1
        }
    }
    return kinds
}

