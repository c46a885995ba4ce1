import CRunLoopKit
import Glibc
import Synchronization

extension Mutex where Value: ~Copyable {
    /// `withLock`, with the critical section announced to ThreadSanitizer.
    ///
    /// On Linux, `Mutex` parks threads with raw `futex` system calls, which ThreadSanitizer does not
    /// intercept: it would report every access the lock guards as a data race. This marks the
    /// lock's storage as acquired on entry and released on exit (no-op calls unless built with
    /// `--sanitize=thread`), so the sanitizer sees the ordering the mutex really provides. Every
    /// lock in RunLoopKit is taken through this method.
    @inline(__always)
    package borrowing func locked<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        // The mutex's own address names the lock for the sanitizer: taking it reads no guarded
        // state (a borrow of the lock, not an access to its value).
        let address = withUnsafePointer(to: self) { UnsafeMutableRawPointer(mutating: $0) }
        return try withLock { (value: inout sending Value) throws(E) -> sending Result in
            crlk_tsan_acquire(address)
            defer { crlk_tsan_release(address) }
            return try body(&value)
        }
    }
}

/// A test-and-test-and-set lock for critical sections of a few nanoseconds that two threads hit
/// at once (a queue's producer and its loop): `Mutex` sends a contended waiter down its kernel
/// slow path, which costs more than such a section. Waiters spin with a CPU pause, then yield the
/// CPU if the holder was descheduled. ThreadSanitizer sees its ordering (atomics). No user code
/// may run under it.
///
/// Inlinable (with ``SpinLocked``) so that a generic caller's critical section, a
/// ``MessagePort``'s send, is specialized in the module that knows the message type.
@usableFromInline
struct SpinLock: ~Copyable, Sendable {
    @usableFromInline let held = Atomic<Bool>(false)

    @usableFromInline init() {}

    @inlinable @inline(__always)
    func lock() {
        if held.exchange(true, ordering: .acquiring) { waitAndLock() }
    }

    /// The contended path: spin with a CPU pause, then yield, until the lock is taken.
    @usableFromInline
    func waitAndLock() {
        while held.exchange(true, ordering: .acquiring) {
            var spins = 0
            while held.load(ordering: .relaxed) {
                spins += 1
                if spins < 64 { crlk_cpu_relax() } else { sched_yield() }
            }
        }
    }

    @inlinable @inline(__always)
    func unlock() { held.store(false, ordering: .releasing) }
}

/// A value behind a ``SpinLock`` (a port's queue: see ``BlockQueue`` for why not `Mutex`).
///
/// `@unchecked Sendable`: `value` is read and written only while `spin` is held.
@usableFromInline
final class SpinLocked<Value>: @unchecked Sendable {
    @usableFromInline let spin = SpinLock()
    @usableFromInline var value: Value

    @usableFromInline init(_ value: Value) { self.value = value }

    /// Runs `body` with the value, under the lock.
    @inlinable @inline(__always)
    func locked<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        spin.lock()
        defer { spin.unlock() }
        return try body(&value)
    }
}
