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
//
// Hostile conditions that need a process of their own (they print what they saw, then "done"):
//
//   no-descriptors    no descriptor left: a DisplayLink reports EMFILE and stays invalid, while an
//                     idle queue and a coalescer (which need none) still run on the loop
//   fork-link         a 100 Hz link runs; a forked child pauses and invalidates it (shared timerfd):
//                     the parent's frames must go on
import Foundation
import Glibc
import Synchronization

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
case "no-descriptors":
    noDescriptors()
case "fork-link":
    forkLink()
default:
    FileHandle.standardError.write(Data("usage: SchedulingProbe SCENARIO (see Tests/SchedulingProbe/main.swift)\n".utf8))
    exit(2)
}
print("no precondition stopped \(scenario)")

/// Fills the process's descriptor table (soft limit lowered to 64 first).
func exhaustDescriptors() -> [Int32] {
    var limit = rlimit()
    getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
    limit.rlim_cur = min(limit.rlim_cur, 64)
    setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
    var fillers: [Int32] = []
    while true {
        let fd = open("/dev/null", O_RDONLY | O_CLOEXEC)
        if fd < 0 { break }
        fillers.append(fd)
    }
    return fillers
}

func noDescriptors() {
    let fillers = exhaustDescriptors()
    let link = DisplayLink(loop: loop) { _ in }
    print("link error: \(link.creationError.map { "\($0)" } ?? "none")")
    print("link valid: \(link.isValid)")
    link.isPaused = true
    link.invalidate()
    let ran = Mutex<[String]>([])
    let idle = IdleTaskQueue(loop: loop)
    let commit = CommitCoalescer(loop: loop)
    let keep = RunLoopTimer(after: .seconds(3600)) { _ in }
    loop.add(keep, forMode: .default)
    loop.perform {
        idle.enqueue { _ in ran.locked { $0.append("idle") }; return .done }
        commit.setNeedsCommit(key: 1) { ran.locked { $0.append("commit") } }
    }
    let deadline = ContinuousClock.now + .seconds(10)
    while ran.locked({ $0.count }) < 2 && ContinuousClock.now < deadline { loop.run(mode: .default, for: .milliseconds(50)) }
    print("ran: \(ran.locked { $0.sorted().joined(separator: ",") })")
    for fd in fillers { close(fd) }
    let again = DisplayLink(loop: loop) { _ in }
    print("after release: \(again.creationError == nil && again.isValid)")
    again.invalidate()
    keep.invalidate()
    print("done")
}

func forkLink() {
    let frames = Atomic<Int>(0)
    let link = DisplayLink(loop: loop, framesPerSecond: 100) { _ in frames.add(1, ordering: .relaxed) }
    loop.run(mode: .default, for: .milliseconds(100))
    let child = fork()
    if child == 0 {
        link.isPaused = true
        link.invalidate()
        _exit(0)
    }
    var status: Int32 = 0
    waitpid(child, &status, 0)
    print("child exit: \(status)")
    let before = frames.load(ordering: .relaxed)
    loop.run(mode: .default, for: .milliseconds(300))
    print("frames after the child: \(frames.load(ordering: .relaxed) - before)")
    link.invalidate()
    print("done")
}
