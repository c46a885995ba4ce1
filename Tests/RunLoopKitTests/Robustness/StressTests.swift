import CRunLoopKit
import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

// Thread-safety is proven, not assumed (the DocC article Threading): four threads add, remove, signal, reschedule,
// invalidate, perform, wake and stop for a few seconds while the loop's thread runs and nests
// runs (callbacks run the loop again in other modes), and a second loop shares the sources. At
// the end the loop must still answer, and the books must balance.

@Suite(.serialized, .exclusive(.robustness)) struct Stress {
    @Test func manyThreadsChangeItemsWhileTheLoopRunsAndNests() async {
        let seed = stressSeed()
        let duration = TestThreads.stressDuration(.seconds(3))
        let world = StressWorld(seed: seed)
        let comment = Comment(rawValue: "seed \(seed) (replay with RUNLOOPKIT_STRESS_SEED=\(seed))")

        guard
            let other = TestThread.hostingLoop(
                name: "rlk-stress-b",
                run: { loop in
                    while !world.finishing.load(ordering: .acquiring) {
                        loop.run(mode: .default, for: .milliseconds(10))
                    }
                    _ = world.released.wait(timeout: .seconds(120))
                })
        else { return }
        guard
            let host = TestThread.hostingLoop(
                name: "rlk-stress-a",
                setup: { loop in
                    loop.add(RunLoopSource {}, forMode: StressWorld.nested)
                    loop.add(world.keepAlive, forMode: .default)
                },
                run: { loop in world.runLoopThread(loop) })
        else { return }
        world.loops = [host.loop, other.loop]
        world.ready.fire()

        let start = ContinuousClock.now
        let workers = (0..<4).map { index in
            TestThread(name: "rlk-stress-\(index)") {
                world.work(index: index, until: start + duration)
            }
        }
        var workersDone = true
        for worker in workers {
            workersDone = await worker.joinAsync(timeout: duration + .seconds(60)) && workersDone
        }
        #expect(workersDone, "the workers finished (no deadlock) (seed \(seed))")
        world.finishing.store(true, ordering: .releasing)
        host.loop.wakeUp()
        #expect(await world.drained.waitAsync(timeout: .seconds(60)) { $0 }, "the loop drained (seed \(seed))")

        // Membership, checked while both loops live (a thread's exit removes everything).
        let modes: [RunLoop.Mode] = [
            .default, .common, StressWorld.nested, StressWorld.extra, StressWorld.lateCommon,
        ]
        var unbalanced: [String] = []
        var stillIn: [String] = []
        for (index, tracked) in world.allSources.locked({ $0 }).enumerated() {
            #expect(!tracked.source.isValid)
            let schedules = tracked.scheduled.load(ordering: .relaxed)
            let cancels = tracked.cancelled.load(ordering: .relaxed)
            if schedules != cancels {
                unbalanced.append("source \(index): \(schedules) schedules, \(cancels) cancels")
            }
            for loop in [host.loop, other.loop] {
                for mode in modes where loop.contains(tracked.source, inMode: mode) {
                    stillIn.append("source \(index) in \(mode)")
                }
            }
        }
        for (index, timer) in world.allTimers.locked({ $0 }).enumerated() {
            for loop in [host.loop, other.loop] {
                for mode in modes where loop.contains(timer, inMode: mode) {
                    stillIn.append("timer \(index) in \(mode)")
                }
            }
        }
        for (index, observer) in world.allObservers.locked({ $0 }).enumerated() {
            for loop in [host.loop, other.loop] {
                for mode in modes where loop.contains(observer, inMode: mode) {
                    stillIn.append("observer \(index) in \(mode)")
                }
            }
        }
        #expect(
            unbalanced.isEmpty, "schedule and cancel callbacks balance: \(unbalanced.prefix(10)) (seed \(seed))")
        #expect(stillIn.isEmpty, "invalidated items are gone: \(stillIn.prefix(10)) (seed \(seed))")
        #expect(!host.loop.allModes.contains(.common), ".common is never a real mode (seed \(seed))")
        #expect(host.loop.allModes.isSubset(of: Set(modes)), comment)

        // Still responsive: a block, a timer and a source, each within a bound.
        let loop = host.loop
        let blockRan = TestEvent()
        loop.perform { blockRan.fire() }
        #expect(await blockRan.waitAsync(timeout: .seconds(10)) { $0 }, "a performed block runs (seed \(seed))")
        let timerFired = TestEvent()
        loop.add(RunLoopTimer(after: .milliseconds(1)) { _ in timerFired.fire() }, forMode: .default)
        #expect(await timerFired.waitAsync(timeout: .seconds(10)) { $0 }, "a new timer fires (seed \(seed))")
        let performed = TestEvent()
        let probe = RunLoopSource { performed.fire() }
        loop.add(probe, forMode: .default)
        probe.signal()
        loop.wakeUp()
        #expect(
            await performed.waitAsync(timeout: .seconds(10)) { $0 }, "a signalled source performs (seed \(seed))")

        loop.perform {
            world.finalStop.store(true, ordering: .releasing)
            RunLoop.current.stop()
        }
        world.released.fire()
        #expect(await host.joinAsync(timeout: .seconds(30)), "the loop thread ended (seed \(seed))")
        #expect(await other.joinAsync(timeout: .seconds(30)), "the second loop thread ended (seed \(seed))")
        let elapsed = secondsSince(start)

        // The books.
        let submitted = world.blocksSubmitted.load(ordering: .relaxed)
        let runs = world.blockRuns.locked { Array($0.prefix(submitted)) }
        let notRun = runs.filter { $0 == 0 }.count
        let ranTwice = runs.filter { $0 > 1 }.count
        #expect(
            notRun == 0 && ranTwice == 0,
            "every block ran exactly once: \(notRun) never, \(ranTwice) more than once of \(submitted) (seed \(seed))"
        )
        #expect(
            world.offThread.load(ordering: .relaxed) == 0, "callbacks run on their loop's thread (seed \(seed))")
        #expect(
            world.modeMismatches.load(ordering: .relaxed) == 0,
            "currentMode is the innermost run's mode (seed \(seed))")
        #expect(
            world.finalCurrentMode.locked { $0 } == .some(nil),
            "currentMode is nil once the runs returned (seed \(seed))")

        // The stress did stress.
        let counts = world.counts()
        #expect(counts["nested runs", default: 0] > 0, comment)
        // Under a sanitizer one pass can take seconds (it fires every timer due when it began,
        // thousands here, and a run nested in one of their handlers takes over the rest of
        // them, as in CoreFoundation), so one run that reached its end is all it can promise.
        #expect(
            counts["outer runs", default: 0] >= (TestThreads.sanitized ? 1 : 3),
            "the outer runs reach their deadlines (seed \(seed))")
        #expect(counts["timer fires", default: 0] > 0, comment)
        #expect(counts["source performs", default: 0] > 0, comment)
        #expect(counts["observer calls", default: 0] > 0, comment)
        #expect(submitted > 0, comment)
        world.breakCycles()
        print("Stress: \(elapsed) s, seed \(seed), blocks \(submitted), \(counts.sorted { $0.key < $1.key })")
    }
}

/// Everything the stress test's threads share.
///
/// `@unchecked Sendable`: the `var`s marked loop-thread-only are touched only on loop A's thread
/// (callbacks check which loop's thread they are on before using them), `loops` is written once
/// before the workers start (`ready`).
final class StressWorld: @unchecked Sendable {
    static let nested: RunLoop.Mode = "RobustnessNested"
    static let extra: RunLoop.Mode = "RobustnessExtra"
    static let lateCommon: RunLoop.Mode = "RobustnessLateCommon"
    static let itemModes: [RunLoop.Mode] = [.default, .common, nested, extra, lateCommon]
    static let blockCapacity = 4_000_000

    final class TrackedSource: Sendable {
        let scheduled = Atomic<Int>(0)
        let cancelled = Atomic<Int>(0)
        nonisolated(unsafe) var source: RunLoopSource!
    }

    var loops: [RunLoop] = []
    let ready = TestEvent()
    let finishing = Atomic<Bool>(false)
    let draining = Atomic<Bool>(false)
    let finalStop = Atomic<Bool>(false)
    let drained = TestEvent()
    /// Lets loop B's thread exit (after the membership checks, which its teardown would blur).
    let released = TestEvent()
    let finalCurrentMode = Mutex<RunLoop.Mode??>(nil)
    let keepAlive = RunLoopSource {}

    let blocksSubmitted = Atomic<Int>(0)
    let blocksRan = Atomic<Int>(0)
    let blockRuns = Mutex<[UInt8]>(Array(repeating: 0, count: StressWorld.blockCapacity))
    let offThread = Atomic<Int>(0)
    let modeMismatches = Atomic<Int>(0)
    let counters = Mutex<[String: Int]>([:])

    let allSources = Mutex<[TrackedSource]>([])
    let liveSources = Mutex<[RunLoopSource]>([])
    let allTimers = Mutex<[RunLoopTimer]>([])
    let liveTimers = Mutex<[RunLoopTimer]>([])
    let allObservers = Mutex<[RunLoopObserver]>([])
    let liveObservers = Mutex<[RunLoopObserver]>([])

    // Loop-thread-only (loop A).
    var random: SplitMix
    var modeStack: [RunLoop.Mode] = []
    var depth = 0
    var lastNest = ContinuousClock.now

    let seed: UInt64

    init(seed: UInt64) {
        self.seed = seed
        random = SplitMix(seed: seed ^ 0xA5A5)
    }

    var loop: RunLoop { loops[0] }

    /// Each tracked source and its callbacks refer to each other; let them go at the end.
    func breakCycles() {
        for tracked in allSources.locked({ $0 }) { tracked.source = nil }
        allSources.locked { $0.removeAll() }
    }

    func count(_ name: String, _ amount: Int = 1) { counters.locked { $0[name, default: 0] += amount } }
    func counts() -> [String: Int] { counters.locked { $0 } }

    // MARK: Loop A's thread

    func runLoopThread(_ loop: RunLoop) {
        _ = ready.wait(timeout: .seconds(30))
        while !finishing.load(ordering: .acquiring) {
            let timeout = Duration.microseconds(Int64(100 + random.below(20_000)))
            let began = ContinuousClock.now
            let result = run(loop, .default, timeout, returnAfterSourceHandled: random.oneIn(4))
            let took = ContinuousClock.now - began
            count("outer runs")
            count("outer run \(result)")
            if took > timeout + .milliseconds(500) {
                count("outer runs overran")
                counters.locked {
                    $0["longest outer run ms"] = max(
                        $0["longest outer run ms", default: 0], Int(took / .milliseconds(1)))
                }
            }
        }
        // Drain: invalidate every item, then run every mode until every block has run.
        draining.store(true, ordering: .releasing)
        for tracked in allSources.locked({ $0 }) { tracked.source.invalidate() }
        for timer in allTimers.locked({ $0 }) { timer.invalidate() }
        for observer in allObservers.locked({ $0 }) { observer.invalidate() }
        let drainDeadline = ContinuousClock.now + .seconds(30)
        while blocksRan.load(ordering: .acquiring) < blocksSubmitted.load(ordering: .acquiring),
            ContinuousClock.now < drainDeadline
        {
            for mode in [RunLoop.Mode.default, Self.nested, Self.extra, Self.lateCommon] {
                run(loop, mode, .zero, returnAfterSourceHandled: false)
            }
        }
        drained.fire()
        while !finalStop.load(ordering: .acquiring) {
            run(loop, .default, .seconds(30), returnAfterSourceHandled: false)
        }
        finalCurrentMode.locked { $0 = .some(loop.currentMode) }
    }

    @discardableResult
    private func run(
        _ loop: RunLoop, _ mode: RunLoop.Mode, _ timeout: Duration, returnAfterSourceHandled: Bool
    )
        -> RunLoop.RunResult
    {
        modeStack.append(mode)
        defer { modeStack.removeLast() }
        return loop.run(mode: mode, for: timeout, returnAfterSourceHandled: returnAfterSourceHandled)
    }

    /// Checks where a callback runs; returns true on loop A's thread (where it may use `random`).
    private func enterCallback() -> Bool {
        if loop.isCurrent {
            if loop.currentMode != modeStack.last { modeMismatches.add(1, ordering: .relaxed) }
            return true
        }
        if !loops[1].isCurrent { offThread.add(1, ordering: .relaxed) }
        return false
    }

    /// Sometimes runs the loop again, in another mode, from inside a callback.
    /// Nests are rationed, at most one start every 5 ms and at most 1 ms each, so that runs
    /// still get to their own deadlines (a pass may call thousands of callbacks, each of which could
    /// nest).
    private func maybeNest() {
        guard !draining.load(ordering: .relaxed), depth < 3, random.oneIn(5) else { return }
        let now = ContinuousClock.now
        guard now - lastNest > .milliseconds(5) else { return }
        lastNest = now
        let modes = [Self.nested, Self.extra, .default, Self.lateCommon]
        let mode = modes[random.below(modes.count)]
        depth += 1
        count("nested runs")
        run(loop, mode, .microseconds(Int64(random.below(1000))), returnAfterSourceHandled: random.oneIn(2))
        depth -= 1
    }

    // MARK: Items

    func makeSource() -> RunLoopSource {
        let tracked = TrackedSource()
        let source = RunLoopSource(
            order: Int.random(in: -2...2),
            onSchedule: { _, _ in tracked.scheduled.add(1, ordering: .relaxed) },
            onCancel: { _, _ in tracked.cancelled.add(1, ordering: .relaxed) },
            perform: { [unowned self] in
                count("source performs")
                guard enterCallback() else { return }
                if random.oneIn(32), let victim = liveSources.locked({ $0.randomElement() }) { victim.signal() }
                if random.oneIn(64) { invalidateRandomItem() }
                maybeNest()
            })
        tracked.source = source
        allSources.locked { $0.append(tracked) }
        liveSources.locked { $0.append(source) }
        return source
    }

    func makeTimer(_ rng: inout SplitMix) -> RunLoopTimer {
        let repeating: Duration? = rng.oneIn(2) ? .microseconds(Int64(200 + rng.below(3000))) : nil
        let timer = RunLoopTimer(
            after: .microseconds(Int64(rng.below(4000)) - 500), repeating: repeating,
            tolerance: .microseconds(Int64(rng.below(2000)) - 1000)
        ) { [unowned self] timer in
            count("timer fires")
            guard enterCallback() else { return }
            if random.oneIn(8) {
                timer.invalidate()
            } else if random.oneIn(8) {
                timer.fireDate = .now + .microseconds(Int64(random.below(3000)))
            }
            if random.oneIn(64) { invalidateRandomItem() }
            maybeNest()
        }
        allTimers.locked { $0.append(timer) }
        liveTimers.locked { $0.append(timer) }
        return timer
    }

    func makeObserver(_ rng: inout SplitMix) -> RunLoopObserver {
        let all: [RunLoop.Activity] = [.entry, .beforeTimers, .beforeSources, .beforeWaiting, .afterWaiting, .exit]
        var activities: RunLoop.Activity = []
        for activity in all where rng.oneIn(2) { activities.insert(activity) }
        if activities.isEmpty { activities = .allActivities }
        let observer = RunLoopObserver(activities: activities, repeats: !rng.oneIn(4), order: rng.below(5) - 2) {
            [unowned self] observer, _ in
            count("observer calls")
            guard enterCallback() else { return }
            if random.oneIn(64) { observer.invalidate() }
            if random.oneIn(50) { maybeNest() }
        }
        allObservers.locked { $0.append(observer) }
        liveObservers.locked { $0.append(observer) }
        return observer
    }

    private func invalidateRandomItem() {
        switch random.below(3) {
        case 0: liveSources.locked { $0.randomElement() }?.invalidate()
        case 1: liveTimers.locked { $0.randomElement() }?.invalidate()
        default: liveObservers.locked { $0.randomElement() }?.invalidate()
        }
    }

    func performBlock(_ rng: inout SplitMix, on loop: RunLoop) {
        guard !draining.load(ordering: .relaxed),
            blocksSubmitted.load(ordering: .relaxed) - blocksRan.load(ordering: .relaxed) < 500
        else { return }
        let id = blocksSubmitted.wrappingAdd(1, ordering: .relaxed).oldValue
        guard id < Self.blockCapacity else {
            blocksSubmitted.wrappingSubtract(1, ordering: .relaxed)
            return
        }
        let choices: [[RunLoop.Mode]] = [
            [.default], [.common], [Self.nested], [.default, Self.nested], [Self.extra], [Self.lateCommon],
        ]
        loop.perform(inModes: choices[rng.below(choices.count)]) { [unowned self] in
            let onA = enterCallback()
            blockRuns.locked { $0[id] &+= 1 }
            blocksRan.add(1, ordering: .releasing)
            guard onA else { return }
            if random.oneIn(32) {
                var child = SplitMix(seed: random.next())
                performBlock(&child, on: loop)
            }
            maybeNest()
        }
    }

    private func take<T: AnyObject>(_ pool: borrowing Mutex<[T]>, _ random: inout SplitMix, remove: Bool) -> T? {
        pool.locked { pool in
            guard !pool.isEmpty else { return nil }
            let index = random.below(pool.count)
            return remove ? pool.remove(at: index) : pool[index]
        }
    }

    // MARK: Workers

    func work(index: Int, until deadline: ContinuousClock.Instant) {
        var random = SplitMix(seed: seed &+ UInt64(index + 1) &* 0x9E37_79B9)
        _ = ready.wait(timeout: .seconds(30))
        let loopA = loops[0]
        let loopB = loops[1]
        var operations = 0
        var madeCommon = false
        while ContinuousClock.now < deadline {
            operations += 1
            let mode = Self.itemModes[random.below(Self.itemModes.count)]
            let target = random.oneIn(4) ? loopB : loopA
            switch random.below(22) {
            case 0, 1:
                if liveSources.locked({ $0.count }) < 64 {
                    target.add(makeSource(), forMode: mode)
                } else {
                    take(liveSources, &random, remove: true)?.invalidate()
                }
            case 2:
                if let source = take(liveSources, &random, remove: false) { target.remove(source, forMode: mode) }
            case 3, 4:
                if let source = take(liveSources, &random, remove: false) {
                    source.signal()
                    if !random.oneIn(4) { target.wakeUp() }
                }
            case 5:
                take(liveSources, &random, remove: true)?.invalidate()
            case 6, 7:
                if liveTimers.locked({ $0.count }) < 64 {
                    target.add(makeTimer(&random), forMode: mode)
                } else {
                    take(liveTimers, &random, remove: true)?.invalidate()
                }
            case 8:
                take(liveTimers, &random, remove: false)?.fireDate =
                    .now + .microseconds(Int64(random.below(6000)) - 2000)
            case 9:
                take(liveTimers, &random, remove: false)?.tolerance = .microseconds(Int64(random.below(3000)) - 1000)
            case 10:
                if random.oneIn(2) {
                    if let timer = take(liveTimers, &random, remove: false) { target.remove(timer, forMode: mode) }
                } else {
                    take(liveTimers, &random, remove: true)?.invalidate()
                }
            case 11:
                if liveObservers.locked({ $0.count }) < 32 {
                    target.add(makeObserver(&random), forMode: mode)
                } else {
                    take(liveObservers, &random, remove: true)?.invalidate()
                }
            case 12:
                if random.oneIn(2) {
                    if let observer = take(liveObservers, &random, remove: false) {
                        target.remove(observer, forMode: mode)
                    }
                } else {
                    take(liveObservers, &random, remove: true)?.invalidate()
                }
            case 13, 14, 15:
                for _ in 0...random.below(8) { performBlock(&random, on: loopA) }
            case 16:
                target.wakeUp()
            case 17:
                if random.oneIn(2) { loopA.stop() } else { loopB.stop() }
                count("stops")
            case 18:
                // Existing items join other modes (and the other loop, which rejects timers and
                // observers that belong to this one).
                switch random.below(3) {
                case 0: if let source = take(liveSources, &random, remove: false) { target.add(source, forMode: mode) }
                case 1: if let timer = take(liveTimers, &random, remove: false) { target.add(timer, forMode: mode) }
                default:
                    if let observer = take(liveObservers, &random, remove: false) {
                        target.add(observer, forMode: mode)
                    }
                }
            case 19:
                if !madeCommon, index == 0 || random.oneIn(1000) {
                    loopA.addCommonMode(Self.lateCommon)
                    madeCommon = true
                }
            default:
                // Readers.
                if let source = take(liveSources, &random, remove: false) { _ = target.contains(source, inMode: mode) }
                _ = target.nextTimerFireDate(forMode: mode)
                _ = target.currentMode
                _ = target.isWaiting
                if random.oneIn(64) {
                    _ = target.description
                    _ = target.allModes
                    _ = target.commonModes
                }
            }
        }
        count("worker operations", operations)
    }
}
