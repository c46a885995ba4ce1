import Foundation
import RunLoopKit

import class RunLoopKit.RunLoop

/// Experiment 5 (seed 000, `__CFRUNLOOP_IS_SERVICING_THE_MAIN_DISPATCH_QUEUE__`): `RunLoop.main`
/// serves `DispatchQueue.main` and `@MainActor` work in its common modes only.
struct MainQueueOnTheMainLoop: Experiment {
    let title = "DispatchQueue.main is served by the main loop, in common modes only"
    let seed = Seed.cite(0, 2, 3)
    let seedSays = """
        Seed 003: "当调用 dispatch_async(dispatch_get_main_queue(), block) 时,libDispatch 会向主线程的 \
        RunLoop 发送消息,RunLoop会被唤醒" (libdispatch sends the main thread's loop a message and \
        wakes it) — right; seed 002 quotes CF's __CFRunLoopRun, which watches the main queue's port \
        only in common modes. Seed 002 also says "dispatch_async到主线程的任务最终封装为Source0" (a \
        block dispatched to the main thread ends up as a Source0): that is mistaken — the main \
        queue is served through its port, CF's version-1 path, and the block runs in the loop's \
        sources1 phase, as the trace shows. The private mode, @MainActor and asyncAfter are ours.
        """
    let summary = """
        On the main thread, a block goes to DispatchQueue.main and a task to the main actor. \
        The main loop first runs in a private mode whose only item is a 100 ms timer: the work \
        waits, and the run ends when the timer has fired and the mode is empty. Then it runs in \
        .default, a common mode: the work runs at once and the run returns after serving it \
        (CF's __CFRUNLOOP_IS_SERVICING_THE_MAIN_DISPATCH_QUEUE__). Last, run() with nothing but \
        main-queue work: the main queue keeps .default from being empty, and an asyncAfter block \
        ends it with stop().
        """

    func run() {
        guard Thread.isMainThread, RunLoop.main.servesMainDispatchQueue else {
            Out.conclusion("skipped: the tour is not on the main thread, or libdispatch has no main-queue handle here")
            return
        }
        let loop = RunLoop.main
        LabTrace.recordIfTracing(loop)
        let trace = TourLog()
        let privateMode: RunLoop.Mode = "PrivateMode"

        trace.log("main:  DispatchQueue.main.async { A }; Task { @MainActor in B }")
        // The phase tells how the loop served it: seed 002 says a Source0 ("sources0"); CF and
        // RunLoopKit serve the main queue's port after the wait ("sources1").
        DispatchQueue.main.async {
            trace.log("A:     ran (DispatchQueue.main block), mode \(Self.mode(loop)), loop phase \(loop.phaseSnapshot.phase)")
        }
        Task { @MainActor in trace.log("B:     ran (main-actor task), mode \(Self.mode(loop))") }

        loop.add(RunLoopTimer(after: .milliseconds(100)) { _ in trace.log("timer: fired in \(Self.mode(loop))") }, forMode: privateMode)
        trace.log("main:  run(mode: PrivateMode, for: .seconds(1))")
        let privateResult = loop.run(mode: privateMode, for: .seconds(1))
        trace.log("main:  run(mode: PrivateMode) returned \(privateResult); A and B have not run")

        trace.log("main:  run(mode: .default, for: .seconds(1), returnAfterSourceHandled: true)")
        let defaultResult = loop.run(mode: .default, for: .seconds(1), returnAfterSourceHandled: true)
        trace.log("main:  run(mode: .default) returned \(defaultResult)")

        trace.log("main:  DispatchQueue.main.asyncAfter(50 ms) { stop() }; run()")
        DispatchQueue.main.asyncAfter(deadline: .now() + .milliseconds(50)) {
            trace.log("C:     asyncAfter block ran; RunLoop.main.stop()")
            loop.stop()
        }
        loop.run()
        trace.log("main:  run() returned")
        trace.printEvents()
        Out.conclusion(
            "the private mode ran \(privateResult) with the work still queued; .default served it and returned \(defaultResult); run() did not finish for want of sources, it ran until the main-queue block stopped it"
        )
    }

    private static func mode(_ loop: RunLoop) -> String { loop.currentMode?.rawValue ?? "(none)" }
}
