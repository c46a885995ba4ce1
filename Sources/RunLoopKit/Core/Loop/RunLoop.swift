import CRunLoopKit
import Glibc
import Logging
import Synchronization
import SystemPackage

// Threading, in one place (the DocC article "Threading" says the same for users).
//
// Threads. A loop runs only on its own thread: the run entry points and limitDate start with
// preconditionOnOwnThread. Everything else (adding and removing items, perform, stop, wakeUp,
// the instrumentation readers) is safe from any thread.
//
// Locks, outermost first; a lock is never taken while one below it in this list is held:
//   1. The loop's `state` (Mutex<LoopState>): the mode table (each mode's version-0 sources,
//      observers, timer heap, version-1 sources, descriptor registrations and interest set), the
//      common modes and common items, the descriptor owners by number, the running modes, the
//      armed timerfd deadline, `tornDown`. The kernel backend's registration calls and the timerfd
//      arming are made under it (it orders them).
//   2. An item's own lock: a timer's `state`, a version-1 source's `registration`, a version-0
//      source's or an observer's `registrations`. Item methods that need the loop read the loop
//      under the item's lock, let it go, and call the loop, which takes 1 then 2.
//   3. Leaf locks, under which nothing else is taken: a port's `queue`, the block inbox's spin
//      lock, the instrumentation's reporters, the attachments, the backend's `closed` flag.
//   State only the loop's thread touches is in `confined` (LoopThreadState), with no lock.
//
// No lock is held while user code runs: each phase takes its items out under the lock (or from
// the run's copy of the mode's lists, re-read when `itemsVersion` moves) and calls them after.
// What may run deinits is released after the lock (`withState` releases dropped timer entries;
// `mutatingItems` sends wakeups decided under the lock once it is let go). User code is called
// from doObservers, doBlocks, doSources0, doTimers, doSources1 and reportPass (RunLoop+Run.swift and its siblings),
// from add/remove/invalidate of a version-0 source (onSchedule/onCancel, on the calling thread),
// and from the thread-exit teardown (onCancel, deinits).
//
// The wake protocol (whether a pass sleeps, what ends a sleep, and why no wakeup is lost) is
// written once, with its table of flags and transitions, at the top of Loop/WakeProtocol.swift.

/// A thread's event loop, with CoreFoundation's semantics (CFRunLoop / NSRunLoop), for Linux.
///
/// Every thread has at most one loop, created the first time the thread asks for
/// ``current``; ``main`` is the main thread's and can be reached from any thread. A loop runs only
/// on its own thread, in one mode at a time, and sleeps in the kernel (`epoll_wait`) until one of
/// the mode's timers is due, a source fires, a block is performed, or another thread calls
/// ``wakeUp()``. Items (sources, timers, observers) and blocks can be added from any thread.
///
/// ```swift
/// let loop = RunLoop.current
/// let timer = RunLoopTimer(after: .milliseconds(10), repeating: .milliseconds(10)) { _ in print("tick") }
/// loop.add(timer, forMode: .common)
/// loop.run(mode: .default, for: .seconds(1))
/// ```
///
/// When the thread exits, its loop is torn down: its items are removed (sources get their cancel
/// callbacks) and its kernel descriptors are closed.
public final class RunLoop: Sendable, Hashable, CustomStringConvertible {
    /// Items, modes and blocks: everything other threads may change.
    let state = Mutex(LoopState())
    /// The kernel side, set once the loop's descriptors could be opened (normally at creation;
    /// a loop made while the process was out of descriptors retries at each run and each wait,
    /// and until then sleeps on ``futex``).
    let backendSlot = AtomicLazyReference<EpollBackend>()
    /// The backend opened when the loop was made (the usual case): a `let`, which the hot paths
    /// read without reference counting.
    private let initialBackend: EpollBackend?
    /// The kernel side; nil while the loop's descriptors cannot be opened.
    @inline(__always)
    var backend: EpollBackend? { initialBackend ?? backendSlot.load() }
    /// Whether the loop has its kernel descriptors, without taking a reference (every pass asks).
    @inline(__always)
    var hasKernelDescriptors: Bool { initialBackend != nil || backendSlot.load() != nil }
    /// Where a loop without kernel descriptors sleeps.
    let futex = FutexWord()
    /// `crlk_fork_generation()` when the loop was made: a loop made before a fork(2) shares its
    /// descriptors with the parent and must not be used in the child.
    let forkGeneration: UInt64
    /// State only the loop's own thread touches.
    let confined = LoopThreadState()

    /// The owning thread's kernel id and name, for messages.
    let ownerTID: Int32
    let ownerName: String
    let isMainLoop: Bool

    /// Whether the loop sleeps and what ends its sleep: wakeup requests, the ignore window, stops
    /// (Loop/WakeProtocol.swift).
    let wake = WakeProtocol()
    /// Bumped (under the lock) whenever a mode's sources, observers or timers change, so a run can
    /// keep its mode's item lists between passes and re-read them only after a change.
    let itemsVersion = Atomic<UInt64>(0)
    /// How many `RunLoopPendingWork` objects hold ``Mode/common`` (each mode's own count is in
    /// its `ModeState`).
    let commonPendingWork = PendingWorkCount()
    /// Blocks on their way from ``perform(inModes:_:)->()`` to the loop's thread.
    let inbox = BlockQueue()
    /// Set when the thread exits: blocks performed after that are dropped.
    let blocksClosed = Atomic<Bool>(false)
    /// ``timerSpinWindow`` in nanoseconds.
    let timerSpinNs = Atomic<Int64>(0)
    /// ``wakeUpSpinWindow`` in nanoseconds.
    let wakeUpSpinNs = Atomic<Int64>(LoopThreadState.spinNs)
    /// The instrumentation seam: phase, generation, reporters (Instrumentation.swift).
    let instrumentation = LoopInstrumentation()
    /// Per-loop objects of the layers above the core (see ``LoopAttachments``).
    let attachments = LoopAttachments()
    /// The loop's serial executor, made on first use (see ``serialExecutor``).
    private let serialExecutorSlot = AtomicLazyReference<LoopSerialExecutor>()
    /// The serial executor of actors pinned to the loop (its conformance is the concurrency
    /// layer's): an object of its own, since the loop itself is the task executor. Any thread; one
    /// atomic load once made.
    var serialExecutor: LoopSerialExecutor {
        serialExecutorSlot.load() ?? serialExecutorSlot.storeIfNil(LoopSerialExecutor(loop: self))
    }
    /// The loop's virtual clock, published for other threads (VirtualTime.swift); `Int64.min`
    /// for a loop on real time.
    let virtualClockNs = Atomic<Int64>(.min)

    init(ownerTID: Int32, ownerName: String, isMainLoop: Bool) {
        self.ownerTID = ownerTID
        self.ownerName = ownerName
        self.isMainLoop = isMainLoop
        crlk_watch_forks()
        self.forkGeneration = crlk_fork_generation()
        do {
            initialBackend = try EpollBackend(ownerTID: ownerTID)
        } catch {
            initialBackend = nil
            reportMissingDescriptors(error)
        }
    }

    /// Logs, once per stretch without them, that the loop could not open its kernel descriptors.
    private func reportMissingDescriptors(_ error: any Error) {
        guard !confined.lackedDescriptors else { return }
        confined.lackedDescriptors = true
        Diagnostics.error(
            "cannot open the kernel descriptors of \(shortDescription): \(error); until it can (retried at each run and at least every \(LoopThreadState.descriptorRetryNs / 1_000_000) ms while it sleeps), it sleeps on a futex: timers, blocks, sources and ports keep working, descriptor sources are not watched"
        )
    }

    /// Opens the loop's epoll set, eventfd and timerfd if it has none yet; returns whether it has
    /// them. Out of descriptors, the loop keeps working without them (it sleeps on a futex; timers,
    /// blocks, version-0 sources and ports work, descriptor sources wait) and retries here at each
    /// run and each wait. Loop thread.
    @discardableResult
    func openKernelDescriptors() -> Bool {
        if hasKernelDescriptors { return true }
        do {
            _ = backendSlot.storeIfNil(try EpollBackend(ownerTID: ownerTID))
            wake.sleepsOnFutex.store(false, ordering: .sequentiallyConsistent)
            // The timerfd starts disarmed; the next wait arms it for what is due. Through
            // mutatingItems: a run in progress must re-read its items, which name the epoll set.
            mutatingItems { state in state.armedDeadline = LoopClock.never }
            if confined.lackedDescriptors {
                confined.lackedDescriptors = false
                Diagnostics.warning("\(shortDescription) opened its kernel descriptors; it sleeps in epoll again")
            }
            return true
        } catch {
            reportMissingDescriptors(error)
            return false
        }
    }

    // MARK: Loops and threads

    /// The calling thread's loop, made on first use; on the main thread, `mainLoop()` (the public
    /// door, ``current``, lives with the main-queue integration, which sets the main loop up).
    ///
    /// In a process made by `fork()`, the thread's loop is a new one: a loop made before the fork
    /// shares its kernel descriptors with the parent.
    static func loopOfCurrentThread(mainLoop: () -> RunLoop) -> RunLoop {
        if let raw = pthread_getspecific(ThreadLoops.key) {
            let loop = Unmanaged<RunLoop>.fromOpaque(raw).takeUnretainedValue()
            if !loop.isFromBeforeFork { return loop }
            // The parent's loop, inherited through fork(): left alone (its locks may be held by
            // threads the child does not have) and replaced.
        }
        let loop =
            crlk_is_main_thread()
            ? mainLoop() : RunLoop(ownerTID: crlk_gettid(), ownerName: ThreadLoops.currentName(), isMainLoop: false)
        pthread_setspecific(ThreadLoops.key, Unmanaged.passRetained(loop).toOpaque())
        return loop
    }

    /// The calling thread's loop if it has one and is running it now, without making one: the
    /// loop whose job (an actor's, a task's that prefers it) the caller runs in, when the caller
    /// is async code on a loop's thread (RunLoopConcurrency's executors).
    package static var runningOnCurrentThread: RunLoop? {
        let loop: RunLoop
        if let raw = pthread_getspecific(ThreadLoops.key) {
            loop = Unmanaged<RunLoop>.fromOpaque(raw).takeUnretainedValue()
        } else if crlk_is_main_thread(), let main = MainLoopSlot.existing {
            loop = main
        } else {
            return nil
        }
        return !loop.isFromBeforeFork && loop.confined.runDepth > 0 ? loop : nil
    }

    /// How many runs of the loop are in progress (nested runs count each). Any thread.
    package var runDepth: Int { state.locked { $0.runningModes.count } }

    /// ``runDepth`` without the lock, for the loop's own callouts (an observer's): only on the
    /// loop's thread, which alone changes it.
    package var runDepthOnOwnThread: Int { confined.runDepth }

    /// Whether the loop was made before this process was forked (so it belongs to the parent).
    @inline(__always)
    var isFromBeforeFork: Bool { forkGeneration != crlk_fork_generation() }

    /// Stops the process with a clear message if the loop was made before a fork (see
    /// ``current``): its descriptors are the parent's, and using them would steal the parent's
    /// wakeups and timers.
    @inline(__always)
    func preconditionNotForked(_ function: StaticString) {
        guard _slowPath(isFromBeforeFork) else { return }
        fatalError(
            "RunLoop.\(function) on \(shortDescription), which was made before this process was forked: its epoll, eventfd and timerfd are shared with the parent process. In a child of fork(), use RunLoop.current or RunLoop.main (new loops), or exec."
        )
    }

    /// Whether the calling thread is the loop's own thread.
    public var isCurrent: Bool {
        if let raw = pthread_getspecific(ThreadLoops.key) {
            return raw == Unmanaged.passUnretained(self).toOpaque()
        }
        return isMainLoop && crlk_is_main_thread()
    }

    /// Stops the process with a message naming the loop and both threads unless the caller is on
    /// the loop's own thread.
    @inline(__always)
    func preconditionOnOwnThread(_ function: StaticString) {
        preconditionNotForked(function)
        guard !isCurrent else { return }
        wrongThread(function)
    }

    /// Stops the process with a message naming the loop and both threads, and, when the caller
    /// runs in a Swift concurrency task, why it is not on the thread it may expect.
    private func wrongThread(_ function: StaticString) -> Never {
        var message =
            "RunLoop.\(function) called on thread '\(ThreadLoops.currentName())' (tid \(crlk_gettid())), but \(shortDescription) belongs to thread '\(ownerName)' (tid \(ownerTID)); a loop runs only on its own thread"
        if withUnsafeCurrentTask(body: { $0 != nil }) {
            message +=
                ". The caller runs in a Swift concurrency task, on one of the concurrency runtime's pool threads: after an `await` (in an async `main` too) a task resumes on whatever thread its executor picks, not on the thread it started on"
            if isMainLoop {
                message +=
                    ". Run RunLoop.main from a synchronous `main` (before any `await`), and reach it from async code with `await loop.submit { ... }` or an actor pinned to the loop"
            } else {
                message += ". Run a loop from the thread that owns it (a PermanentThread, or a Thread you start), and reach it from async code with `await loop.submit { ... }`"
            }
        }
        // fatalError, not preconditionFailure: the message must name the threads in -O builds too.
        fatalError(message)
    }

    /// Called by the thread-exit hook: removes every item and closes the kernel descriptors.
    func tearDown() {
        let (sources, timers, observers, sources1) = mutatingItems { state in
            state.tornDown = true
            // Every item, those only in the common lists (added for .common, then removed from
            // every mode) included: each holds a reference to this loop that must be cleared. They
            // are let go after the lock, with these lists (a last reference dropped runs deinits).
            var sources: [(RunLoopSource, RunLoop.Mode?)] = []
            var timers: [RunLoopTimer] = state.commonTimers
            var observers: [RunLoopObserver] = state.commonObservers
            for mode in state.modes {
                for source in mode.sources { sources.append((source, mode.name)) }
                for entry in mode.timers.entries where entry.isLive { timers.append(entry.timer) }
                observers.append(contentsOf: mode.observers)
            }
            for source in state.commonSources { sources.append((source, nil)) }
            for index in state.modes.indices {
                state.modes[index].sources.removeAll()
                state.modes[index].observers.removeAll()
                state.modes[index].observerMask = 0
                state.modes[index].timers.removeAll(graveyard: &state.graveyard)
                state.modes[index].timerCount = 0
            }
            state.commonSources.removeAll()
            state.commonObservers.removeAll()
            state.commonTimers.removeAll()
            var sources1: [any Source1Item] = []
            for index in state.modes.indices {
                for item in state.modes[index].sources1 where !sources1.contains(where: { $0 === item }) {
                    sources1.append(item)
                }
                state.modes[index].sources1.removeAll()
                state.modes[index].descriptors.removeAll()
                state.modes[index].descriptorNumbers.removeAll()
                if let set = state.modes[index].interestSet {
                    backend?.closeSet(set)
                    state.modes[index].interestSet = nil
                }
            }
            for item in state.commonSources1 where !sources1.contains(where: { $0 === item }) { sources1.append(item) }
            state.commonSources1.removeAll()
            state.descriptorOwners.removeAll()
            // Untied under each item's lock (see LoopRef); they stay valid and can join another loop.
            for item in sources1 {
                item.withRegistration { registration in
                    guard registration.loop === self else { return }
                    registration.loop = nil
                    registration.modes.removeAll()
                    registration.inCommonModes = false
                }
            }
            return (sources, timers, observers, sources1)
        }
        for timer in timers {
            timer.state.locked { timer in
                if timer.loop === self || timer.loop == nil {
                    timer.loop = nil
                    timer.modes.removeAll()
                    timer.inCommonModes = false
                }
            }
        }
        for observer in observers { observer.registrations.locked { $0.removeAll { $0.loop === self } } }
        for (source, mode) in sources {
            source.registrations.locked { $0.removeAll { $0.loop === self } }
            if let mode { source.cancelCallout?(self, mode) }
        }
        // A descriptor source or port whose thread is gone can never deliver again: invalidated,
        // so owned descriptors are closed and later sends throw instead of piling up.
        for item in sources1 { item.invalidateItem() }
        // Blocks still queued can never run now; the thread exit drops them (this runs on the
        // loop's own thread, the queue's consumer): a task's job goes on elsewhere.
        blocksClosed.store(true, ordering: .releasing)
        let queued = inbox.close()
        while let block = confined.blocks.popFirst() { block.dropped(by: self) }
        while let block = queued.popFirst() { block.dropped(by: self) }
        backend?.close()
    }

    // MARK: Identity

    /// Loops are equal only to themselves.
    public static func == (lhs: RunLoop, rhs: RunLoop) -> Bool { lhs === rhs }

    /// Hashes the loop's identity.
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }

    package var shortDescription: String { "<RunLoop \(objectAddress(self)) thread '\(ownerName)' tid \(ownerTID)>" }
}

/// Where ``RunLoop/main`` lives: made on first use, and made again in a child of fork() (the
/// parent's main loop shares its descriptors with the parent). A compare-and-swap on a retained
/// pointer rather than a lock, because a lock could be held, at the fork, by a thread the child
/// does not have.
enum MainLoopSlot {
    private static let slot = Atomic<UInt>(0)

    /// The main loop if it was made (without making it).
    static var existing: RunLoop? {
        let raw = slot.load(ordering: .acquiring)
        guard raw != 0 else { return nil }
        return Unmanaged<RunLoop>.fromOpaque(UnsafeRawPointer(bitPattern: raw)!).takeUnretainedValue()
    }

    /// The main loop; `setUp` runs once on a new one, on the thread that made it.
    static func loop(setUp: (RunLoop) -> Void) -> RunLoop {
        let raw = slot.load(ordering: .acquiring)
        if raw != 0 {
            let loop = Unmanaged<RunLoop>.fromOpaque(UnsafeRawPointer(bitPattern: raw)!).takeUnretainedValue()
            if !loop.isFromBeforeFork { return loop }
        }
        return make(replacing: raw, setUp: setUp)
    }

    private static func make(replacing old: UInt, setUp: (RunLoop) -> Void) -> RunLoop {
        let loop = RunLoop.makeMain()
        let new = UInt(bitPattern: Unmanaged.passRetained(loop).toOpaque())
        let (exchanged, current) = slot.compareExchange(
            expected: old, desired: new, ordering: .acquiringAndReleasing)
        guard exchanged else {
            Unmanaged<RunLoop>.fromOpaque(UnsafeRawPointer(bitPattern: new)!).release()
            return Unmanaged<RunLoop>.fromOpaque(UnsafeRawPointer(bitPattern: current)!).takeUnretainedValue()
        }
        // The replaced loop (the parent's, in a forked child) is left alone, as `current` does.
        setUp(loop)
        return loop
    }
}

extension RunLoop {
    /// A new main loop (see ``MainLoopSlot``).
    fileprivate static func makeMain() -> RunLoop { RunLoop(ownerTID: getpid(), ownerName: "main", isMainLoop: true) }
}

/// The thread-local slot that maps a thread to its loop, and the thread-exit hook.
enum ThreadLoops {
    /// The key; its destructor runs when a thread with a loop exits and tears the loop down.
    static let key: pthread_key_t = {
        var key = pthread_key_t()
        let status = pthread_key_create(&key) { raw in
            guard let raw else { return }
            let loop = Unmanaged<RunLoop>.fromOpaque(raw).takeRetainedValue()
            // A loop inherited through fork() belongs to the parent: left alone.
            guard !loop.isMainLoop, !loop.isFromBeforeFork else { return }
            // The teardown's callbacks (cancel callbacks, deinits) run on this thread, which is
            // still the loop's: the slot points at the loop meanwhile, so `isCurrent`,
            // `RunLoop.current`, `perform(waitUntilDone:)` and `LoopBound` see it. Cleared after,
            // so the destructor is not called again.
            pthread_setspecific(ThreadLoops.key, raw)
            loop.tearDown()
            pthread_setspecific(ThreadLoops.key, nil)
        }
        fatalPrecondition(status == 0, "RunLoopKit: pthread_key_create failed (\(status))")
        return key
    }()

    /// The calling thread's name, or `tid N` when it has none.
    static func currentName() -> String {
        var buffer = [CChar](repeating: 0, count: 64)
        guard crlk_get_thread_name(&buffer, buffer.count) == 0 else { return "tid \(crlk_gettid())" }
        let name = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return name.isEmpty ? "tid \(crlk_gettid())" : name
    }
}

/// Log messages of the library, through swift-log (`Logger(label: "RunLoopKit")`).
enum Diagnostics {
    /// `RUNLOOPKIT_DEBUG=1` in the environment: misuse that is legal in CoreFoundation and silent
    /// there (a run of an empty mode, a dropped `stop()`) is logged too. Read once.
    static let debugEnabled: Bool = {
        guard let value = getenv("RUNLOOPKIT_DEBUG") else { return false }
        return String(cString: value) == "1"
    }()

    static func warning(_ message: @autoclosure () -> String) {
        Logger(label: "RunLoopKit").warning("\(message())")
    }

    static func error(_ message: @autoclosure () -> String) {
        Logger(label: "RunLoopKit").error("\(message())")
    }
}
