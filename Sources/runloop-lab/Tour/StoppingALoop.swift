import Foundation
import RunLoopKit

import class RunLoopKit.RunLoop

/// Experiment 3 (seed 004): what `stop()` (CFRunLoopStop) ends, under `run()`, `run(until:)` and
/// the seed's `while (shouldKeepRunning) { [runLoop runMode:beforeDate:] }` pattern.
struct StoppingALoop: Experiment {
    let title = "What stop() does to run(), run(until:) and a runMode:beforeDate: loop"
    let seed = Seed.cite(4)
    let seedSays = """
        Seed 004 lists the ways to leave a loop (run and runUntilDate: repeat runMode:beforeDate:, \
        so a stop does not end them) and the stoppable thread: while (shouldKeepRunning) \
        [runLoop runMode:NSDefaultRunLoopMode beforeDate:[NSDate distantFuture]]; its customStop \
        sets the flag and performs an empty method on the thread with performSelector:onThread: — \
        "调用后立即退出RunLoop" (the loop exits right after the call).
        """
    let summary = """
        stop() ends only the innermost run in progress (one pass of the loop). Each loop below is \
        kept alive by a Source0 that is never signalled (the seed's `addPort:`), and the main \
        thread sends the stops: run() ends on a stop; run(until:) only starts another pass and \
        goes on until its date; the seed's stoppable loop ends with its flag plus an empty \
        perform, which is a Source0, as performSelector:onThread: is.
        """

    func run() {
        runForever()
        runUntilDate()
        stoppableLoop()
    }

    /// Adds a source that is never signalled, so that `.default` is never empty (the seed adds an
    /// `NSMachPort` for the same reason), and an observer that logs each pass's entry and exit.
    private static func prepare(_ loop: RunLoop, _ trace: TourLog) -> (RunLoopSource, RunLoopObserver) {
        let keepAlive = RunLoopSource {}
        let passes = SharedCounter()
        let observer = RunLoopObserver(activities: [.entry, .exit]) { _, activity in
            if activity == .entry {
                trace.log("loop:  pass \(passes.increment()) starts (entry)")
            } else {
                trace.log("loop:  pass \(passes.count) ends (exit)")
            }
        }
        loop.add(keepAlive, forMode: .default)
        loop.add(observer, forMode: .default)
        return (keepAlive, observer)
    }

    /// (a) `run()` (CFRunLoopRun) returns when stopped.
    private func runForever() {
        Out.subheading("(a) run() (CFRunLoopRun): one stop() ends it")
        let trace = TourLog()
        let thread = LoopThread(name: "run-forever") { loop in
            let (keepAlive, observer) = Self.prepare(loop, trace)
            trace.log("loop:  run()")
            loop.run()
            trace.log("loop:  run() returned")
            keepAlive.invalidate()
            observer.invalidate()
        }
        let loop = thread.loop
        usleep(100_000)
        loop.waitUntilAsleep()
        let stopped = trace.log("main:  stop()")
        loop.stop()
        thread.join()
        trace.printEvents()
        let returned = trace.events.last.map { TourLog.ms($0.at - stopped) } ?? "?"
        Out.conclusion("run() returned \(returned) after the stop")
    }

    /// (b) `run(until:)` (runUntilDate:) runs passes until its date; a stop ends only one pass.
    private func runUntilDate() {
        Out.subheading("(b) run(until: now + 300 ms) (runUntilDate:): three stop()s, and it still runs to its date")
        let trace = TourLog()
        let thread = LoopThread(name: "run-until") { loop in
            let (keepAlive, observer) = Self.prepare(loop, trace)
            trace.log("loop:  run(until: now + 300 ms)")
            loop.run(until: Date(timeIntervalSinceNow: 0.3))
            trace.log("loop:  run(until:) returned")
            keepAlive.invalidate()
            observer.invalidate()
        }
        let loop = thread.loop
        for _ in 1...3 {
            usleep(50_000)
            loop.waitUntilAsleep()
            trace.log("main:  stop()")
            loop.stop()
        }
        thread.join()
        trace.printEvents()
        let events = trace.events
        let passes = events.filter { $0.text.hasSuffix("(entry)") }.count
        let called = events.first { $0.text.hasSuffix("run(until: now + 300 ms)") }?.at ?? .zero
        let returned = events.last.map { TourLog.ms($0.at - called) } ?? "?"
        Out.conclusion(
            "3 stops, \(passes) passes; run(until:) returned \(returned) after it was called: at its date, not at a stop"
        )
    }

    /// (c) The seed's stoppable loop, as seed 004 writes it: `customStart` runs
    /// `while (shouldKeepRunning) [runLoop runMode:NSDefaultRunLoopMode beforeDate:[NSDate distantFuture]]`
    /// on a thread whose loop has a port; `customStop` sets `shouldKeepRunning = NO` and performs an
    /// empty method on the thread (`performSelector:onThread:withObject:waitUntilDone:NO`), with no
    /// CFRunLoopStop ("调用后立即退出RunLoop": the loop exits at once).
    private func stoppableLoop() {
        Out.subheading(
            "(c) seed 004's customStart/customStop: while shouldKeepRunning { run(mode:before: .distantFuture) }; "
                + "shouldKeepRunning = false + an empty perform")
        let trace = TourLog()
        let shouldKeepRunning = SharedFlag(true)
        let thread = LoopThread(name: "stoppable") { loop in
            let (keepAlive, observer) = Self.prepare(loop, trace)
            trace.log("loop:  while shouldKeepRunning { run(mode: .default, before: .distantFuture) }")
            while shouldKeepRunning.isSet {
                loop.run(mode: .default, before: .distantFuture)
            }
            trace.log("loop:  the while loop ended (the seed's NSLog(@\"退出\"))")
            keepAlive.invalidate()
            observer.invalidate()
        }
        let loop = thread.loop
        usleep(50_000)
        loop.waitUntilAsleep()
        trace.log("main:  stop() alone")
        loop.stop()
        usleep(50_000)
        loop.waitUntilAsleep()
        let requested = trace.log(
            "main:  customStop: shouldKeepRunning = false; perform(inModes: [.default], waitUntilDone: false) {}")
        shouldKeepRunning.set(false)
        // performSelector:onThread: is delivered by a Source0 (on iOS, __NSThreadPerformPerform):
        // run(mode:before:) returns after it, and the while loop sees the flag.
        try? loop.perform(inModes: [.default], waitUntilDone: false) {
            trace.log("loop:  the empty perform runs (a Source0: run(mode:before:) returns after it)")
        }
        thread.join()
        trace.printEvents()
        let ended = trace.events.last.map(\.at) ?? requested
        Out.conclusion(
            "stop() alone ended pass 1 and the while loop started pass 2; with the flag cleared, the empty "
                + "perform ended the run (no stop()), and the thread left the loop \(TourLog.ms(ended - requested)) "
                + "after the request, as the seed says. (A block queued with perform {}, CFRunLoopPerformBlock, "
                + "is not a source: it would run, but the run would go on sleeping until .distantFuture.)")
    }
}
