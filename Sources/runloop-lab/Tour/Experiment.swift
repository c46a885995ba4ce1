/// One experiment of the tour: a seed's scenario, run on real threads, printed as a trace.
protocol Experiment: Sendable {
    /// A short title, used in the heading and by `runloop-lab list`.
    var title: String { get }
    /// Which seed article it reproduces.
    var seed: String { get }
    /// What it shows and why, in one or two sentences, printed under the heading.
    var summary: String { get }
    /// Runs the experiment and prints its trace (the heading is printed by the caller).
    func run()
}

/// The tour's experiments, in order; `--only N` picks `all[N - 1]`.
enum Tour {
    static let all: [any Experiment] = [
        ObserverLog(),
        TimerWhileScrolling(),
        StoppingALoop(),
        NetworkThread(),
        MainQueueOnTheMainLoop(),
        TimerPitfalls(),
        KeepAliveThreads(),
        LagMonitorSideBySide(),
        HotThread(),
        IdleImageLoading(),
        MainLoopObservers(),
        CoalescedCommit(),
        DisplayLinkStall(),
        GCDTimerWhileScrolling(),
        PerformAfterOnIdleThread(),
        EventPipeline(),
        MainLoopDescription(),
        CrashGuardExperiment(),
    ]
}
