import ArgumentParser
import CBenchSupport
import Foundation

/// Every workload, in the issue's order.
func workloads(full: Bool) -> [any Workload] {
    var churn = TimerChurnWorkload()
    if full { churn.cfOperations = churn.operations }
    return [
        SubmissionWorkload(),
        PingPongWorkload(),
        TimerInsertionWorkload(),
        TimerFiringWorkload(),
        IterationWorkload(),
        TimerAccuracyWorkload(),
        IdleWorkload(),
        BackgroundWorkload(),
        AllocationWorkload(),
        MemoryWorkload(),
        churn,
        MessagePortWorkload(),
        StallMonitorWorkload(),
        MonitorCostWorkload(),
        FirstReportWorkload(),
        StackCaptureWorkload(),
        ParkedCaptureWorkload(),
        CPUScanWorkload(),
        IdleFeedWorkload(),
        SchedulingWakeupsWorkload(),
        SchedulingCostWorkload(),
        CommitWorkload(),
        DisplayLinkWorkload(),
        TraceCostWorkload(),
        MainActorWorkload(),
        TicksWorkload(),
        ClockDeterminismWorkload(),
        NIOTickWorkload(),
        GLibWorkload(),
        GTKWorkload(),
    ]
}
let allWorkloads = workloads(full: false)

@main
struct RunLoopBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "runloop-bench",
        abstract: "RunLoopKit side by side with CFRunLoop and SwiftNIO, interleaved in one run.",
        discussion: "Workloads: \(allWorkloads.map(\.name).joined(separator: ", ")).")

    @Option(name: .customLong("only"), help: "Run only this workload (repeatable).")
    var only: [String] = []

    @Option(
        name: .customLong("impl"),
        help:
            "Run only this implementation (repeatable: runloopkit, runloopkit-nospin, cf, nio, floor, floor-nospin); for profiling one, e.g. under perf record. Ratios need all."
    )
    var impls: [String] = []

    @Option(help: "Repetitions of each implementation (at least 1; the targets assume 5 or more).")
    var reps = 5

    @Option(help: "Also write the figures as JSON to this file.")
    var json: String?

    @Flag(
        help:
            "Run every workload at its full size on every implementation (CF's timer churn: 1,000,000 operations instead of 100,000 scaled)."
    )
    var full = false

    @Flag(help: "List the workloads and exit.")
    var list = false

    func validate() throws {
        guard reps >= 1 else { throw ValidationError("--reps must be at least 1") }
        for name in impls where !Impl.allCases.contains(where: { $0.option == name }) {
            throw ValidationError(
                "unknown implementation '\(name)'; known: \(Impl.allCases.map(\.option).joined(separator: ", "))")
        }
        let known = Set(allWorkloads.map(\.name))
        for name in only where !known.contains(name) {
            throw ValidationError(
                "unknown workload '\(name)'; known: \(allWorkloads.map(\.name).joined(separator: ", "))")
        }
    }

    func run() throws {
        if list {
            for (i, w) in allWorkloads.enumerated() {
                print("\(w.name.padding(toLength: 9, withPad: " ", startingAt: 0)) \(i + 1). \(w.title)")
            }
            return
        }
        // `gtk` needs the trait GTK and Xvfb: it runs only when named.
        let selected = workloads(full: full).enumerated().filter {
            only.isEmpty ? $0.element.name != "gtk" : only.contains($0.element.name)
        }
        let machine = Machine.current()
        let header = """
            runloop-bench: \(reps) interleaved repetitions per implementation; figures are medians (min–max).
            machine: \(machine.nproc) CPUs, \(machine.cpu), Linux \(machine.kernel), \(machine.swift)

            """
        print(header)
        let harness = Harness(reps: reps, only: Set(Impl.allCases.filter { impls.contains($0.option) })) { line in
            FileHandle.standardError.write(Data((line + "\n").utf8))
        }
        let started = cbench_now_ns()
        var reports: [WorkloadReport] = []
        var everything: [WorkloadResults] = []
        for (index, workload) in selected {
            let results = harness.run(workload)
            let report = makeReport(results)
            reports.append(report)
            everything.append(results)
            print(renderTable(index + 1, results, report))
        }
        if let headline = renderHeadline(everything) { print(headline) }
        let elapsed = seconds(from: started, to: cbench_now_ns())
        let targets = reports.flatMap { r in r.targets.map { (r.title, $0) } }
        if !targets.isEmpty {
            print("Targets (\(targets.filter { $0.1.met }.count) of \(targets.count) MET)")
            for (title, t) in targets {
                print("  \(t.met ? "MET   " : "MISSED") \(title): \(t.target) — \(t.measured)")
            }
        }
        print(String(format: "\ntotal %.0f s", elapsed))
        if let json {
            let formatter = ISO8601DateFormatter()
            let command = (["runloop-bench"] + CommandLine.arguments.dropFirst()).joined(separator: " ")
            try writeJSON(
                BenchReport(
                    date: formatter.string(from: Date()), command: command, machine: machine, reps: reps,
                    seconds: elapsed, workloads: reports),
                to: json)
        }
    }
}
