// Stall-monitor scenarios that need a process of their own (RunLoopMonitorTests launch them):
//
//   trust [NAME]      what a monitor must do in a real program (Trust.swift): blocked stalls read
//                     without changing them, one stall per callout, blame, end, back-off; prints
//                     ok/FAIL lines, exits 1 on a failure. NAME runs one scenario.
//   fork-captures     20 fork()s while another thread captures and symbolicates in a loop: each
//                     child captures and runs a stall monitor; prints "children ok N/20".
//   handler-replaced  the capture signal reset to SIG_DFL, then given another handler: captures
//                     fail with a clear error and the process lives.
//   small-stack       50 captures of a thread on a PTHREAD_STACK_MIN stack with 5.5 KiB left;
//                     prints "captured N/50".
//   stall DIR?        a 400 ms busy stall and a 400 ms blocked stall on a watched loop; prints each
//                     event as a JSON line ("began"/"ended" + the report), then "done". In a
//                     release build (frame pointers omitted) this checks the unwinder CI relies on.
//   hang DIR          a monitor with a StallReportStore in DIR, then a stall that never ends; once
//                     the began line is on disk it prints "began" and SIGKILLs itself.
//   unfinished DIR    prints the store's unfinished() reports as JSON lines, then "done".
//   bad-threshold     StallMonitor(threshold: 0): must stop with a precondition message.
//   bad-interval      StallMonitor(sampleInterval: -1 ms): the same.
//   cpu-windows N     a CPU monitor runs N windows at once (test hook), reports a spinner, stops;
//                     prints "windows done", "hot reported", "stopped".
//   began DIR         a monitor with a store in DIR and a stall; exits (0) once the began line is on
//                     disk, printing "began pid P".
//   pidns ARGS...     runs this probe with ARGS as pid 1 of a new PID namespace (unshare; status
//                     77 when it cannot).
//   torn-write DIR    a store line cut short by RLIMIT_FSIZE, then an acknowledgement and a record;
//                     prints the ids read back.
//   store-write DIR N TAG  N began lines (ids TAG-0…) into a store rotating at 4 KiB, keeping 100
//                     files; two at once must leave every line whole.
//   emfile WHEN       a 1 s blocked and a 0.6 s busy stall with no descriptor left, the table
//                     filled while "watching" or before "start" (Descriptors.swift); JSON lines.
//   first-report      a stall right after the monitor starts: when its began and ended reports
//                     come (BENCHMARKS.md's first-report latency).
//   fork              running stall and CPU monitors, then fork(): the child stops both (which
//                     must return at once: their threads are not in the child) and exits 0; the
//                     parent prints the child's status, then stops its own monitors.
import Foundation
import Glibc
import RunLoopKit
import RunLoopMonitor

/// Writes a line to standard output at once (the parent waits for lines while this runs on).
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}
// A process started by the test runner (Foundation's Process, from a libdispatch thread) inherits
// a mask that blocks every signal; a program started from a shell blocks none. Start as the latter.
var noSignals = sigset_t()
sigemptyset(&noSignals)
pthread_sigmask(SIG_SETMASK, &noSignals, nil)

let arguments = CommandLine.arguments
let scenario = arguments.count > 1 ? arguments[1] : ""

func printJSON(_ event: String, _ report: StallReport) {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    let data = (try? encoder.encode(report)) ?? Data()
    say("{\"event\":\"\(event)\",\"report\":\(String(decoding: data, as: UTF8.self))}")
}

switch scenario {
case "trust":
    Trust.run(only: arguments.count > 2 ? arguments[2] : nil)
case "fork-captures":
    Hostile.forkWhileCapturing()
case "handler-replaced":
    Hostile.handlerReplaced()
case "small-stack":
    Hostile.smallStack()
case "stall":
    Probes.stall()
case "hang":
    Probes.hang(directory: arguments[2])
case "unfinished":
    let store = try StallReportStore(directory: arguments[2])
    for report in try store.unfinished() { printJSON("unfinished", report) }
    say("done")
case "bad-threshold":
    _ = StallMonitor(loop: RunLoop.current, threshold: .zero)
case "bad-interval":
    _ = StallMonitor(loop: RunLoop.current, sampleInterval: .milliseconds(-1))
case "fork":
    Probes.forkWithRunningMonitors()
case "first-report":
    FirstReport.measure()
case "emfile":
    Descriptors.stallsWithNoDescriptorLeft(whenFull: arguments[2])
case "cpu-windows":
    Probes.cpuWindows(Int(arguments[2]) ?? 100_000)
case "began":
    Probes.began(directory: arguments[2])
case "pidns":
    Probes.inNewPIDNamespace(Array(arguments.dropFirst(2)))
case "torn-write":
    Probes.tornWrite(directory: arguments[2])
case "store-write":
    Probes.storeWrite(directory: arguments[2], count: Int(arguments[3])!, tag: arguments[4])
default:
    FileHandle.standardError.write(Data("usage: MonitorProbe trust [NAME] | fork-captures | handler-replaced | small-stack | stall | hang DIR | unfinished DIR | bad-threshold | bad-interval | fork | emfile watching|start | first-report | cpu-windows N | began DIR | pidns ARGS... | torn-write DIR | store-write DIR N TAG\n".utf8))
    exit(2)
}
