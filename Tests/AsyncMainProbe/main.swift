import Glibc
import RunLoopAsyncMain
import RunLoopConcurrency
import RunLoopKit

import class RunLoopKit.RunLoop

// An async main linked with RunLoopAsyncMain (RunLoopConcurrencyTests launch it): its main-actor
// jobs run on RunLoop.main, whose timers fire, also during a `.tracking` run entered from the loop.

func report(_ key: String, _ value: Any) {
    var line = "\(key)=\(value)\n"
    line.withUTF8 { _ = write(1, $0.baseAddress, $0.count) }
}

@main struct AsyncMainProbe {
    static func main() async {
        alarm(30)
        report("installed", RunLoopAsyncMain.isInstalled)
        report("bodyOnMainLoopThread", RunLoop.main.isCurrent)
        let scenario = CommandLine.arguments.dropFirst().first ?? ""
        RunLoop.main.addCommonMode(.tracking)
        // A tracking run entered from the main loop's own timer: main-actor steps go on in it.
        let track = RunLoopTimer(after: .milliseconds(50)) { _ in
            let result = RunLoop.main.run(mode: .tracking, for: .milliseconds(200))
            report("trackingRun", result)
        }
        RunLoop.main.add(track, forMode: .default)
        var stepsDuringTracking = 0
        for _ in 0..<30 {
            try? await Task.sleep(for: .milliseconds(10))
            if RunLoop.main.currentMode == .tracking { stepsDuringTracking += 1 }
        }
        report("stepsDuringTracking", stepsDuringTracking)
        report("stillOnMainLoopThread", RunLoop.main.isCurrent)
        if scenario == "stop" {
            // The main loop's run ends with the stop; runMain()'s status becomes the process's.
            // (Returning from here at once would exit(0) first: the body's return ends the program.)
            RunLoopConcurrency.stopMain(status: 4)
            try? await Task.sleep(for: .seconds(10))
        }
        // Returning ends the program with status 0.
    }
}
