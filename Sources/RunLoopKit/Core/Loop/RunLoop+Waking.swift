import CRunLoopKit
import Glibc
import Synchronization

// Waking and stopping a loop from any thread: the callers of the wake protocol's waker side
// (Loop/WakeProtocol.swift).

extension RunLoop {
    // MARK: Waking and stopping

    /// Wakes the loop if it sleeps; if it is running and has not slept yet in this pass, its next
    /// sleep returns at once. Safe from any thread. A wakeup with nothing to do is not a handled
    /// source: the run goes on.
    ///
    /// As in CoreFoundation, a wakeup is ignored while the loop is not running and from the end of
    /// a sleep until the next pass begins (the pass handles what woke it, and the next pass looks
    /// at every source anyway). Unlike CoreFoundation, the next pass does not sleep if the mode
    /// is then empty: the run returns ``RunResult/finished``. So emptying a mode from another
    /// thread and then calling `wakeUp()` always ends the run.
    public func wakeUp() {
        if wake.requestByUser().mustSignal { signalSleeper() }
    }

    /// Whether the loop is sleeping in the kernel right now (or about to).
    public var isWaiting: Bool { wake.sleeping.load(ordering: .acquiring) }

    /// How long before a timer is due the loop stops sleeping in the kernel and spins instead,
    /// trading CPU time for punctuality. `.zero` (the default) sleeps until the timer is due, as
    /// CoreFoundation does: a timer then fires late by the kernel's wakeup latency, tens of
    /// microseconds on a virtual machine and more under load.
    ///
    /// With a window `w`, a sleep that a timer ends is cut short by `w`: the loop wakes `w` early,
    /// then waits out the rest on the CPU, watching for wakeups from other threads. Set it for
    /// frame-aligned or measurement timers where a late fire matters more than a core's time; the
    /// cost is up to `w` of busy CPU per timer fire (a 200 µs window on a 1 ms timer is a fifth of
    /// a core). Observers see the spin as a wait: `beforeWaiting`, then `afterWaiting`, possibly
    /// twice for one timer (once for the early wakeup, once for the spin). Negative values count
    /// as zero. Safe from any thread; takes effect at the loop's next sleep.
    public var timerSpinWindow: Duration {
        get { .nanoseconds(timerSpinNs.load(ordering: .relaxed)) }
        set { timerSpinNs.store(max(0, newValue.saturatedNanoseconds), ordering: .relaxed) }
    }

    /// How long the loop watches for the next wakeup on the CPU, right after another thread woke
    /// it, before it sleeps in the kernel again. 5 µs by default, about the price of one sleep
    /// and wakeup: a producer that hands work over in quick succession (a request and its reply,
    /// a stream of blocks) then finds the loop awake, and neither side pays for a wakeup.
    ///
    /// The spin only follows a wakeup from another thread, and only in modes without descriptor
    /// sources, so an idle loop or one woken by its own timers never spins. Its price is CPU time:
    /// up to the window per cross-thread wakeup. Set `.zero` where that matters more than latency
    /// (a loop that shares its core with its producer, a battery-powered device, a machine with
    /// more busy threads than cores). Negative values count as zero; values above 1 ms count as
    /// 1 ms. Safe from any thread; takes effect at the loop's next sleep.
    public var wakeUpSpinWindow: Duration {
        get { .nanoseconds(wakeUpSpinNs.load(ordering: .relaxed)) }
        set {
            let ns = min(max(0, newValue.saturatedNanoseconds), LoopThreadState.maximumSpinNs)
            wakeUpSpinNs.store(ns, ordering: .relaxed)
        }
    }

    /// Ends the innermost run in progress with ``RunResult/stopped``. Safe from any thread. A stop
    /// while the loop is not running is dropped, as in CoreFoundation.
    public func stop() {
        guard wake.requestStop() else {
            if Diagnostics.debugEnabled {
                Diagnostics.warning(
                    "stop() on \(shortDescription), which is not running: dropped, as CoreFoundation drops it (to stop a keep-alive loop, perform { loop.stop() } on it, or clear its keep-running flag)"
                )
            }
            return
        }
        // CFRunLoopStop wakes the loop as CFRunLoopWakeUp does; a pass in progress ends with the
        // stop at its end in any case.
        wakeUp()
    }

    /// The coalesced wakeup: asks for it, and writes the eventfd only if the loop sleeps and no
    /// other waker got there first (the wake protocol's `request`).
    @inline(__always)
    func requestWakeUp() {
        if wake.request() { signalSleeper() }
    }

    /// Wakes the sleeping loop: writes its eventfd, or posts its futex while it has no descriptors.
    func signalSleeper() {
        preconditionNotForked("wakeUp()")
        if wake.sleepsOnFutex.load(ordering: .sequentiallyConsistent) {
            futex.post()
        } else {
            backend?.signal()
        }
    }
}
