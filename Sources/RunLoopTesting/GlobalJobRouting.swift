import Glibc
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

// Unstructured tasks started by the code under test (`Task {}`, `Task.detached {}`) run on the
// global concurrent executor, and their jobs reach a virtual-time loop only after `advance(by:)`
// has returned, if at all. So, inside a virtual-time scope, a job enqueued on the global executor
// *from the scope's thread* runs on the scope's loop instead: a task the test body starts, and
// every resumption the loop's callouts cause (a sleep on the virtual clock ending in a timer, a
// continuation resumed in a block), runs inside the test's `advance(by:)`, in order, with no
// thread racing the test. Jobs enqueued from other threads, and every job outside a scope, go to
// the platform's executor as before.
//
// The seam is the Swift runtime's `swift_task_enqueueGlobal_hook`: an exported, writable function
// pointer that `swift_task_enqueueGlobal` calls, when set, with the job and the runtime's own
// implementation. It is the runtime's underscored ABI, not API (checked on Swift 6.3.1, x86_64
// and aarch64 Linux; swift-concurrency-extras' `withMainSerialExecutor` uses the same variable).
// It is found with `dlsym` when the first scope starts; a runtime without it gets a one-time
// warning and scopes that do not route. A hook another library installed first is kept and
// called for every job this one does not take; one installed later replaces this one until it
// puts it back (each scope re-installs it if it finds it gone).
//
// The runtime's two delayed-enqueue hooks (`…WithDelay_hook`, `…WithDeadline_hook`) are not
// used: Swift 6.3.1 schedules `Task.sleep` through its global executor's `SchedulingExecutor`
// conformance and never calls them (measured: 0 calls for `Task.sleep(for:)`,
// `Task.sleep(until:clock:)` and `Task.sleep(nanoseconds:)`), so a plain `Task.sleep` stays on
// real time; sleep on the scope's clock (`time.clock`, an injected `any Clock<Duration>`).

enum GlobalJobRouting {
    typealias Original = @convention(thin) (UnownedJob) -> Void
    typealias Hook = @convention(thin) (UnownedJob, Original) -> Void

    /// The address of the runtime's hook variable, or 0 when this runtime has none (an address,
    /// not a pointer: a constant the hook's readers share).
    private static let hookAddress: UInt = {
        guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "swift_task_enqueueGlobal_hook") else { return 0 }
        return UInt(bitPattern: symbol)
    }()

    /// The runtime's hook variable, or nil when this runtime has none.
    private static var hookVariable: UnsafeMutablePointer<Hook?>? {
        UnsafeMutablePointer(bitPattern: hookAddress)
    }

    /// The hook that was installed before this one (another library's), as a raw pointer; 0 if
    /// none. Read by the hook on any thread.
    private static let chained = Atomic<UInt>(0)
    /// The runtime's own implementation, as the hook is handed it (the same every call); 0 until
    /// the hook first runs. A job that no scope ran is handed back to it.
    private static let original = Atomic<UInt>(0)
    private static let installLock = Mutex(false)

    /// Installs the hook unless it is installed; a warning, once, if this runtime has no hook.
    /// Any thread.
    static func install() {
        let missing = installLock.locked { warned -> Bool in
            guard let variable = hookVariable else {
                defer { warned = true }
                return !warned
            }
            let ours = unsafeBitCast(route, to: UInt.self)
            let current = variable.pointee.map { unsafeBitCast($0, to: UInt.self) } ?? 0
            guard current != ours else { return false }
            chained.store(current, ordering: .releasing)
            variable.pointee = route
            return false
        }
        if missing {
            print(
                "RunLoopTesting: warning: this Swift runtime exports no swift_task_enqueueGlobal_hook; unstructured tasks started inside withVirtualTime run on the global pool, not on the virtual loop (run such code on the loop: Task(executorPreference: time.runLoop))"
            )
        }
    }

    /// Whether the hook can route jobs in this process.
    static var isAvailable: Bool { hookVariable != nil }

    /// The hook: a job enqueued from a thread on virtual time runs on that thread's virtual loop.
    private static var route: Hook { { job, runtimeEnqueue in routeGlobalJob(job, runtimeEnqueue) } }

    fileprivate static func routeJob(_ job: UnownedJob, _ runtimeEnqueue: Original) {
        // The same function every call: stored once, so that the hook, which sees every global
        // job of the process, writes no shared cache line after the first.
        if original.load(ordering: .relaxed) == 0 {
            original.store(unsafeBitCast(runtimeEnqueue, to: UInt.self), ordering: .relaxed)
        }
        if let loop = RunLoop.virtualTimeLoopOfCurrentThread {
            let routed = RoutedJob(job)
            loop.perform(inModes: [.common]) { routed.run() }
            return
        }
        let previous = chained.load(ordering: .acquiring)
        if previous != 0 {
            unsafeBitCast(previous, to: Hook.self)(job, runtimeEnqueue)
        } else {
            runtimeEnqueue(job)
        }
    }

    /// Hands `job` to the runtime's own global executor, bypassing every hook (a routed job whose
    /// loop went away before running it).
    static func enqueueOnPlatform(_ job: UnownedJob) {
        let raw = original.load(ordering: .relaxed)
        // The hook stored it before it made the RoutedJob that calls this.
        unsafeBitCast(raw, to: Original.self)(job)
    }
}

/// The hook's body (a free function: a thin function value may not refer to a type's members).
private func routeGlobalJob(_ job: UnownedJob, _ runtimeEnqueue: GlobalJobRouting.Original) {
    GlobalJobRouting.routeJob(job, runtimeEnqueue)
}

/// A job routed to a virtual-time loop: run by the loop's block, or — if the loop drops the block
/// (its scope ended first) — handed to the platform's global executor, so no task is lost.
final class RoutedJob: Sendable {
    private let job: UnownedJob
    private let claimed = Atomic<Bool>(false)

    init(_ job: UnownedJob) { self.job = job }

    /// Runs the job here, on the virtual loop's thread, as the global executor would run it.
    func run() {
        guard !claimed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        job.runSynchronously(on: globalConcurrentExecutor.asUnownedTaskExecutor())
    }

    deinit {
        guard !claimed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        GlobalJobRouting.enqueueOnPlatform(job)
    }
}
