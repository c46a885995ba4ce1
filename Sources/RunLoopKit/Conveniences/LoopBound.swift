import CRunLoopKit

/// A box for state that belongs to one run loop's thread, which `@Sendable` callbacks of that loop
/// (timer handlers, blocks, observers) can capture.
///
/// A loop's callbacks all run on its thread, so they may share mutable state without a lock, but
/// Swift cannot see that: their closures are `@Sendable`. `LoopBound` is `Sendable` and checks,
/// on every access, that the caller is on the loop's thread; an access from any other thread
/// stops the process with a message naming the loop and both threads.
///
/// ```swift
/// let count = LoopBound(0, on: loop)
/// loop.schedule(after: .milliseconds(10), repeating: .milliseconds(10)) { timer in
///     count.value += 1
///     if count.value == 10 { timer.invalidate() }
/// }
/// ```
///
/// The check costs one thread-local read per access. `withValue(_:)` gives in-place access;
/// touching the same box again from inside its body (say, from a nested run) is an overlapping
/// access, which Swift's exclusivity checking stops.
///
/// The value is deinitialized on whichever thread drops the last reference to the box.
public final class LoopBound<Value>: @unchecked Sendable {
    // Why `@unchecked Sendable` is safe: `storage` is read and written only through `value` and
    // `withValue`, which first check (`preconditionOnLoop`, also in -O builds) that the caller is
    // on `loop`'s thread, and a loop has exactly one thread for its whole life. So all accesses
    // after initialization come from one thread, in program order: no two can race. The initial
    // value is handed over with `sending`, so no other reference to it (for a non-Sendable value)
    // is left on the creating thread, and the box's publication to the loop's thread (through
    // whatever hands the box over) orders the initialization before every access. Deinitialization
    // happens after the last release, which the reference count orders after every access.
    private var storage: Value

    /// The loop whose thread owns the value.
    public let loop: RunLoop

    /// Creates a box for `value`, owned by `loop`'s thread (by default the caller's loop). It may
    /// be made on any thread; only reading and writing are confined.
    public init(_ value: sending Value, on loop: RunLoop = .current) {
        self.storage = value
        self.loop = loop
    }

    /// The value. Only on the loop's thread.
    public var value: Value {
        get {
            preconditionOnLoop("value")
            return storage
        }
        set {
            preconditionOnLoop("value")
            storage = newValue
        }
    }

    /// Runs `body` with the value in place. Only on the loop's thread.
    public func withValue<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        preconditionOnLoop("withValue(_:)")
        return try body(&storage)
    }

    /// Whether the caller may touch the value (it is on the loop's thread).
    public var isAccessible: Bool { loop.isCurrent }

    /// Stops the process with a message naming the box, the loop and both threads unless the
    /// caller is on the loop's thread (as `RunLoop`'s own foreign-thread check).
    @inline(__always)
    private func preconditionOnLoop(_ member: StaticString) {
        guard !loop.isCurrent else { return }
        // fatalError, not preconditionFailure: the message must name the threads in -O builds too.
        fatalError(
            "LoopBound<\(Value.self)>.\(member) accessed on thread '\(ThreadLoops.currentName())' (tid \(crlk_gettid())), but the value belongs to \(loop.shortDescription) on thread '\(loop.ownerName)' (tid \(loop.ownerTID)); a LoopBound is confined to its loop's thread"
        )
    }
}
