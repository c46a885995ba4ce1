import RunLoopKit
import Foundation
import class RunLoopKit.RunLoop

let rl = RunLoop.current
let obs = RunLoopObserver(activities: .allActivities) { _, act in print("obs", act.rawValue) }
rl.add(obs, forMode: .default)
let t = RunLoopTimer(after: .milliseconds(10)) { _ in print("timer") }
rl.add(t, forMode: .default)
rl.perform { print("block") }
let r = rl.run(mode: .default, for: .milliseconds(100))
print("result", r.rawValue)
print(rl)
