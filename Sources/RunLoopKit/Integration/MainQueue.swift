import CRunLoopKit
import SystemPackage
// Links libdispatch (the module map's `link "dispatch"`), which exports the `_4CF` entry points
// declared in CRunLoopKit.h.
import Dispatch

// The main loop serves `DispatchQueue.main`, as CFRunLoop does with libdispatch's
// `_dispatch_get_main_queue_handle_4CF` / `_dispatch_main_queue_callback_4CF`.
//
// What CF does on Linux (swift-corelibs-foundation, Sources/CoreFoundation/CFRunLoop.c,
// `__CFRunLoopRun`): when the loop is `CFRunLoopGetMain()`, runs on the main thread, in one of its
// common modes, and is not inside a main-queue callout (`__CFTSDKeyIsInGCDMainQ`), it adds the main
// queue's eventfd to the mode's epoll set for the wait; when that eventfd wakes it, it reads the
// eventfd (8 bytes, resetting the counter) and calls `_dispatch_main_queue_callback_4CF`, which
// counts as a handled source. `__CFRunLoopModeIsEmpty` says "not empty" under the same conditions:
// the main queue keeps the main loop's common modes alive.
//
// What libdispatch does on Linux (swift-corelibs-libdispatch, src/queue.c; checked on this
// toolchain with a probe): the handle is an eventfd (`eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)`,
// made once), libdispatch writes 1 to it when the main queue gets work and never reads it, so the
// caller must; the callback runs the blocks queued so far on the calling thread, which must be the
// main thread; blocks they queue make libdispatch write the eventfd again; a callback nested in a
// block returns at once. After `dispatch_main()` the handle is -1 (libdispatch closed it).
//
// Here the same thing is one internal version-1 source: a FileDescriptorSource on the eventfd,
// added to the main loop's `.common` when the main loop is made. Since a loop runs only on its own
// thread, its handler runs only when `RunLoop.main` runs on the main thread, in a common mode: the
// rule above, with the source's presence in the common modes keeping them non-empty. While the
// main queue's blocks run, the source leaves the common modes (CF's `__CFTSDKeyIsInGCDMainQ` rule;
// see `serve`). The source is not public, so no caller can remove or invalidate it by accident; it
// goes for good only if libdispatch closes the eventfd (it is then told `.closed` or `.hangUp`
// and is invalidated), or if a caller adds its own descriptor source for the same descriptor number
// to the main loop (one source per number: the earlier one is taken for a closed descriptor).
//
// CF and RunLoopKit in one process (Foundation is loaded wherever CF is): both may watch the same
// eventfd, epoll allows that, and only the loop running on the main thread waits on it. Each can run
// nested in the other (from a timer or a source). The one that reads the eventfd first drains the
// queue. The other reads nothing: CF then handles nothing; this handler still calls libdispatch,
// which finds nothing to run, and the pass counts a handled source. No block runs twice or is lost
// (MainQueueTests' coexistence scenario).

extension RunLoop {
    /// Whether the loop serves `DispatchQueue.main` (and so the main actor's jobs) when it runs on
    /// the main thread in one of its common modes.
    ///
    /// True for ``RunLoop/main`` in an ordinary process, except while it runs the main queue's
    /// blocks (a run nested in one of them cannot serve the queue: libdispatch's drain is not
    /// re-entrant). False for every other loop, and for the main loop of a process that called
    /// `dispatch_main()` before the main loop was made (libdispatch then serves the main queue from
    /// its worker threads, and has no handle to give). Safe from any thread. See <doc:MainQueue>.
    public var servesMainDispatchQueue: Bool {
        guard isMainLoop, let source = MainQueueDrain.source else { return false }
        return source.isValid && contains(source, inMode: .common)
    }

    /// The calling thread's loop, created on first use.
    ///
    /// In a process made by `fork()`, the thread's loop is a new one: a loop made before the fork
    /// shares its kernel descriptors with the parent (see <doc:FailureModes>).
    public static var current: RunLoop { loopOfCurrentThread(mainLoop: { main }) }

    /// The main thread's loop, reachable from any thread (it runs only on the main thread).
    ///
    /// Running in a common mode, it serves `DispatchQueue.main` and so `@MainActor` jobs, as
    /// CoreFoundation's main loop does, and the main queue keeps its common modes from being empty
    /// (see <doc:MainQueue>). In a process made by `fork()` it is a new loop, which does not serve
    /// the main queue (libdispatch cannot be used in a forked child).
    public static var main: RunLoop { MainLoopSlot.loop(setUp: MainQueueDrain.attach) }
}

/// The main queue's version-1 source and its handler.
enum MainQueueDrain {
    /// Adds the main queue's source to a new main loop's common modes. Runs once per main loop,
    /// on whichever thread first asks for it: the source's handler runs only where the main loop
    /// runs, on the main thread. Not in a child of fork(), where libdispatch cannot be used.
    static func attach(to loop: RunLoop) {
        guard crlk_fork_generation() == 0, let source else { return }
        loop.add(source, forMode: .common)
        loop.setDispatchPort(source)
    }

    /// The source on libdispatch's main-queue eventfd, or nil where libdispatch has none.
    ///
    /// Order `Int.min`: it is handled before the mode's other version-1 sources, right after the
    /// timers, where CF handles the main queue. It does not own the descriptor (libdispatch does).
    static let source: FileDescriptorSource? = {
        let handle = _dispatch_get_main_queue_handle_4CF()
        // -1: dispatch_main() has run; the main queue is no longer bound to the main thread.
        guard handle >= 0 else { return nil }
        do {
            let source = try FileDescriptorSource(
                descriptor: handle, watching: .readable, ownsDescriptor: false, order: .min, handler: serve)
            source.isLibrarySource.store(true, ordering: .relaxed)
            // What traces and stall reports call its callouts (libdispatch's drain).
            source.label = "main queue"
            return source
        } catch {
            Diagnostics.error(
                "cannot watch libdispatch's main-queue descriptor \(handle): \(error); RunLoop.main will not serve DispatchQueue.main"
            )
            return nil
        }
    }()

    /// Reads the eventfd (libdispatch never resets it), then runs the main queue's blocks.
    ///
    /// While they run, the source is out of the common modes, as CF stops waiting on the main
    /// queue and stops counting it as an item inside a main-queue callout
    /// (`__CFTSDKeyIsInGCDMainQ`): libdispatch would run nothing for a run nested in one of the
    /// blocks (its drain is not re-entrant), so such a run neither wakes for the eventfd nor counts
    /// the main queue, and in an otherwise empty mode returns ``RunLoop/RunResult/finished`` at
    /// once. Blocks queued meanwhile run after the block that nested the run returns. Leaving and
    /// rejoining costs about 2 µs per drain (two locked item changes and an `epoll_ctl` each per
    /// common mode); a queue-and-drain round is about 4 µs here, CF's 6 to 9 µs.
    private static func serve(_ source: FileDescriptorSource, _ events: FileDescriptorSource.Events) {
        guard events.contains(.readable), events.isDisjoint(with: [.hangUp, .error, .closed]) else {
            // libdispatch closed its eventfd (dispatch_main() ran): the loop invalidates the source
            // when this returns.
            Diagnostics.warning(
                "libdispatch's main-queue descriptor \(source.descriptor) reported \(events); RunLoop.main stops serving DispatchQueue.main"
            )
            return
        }
        // The handler runs only on the main loop's thread, in one of its runs: RunLoop.main exists.
        let loop = RunLoop.main
        // The main queue and the main loop's serial executor (the main actor's, once
        // RunLoopConcurrency installs it; actors pinned to RunLoop.main) are one isolation, as on
        // Darwin's main thread: neither runs inside the other. Inside a nested run started by such
        // a job, the queue waits (its eventfd stays set) and rejoins when that job returns.
        let executor = loop.serialExecutor
        guard executor.enterExclusive() else {
            loop.remove(source, forMode: .common)
            executor.whenIdle { loop.add(source, forMode: .common) }
            return
        }
        defer { executor.leaveExclusive() }
        do throws(Errno) { try Counter.drain(source.descriptor, .caller) } catch {
            // Not expected (the eventfd was reported readable); libdispatch's queue is drained
            // anyway, and the next wait reports the eventfd again if it is still set.
            Diagnostics.error("reading libdispatch's main-queue descriptor \(source.descriptor) failed: \(error)")
        }
        loop.remove(source, forMode: .common)
        _dispatch_main_queue_callback_4CF(nil)
        // Level-triggered: if blocks were queued meanwhile, libdispatch wrote the eventfd again and
        // the next wait reports it.
        loop.add(source, forMode: .common)
    }
}
