import CRunLoopAsyncMain
import Glibc
import RunLoopConcurrency
import RunLoopKit

import class RunLoopKit.RunLoop

// Linking this product makes an async `main` run on `RunLoop.main` (the C target's constructor
// sets the runtime's drain hook before `main`); see the RunLoopAsyncMain article.

/// Whether an async `main` in this process runs on `RunLoop.main`: false if the runtime has no
/// drain hook, or another library had set it first (a message on standard error said which).
public enum RunLoopAsyncMain {
    /// Whether the drain hook is RunLoopAsyncMain's.
    public static var isInstalled: Bool { rlam_hook_installed() }
}

/// The drain hook's body: the main loop on the main thread until the program ends. An async main's
/// body is a main-actor job, a main-queue block here, which the main loop runs in its common
/// modes; its return calls `exit(0)`. `RunLoopConcurrency.stopMain(status:)` ends the process with
/// `status`, as `runMain()` would return it to a synchronous main.
@_cdecl("runloopkit_async_main_drain")
func runloopkitAsyncMainDrain() {
    guard RunLoop.main.isCurrent else {
        fatalError("RunLoopAsyncMain: the async main's drain ran off the main thread")
    }
    exit(RunLoopConcurrency.runMain())
}
