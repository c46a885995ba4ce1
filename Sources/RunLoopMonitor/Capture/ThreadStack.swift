import CRunLoopMonitor
import Glibc
import RunLoopKit
import Synchronization

/// Captures the stack of any thread of the process, as it is now.
///
/// A running thread is sent a real-time signal (``signalNumber``, SIGRTMIN+7) with `tgkill`; its
/// handler, on that thread, writes the return addresses into a preallocated buffer and returns
/// (the thread is never parked), while the capturing thread waits on a futex. The handler is
/// async-signal-safe: it allocates nothing, takes no lock and restores `errno`. It walks the
/// frame-pointer chain (under a microsecond) when the thread registered its stack bounds
/// (``prepareCurrentThread()``), the interrupted code is in the main executable, and a
/// calibration at install showed that executable keeps frame pointers. Otherwise it walks the
/// DWARF unwind tables (`.eh_frame`, found with `_dl_find_object`; works in `-O` builds, where
/// Swift omits frame pointers) with an unwinder of its own that reads only the thread's stack:
/// its registered bounds, or, for a thread that registered none, through `process_vm_readv`,
/// which fails where a read would fault. An interrupt lands on any instruction, and the tables
/// are sometimes wrong there (AddressSanitizer's runtime has such instructions), so an unwinder
/// that trusts them, like glibc's `backtrace()`, can crash the process; this one ends the stack
/// early instead. `backtrace()` remains the fallback where the bounded walk is unavailable
/// (see ``RawStack/Unwinder/glibcBacktrace``).
///
/// Symbolication (``symbolicate(_:)->[StackFrame]``) happens on the calling thread, never in the handler, and
/// is cached per address: names come from the Swift runtime's symbolicator (full symbol tables and
/// DWARF: demangled names, file and line), else from `dladdr`; the image path and the
/// image-relative offset are always given for offline use (see ``StackFrame``).
///
/// A thread parked in the kernel (blocked in a system call, or stopped) is not signalled: its
/// stack is read where it is parked (``RawStack/Unwinder/parkedInKernel``), so its `usleep`,
/// `poll` or `read` goes on as if nobody had looked. Only a thread that is running gets the
/// signal, and only when it neither blocks the signal nor has one of ours pending, and while the
/// handler is still ThreadStack's (``ThreadStackError/handlerReplaced(signal:)`` otherwise). What
/// remains: a thread that enters a blocking call between the check and the signal's arrival has
/// that call interrupted (`nanosleep`, `epoll_wait`, `poll` return `EINTR`, as POSIX allows at any
/// time); BENCHMARKS.md (`parked`) measures how often.
public enum ThreadStack {
    /// How long ``capture(threadID:timeout:)`` waits for the handler by default.
    public static let defaultTimeout: Duration = .milliseconds(250)

    /// The signal the captures use (SIGRTMIN+7).
    public static var signalNumber: Int32 { crlm_default_signal() }

    /// Captures thread `threadID`'s stack and symbolicates it: innermost frame first, inlined
    /// functions as frames of their own.
    ///
    /// - Throws: ``ThreadStackError`` when the thread does not exist, does not answer within the
    ///   timeout (it blocks the signal, or is stopped), or the signal cannot be installed.
    public static func capture(threadID: Int32, timeout: Duration = defaultTimeout) throws(ThreadStackError) -> [StackFrame] {
        symbolicate(try captureAddresses(threadID: threadID, timeout: timeout))
    }

    /// Captures thread `threadID`'s stack as addresses, without symbolicating it (what a sampler
    /// does while a stall lasts; ``symbolicate(_:)->[StackFrame]`` later). One capture at a time per process;
    /// a capture waits for the one in progress.
    ///
    /// - Throws: ``ThreadStackError``.
    public static func captureAddresses(threadID: Int32, timeout: Duration = defaultTimeout) throws(ThreadStackError) -> RawStack {
        try engine.capture(threadID: threadID, timeout: timeout)
    }

    /// Names the addresses of `stack`: see ``StackFrame``. Cached per address; the first call
    /// loads the images' symbol tables (milliseconds), later ones cost microseconds per new
    /// address.
    public static func symbolicate(_ stack: RawStack) -> [StackFrame] {
        Symbolicator.shared.frames(for: stack.addresses)
    }

    /// Makes the calling thread capturable at its best, and is what a thread that wants to be
    /// monitored calls once: unblocks the capture signal for it (a thread started from a
    /// libdispatch worker or a Swift concurrency thread inherits a mask that blocks every signal,
    /// and its captures then fail with ``ThreadStackError/noAnswer(threadID:waited:signalBlocked:)``),
    /// and records its stack bounds, so that its captures may walk frame pointers when the
    /// executable keeps them. A ``StallMonitor`` does this on each loop it watches. Call
    /// ``forgetCurrentThread()`` before the thread exits (a stale entry is never used for a thread
    /// whose stack is elsewhere, but it takes one of 512 places).
    public static func prepareCurrentThread() {
        if crlm_signal_number() == 0 { try? install() }
        _ = crlm_unblock_signal()
        _ = crlm_register_current_thread()
    }

    /// Forgets the calling thread's stack bounds.
    public static func forgetCurrentThread() {
        crlm_unregister_current_thread()
    }

    /// Forgets the stack bounds of thread `threadID`, which exited, and closes its kept files.
    static func forget(threadID: Int32) {
        crlm_forget_thread(threadID)
    }

    /// Keeps thread `threadID`'s procfs files open, so that where it is can be read even when the
    /// process has no descriptor left (see `crlm_keep_thread_readable`). Returns whether they are.
    @discardableResult
    static func keepReadable(threadID: Int32) -> Bool {
        crlm_keep_thread_readable(threadID)
    }

    /// Closes what ``keepReadable(threadID:)`` kept open (the thread is no longer watched).
    static func releaseReadable(threadID: Int32) {
        crlm_release_thread_readable(threadID)
    }

    /// Installs the signal handler now (it is installed on first capture otherwise) and runs the
    /// frame-pointer calibration.
    ///
    /// - Throws: ``ThreadStackError/signalInUse(signal:)`` when the application installed its own
    ///   handler for ``signalNumber``.
    public static func install() throws(ThreadStackError) {
        try engine.install()
    }

    /// Whether captures walk the unwind tables with the bounded unwinder (x86-64 with glibc 2.35
    /// or later, and not under ThreadSanitizer, which defers signals and hands the handler a
    /// stale context) rather than glibc's `backtrace()`, for threads that called
    /// ``prepareCurrentThread()``; and for other threads too when the process may read its own
    /// memory with `process_vm_readv` (a seccomp filter can forbid it). Installs the handler.
    public static var boundedUnwindAvailable: Bool {
        try? install()
        var forOthers = false
        return crlm_bounded_unwind_available(&forOthers)
    }

    /// Whether threads that never called ``prepareCurrentThread()`` get the bounded unwinder too.
    public static var boundedUnwindAvailableForUnpreparedThreads: Bool {
        try? install()
        var forOthers = false
        return crlm_bounded_unwind_available(&forOthers) && forOthers
    }

    /// Whether a thread blocked in the kernel is read where it is parked, without a signal
    /// (``RawStack/Unwinder/parkedInKernel``): x86-64 with glibc 2.35 or later, and a process that
    /// may read its own memory with `process_vm_readv`. Elsewhere every capture signals the thread.
    /// Installs the handler.
    public static var parkedThreadsReadWithoutSignal: Bool {
        try? install()
        return crlm_parked_walk_available()
    }

    /// Whether captures may walk frame pointers in the main executable (found at install).
    public static var framePointersUsable: Bool { crlm_frame_pointers_usable() }

    /// From the last capture's signal to the end of its handler (what the benchmark reports).
    public static var lastCaptureLatency: Duration { .nanoseconds(crlm_last_capture_latency_ns()) }

    static let engine = CaptureEngine()
}

/// Why a stack could not be captured.
public enum ThreadStackError: Error, Sendable, Hashable, CustomStringConvertible {
    /// No thread with this id exists in the process (it exited, or never was).
    case noSuchThread(threadID: Int32)
    /// The thread did not run the handler within `waited`: it blocks the signal (`signalBlocked`
    /// true), is stopped, or exited meanwhile.
    case noAnswer(threadID: Int32, waited: Duration, signalBlocked: Bool)
    /// Another handler is installed for the capture signal.
    case signalInUse(signal: Int32)
    /// `sigaction` failed (an errno).
    case cannotInstall(signal: Int32, errno: Int32)
    /// `tgkill` failed for another reason than a missing thread (an errno).
    case sendFailed(threadID: Int32, errno: Int32)
    /// The capture signal no longer runs ThreadStack's handler: something reset it to its default
    /// action (which would kill the process) or installed a handler of its own after ThreadStack
    /// installed its. Nothing was sent.
    case handlerReplaced(signal: Int32)
    /// The watched thread is not known: a heartbeat source whose queue or loop has not answered
    /// a single heartbeat yet (so no thread of it was ever seen).
    case threadUnknown
    /// Where the thread is could not be read (`/proc/self/task/TID/syscall`: `errno`, EMFILE when
    /// the process has no descriptor left), and it was not seen using CPU: it is probably blocked
    /// in the kernel, where a signal would cut its call short, so none was sent and its stack is
    /// unknown. The thread exists. (Threads the stall monitor watches keep their files open, so
    /// they are read even then; see ``StallMonitor``.)
    case unreadable(threadID: Int32, errno: Int32)

    /// What went wrong, in words.
    public var description: String {
        switch self {
        case .noSuchThread(let id):
            "no thread \(id) in this process"
        case .noAnswer(let id, let waited, let blocked):
            blocked
                ? "thread \(id) blocks the capture signal (\(ThreadStack.signalNumber)); no stack after \(waited)"
                : "thread \(id) did not answer the capture signal within \(waited) (stopped, or exited meanwhile)"
        case .signalInUse(let signal):
            "signal \(signal) already has a handler; ThreadStack will not replace it"
        case .cannotInstall(let signal, let errno):
            "cannot install the handler for signal \(signal) (errno \(errno))"
        case .sendFailed(let id, let errno):
            "cannot signal thread \(id) (errno \(errno))"
        case .handlerReplaced(let signal):
            "the handler of signal \(signal) was replaced (reset to its default action, or another handler installed) after ThreadStack installed its own; no signal was sent"
        case .threadUnknown:
            "the watched thread is not known yet (it never answered a heartbeat), so its stack cannot be read"
        case .unreadable(let id, let errno):
            "cannot read where thread \(id) is (/proc/self/task/\(id)/syscall: \(String(cString: strerror(errno)))) and it is not running; no signal sent, no stack"
        }
    }
}

/// The process's one capture buffer and its install state; captures are serialized by its lock.
final class CaptureEngine: Sendable {
    private struct State {
        var installed = false
        var installError: ThreadStackError?
        let buffer = UnsafeMutablePointer<UInt64>.allocate(capacity: Int(CRLM_MAX_FRAMES))
    }

    /// Fork-safe: a child whose parent was mid-capture at the fork starts over (see
    /// ``ForkSafeLock``); the handler stays installed in the child (signal dispositions are
    /// inherited), so the child's first capture finds `crlm_install` already done.
    private let state = ForkSafeLock { State() }

    func install() throws(ThreadStackError) {
        try state.locked { state throws(ThreadStackError) in try Self.install(&state) }
    }

    private static func install(_ state: inout State) throws(ThreadStackError) {
        if state.installed { return }
        if let error = state.installError { throw error }
        let signal = crlm_default_signal()
        let result = crlm_install(signal)
        guard result == 0 else {
            let error: ThreadStackError = result == EBUSY ? .signalInUse(signal: signal) : .cannotInstall(signal: signal, errno: result)
            state.installError = error
            throw error
        }
        state.installed = true
        crlm_set_frame_pointers_usable(calibrate())
    }

    /// Whether the frame-pointer chain of this build matches what the unwind tables find: the
    /// chain's frames must appear, in order, among backtrace()'s.
    @inline(never)
    private static func calibrate() -> Bool {
        guard let calibration = calibrationCapture() else { return false }
        let unwound = calibration.backtrace, chained = calibration.framePointers
        let chainedCount = chained.count
        // The chain misses the frame whose callee (in libc) kept no frame record, so compare from
        // its second return address on: three in a row must match.
        guard chainedCount >= 4 else { return false }
        let chain = Array(chained[1..<min(Int(chainedCount), 4)])
        let table = unwound
        guard table.count >= chain.count else { return false }
        for start in 0...(table.count - chain.count) where Array(table[start..<start + chain.count]) == chain {
            return true
        }
        return false
    }

    private static func unwinder(_ method: Int32) -> RawStack.Unwinder {
        switch Int(method) {
        case Int(CRLM_UNWIND_FRAME_POINTERS): .framePointers
        case Int(CRLM_UNWIND_BACKTRACE): .glibcBacktrace
        case Int(CRLM_UNWIND_PARKED): .parkedInKernel
        default: .unwindTables
        }
    }

    /// The calling thread's stack, unwound by the handler every way it can (a way that is
    /// unavailable gives no frames); nil when the handler is not installed.
    static func calibrationCapture() -> (backtrace: [UInt64], framePointers: [UInt64], tables: [UInt64])? {
        // Registered for the capture only, unless it already was.
        let registeredHere = !crlm_current_thread_registered() && crlm_register_current_thread()
        defer { if registeredHere { crlm_unregister_current_thread() } }
        var unwound = [UInt64](repeating: 0, count: 64)
        var chained = [UInt64](repeating: 0, count: 64)
        var walked = [UInt64](repeating: 0, count: 64)
        var counts: (Int32, Int32, Int32) = (0, 0, 0)
        let done = unwound.withUnsafeMutableBufferPointer { unwound in
            chained.withUnsafeMutableBufferPointer { chained in
                walked.withUnsafeMutableBufferPointer { walked in
                    crlm_calibrate(
                        unwound.baseAddress, &counts.0, chained.baseAddress, &counts.1, walked.baseAddress, &counts.2, 64)
                }
            }
        }
        guard done else { return nil }
        return (Array(unwound.prefix(Int(counts.0))), Array(chained.prefix(Int(counts.1))), Array(walked.prefix(Int(counts.2))))
    }

    func capture(threadID: Int32, timeout: Duration) throws(ThreadStackError) -> RawStack {
        try state.locked { state throws(ThreadStackError) -> RawStack in
            try Self.install(&state)
            var count: Int32 = 0
            var method: Int32 = 0
            var error: Int32 = 0
            // At least 1 ms; at most half of Int64 (the C side adds it to a clock reading).
            let timeoutNs = min(max(1_000_000, timeout.saturatedNanoseconds), Int64.max / 2)
            let result = crlm_capture(
                threadID, timeoutNs, min(timeoutNs, 5_000_000), state.buffer, CRLM_MAX_FRAMES, &count, &method, &error)
            switch Int(result) {
            case Int(CRLM_CAPTURED):
                return RawStack(
                    addresses: Array(UnsafeBufferPointer(start: state.buffer, count: Int(count))),
                    unwinder: Self.unwinder(method))
            case Int(CRLM_NO_SUCH_THREAD):
                throw .noSuchThread(threadID: threadID)
            case Int(CRLM_HANDLER_REPLACED):
                throw .handlerReplaced(signal: crlm_default_signal())
            case Int(CRLM_UNREADABLE):
                throw .unreadable(threadID: threadID, errno: error)
            case Int(CRLM_NO_ANSWER):
                if !ProcessThreads.exists(threadID) { throw .noSuchThread(threadID: threadID) }
                throw .noAnswer(
                    threadID: threadID, waited: timeout,
                    signalBlocked: ProcessThreads.blocks(signal: crlm_default_signal(), threadID: threadID) ?? false)
            default:
                throw .sendFailed(threadID: threadID, errno: error)
            }
        }
    }
}
