import ArgumentParser
import CoreFoundation
import Foundation
import RunLoopConcurrency
import RunLoopKit
import Synchronization

import class RunLoopKit.RunLoop

/// Experiment 22 (seeds 000, 004, with Swift concurrency from elsewhere): an animation written
/// with `Task.sleep` on the main actor, while the main loop runs a nested `.tracking` run, on
/// three main-actor executors, each in its own process (the executor is chosen per process).
struct MainActorWhileTracking: Experiment {
    let title = "A main-actor animation with Task.sleep while scrolling, on three main-actor executors"
    let seed = Seed.cite(0, 4)
    let seedSays = """
        Seed 000 (NSTimer 不准, 方案一) and seed 004: an NSTimer scheduled in the default mode stops \
        while a scroll view tracks, because the main loop then runs UITrackingRunLoopMode; adding \
        it for NSRunLoopCommonModes keeps it firing. The seeds say nothing of Swift concurrency: \
        the main actor, Task.sleep and the three executors compared here are from elsewhere (Swift \
        6.3's executor SPI, swift-corelibs-foundation's CFRunLoop), as are the timings.
        """
    let summary = """
        The same animation, `while true { frame += 1; try await Task.sleep(for: 20 ms) }` on the \
        main actor, runs in a child process per executor. After 100 ms the main loop's own timer \
        (standing in for UIKit's touch source, whose callout starts tracking) runs the main loop \
        in .tracking for 300 ms (a finger dragging a scroll view), then the animation goes on for \
        100 ms. (1) Foundation's way on Linux: the main actor is libdispatch's main queue, drained \
        by CFRunLoop's main loop in its common modes; .tracking is not one of them (Foundation has \
        no UIKit to add it). (2) The same main queue drained by RunLoopKit's main loop, with \
        .tracking made common as UIKit does. (3) RunLoopKit's main loop as the main actor's \
        executor (RunLoopConcurrency), .tracking common: main-actor jobs are the loop's own work. \
        (4) As (3), but the tracking run is started from inside a main-actor job. The trace counts \
        frames before, during and after tracking.
        """

    func run() {
        for variant in MainActorChildCommand.Variant.allCases {
            let process = Process()
            process.executableURL = URL(filePath: "/proc/self/exe")
            process.arguments = ["main-actor-child", variant.rawValue]
            let out = Pipe()
            process.standardOutput = out
            do {
                try process.run()
            } catch {
                print("    cannot start the child for \(variant.rawValue): \(error)")
                continue
            }
            let data = out.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            print("  \(variant.heading):")
            for line in String(decoding: data, as: UTF8.self).split(separator: "\n") { print("    \(line)") }
            if process.terminationStatus != 0 { print("    (the child exited with status \(process.terminationStatus))") }
        }
        Out.paragraph("""
            What it shows: the animation moves during tracking in (2) and (3), and not in (1) or \
            (4). In (1) .tracking is not a common mode, so the main queue is not served there, as \
            the seeds' .default NSTimer is not. In (2) and (3) .tracking is common and the nested \
            run is entered from the loop itself (a timer's callout, as UIKit enters tracking from \
            its event source's callout), so main-actor jobs run in it: as main-queue blocks in \
            (2), as the main loop's own work in (3). In (4) the nested run is made by a main-actor \
            job, and a serial executor never re-enters: no other main-actor job starts while one \
            is on the thread's stack (it would break the actor's exclusive access to its state), \
            so every frame waits for the nested run to end — CFRunLoop's rule for the main queue, \
            which RunLoopKit keeps for every serial executor. (Task.sleep's wakeup is the \
            platform's timer in all four: Swift 6.3.1 schedules it from a global-pool thread; \
            RunLoop.main.clock sleeps on the loop instead.)
            """)
    }
}

/// `runloop-lab main-actor-child <variant>`: the child process of experiment 22. Its main thread
/// runs the main loop of the variant; the main actor's executor is chosen before anything else.
struct MainActorChildCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "main-actor-child", abstract: "Experiment 22's child process.", shouldDisplay: false)

    enum Variant: String, CaseIterable, ExpressibleByArgument {
        case foundation, mainQueueOnRunLoopKit = "main-queue-runloopkit", runLoopKitExecutor = "runloopkit-executor"
        case nestedInAJob = "runloopkit-executor-nested-in-a-job"

        var heading: String {
            switch self {
            case .foundation: "(1) main actor = libdispatch's main queue, drained by CFRunLoop (Foundation)"
            case .mainQueueOnRunLoopKit: "(2) main actor = libdispatch's main queue, drained by RunLoopKit's main loop"
            case .runLoopKitExecutor: "(3) main actor = RunLoopKit's main loop (RunLoopConcurrency)"
            case .nestedInAJob: "(4) as (3), tracking started from inside a main-actor job"
            }
        }
    }

    @Argument var variant: Variant

    static let frameInterval = Duration.milliseconds(20)
    static let trackAt = Duration.milliseconds(100)
    static let trackFor = Duration.milliseconds(300)
    static let after = Duration.milliseconds(100)

    func run() throws {
        alarm(30)
        let variant = self.variant
        if variant == .runLoopKitExecutor || variant == .nestedInAJob { RunLoopConcurrency.installMainExecutor() }
        let start = ContinuousClock.now
        let phase = Atomic<Int>(0)
        // The tracking mode's own item (UIKit's touch source): without one, a run in it would
        // return at once.
        let trackingMode = "UITrackingRunLoopMode"
        let touches = RunLoopSource {}
        switch variant {
        case .foundation:
            let cfMode = CFStringCreateWithCString(nil, trackingMode, CFStringBuiltInEncodings.UTF8.rawValue)
            let timer = CFRunLoopTimerCreateWithHandler(nil, CFAbsoluteTimeGetCurrent() + 3600, 0, 0, 0) { _ in }
            CFRunLoopAddTimer(CFRunLoopGetMain(), timer, cfMode)
        case .mainQueueOnRunLoopKit, .runLoopKitExecutor, .nestedInAJob:
            RunLoop.main.add(touches, forMode: .tracking)
        }
        /// The tracking run: a finger down, dragging for `trackFor`.
        @Sendable func track() {
            phase.store(1, ordering: .relaxed)
            print("\(TourLog.ms(.now - start)) tracking starts: the main loop runs \(trackingMode) for \(TourLog.ms(Self.trackFor))")
            switch variant {
            case .foundation:
                let cfMode = CFStringCreateWithCString(nil, trackingMode, CFStringBuiltInEncodings.UTF8.rawValue)
                _ = CFRunLoopRunInMode(cfMode, Self.trackFor.seconds, false)
            case .mainQueueOnRunLoopKit, .runLoopKitExecutor, .nestedInAJob:
                _ = RunLoop.main.run(mode: .tracking, for: Self.trackFor)
            }
            phase.store(2, ordering: .relaxed)
            print("\(TourLog.ms(.now - start)) tracking ends")
        }
        // UIKit enters tracking from its event source's callout, at the top of the main loop; a
        // timer of the main loop's default mode stands in for it here.
        switch variant {
        case .foundation:
            let timer = CFRunLoopTimerCreateWithHandler(nil, CFAbsoluteTimeGetCurrent() + Self.trackAt.seconds, 0, 0, 0) { _ in
                track()
            }
            CFRunLoopAddTimer(CFRunLoopGetMain(), timer, kCFRunLoopDefaultMode)
        case .mainQueueOnRunLoopKit, .runLoopKitExecutor:
            RunLoop.main.add(RunLoopTimer(after: Self.trackAt) { _ in track() }, forMode: .default)
        case .nestedInAJob:
            break
        }
        Task { @MainActor in
            let animation = Task { @MainActor in
                var frames = [0, 0, 0]
                while !Task.isCancelled {
                    frames[phase.load(ordering: .relaxed)] += 1
                    try? await Task.sleep(for: Self.frameInterval)
                }
                return frames
            }
            if variant == .nestedInAJob {
                try? await Task.sleep(for: Self.trackAt)
                track()
            }
            // Until tracking has ended (the main actor is free meanwhile in (2) and (3)).
            while phase.load(ordering: .relaxed) != 2 { try? await Task.sleep(for: .milliseconds(5)) }
            try? await Task.sleep(for: Self.after)
            animation.cancel()
            let frames = await animation.value
            print("frames: \(frames[0]) before tracking, \(frames[1]) during (\(TourLog.ms(Self.trackFor))), \(frames[2]) after")
            switch variant {
            case .foundation: CFRunLoopStop(CFRunLoopGetMain())
            case .mainQueueOnRunLoopKit: RunLoop.main.stop()
            case .runLoopKitExecutor, .nestedInAJob: RunLoopConcurrency.stopMain()
            }
        }
        switch variant {
        case .foundation:
            CFRunLoopRun()
        case .mainQueueOnRunLoopKit:
            RunLoop.main.addCommonMode(.tracking)
            RunLoop.main.run()
        case .runLoopKitExecutor, .nestedInAJob:
            RunLoop.main.addCommonMode(.tracking)
            _ = RunLoopConcurrency.runMain()
        }
    }
}

extension Duration {
    fileprivate var seconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
