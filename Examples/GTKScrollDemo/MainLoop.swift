#if GTK
import Foundation
import RunLoopKit

import class RunLoopKit.RunLoop

/// Runs `RunLoop.main` in `.default` while a condition holds, with a time limit, and without a
/// polling interval: the run returns after every source it handles (GLib's dispatches are
/// sources), and ``poke()`` is a source other threads signal when something they wait for
/// happened.
///
/// `@unchecked Sendable`: its one property, a `RunLoopSource`, is thread-safe to signal.
public final class MainLoopDriver: @unchecked Sendable {
    private let source: RunLoopSource

    /// Adds its source to the main loop's common modes.
    public init() {
        source = RunLoopSource {}
        source.label = "GTKScrollDemo poke"
        RunLoop.main.add(source, forMode: .common)
    }

    /// Ends the current `run(for:until:)` pass early so that its condition is read again (any
    /// thread).
    public func poke() {
        source.signal()
        RunLoop.main.wakeUp()
    }

    /// Runs the main loop for `duration`, or until `done()` is true; returns whether `done()`
    /// became true. The main thread only.
    @discardableResult
    public func run(for duration: Duration, until done: () -> Bool = { false }) -> Bool {
        let deadline = ContinuousClock.now + duration
        while !done() {
            let left = deadline - .now
            if left <= .zero { return false }
            RunLoop.main.run(mode: .default, for: left, returnAfterSourceHandled: true)
        }
        return true
    }

    /// Runs the main loop until `tool` exits (at most `timeout`, then kills it); returns its exit
    /// code. A thread of its own waits for the process and pokes the loop.
    @discardableResult
    public func run(until tool: ToolProcess, timeout: Duration) -> Int32 {
        let waiter = Thread { [self] in
            tool.wait(timeout: timeout)
            poke()
        }
        waiter.start()
        run(for: timeout + .seconds(5)) { tool.hasExited }
        return tool.wait(timeout: .seconds(5))
    }

    /// Removes its source.
    public func invalidate() { source.invalidate() }
}
#endif
