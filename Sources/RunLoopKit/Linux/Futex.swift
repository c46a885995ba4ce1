import CRunLoopKit

/// A wakeup that needs no descriptor: a futex word, where a loop that could not open its kernel
/// descriptors sleeps (`crlk_futex_wait` / `crlk_futex_post`).
///
/// `@unchecked Sendable` is safe because the word is only ever read and written through the C
/// atomics of those two functions, and it is freed only when the last reference goes.
final class FutexWord: @unchecked Sendable {
    private let word: UnsafeMutablePointer<UInt32>

    init() {
        word = .allocate(capacity: 1)
        word.initialize(to: 0)
    }

    deinit { word.deallocate() }

    /// Wakes the sleeper (or makes its next wait return at once).
    func post() { crlk_futex_post(word) }

    /// Sleeps until posted or `timeoutNs` passes; consumes a post.
    func wait(timeoutNs: Int64) { _ = crlk_futex_wait(word, timeoutNs) }
}
