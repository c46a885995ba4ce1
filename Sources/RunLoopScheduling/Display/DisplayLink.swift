import RunLoopKit
import Synchronization
import SystemPackage

/// `CADisplayLink` for Linux, headless: a handler called once per frame on its loop's thread, in
/// its modes.
///
/// It is a version-1 source (`FileDescriptorSource`) on a timerfd armed on an absolute grid,
/// `start + k × (1 s / framesPerSecond)` on the loop's clock: no drift, however late a frame is
/// handled. When the loop is late (a stall, or another mode running), the timerfd's expiration
/// count says how many frames went by: ``Frame/droppedFrames`` is that count minus one, never a
/// guess from rounding. Paused means disarmed: a paused link never wakes its loop.
///
/// The handler is never re-entered: a handler that runs the loop nested for longer than a frame
/// is not called again inside that run (as a `RunLoopTimer`'s is not); the frames that go by are
/// counted in the next frame's ``Frame/droppedFrames``.
///
/// No real display's vertical blank is followed (this machine has no `/dev/dri` and no Wayland
/// display): frames are paced by the clock, as Choreographer does without vsync.
///
/// The link stays on its loop until ``invalidate()`` or the loop's thread exits; either releases
/// the handler and closes the timerfd. In a child made by `fork()`, pausing and invalidating
/// leave the timerfd (shared with the parent) armed: the parent's frames go on.
public final class DisplayLink: Sendable {
    /// One frame.
    public struct Frame: Sendable, Hashable {
        /// When this frame was due (the grid point of the timerfd's latest expiration).
        public var timestamp: ContinuousClock.Instant
        /// When the next frame is due: the deadline for this frame's work.
        public var targetTimestamp: ContinuousClock.Instant
        /// The time between frames.
        public var duration: Duration
        /// The frame's number on the grid, counted from 1 at the first frame; dropped frames
        /// count too, so it grows by `droppedFrames + 1`.
        public var sequence: UInt64
        /// Frames that went by since the previous call without one (the loop was late, or in a
        /// mode the link is not in).
        public var droppedFrames: Int
    }

    /// The loop the frames are handled on.
    public let loop: RunLoop
    /// The frame rate asked for.
    public let framesPerSecond: Int
    /// The time between frames.
    public let frameDuration: Duration
    /// Why the link could not start (no descriptor left, or epoll refused the timerfd); such a
    /// link is invalid from the start.
    public let creationError: Errno?

    private let core: Ticker

    /// A display link calling `handler` `framesPerSecond` times a second on `loop`, in `modes`.
    /// The first frame is due one frame duration from now.
    ///
    /// - Precondition: `framesPerSecond` is positive (at most 1,000,000); `modes` is not empty.
    public init(
        loop: RunLoop, modes: [RunLoop.Mode] = [.common], framesPerSecond: Int = 60,
        handler: @escaping @Sendable (Frame) -> Void
    ) {
        requirePositive(framesPerSecond, "DisplayLink framesPerSecond")
        require(framesPerSecond <= 1_000_000, "DisplayLink framesPerSecond must be at most 1,000,000 (got \(framesPerSecond))")
        require(!modes.isEmpty, "DisplayLink needs at least one mode")
        self.loop = loop
        self.framesPerSecond = framesPerSecond
        let interval = Int64(1_000_000_000 / framesPerSecond)
        frameDuration = .nanoseconds(interval)
        let timer: PeriodicTimerDescriptor
        do throws(Errno) {
            timer = try PeriodicTimerDescriptor()
        } catch {
            self.core = Ticker(interval: interval, timer: nil, handler: handler)
            self.core.state.locked { $0.valid = false }
            creationError = error
            return
        }
        let core = Ticker(interval: interval, timer: timer, handler: handler)
        self.core = core
        do throws(Errno) {
            let detach = DetachSignal { [core] in core.detached() }
            let source: FileDescriptorSource
            do throws(Errno) {
                source = try FileDescriptorSource(descriptor: timer.descriptor, watching: .readable) { [core] _, _ in
                    detach.keepAlive()
                    core.frameDue()
                }
            } catch {
                core.close()
                throw error
            }
            core.source.locked { $0.value = source }
            try core.start()
            for mode in modes { loop.add(source, forMode: mode) }
            creationError = nil
        } catch {
            core.state.locked { $0.valid = false }
            creationError = error
        }
    }

    /// Whether frames are paused. A paused link's timerfd is disarmed: no wakeups. Resuming
    /// keeps the grid: the next frame is the next grid point, with no dropped frames counted for
    /// the pause. Any thread.
    public var isPaused: Bool {
        get { core.state.locked { $0.paused } }
        set { core.setPaused(newValue) }
    }

    /// Whether the link still delivers frames (false after ``invalidate()``, its thread's exit,
    /// or a ``creationError``).
    public var isValid: Bool { core.state.locked { $0.valid } }

    /// Stops the link for good: no more frames, the handler released, the timerfd closed. Any
    /// thread, including from inside the handler.
    public func invalidate() { core.invalidate() }

    /// Adds `listener`, called on the loop's thread after the handler for every frame (what
    /// ``FrameRateMonitor`` uses).
    func addListener(_ listener: @escaping @Sendable (Frame) -> Void) {
        core.state.locked { $0.listeners.append(listener) }
    }
}

extension DisplayLink {
    struct State: ~Copyable {
        var valid = true
        var paused = false
        var handler: (@Sendable (Frame) -> Void)?
        var listeners: [@Sendable (Frame) -> Void] = []
        /// The grid: frame `k` is due at `origin + k × interval` (k from 1).
        var origin: Int64 = 0
        /// The grid index of the first expiration since the timer was last armed, and how many
        /// expirations were taken since.
        var firstIndex: Int64 = 1
        var expirationsSinceArm: Int64 = 0
        var closed = false
        /// The handler (or a listener) is running: a run nested in it does not call it again.
        var inHandler = false
        /// Frames that went by while the handler ran, reported as dropped with the next frame.
        var skippedInHandler: Int64 = 0
    }

    /// What the loop's descriptor source holds: the timerfd, the frame grid and the handlers.
    final class Ticker: Sendable {
        let interval: Int64
        let state: Mutex<State>
        let source = Mutex(Weak<FileDescriptorSource>())
        /// Every call on it is made under `state`'s lock, which also says whether it is closed.
        let timer: PeriodicTimerDescriptor?

        init(interval: Int64, timer: PeriodicTimerDescriptor?, handler: @escaping @Sendable (Frame) -> Void) {
            self.interval = interval
            self.timer = timer
            var state = State()
            state.handler = handler
            self.state = Mutex(state)
        }

        func start() throws(Errno) {
            try state.locked { state throws(Errno) in
                state.origin = PeriodicTimerDescriptor.nowNanoseconds()
                try timer?.arm(firstNanoseconds: state.origin + interval, intervalNanoseconds: interval)
            }
        }

        /// The timerfd is readable: one call for however many frames went by.
        func frameDue() {
            guard let timer else { return }
            let call = state.locked { state -> (Frame, (@Sendable (Frame) -> Void)?, [@Sendable (Frame) -> Void])? in
                guard !state.closed else { return nil }
                let expirations: UInt64
                do throws(Errno) { expirations = try timer.takeExpirations() } catch { return nil }
                guard expirations > 0, state.valid, !state.paused else { return nil }
                state.expirationsSinceArm += Int64(clamping: expirations)
                // A frame due while the handler runs the loop nested (a source is not guarded
                // against re-entry as a timer or an observer is): taken from the timerfd, not
                // delivered; the next frame counts it as dropped. As a RunLoopTimer's handler,
                // the frame handler never nests in itself.
                guard !state.inHandler else {
                    state.skippedInHandler += Int64(clamping: expirations)
                    return nil
                }
                let index = state.firstIndex + state.expirationsSinceArm - 1
                let due = state.origin + index * interval
                let frame = Frame(
                    timestamp: instant(due), targetTimestamp: instant(due + interval), duration: .nanoseconds(interval),
                    sequence: UInt64(index),
                    droppedFrames: Int(clamping: Int64(clamping: expirations - 1) + state.skippedInHandler))
                state.skippedInHandler = 0
                state.inHandler = true
                return (frame, state.handler, state.listeners)
            }
            guard let (frame, handler, listeners) = call else { return }
            defer { state.locked { $0.inHandler = false } }
            handler?(frame)
            for listener in listeners { listener(frame) }
        }

        func setPaused(_ paused: Bool) {
            guard let timer else { return }
            state.locked { state in
                guard state.valid, !state.closed, state.paused != paused else { return }
                state.paused = paused
                do throws(Errno) {
                    if paused {
                        try timer.disarm()
                        _ = try timer.takeExpirations()  // one that expired before the disarm
                        return
                    }
                    // Resume on the grid: the first grid point after now.
                    let now = PeriodicTimerDescriptor.nowNanoseconds()
                    let next = (now - state.origin) / interval + 1
                    state.firstIndex = next
                    state.expirationsSinceArm = 0
                    try timer.arm(firstNanoseconds: state.origin + next * interval, intervalNanoseconds: interval)
                } catch {
                    // Only a bad descriptor or bad values fail here, neither possible while open:
                    // a bug of this module's, and a display link that would never tick again.
                    fatalPrecondition(false, "RunLoopScheduling: DisplayLink cannot arm its timerfd: \(error)")
                }
            }
        }

        func invalidate() {
            let released = state.locked { state -> (@Sendable (Frame) -> Void)? in
                state.valid = false
                // Disarmed now (no more wakeups); closed once the loop let go of the source.
                if !state.closed { try? timer?.disarm() }
                defer {
                    state.handler = nil
                    state.listeners = []
                }
                return state.handler
            }
            source.locked { $0.value }?.invalidate()
            withExtendedLifetime(released) {}
        }

        /// The loop let go of the source (invalidated, or its thread exited): nothing reads the
        /// timerfd any more.
        func detached() {
            invalidate()
            close()
        }

        func close() {
            state.locked { state in
                guard !state.closed else { return }
                state.closed = true
                timer?.close()
            }
        }

        private func instant(_ ns: Int64) -> ContinuousClock.Instant {
            unsafeBitCast(Duration.nanoseconds(ns), to: ContinuousClock.Instant.self)
        }
    }
}
