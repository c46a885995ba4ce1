import ArgumentParser
import Foundation

/// `runloop-lab`: the seeds' RunLoop experiments, run on Linux with RunLoopKit.
@main
struct RunLoopLab: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "runloop-lab",
        abstract: "Run the RunLoop experiments of the seed articles on RunLoopKit and show what the loop did.",
        subcommands: [TourCommand.self, ListCommand.self],
        defaultSubcommand: TourCommand.self
    )
}

/// `runloop-lab tour [--only N ...]`: runs the experiments and prints their traces.
struct TourCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tour",
        abstract: "Run the experiments (all of them, or those given with --only) and print their traces."
    )

    @Option(
        name: .long, help: ArgumentHelp("Run only experiment N (repeatable; see `runloop-lab list`).", valueName: "n"))
    var only: [Int] = []

    func validate() throws {
        for number in only where !Tour.all.indices.contains(number - 1) {
            throw ValidationError("no experiment \(number); there are \(Tour.all.count) (see `runloop-lab list`)")
        }
    }

    func run() {
        let started = ContinuousClock.now
        let numbers = only.isEmpty ? Array(1...Tour.all.count) : only
        print("runloop-lab tour: \(numbers.count) experiment(s) on RunLoopKit, each on its own threads.")
        print("Times are milliseconds since the experiment started; they vary from run to run.")
        for number in numbers {
            let experiment = Tour.all[number - 1]
            Out.heading(number, "\(experiment.title) (\(experiment.seed))")
            Out.paragraph(experiment.summary)
            experiment.run()
        }
        print("")
        print("Tour done in \(Trace.ms(.now - started)).")
    }
}

/// `runloop-lab list`: the experiments, numbered as `tour --only N` expects.
struct ListCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "List the experiments of the tour."
    )

    func run() {
        for (index, experiment) in Tour.all.enumerated() {
            print("\(index + 1). \(experiment.title) (\(experiment.seed))")
            Out.paragraph(experiment.summary, indent: 3)
        }
    }
}
