import Glibc

/// Which sanitizer the test process runs under (`swift test --sanitize=…`): tests scale their
/// work and widen their time bounds with it, and skip what a sanitizer cannot do (a signal
/// handler's `backtrace()` under ThreadSanitizer).
public enum Sanitizers {
    /// ThreadSanitizer.
    public static let thread: Bool = dlsym(nil, "__tsan_init") != nil
    /// AddressSanitizer.
    public static let address: Bool = dlsym(nil, "__asan_init") != nil
    /// Either.
    public static var any: Bool { thread || address }
}
