import RunLoopKit
import Synchronization

// How a scheduling object meets its loop. Each public type (CommitCoalescer, DisplayLink,
// FrameRateMonitor, IterationPool, IdleTaskQueue) is a thin class over a nested one that the
// loop's items hold (Committer, Ticker, FrameCounter, Drainer, Runner): the loop keeps the nested part
// alive as long as it keeps the items, while the public object's `deinit` invalidates them. The
// items are held weakly everywhere else (`Weak`, from RunLoopKit), and a `DetachSignal` in their
// handlers tells when the loop has let go of all of them.

/// Runs `action` once, when the last reference to it goes: put one in the handler closure of every
/// item a scheduling object adds to a loop, and it runs when the loop has let go of all of them,
/// after `invalidate()` or when the loop's thread exits (its teardown removes every item).
final class DetachSignal: Sendable {
    private let action: @Sendable () -> Void

    init(_ action: @escaping @Sendable () -> Void) { self.action = action }

    /// Keeps the signal in the closure that calls this (a closure captures only what it uses).
    @inline(__always)
    func keepAlive() { withExtendedLifetime(self) {} }

    deinit { action() }
}


extension RunLoop {
    /// Adds `observer` to each of `modes`.
    func add(_ observer: RunLoopObserver, forModes modes: [RunLoop.Mode]) {
        for mode in modes { add(observer, forMode: mode) }
    }
}

/// Stops the process with `message` when `condition` is false, in optimized builds too
/// (RunLoopKit's `fatalPrecondition`, the module's name in front).
func require(_ condition: Bool, _ message: @autoclosure () -> String, file: StaticString = #file, line: UInt = #line) {
    fatalPrecondition(condition, "RunLoopScheduling: " + message(), file: file, line: line)
}

/// Stops the process when `value` is not above zero, naming `what`.
func requirePositive(_ value: Duration, _ what: String) {
    require(value > .zero, "\(what) must be positive (got \(value))")
}

/// Stops the process when `value` is not above zero, naming `what`.
func requirePositive(_ value: Int, _ what: String) {
    require(value > 0, "\(what) must be positive (got \(value))")
}

/// A caller's key (`AnyHashable`, which the standard library does not mark `Sendable` because it
/// may wrap anything).
///
/// `@unchecked Sendable`: the scheduling objects only hash and compare keys, always under their
/// own lock, and never hand them back; the wrapped value is the caller's, who passes a value type
/// (a string, a number, an `ObjectIdentifier`) as the docs ask. A key whose hashing reads shared
/// mutable state is the caller's data race, as it would be in any dictionary.
struct Key: @unchecked Sendable, Hashable {
    let value: AnyHashable
    init(_ value: AnyHashable) { self.value = value }
}

/// `duration` from now (`Duration` is 128-bit: even `.seconds(Int64.max)` does not overflow).
func deadline(after duration: Duration) -> ContinuousClock.Instant {
    RunLoop.now.advanced(by: duration)
}

/// A scheduling object's loop, for its observers' calls on the loop's own thread, without the
/// reference counting of a `weak` load (a loop has a side table: each load and release of it
/// takes the slow path, tens of nanoseconds a pass).
///
/// `@unchecked Sendable`, and sound only where ``withLoop(_:)`` says: an observer runs on its
/// loop's thread while that loop runs, and a loop lives as long as its thread, so the loop is
/// alive for the whole call.
struct LoopOnItsThread: @unchecked Sendable {
    private let loop: Unmanaged<RunLoop>

    init(_ loop: RunLoop) { self.loop = Unmanaged.passUnretained(loop) }

    /// Calls `body` with the loop. Only from a callback the loop is running (an observer's).
    @inline(__always)
    func withLoop<Result>(_ body: (RunLoop) -> Result) -> Result { loop._withUnsafeGuaranteedRef(body) }
}
