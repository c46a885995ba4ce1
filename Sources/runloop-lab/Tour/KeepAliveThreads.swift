import CRunLoopLab
import Foundation
import RunLoopKit

import class RunLoopKit.RunLoop

/// Experiment (seeds 000 and 002): thread keep-alive (线程保活), from a thread that dies after one
/// task to ``PermanentThread``.
struct KeepAliveThreads: Experiment {
    let title = "Thread keep-alive: from a thread that dies to PermanentThread"
    let seed = Seed.cite(0, 2, 4)
    let seedSays = """
        Seed 004: "一个线程一次只能执行一次任务,当任务执行完毕后,该线程就退出并被销毁" (a thread runs one \
        task, then exits); seed 002's keep-alive thread adds an NSMachPort and calls [[NSRunLoop \
        currentRunLoop] run], and its stoppable version uses a flag with runMode:beforeDate:; \
        seed 000 shows AFNetworking's thread. PermanentThread (ordered tasks, a synchronous form, a \
        joining stop) is RunLoopKit's.
        """
    let summary = """
        A thread ends when its body returns, and its loop with it. Kept alive by a port, the loop \
        lives on, but under run(until: .distantFuture) no stop() can end it; the seeds' fix is a \
        flag plus run(mode:before:) in a while loop, stopped from the thread itself. PermanentThread \
        packages that: ordered tasks, a synchronous form, a stop that joins the thread.
        """

    func run() {
        threadThatDies()
        runUntilCannotBeStopped()
        stoppableLoop()
        permanentThread()
    }

    /// Counts the passes of a loop (entry observer) into `trace`.
    private static func observePasses(_ loop: RunLoop, _ trace: TourLog) -> RunLoopObserver {
        let passes = SharedCounter()
        let observer = RunLoopObserver(activities: [.entry]) { _, _ in
            trace.log("loop:  pass \(passes.increment()) starts")
        }
        loop.add(observer, forMode: .default)
        return observer
    }

    /// (a) No loop: the thread runs its body once and ends, and its loop is torn down.
    private func threadThatDies() {
        Out.subheading("(a) a thread with no loop: it runs one task and ends (seed 000, 情景1)")
        let trace = TourLog()
        let thread = LoopThread(name: "one-shot") { _ in trace.log("thread: task runs, then the body returns") }
        thread.join()
        let loop = thread.loop
        do {
            try loop.perform(waitUntilDone: true) { trace.log("thread: a later task (never printed)") }
            trace.log("main:  perform(waitUntilDone:) returned")
        } catch {
            trace.log("main:  perform(waitUntilDone: true) threw: \(error)")
        }
        trace.printEvents()
        Out.conclusion("the thread is gone, and a task sent to its loop is refused instead of waiting forever")
    }

    /// (b) A port keeps the loop alive, but `run(until:)` starts a new pass after each stop.
    private func runUntilCannotBeStopped() {
        Out.subheading("(b) kept alive by a port, driven by run(until:): stop() ends one pass, not the loop (情景2)")
        Out.paragraph(
            "The seed runs until .distantFuture; here the date is now + 250 ms, so that the tour can go on: "
                + "the loop ends at its date, never at a stop.", indent: 4)
        let trace = TourLog()
        let thread = LoopThread(name: "run-until") { loop in
            let port = MessagePort<Never> { _ in }  // the seed's addPort:[NSPort port]
            loop.add(port, forMode: .default)
            let observer = Self.observePasses(loop, trace)
            trace.log("loop:  run(until: now + 250 ms)")
            loop.run(until: Date(timeIntervalSinceNow: 0.25))
            trace.log("loop:  run(until:) returned at its date")
            observer.invalidate()
            port.invalidate()
        }
        let loop = thread.loop
        for _ in 1...2 {
            loop.waitUntilAsleep()
            trace.log("main:  stop()")
            loop.stop()
            // Still alive: a task sent now runs (in the next pass).
            try? loop.perform(waitUntilDone: true) { trace.log("loop:  a task still runs after the stop") }
        }
        thread.join()
        trace.printEvents()
        Out.conclusion("each stop() only made run(until:) start another pass; the thread lived until the date")
    }

    /// (c) The seeds' stoppable pattern, stopped from the thread itself with waitUntilDone.
    private func stoppableLoop() {
        Out.subheading("(c) while !stopped { run(mode: .default, before: .distantFuture) } (情景3)")
        let trace = TourLog()
        let stopped = SharedFlag(false)
        let thread = LoopThread(name: "stoppable") { loop in
            let port = MessagePort<Never> { _ in }
            loop.add(port, forMode: .default)
            let observer = Self.observePasses(loop, trace)
            while !stopped.isSet {
                loop.run(mode: .default, before: .distantFuture)
            }
            trace.log("loop:  the while loop ended; the thread returns")
            observer.invalidate()
            port.invalidate()
        }
        let loop = thread.loop
        loop.waitUntilAsleep()
        try? loop.perform(waitUntilDone: true) { trace.log("loop:  task 1") }
        let requested = trace.log("main:  perform(waitUntilDone: true) { stopped = true; stop() }")
        try? loop.perform(waitUntilDone: true) {
            stopped.set(true)
            RunLoop.current.stop()
        }
        thread.join()
        let joined = trace.log("main:  thread joined")
        trace.printEvents()
        Out.conclusion(
            "the flag ends the while loop and the stop ends the pass that would otherwise sleep until "
                + ".distantFuture: the thread ended \(TourLog.ms(joined - requested)) after the request")
    }

    /// (d) ``PermanentThread``.
    private func permanentThread() {
        Out.subheading("(d) PermanentThread: the pattern above, packaged (情景4, ZXYPermenantThread)")
        let trace = TourLog()
        let threadsBefore = Self.threadCount()
        let worker = PermanentThread(name: "permanent")
        let comm = (try? String(contentsOfFile: "/proc/self/task/\(worker.threadID)/comm", encoding: .utf8)) ?? "?"
        trace.log("main:  PermanentThread(name: \"permanent\"): tid \(worker.threadID), OS name '\(comm.trimmed)'")
        for index in 1...3 {
            try? worker.execute { trace.log("permanent: task \(index) (tid \(crll_gettid()))") }
        }
        let sum = (try? worker.executeAndWait { (1...10).reduce(0, +) }) ?? -1
        trace.log("main:  executeAndWait { 1 + ... + 10 } returned \(sum)")
        try? worker.execute { trace.log("permanent: task 4, queued just before stop()") }
        worker.stop()
        trace.log("main:  stop() returned: task 4 ran, the thread is joined")
        do {
            try worker.execute {}
        } catch {
            trace.log("main:  execute after stop() throws: \(error)")
        }
        trace.printEvents()
        Out.conclusion(
            "tasks ran in order on one thread; process threads before \(threadsBefore), after stop() "
                + "\(Self.threadCount()) (the kernel reaps a joined thread a moment after the join)")
    }

    /// The entries of /proc/self/task.
    private static func threadCount() -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task").count) ?? -1
    }
}

extension String {
    fileprivate var trimmed: String { trimmingCharacters(in: .whitespacesAndNewlines) }
}
