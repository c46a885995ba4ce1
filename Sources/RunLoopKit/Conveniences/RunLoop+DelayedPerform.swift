import Synchronization

// Delayed perform: `performSelector:withObject:afterDelay:inModes:` and
// `cancelPreviousPerformRequestsWithTarget:` for closures, built on a one-shot RunLoopTimer.

extension RunLoop {
    /// A block queued with ``RunLoop/perform(after:inModes:_:)``, which can be cancelled until it
    /// starts.
    ///
    /// A request is in one of three states: pending (its timer is scheduled), started (the block
    /// began running on the loop's thread), or cancelled. It moves out of pending exactly once, in
    /// one atomic step taken either by the loop (when the timer fires) or by ``cancel()``: so a
    /// block that has not started when `cancel()` returns never starts.
    ///
    /// The request holds the block only while it is pending: once it starts or is cancelled, the
    /// block (and whatever it captured) is released.
    public final class PerformRequest: Sendable, Hashable, CustomStringConvertible {
        /// The one-shot timer that runs the block.
        let timer: RunLoopTimer
        let core: PerformRequestCore

        init(timer: RunLoopTimer, core: PerformRequestCore) {
            self.timer = timer
            self.core = core
        }

        /// Cancels the request: if its block has not started yet, it never will. Safe from any
        /// thread and from inside any callback; calling it again does nothing.
        ///
        /// Returns `true` if this call stopped the block from running; `false` if the block had
        /// already started (it may still be running on the loop's thread: `cancel()` does not wait
        /// for it) or the request was already cancelled.
        @discardableResult
        public func cancel() -> Bool {
            guard let block = core.cancel() else { return false }
            timer.invalidate()
            // The block (and its captures) is released here, after the lock, never under it.
            _ = consume block
            return true
        }

        /// Whether the block is still waiting to run (neither started nor cancelled).
        ///
        /// A request whose loop's thread exited before the delay passed stays pending forever:
        /// its block never runs.
        public var isPending: Bool { core.step == .pending }

        /// Whether the request was cancelled before its block started.
        public var isCancelled: Bool { core.step == .cancelled }

        /// Whether the block has started running (it may still be running).
        public var hasStarted: Bool { core.step == .started }

        /// When the block is due (it runs at the loop's first pass in one of its modes after that).
        public var fireDate: ContinuousClock.Instant { timer.fireDate }

        /// A short identity with the state and the timer.
        public var description: String {
            "<PerformRequest \(objectAddress(self)) \(core.step) \(timer)>"
        }

        /// Requests are equal only to themselves.
        public static func == (lhs: PerformRequest, rhs: PerformRequest) -> Bool { lhs === rhs }

        /// Hashes the request's identity.
        public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
    }

    /// Runs `block` on the loop's thread once `delay` has passed, the first time the loop then
    /// runs in one of `modes` (``Mode/common`` matches every common mode): NSObject's
    /// `performSelector:withObject:afterDelay:inModes:` for closures.
    ///
    /// It is a one-shot ``RunLoopTimer`` in those modes, so it obeys the timer rules: while the
    /// loop runs in another mode the block waits, and it keeps the modes from being empty until it
    /// runs or is cancelled. The classic image-loading trick — set an image only when the user is
    /// not scrolling — is `loop.perform(after: .zero, inModes: [.default]) { show(image) }`: while
    /// the loop runs in ``Mode/tracking`` the block waits; back in ``Mode/default``, it runs.
    ///
    /// <!-- snippet: prelude
    /// func search(_ text: String) {}
    /// let text = "run loop"
    /// -->
    /// ```swift
    /// let request = loop.perform(after: .milliseconds(300)) { search(text) }
    /// // a new keystroke:
    /// request.cancel()
    /// ```
    ///
    /// Safe from any thread. A negative delay counts as zero; an empty `modes` returns a request
    /// that is already cancelled.
    ///
    /// - Returns: A handle to cancel the block (see ``PerformRequest/cancel()``); dropping it does
    ///   not cancel anything.
    @discardableResult
    public func perform(
        after delay: Duration,
        inModes modes: [Mode] = RunLoop.defaultModeOnly,
        _ block: @escaping @Sendable () -> Void
    ) -> PerformRequest {
        schedule(PerformRequestCore(block, target: nil), after: delay, inModes: modes)
    }

    /// Makes the request's one-shot timer and adds it to `modes`.
    private func schedule(_ core: PerformRequestCore, after delay: Duration, inModes modes: [Mode]) -> PerformRequest {
        // The handler captures the core, not the request: the request holds the timer, and a
        // timer's handler is kept for the timer's life.
        let timer = RunLoopTimer(after: delay) { _ in
            guard let block = core.start() else { return }
            block()
        }
        let request = PerformRequest(timer: timer, core: core)
        guard !modes.isEmpty else {
            request.cancel()
            return request
        }
        performRequests.register(request)
        for mode in modes { add(timer, forMode: mode) }
        return request
    }

    /// Runs `block` with `target` on the loop's thread once `delay` has passed, in one of `modes`:
    /// ``perform(after:inModes:_:)`` for a request that
    /// ``cancelPreviousPerformRequests(withTarget:)`` can find by its target, as NSObject's
    /// `performSelector:withObject:afterDelay:` and `cancelPreviousPerformRequestsWithTarget:`.
    ///
    /// <!-- snippet: prelude
    /// final class SearchBox: Sendable { func search() {} }
    /// let searchBox = SearchBox()
    /// -->
    /// ```swift
    /// // Coalesce: each keystroke replaces the pending search.
    /// loop.cancelPreviousPerformRequests(withTarget: searchBox)
    /// loop.perform(after: .milliseconds(300), target: searchBox) { box in box.search() }
    /// ```
    ///
    /// The request holds `target` strongly until the block starts or is cancelled (as
    /// `performSelector:afterDelay:` retains its target), then lets it go.
    @discardableResult
    public func perform<Target: AnyObject & Sendable>(
        after delay: Duration,
        inModes modes: [Mode] = RunLoop.defaultModeOnly,
        target: Target,
        _ block: @escaping @Sendable (Target) -> Void
    ) -> PerformRequest {
        let core = PerformRequestCore({ block(target) }, target: target)
        return schedule(core, after: delay, inModes: modes)
    }

    /// Cancels the pending delayed performs on this loop made for `target` with
    /// ``perform(after:inModes:target:_:)`` (compared by identity): none of their blocks will
    /// start. NSObject's `cancelPreviousPerformRequestsWithTarget:`, for this loop. Safe from any
    /// thread; blocks that already started are not waited for.
    ///
    /// - Returns: How many requests this call cancelled.
    /// - Complexity: O(n) in the loop's delayed performs.
    @discardableResult
    public func cancelPreviousPerformRequests(withTarget target: AnyObject) -> Int {
        guard let registry = attachments.existing(PerformRequestRegistry.self) else { return 0 }
        var cancelled = 0
        for request in registry.requests(for: target) where request.cancel() { cancelled += 1 }
        return cancelled
    }

    /// Cancels every pending delayed perform on this loop (``perform(after:inModes:_:)``): none of
    /// their blocks will start. NSObject's `cancelPreviousPerformRequestsWithTarget:` for a loop.
    ///
    /// Safe from any thread, also while the loop runs; requests made after this call are not
    /// affected, and blocks that already started are not waited for. To cancel a group of
    /// requests rather than all of them, keep their ``PerformRequest`` handles and cancel those.
    ///
    /// - Returns: How many requests this call cancelled.
    @discardableResult
    public func cancelPerformRequests() -> Int {
        var cancelled = 0
        for request in performRequests.takeAll() where request.cancel() { cancelled += 1 }
        return cancelled
    }

    /// How many delayed performs on this loop are pending.
    public var pendingPerformRequestCount: Int { attachments.existing(PerformRequestRegistry.self)?.pendingCount ?? 0 }

    /// The loop's delayed-perform registry, made with the first request.
    var performRequests: PerformRequestRegistry {
        attachments.object(PerformRequestRegistry.self) { PerformRequestRegistry() }
    }
}

/// A delayed perform's state and block, shared by its handle and its timer's handler.
final class PerformRequestCore: Sendable {
    enum Step: Sendable, Equatable, CustomStringConvertible {
        case pending, started, cancelled
        var description: String {
            switch self {
            case .pending: "pending"
            case .started: "started"
            case .cancelled: "cancelled"
            }
        }
    }

    /// The block and the target while pending; nil once started or cancelled. The step changes
    /// only here, once.
    private let state: Mutex<(step: Step, block: (@Sendable () -> Void)?, target: (any AnyObject & Sendable)?)>

    init(_ block: @escaping @Sendable () -> Void, target: (any AnyObject & Sendable)?) {
        state = Mutex((.pending, block, target))
    }

    var step: Step { state.locked { $0.step } }

    /// Whether the request is pending and was made for `target`.
    func isPending(for target: AnyObject) -> Bool {
        state.locked { state in state.step == .pending && state.target === target }
    }

    /// Moves pending → started and hands out the block (the caller runs it, outside the lock);
    /// nil if the request was cancelled.
    func start() -> (@Sendable () -> Void)? { take(.started) }

    /// Moves pending → cancelled and hands out the block (the caller releases it, outside the
    /// lock); nil if it had started or was cancelled.
    func cancel() -> (@Sendable () -> Void)? { take(.cancelled) }

    private func take(_ next: Step) -> (@Sendable () -> Void)? {
        // The target is let go after the lock (a last reference runs its deinit).
        let (block, target) = state.locked { state -> ((@Sendable () -> Void)?, (any AnyObject & Sendable)?) in
            guard state.step == .pending else { return (nil, nil) }
            state.step = next
            defer {
                state.block = nil
                state.target = nil
            }
            return (state.block, state.target)
        }
        _ = consume target
        return block
    }
}

/// A loop's pending delayed performs, for ``RunLoop/cancelPerformRequests()`` and
/// ``RunLoop/cancelPreviousPerformRequests(withTarget:)``.
///
/// Requests are not removed when they start or are cancelled (they hold no reference back here);
/// finished ones are swept out when the list has doubled since the last sweep, so the list stays
/// within twice the pending requests plus a constant, at amortized O(1) per request.
final class PerformRequestRegistry: Sendable {
    private struct Requests: Sendable {
        var list: [RunLoop.PerformRequest] = []
        var sweepAt = 32
    }

    private let requests = Mutex(Requests())

    func register(_ request: RunLoop.PerformRequest) {
        // Finished requests swept out are released after the lock (a release may free a timer).
        let swept: [RunLoop.PerformRequest] = requests.locked { requests in
            requests.list.append(request)
            guard requests.list.count >= requests.sweepAt else { return [] }
            var kept: [RunLoop.PerformRequest] = []
            var dropped: [RunLoop.PerformRequest] = []
            for item in requests.list {
                if item.isPending { kept.append(item) } else { dropped.append(item) }
            }
            requests.list = kept
            requests.sweepAt = max(32, kept.count * 2)
            return dropped
        }
        _ = consume swept
    }

    /// Empties the list and returns what it held.
    func takeAll() -> [RunLoop.PerformRequest] {
        requests.locked { requests in
            let all = requests.list
            requests.list = []
            requests.sweepAt = 32
            return all
        }
    }

    /// The pending requests made for `target`.
    func requests(for target: AnyObject) -> [RunLoop.PerformRequest] {
        requests.locked { requests in requests.list.filter { $0.core.isPending(for: target) } }
    }

    var pendingCount: Int {
        requests.locked { $0.list.lazy.filter(\.isPending).count }
    }
}
