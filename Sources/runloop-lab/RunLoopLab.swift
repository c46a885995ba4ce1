import ArgumentParser
import Foundation
import RunLoopMonitor

/// `runloop-lab`: the seeds' RunLoop experiments, run on Linux with RunLoopKit.
@main
struct RunLoopLab: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "runloop-lab",
        abstract: "Run the RunLoop experiments of the seed articles on RunLoopKit and show what the loop did.",
        subcommands: [
            TourCommand.self, ListCommand.self, TimelineCommand.self, CrashChildCommand.self, MainActorChildCommand.self,
            GTKChildCommand.self,
        ],
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

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Record each experiment's loops and write its trace (Chrome JSON, for Perfetto UI) and timeline page (HTML) into this directory.",
            valueName: "dir"))
    var trace: String?

    func validate() throws {
        for number in only where !Tour.all.indices.contains(number - 1) {
            throw ValidationError("no experiment \(number); there are \(Tour.all.count) (see `runloop-lab list`)")
        }
        if let trace {
            do {
                try FileManager.default.createDirectory(atPath: trace, withIntermediateDirectories: true)
            } catch {
                throw ValidationError("cannot make the trace directory \(trace): \(error.localizedDescription)")
            }
        }
    }

    func run() throws {
        let started = ContinuousClock.now
        let numbers = only.isEmpty ? Array(1...Tour.all.count) : only
        print("runloop-lab tour: \(numbers.count) experiment(s) on RunLoopKit, each on its own threads.")
        print("Times are milliseconds since the experiment started; they vary from run to run.")
        for number in numbers {
            let experiment = Tour.all[number - 1]
            Out.heading(number, "\(experiment.title) (\(experiment.seed))")
            Out.paragraph("The seed: " + experiment.seedSays)
            Out.paragraph("Here: " + experiment.summary)
            try LabTrace.tracing(number: number, title: experiment.title, into: trace) { experiment.run() }
        }
        print("")
        print("Tour done in \(TourLog.ms(.now - started)).")
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
            Out.paragraph("The seed: " + experiment.seedSays, indent: 3)
            Out.paragraph("Here: " + experiment.summary, indent: 3)
        }
    }
}

/// `runloop-lab timeline TRACE.json -o PAGE.html`: the timeline page of any Chrome trace file.
struct TimelineCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "timeline",
        abstract: "Turn a Chrome Trace Event JSON file (e.g. one `tour --trace` wrote) into a self-contained HTML timeline."
    )

    @Argument(help: "The trace file (Chrome Trace Event JSON).")
    var input: String

    @Option(name: .shortAndLong, help: ArgumentHelp("The page to write.", valueName: "page.html"))
    var output: String

    @Option(name: .long, help: "The page's title (default: the input's file name).")
    var title: String?

    func run() throws {
        do {
            let bytes = try Self.read(input, limit: TimelinePage.maximumInputBytes)
            let page = try TimelinePage.html(chromeTrace: bytes, title: title ?? URL(filePath: input).lastPathComponent)
            try page.write(toFile: output, atomically: true, encoding: .utf8)
            print("runloop-lab timeline: wrote \(output) from \(input)")
        } catch let error as TimelinePage.InputError {
            Self.fail("\(input): \(error)")
        } catch let error as ReadError {
            Self.fail(error.description)
        } catch {
            Self.fail("cannot write \(output): \(error.localizedDescription)")
        }
    }

    struct ReadError: Error, CustomStringConvertible {
        let description: String
    }

    /// Reads at most `limit + 1` bytes: a larger file is reported as too large without being read.
    static func read(_ path: String, limit: Int) throws -> [UInt8] {
        guard let handle = FileHandle(forReadingAtPath: path) else {
            throw ReadError(description: "cannot open \(path): no such readable file")
        }
        defer { try? handle.close() }
        var bytes: [UInt8] = []
        while bytes.count <= limit {
            let chunk: Data?
            do {
                chunk = try handle.read(upToCount: 1 << 20)
            } catch {
                throw ReadError(description: "cannot read \(path): \(error.localizedDescription)")
            }
            guard let chunk, !chunk.isEmpty else { break }
            bytes.append(contentsOf: chunk)
        }
        return bytes
    }

    static func fail(_ message: String) -> Never {
        FileHandle.standardError.write(Data("runloop-lab timeline: error: \(message)\n".utf8))
        Foundation.exit(1)
    }
}
