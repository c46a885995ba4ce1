import Testing

@testable import RunLoopKit

// `SleepPlan.make`, the one place that decides when a sleep ends (RunState.swift): a pure
// function, so its cases are plain values. Times in nanoseconds; `never` is LoopClock.never.
struct SleepPlanTests {
    static let never = LoopClock.never

    struct Case: CustomTestStringConvertible, Sendable {
        let name: String
        let timer: Int64
        let run: Int64
        let retry: Int64?
        let spin: Int64
        let expected: SleepPlan
        var testDescription: String { name }
    }

    static let cases: [Case] = [
        Case(name: "the next timer ends the sleep", timer: 5_000, run: never, retry: nil, spin: 0, expected: .block(until: 5_000)),
        Case(name: "the run's deadline comes first", timer: 9_000, run: 3_000, retry: nil, spin: 0, expected: .block(until: 3_000)),
        Case(name: "nothing due: a sleep without end", timer: never, run: never, retry: nil, spin: 0, expected: .block(until: never)),
        Case(name: "the timer is due now: no sleep", timer: 1_000, run: never, retry: nil, spin: 0, expected: .none),
        Case(name: "the run's deadline passed: no sleep", timer: 9_000, run: 500, retry: nil, spin: 0, expected: .none),
        Case(name: "a retry comes before the timer", timer: 9_000, run: never, retry: 2_000, spin: 0, expected: .block(until: 3_000)),
        Case(name: "the spin window: wake early", timer: 9_000, run: never, retry: nil, spin: 1_000, expected: .block(until: 8_000)),
        Case(name: "inside the spin window: spin to the timer", timer: 1_500, run: never, retry: nil, spin: 1_000, expected: .spin(until: 1_500)),
        Case(name: "the run ends first: no spin", timer: 9_000, run: 4_000, retry: nil, spin: 1_000, expected: .block(until: 4_000)),
        Case(name: "a retry before the early wake still bounds it", timer: 9_000, run: never, retry: 500, spin: 1_000, expected: .block(until: 1_500)),
        Case(name: "a huge retry saturates", timer: never, run: never, retry: Int64.max, spin: 0, expected: .block(until: never)),
    ]

    @Test(arguments: cases)
    func plans(_ example: Case) {
        let plan = SleepPlan.make(
            timerDeadline: example.timer, runDeadline: example.run, now: 1_000, retryAfter: example.retry,
            spinWindow: example.spin)
        #expect(plan == example.expected)
    }
}
