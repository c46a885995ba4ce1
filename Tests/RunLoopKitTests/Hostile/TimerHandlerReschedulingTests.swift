import Glibc
import SharedTestSupport
import Synchronization
import Testing

@testable import RunLoopKit

/// Finding 1: a repeating timer's handler that touches its own timer — sets its tolerance,
/// removes it from a mode it is not in, removes it from its mode and adds it back — must not
/// stop the loop from moving the timer to its next fire date. A repeating timer's next fire date
/// keeps its phase, and a fire date set inside the handler is kept (the DocC article Timers): only
/// an explicit fire date counts as the handler's own schedule.
///
/// Each scenario runs a 100 ms repeating timer for 550 ms: it fires 5 times (100 ms ... 500 ms).
/// The bound 3...7 leaves room for a loaded machine (a late first fire, or a run that overshoots)
/// while a timer stuck at its old fire date fires on every pass (hundreds of thousands of times).
@Suite struct HostileTimerHandlerTests {
    /// What a handler does to its own timer each time it fires.
    enum SelfTouch: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case setsItsTolerance
        case removesItselfFromAModeItIsNotIn
        case removesItselfAndAddsItselfBack

        var testDescription: String { rawValue }
    }

    @Test(arguments: SelfTouch.allCases)
    func aRepeatingTimerWhoseHandlerTouchesItsOwnTimerStillFiresOncePerInterval(_ touch: SelfTouch) async {
        let fires = await TestThreads.run(name: "hl-self-touch", timeout: .seconds(30)) { () -> Int in
            let loop = RunLoop.current
            // Keeps the mode from being empty while the timer is out of it for a moment.
            let keepAlive = RunLoopSource {}
            loop.add(keepAlive, forMode: .default)
            let count = Atomic<Int>(0)
            let timer = RunLoopTimer(after: .milliseconds(100), repeating: .milliseconds(100)) { timer in
                count.add(1, ordering: .relaxed)
                switch touch {
                case .setsItsTolerance:
                    timer.tolerance = .milliseconds(1)
                case .removesItselfFromAModeItIsNotIn:
                    RunLoop.current.remove(timer, forMode: "HostileNeverScheduled")
                case .removesItselfAndAddsItselfBack:
                    RunLoop.current.remove(timer, forMode: .default)
                    RunLoop.current.add(timer, forMode: .default)
                }
            }
            loop.add(timer, forMode: .default)
            loop.run(mode: .default, for: .milliseconds(550))
            timer.invalidate()
            loop.remove(keepAlive, forMode: .default)
            return count.load(ordering: .relaxed)
        }
        guard let fires else { return }
        #expect((3...7).contains(fires), "a 100 ms repeating timer fired \(fires) times in 550 ms (\(touch))")
    }

    /// A fire date the handler sets is honoured: set to now + 300 ms on the first fire, the next
    /// fire comes no earlier than that (a timer never fires before its fire date).
    @Test func aFireDateSetInTheHandlerIsHonoured() async {
        let gaps = await TestThreads.run(name: "hl-set-date", timeout: .seconds(30)) { () -> [Double] in
            let loop = RunLoop.current
            let keepAlive = RunLoopSource {}
            loop.add(keepAlive, forMode: .default)
            let setAt = Mutex<ContinuousClock.Instant?>(nil)
            let gaps = Mutex<[Double]>([])
            let timer = RunLoopTimer(after: .milliseconds(10), repeating: .milliseconds(100)) { timer in
                if let set = setAt.locked({ $0 }) {
                    gaps.locked { $0.append(millisecondsSince(set)) }
                    timer.invalidate()
                    RunLoop.current.stop()
                    return
                }
                let now = ContinuousClock.now
                setAt.locked { $0 = now }
                timer.fireDate = now + .milliseconds(300)
            }
            loop.add(timer, forMode: .default)
            loop.run(mode: .default, for: .seconds(5))
            timer.invalidate()
            loop.remove(keepAlive, forMode: .default)
            return gaps.locked { $0 }
        }
        guard let gaps else { return }
        #expect(gaps.count == 1, "the timer fired again after its handler set its fire date: \(gaps)")
        if let gap = gaps.first {
            #expect(gap >= 300, "the timer fired \(gap) ms after its handler set its fire date 300 ms ahead")
        }
    }
}
