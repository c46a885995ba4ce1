/// One experiment of the tour: a seed's scenario, run on real threads, printed as a trace.
protocol Experiment: Sendable {
    /// A short title, used in the heading and by `runloop-lab list`.
    var title: String { get }
    /// Which seed article(s) it reproduces, by file name (``Seed/cite(_:)``).
    var seed: String { get }
    /// What the seed says, quoted (Chinese, with a translation) where a quote helps, and what the
    /// experiment takes from elsewhere: printed by `runloop-lab list` and under the heading.
    var seedSays: String { get }
    /// What it shows and why, in one or two sentences, printed under the heading.
    var summary: String { get }
    /// Runs the experiment and prints its trace (the heading is printed by the caller).
    func run()
}

/// The seed articles (`../shared/seeds/` of the project), by number: what `runloop-lab list` names.
/// Seed 001 is a copy of seed 000; the second half of seed 003 repeats its first half.
enum Seed {
    /// The file name of seed `number` (0 to 4).
    static func file(_ number: Int) -> String {
        switch number {
        case 0: "000_c9c04b4a15b393de.txt"
        case 1: "001_7d0e77b88dba50d1.txt"
        case 2: "002_c412634b1f78a0bc.txt"
        case 3: "003_10bbc0f2a6eca2e0.txt"
        case 4: "004_a8b090316d53f601.txt"
        default: fatalError("there are five seeds, 000 to 004; no seed \(number)")
        }
    }

    /// `seed 004_a8b090316d53f601.txt`, or `seeds 000_….txt, 001_….txt` for several.
    static func cite(_ numbers: Int...) -> String {
        (numbers.count == 1 ? "seed " : "seeds ") + numbers.map(file).joined(separator: ", ")
    }
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
        WakeUpPort(),
        BackgroundTimerWhileTracking(),
        URLConnectionThreads(),
        MainActorWhileTracking(),
        BlockedNIOEventLoop(),
        GTKScrollDrag(),
    ]
}
