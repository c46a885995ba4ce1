/// Why a ``VirtualTimeLoop`` could not do what it was asked.
public enum VirtualTimeError: Error, Equatable, CustomStringConvertible {
    /// More passes than allowed at one instant: work that never settles (a source that signals
    /// itself, a block that performs itself, a zero-interval timer). `at` is the virtual time since
    /// the start; `trail` the callouts of the last passes, oldest first, as
    /// `"pass N: <phase> <item>"` (items by their `label`, else by kind and address).
    case livelock(at: Duration, passes: Int, trail: [String])
    /// More passes than `maxPasses` in one ``VirtualTimeLoop/advance(by:in:maxPasses:)-9wgxh``.
    case passLimit(at: Duration, passes: Int, trail: [String])
    /// A run with no deadline and no timer was about to sleep: only another thread could have
    /// woken it, and on virtual time none does. A run nested in a callout with no deadline gets
    /// here, and so does `advance(to: RunLoop.distantFuture)` in a mode without timers. The runs
    /// were ended.
    case sleepsForever(at: Duration, trail: [String])
    /// A callout polled a clock-based deadline (RunLoopScheduling's `IdleDeadline.shouldYield` or
    /// `timeRemaining`) a million times at one instant: on virtual time a callout's work takes no
    /// time, so a `while !deadline.shouldYield { … }` loop would spin for ever. The deadline
    /// reported itself spent so that the callout returned, and the runs were ended. Say how long
    /// each unit of work takes with ``VirtualTimeLoop/elapse(_:)``.
    case clockStalled(at: Duration, polls: Int, trail: [String])
    /// ``VirtualTimeLoop/advance(by:in:maxPasses:)-9wgxh`` with a negative duration.
    case negativeDuration(Duration)
    /// A pass limit below 1.
    case invalidLimit(Int)
    /// A drive (`advance`, `runUntilIdle`) from a callout of the loop it drives: a callout that
    /// wants the loop to run nests a run, as in production.
    case calledFromCallout(String)

    /// What went wrong, with the trail when there is one.
    public var description: String {
        func lines(_ trail: [String]) -> String {
            trail.isEmpty ? "" : "; the last callouts:\n" + trail.map { "  " + $0 }.joined(separator: "\n")
        }
        switch self {
        case .livelock(let at, let passes, let trail):
            return "livelock: \(passes) passes at \(at) of virtual time without settling" + lines(trail)
        case .passLimit(let at, let passes, let trail):
            return "pass limit: \(passes) passes by \(at) of virtual time" + lines(trail)
        case .sleepsForever(let at, let trail):
            return "a nested run would sleep forever at \(at) of virtual time (no deadline, no timer)" + lines(trail)
        case .clockStalled(let at, let polls, let trail):
            return "a callout polled a deadline \(polls) times at \(at) of virtual time, where its work takes no time: call VirtualTimeLoop.elapse(_:) for the time each unit of work takes" + lines(trail)
        case .negativeDuration(let duration):
            return "advance(by: \(duration)): virtual time never goes back"
        case .invalidLimit(let limit):
            return "a pass limit of \(limit): it must be at least 1"
        case .calledFromCallout(let function):
            return "\(function) called from a callout of the loop it drives; nest a run instead"
        }
    }
}
