import CRunLoopKit
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
