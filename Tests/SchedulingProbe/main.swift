// Misuse of RunLoopScheduling that must stop the process with a clear precondition message
// (RunLoopSchedulingTests launch this and read its standard error):
//
//   idle-budget       IdleTaskQueue(budget: .zero)
//   idle-capacity     IdleTaskQueue(capacity: 0)
//   idle-timeout      enqueue(timeout: .milliseconds(-5))
//   idle-modes        IdleTaskQueue(modes: [])
//   fps-zero          DisplayLink(framesPerSecond: 0)
//   fps-huge          DisplayLink(framesPerSecond: 2_000_000)
//   fps-window        FrameRateMonitor(window: .zero)
//   commit-modes      CommitCoalescer(modes: [])
//   pool-modes        IterationPool(modes: [])
import Foundation

import class RunLoopKit.RunLoop
import RunLoopKit
import RunLoopScheduling

let loop = RunLoop.current
let scenario = CommandLine.arguments.count > 1 ? CommandLine.arguments[1] : ""

switch scenario {
case "idle-budget":
    _ = IdleTaskQueue(loop: loop, budget: .zero)
case "idle-capacity":
    _ = IdleTaskQueue(loop: loop, capacity: 0)
case "idle-timeout":
    IdleTaskQueue(loop: loop).enqueue(timeout: .milliseconds(-5)) { _ in .done }
case "idle-modes":
    _ = IdleTaskQueue(loop: loop, modes: [])
case "fps-zero":
    _ = DisplayLink(loop: loop, framesPerSecond: 0) { _ in }
case "fps-huge":
    _ = DisplayLink(loop: loop, framesPerSecond: 2_000_000) { _ in }
case "fps-window":
    _ = FrameRateMonitor(link: DisplayLink(loop: loop) { _ in }, window: .zero)
case "commit-modes":
    _ = CommitCoalescer(loop: loop, modes: [])
case "pool-modes":
    _ = IterationPool(loop: loop, modes: [])
default:
    FileHandle.standardError.write(Data("usage: SchedulingProbe SCENARIO (see Tests/SchedulingProbe/main.swift)\n".utf8))
    exit(2)
}
print("no precondition stopped \(scenario)")
