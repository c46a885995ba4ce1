// An async `main` on RunLoop.main.
//
// The entry point Swift synthesizes for `static func main() async` starts the main task on the
// main executor and then calls `swift_task_asyncMainDrainQueue()`, which, on Linux, parks the main
// thread in libdispatch's `dispatch_main()` for good: main-actor jobs then run on libdispatch's
// threads, and `RunLoop.main` can never run. The runtime consults a hook first: when
// `swift_task_asyncMainDrainQueue_hook` is set, it calls that instead (its underscored ABI,
// exported by libswift_Concurrency.so; checked on Swift 6.3.1, x86_64 and aarch64 Linux). This
// constructor sets it before `main` runs, so that linking this product is the opt-in; the hook
// runs the main loop on the main thread, which serves the main queue and so the main actor's jobs
// (the async main's body among them), until the program exits (the body's return calls exit(0)) or
// `RunLoopConcurrency.stopMain(status:)` ends it with that status.
//
// The hook is `SWIFT_CC(swift) void (*)(original, override)`: on x86_64 and aarch64 the Swift
// calling convention passes two pointer arguments as the C one does, and the hook ignores both.

#include "CRunLoopAsyncMain.h"
#include <stdio.h>
#include <stdlib.h>

typedef void (*rlam_drain_hook)(void *original, void *override);

extern rlam_drain_hook swift_task_asyncMainDrainQueue_hook __attribute__((weak));

/// Runs the main loop until the program ends (RunLoopAsyncMain.swift); never returns.
extern void runloopkit_async_main_drain(void);

static bool installed;

static void drain(void *original, void *override) {
    (void)original;
    (void)override;
    runloopkit_async_main_drain();
}

__attribute__((constructor)) static void install_async_main_drain(void) {
    if (&swift_task_asyncMainDrainQueue_hook == NULL) {
        fputs("RunLoopAsyncMain: this Swift runtime exports no swift_task_asyncMainDrainQueue_hook; "
              "an async main parks the main thread in dispatch_main() and RunLoop.main will not run "
              "(use a synchronous main with RunLoopConcurrency.runMain())\n",
              stderr);
        return;
    }
    if (swift_task_asyncMainDrainQueue_hook != NULL && swift_task_asyncMainDrainQueue_hook != drain) {
        fputs("RunLoopAsyncMain: swift_task_asyncMainDrainQueue_hook was already set by another "
              "library; it is kept, and RunLoop.main will not run an async main\n",
              stderr);
        return;
    }
    swift_task_asyncMainDrainQueue_hook = drain;
    installed = true;
}

bool rlam_hook_installed(void) { return installed; }
