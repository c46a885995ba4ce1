import CRunLoopKit
import Foundation
import Glibc
import SharedTestSupport
import Synchronization
import Testing

import class RunLoopKit.RunLoop

@testable import RunLoopKit

// Bad input gets a clear error and the loop keeps running (the DocC article MisuseAndLogging): a foreign thread running a
// loop, running in `.common`, negative durations, adding invalidated items.

@Suite(.serialized, .exclusive(.robustness)) struct BadInput {
    // MARK: (a) Running a loop from a foreign thread

    @Test func runningALoopFromAForeignThreadStopsTheProcessNamingTheLoopAndBothThreads() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            foreignThreadRunChild(runMain: false)
        }
        guard let result else { return }
        checkForeignRunMessage(
            String(decoding: result.standardErrorContent, as: UTF8.self), ownerName: "rlk-owner")
    }

    @Test func runningTheMainLoopFromAnotherThreadStopsTheProcess() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            foreignThreadRunChild(runMain: true)
        }
        guard let result else { return }
        checkForeignRunMessage(String(decoding: result.standardErrorContent, as: UTF8.self), ownerName: "main")
    }

    /// The precondition message (and every description) names a loop by its address, so that
    /// it can be matched with a debugger's or another message's.
    @Test func descriptionsNameItemsByTheirAddress() async {
        @Sendable func address(_ object: AnyObject) -> String {
            "0x" + String(UInt(bitPattern: Unmanaged.passUnretained(object).toOpaque()), radix: 16)
        }
        let described = await TestThreads.run(name: "rlk-address") { () -> [String: Bool] in
            let loop = RunLoop.current
            let source = RunLoopSource {}
            let timer = RunLoopTimer(after: .seconds(1)) { _ in }
            let observer = RunLoopObserver(activities: .entry) { _, _ in }
            return [
                "loop": loop.shortDescription.contains(address(loop) + " "),
                "source": source.description.contains(address(source) + " "),
                "timer": timer.description.contains(address(timer) + " "),
                "observer": observer.description.contains(address(observer) + " "),
            ]
        }
        #expect(described == ["loop": true, "source": true, "timer": true, "observer": true])
    }

    // MARK: (b) Running in .common

    @Test func runningInCommonReturnsFinishedAndLogsOncePerLoop() async {
        _ = TestLog.recorder
        struct Outcome: Sendable {
            var results: [RunLoop.RunResult] = []
            var beforeDateResult = true
            var activities: [UInt] = []
            var afterwards: RunLoop.RunResult = .finished
            var loopDescription = ""
            var elapsed = 0.0
        }
        @Sendable func exercise() -> Outcome {
            let loop = RunLoop.current
            var outcome = Outcome()
            outcome.loopDescription = loop.shortDescription
            let seen = Mutex<[UInt]>([])
            // The common modes are not empty: running them would wait for the whole timeout.
            loop.add(RunLoopSource {}, forMode: .common)
            let observer = RunLoopObserver(activities: .allActivities) { _, activity in
                seen.locked { $0.append(activity.rawValue) }
            }
            loop.add(observer, forMode: .common)
            let start = ContinuousClock.now
            outcome.results.append(loop.run(mode: .common, for: .seconds(5)))
            outcome.results.append(loop.run(mode: .common, for: .seconds(5), returnAfterSourceHandled: true))
            outcome.beforeDateResult = loop.run(mode: .common, before: Date(timeIntervalSinceNow: 5))
            outcome.results.append(loop.run(mode: .common, for: .seconds(5)))
            outcome.elapsed = secondsSince(start)
            outcome.activities = seen.locked { $0 }
            observer.invalidate()
            // The loop keeps working.
            outcome.afterwards = loop.run(mode: .default, for: .seconds(-1))
            return outcome
        }
        guard let first = await TestThreads.run(name: "rlk-common-1", exercise),
            let second = await TestThreads.run(name: "rlk-common-2", exercise)
        else { return }
        for outcome in [first, second] {
            #expect(outcome.results == [.finished, .finished, .finished])
            #expect(outcome.beforeDateResult == false)
            #expect(outcome.activities.isEmpty, "no observer is called for a .common run")
            #expect(outcome.elapsed < 4, "a .common run returns at once, it does not wait")
            #expect(outcome.afterwards == .timedOut)
            let logged = TestLog.messages(containing: ".common", outcome.loopDescription)
            #expect(logged.count == 1, "logged once per loop: \(logged.map(\.message))")
            #expect(logged.allSatisfy { $0.label == "RunLoopKit" && $0.level >= .warning })
        }
    }

    // MARK: (c) Negative durations

    @Test func aNegativeRunTimeoutMakesOnePassWithoutSleeping() async {
        struct Outcome: Sendable {
            var results: [RunLoop.RunResult] = []
            var passes: [[UInt]] = []
            var performed = 0
        }
        let outcome = await TestThreads.run(name: "rlk-negative") { () -> Outcome in
            let loop = RunLoop.current
            let performed = Atomic<Int>(0)
            let source = RunLoopSource { performed.add(1, ordering: .relaxed) }
            loop.add(source, forMode: .default)
            let seen = Mutex<[UInt]>([])
            let observer = RunLoopObserver(activities: .allActivities) { _, activity in
                seen.locked { $0.append(activity.rawValue) }
            }
            loop.add(observer, forMode: .default)
            var outcome = Outcome()
            func pass(_ body: () -> RunLoop.RunResult) {
                seen.locked { $0.removeAll() }
                outcome.results.append(body())
                outcome.passes.append(seen.locked { $0 })
            }
            pass { loop.run(mode: .default, for: .seconds(-1)) }
            pass { loop.run(mode: .default, for: .nanoseconds(-1)) }
            pass { loop.run(mode: .default, for: Duration(secondsComponent: .min, attosecondsComponent: 0)) }
            source.signal()
            pass { loop.run(mode: .default, for: .seconds(-1)) }
            source.signal()
            pass { loop.run(mode: .default, for: .seconds(-1), returnAfterSourceHandled: true) }
            outcome.performed = performed.load(ordering: .relaxed)
            return outcome
        }
        guard let outcome else { return }
        let onePass: [UInt] = [
            RunLoop.Activity.entry.rawValue, RunLoop.Activity.beforeTimers.rawValue,
            RunLoop.Activity.beforeSources.rawValue, RunLoop.Activity.exit.rawValue,
        ]
        #expect(outcome.results == [.timedOut, .timedOut, .timedOut, .timedOut, .handledSource])
        #expect(outcome.passes == Array(repeating: onePass, count: 5), "one pass, no beforeWaiting/afterWaiting")
        #expect(outcome.performed == 2)
    }

    @Test func negativeDatesInThePastRunOnePass() async {
        let outcome = await TestThreads.run(name: "rlk-past") { () -> (Bool, Double) in
            let loop = RunLoop.current
            loop.add(RunLoopSource {}, forMode: .default)
            let start = ContinuousClock.now
            let ran = loop.run(mode: .default, before: Date.distantPast)
            loop.acceptInput(mode: .default, before: Date(timeIntervalSinceNow: -10))
            loop.run(until: Date.distantPast)
            return (ran, secondsSince(start))
        }
        guard let (ran, elapsed) = outcome else { return }
        #expect(ran)
        #expect(elapsed < 4)
    }

    @Test func aTimerWithANegativeDelayFiresOnTheNextPass() async {
        struct Outcome: Sendable {
            var clampedToNow = false
            var result: RunLoop.RunResult = .finished
            var firedAfterOnePass = 0
            var validAfter = true
            var movedFired = 0
        }
        let outcome = await TestThreads.run(name: "rlk-neg-timer") { () -> Outcome in
            let loop = RunLoop.current
            var outcome = Outcome()
            let fired = Atomic<Int>(0)
            let before = ContinuousClock.now
            let timer = RunLoopTimer(after: .seconds(-5)) { _ in fired.add(1, ordering: .relaxed) }
            outcome.clampedToNow = timer.fireDate >= before && timer.fireDate <= ContinuousClock.now
            loop.add(timer, forMode: .default)
            outcome.result = loop.run(mode: .default, for: .seconds(-1))
            outcome.firedAfterOnePass = fired.load(ordering: .relaxed)
            outcome.validAfter = timer.isValid
            // A fire date moved into the past fires on the next pass too.
            let moved = Atomic<Int>(0)
            let later = RunLoopTimer(after: .seconds(3600)) { _ in moved.add(1, ordering: .relaxed) }
            loop.add(later, forMode: .default)
            later.fireDate = ContinuousClock.now - .seconds(10)
            loop.run(mode: .default, for: .zero)
            outcome.movedFired = moved.load(ordering: .relaxed)
            return outcome
        }
        guard let outcome else { return }
        #expect(outcome.clampedToNow, "after: -5 s means now, not 5 s ago")
        #expect(outcome.result == .timedOut)
        #expect(outcome.firedAfterOnePass == 1)
        #expect(outcome.validAfter == false, "a one-shot timer is invalidated after firing")
        #expect(outcome.movedFired == 1)
    }

    @Test func negativeToleranceReadsBackAsZero() async {
        let timer = RunLoopTimer(after: .seconds(1), tolerance: .seconds(-1)) { _ in }
        #expect(timer.tolerance == .zero)
        timer.tolerance = .milliseconds(5)
        #expect(timer.tolerance == .milliseconds(5))
        timer.tolerance = .milliseconds(-3)
        #expect(timer.tolerance == .zero)
        let direct = RunLoopTimer(fireAt: .now, interval: .seconds(1), tolerance: .nanoseconds(-1)) { _ in }
        #expect(direct.tolerance == .zero)
        // Scheduled on a loop, the setter goes through the loop: same clamping.
        let scheduled = await TestThreads.run(name: "rlk-neg-tol") { () -> Duration in
            let loop = RunLoop.current
            loop.add(timer, forMode: .default)
            timer.tolerance = .seconds(-10)
            return timer.tolerance
        }
        #expect(scheduled == .zero)
    }

    @Test func aNegativeRepeatIntervalMakesAOneShotTimer() async {
        let outcome = await TestThreads.run(name: "rlk-neg-rep") { () -> (Duration, Duration, Int, Bool) in
            let loop = RunLoop.current
            loop.add(RunLoopSource {}, forMode: .default)
            let fired = Atomic<Int>(0)
            let timer = RunLoopTimer(after: .zero, repeating: .seconds(-1)) { _ in fired.add(1, ordering: .relaxed)
            }
            let direct = RunLoopTimer(fireAt: .now, interval: .milliseconds(-1)) { _ in }
            loop.add(timer, forMode: .default)
            loop.run(mode: .default, for: .seconds(-1))
            loop.run(mode: .default, for: .milliseconds(20))
            loop.run(mode: .default, for: .seconds(-1))
            return (timer.interval, direct.interval, fired.load(ordering: .relaxed), timer.isValid)
        }
        guard let (interval, directInterval, fired, valid) = outcome else { return }
        #expect(interval == .zero)
        #expect(directInterval == .zero)
        #expect(fired == 1)
        #expect(valid == false)
    }

    // MARK: (d) Adding invalidated items

    @Test func addingInvalidatedItemsIsANoOp() async {
        struct Outcome: Sendable {
            var contained: [Bool] = []
            var schedules = 0
            var nextFire: ContinuousClock.Instant? = nil
            var results: [RunLoop.RunResult] = []
            var elapsed = 0.0
            var observerCalls = 0
            var stillWorks: RunLoop.RunResult = .finished
        }
        let outcome = await TestThreads.run(name: "rlk-invalid") { () -> Outcome in
            let loop = RunLoop.current
            var outcome = Outcome()
            let schedules = Atomic<Int>(0)
            let observerCalls = Atomic<Int>(0)
            let source = RunLoopSource(onSchedule: { _, _ in schedules.add(1, ordering: .relaxed) }) {}
            let timer = RunLoopTimer(after: .milliseconds(1), repeating: .milliseconds(1)) { _ in }
            let observer = RunLoopObserver(activities: .allActivities) { _, _ in
                observerCalls.add(1, ordering: .relaxed)
            }
            source.invalidate()
            timer.invalidate()
            observer.invalidate()
            // A one-shot timer that fired, and a one-shot observer that was called, are invalid too.
            let fired = RunLoopTimer(after: .zero) { _ in }
            let once = RunLoopObserver(activities: .entry, repeats: false) { _, _ in }
            loop.add(fired, forMode: .default)
            loop.add(once, forMode: .default)
            loop.run(mode: .default, for: .seconds(-1))
            let custom: RunLoop.Mode = "RobustnessInvalid"
            for mode in [RunLoop.Mode.default, .common, custom] {
                loop.add(source, forMode: mode)
                loop.add(timer, forMode: mode)
                loop.add(observer, forMode: mode)
                loop.add(fired, forMode: mode)
                loop.add(once, forMode: mode)
            }
            for mode in [RunLoop.Mode.default, .common, custom] {
                outcome.contained += [
                    loop.contains(source, inMode: mode), loop.contains(timer, inMode: mode),
                    loop.contains(observer, inMode: mode), loop.contains(fired, inMode: mode),
                    loop.contains(once, inMode: mode),
                ]
            }
            outcome.schedules = schedules.load(ordering: .relaxed)
            outcome.nextFire = loop.nextTimerFireDate(forMode: .default)
            let start = ContinuousClock.now
            outcome.results = [
                loop.run(mode: .default, for: .seconds(5)), loop.run(mode: custom, for: .seconds(5)),
            ]
            outcome.elapsed = secondsSince(start)
            outcome.observerCalls = observerCalls.load(ordering: .relaxed)
            // The loop keeps working with valid items.
            let valid = RunLoopSource {}
            loop.add(valid, forMode: .default)
            outcome.stillWorks = loop.run(mode: .default, for: .seconds(-1))
            return outcome
        }
        guard let outcome else { return }
        #expect(outcome.contained == Array(repeating: false, count: 15))
        #expect(outcome.schedules == 0)
        #expect(outcome.nextFire == nil)
        #expect(outcome.results == [.finished, .finished], "the modes stay empty")
        #expect(outcome.elapsed < 4)
        #expect(outcome.observerCalls == 0)
        #expect(outcome.stillWorks == .timedOut)
    }
}

// MARK: - Exit-test bodies (they run in a child process)

/// Makes a loop on thread `rlk-owner` (or uses the main loop), then runs it from thread
/// `rlk-intruder`, which must stop the process. Writes both kernel ids to stderr first.
func foreignThreadRunChild(runMain: Bool) {
    let published = TestMonitor<RunLoop?>(nil)
    let release = TestEvent()
    let ownerTID: Int32
    if runMain {
        ownerTID = getpid()
        let loop = RunLoop.main
        loop.add(RunLoopSource {}, forMode: .default)
        published.update { $0 = loop }
    } else {
        let owner = TestThread(name: "rlk-owner") {
            let loop = RunLoop.current
            loop.add(RunLoopSource {}, forMode: .default)
            published.update { $0 = loop }
            _ = release.wait(timeout: .seconds(60))
        }
        ownerTID = owner.tid() ?? -1
    }
    guard published.wait(timeout: .seconds(10), until: { $0 != nil }), let loop = published.read({ $0 }) else {
        writeToStandardError("the owner thread did not start\n")
        exit(0)  // the expected failure exit does not happen: the test fails
    }
    let intruder = TestThread(name: "rlk-intruder") {
        writeToStandardError("RLK-FOREIGN owner=\(ownerTID) intruder=\(crlk_gettid())\n")
        loop.run(mode: .default, for: .milliseconds(10))
        writeToStandardError("RLK-FOREIGN the run returned\n")
    }
    _ = intruder.join(timeout: .seconds(30))
    release.fire()
    exit(0)
}

/// Checks the precondition message: the function, the loop, and both threads by name and tid.
func checkForeignRunMessage(_ stderr: String, ownerName: String, sourceLocation: SourceLocation = #_sourceLocation) {
    guard let line = stderr.split(separator: "\n").first(where: { $0.hasPrefix("RLK-FOREIGN owner=") }) else {
        Issue.record("the child wrote no thread ids; stderr:\n\(stderr)", sourceLocation: sourceLocation)
        return
    }
    var ids: [String: String] = [:]
    for field in line.split(separator: " ").dropFirst() {
        let parts = field.split(separator: "=")
        if parts.count == 2 { ids[String(parts[0])] = String(parts[1]) }
    }
    let owner = ids["owner"] ?? "?"
    let intruder = ids["intruder"] ?? "?"
    let comment = Comment(rawValue: "stderr:\n\(stderr)")
    #expect(!stderr.contains("the run returned"), comment, sourceLocation: sourceLocation)
    #expect(stderr.contains("RunLoop.run(mode:for:returnAfterSourceHandled:)"), comment, sourceLocation: sourceLocation)
    #expect(stderr.contains("<RunLoop 0x"), comment, sourceLocation: sourceLocation)
    #expect(stderr.contains("thread 'rlk-intruder' (tid \(intruder))"), comment, sourceLocation: sourceLocation)
    #expect(stderr.contains("thread '\(ownerName)' (tid \(owner))"), comment, sourceLocation: sourceLocation)
}
