import Foundation
import SharedTestSupport
import Testing

// A seeded, randomized differential test: random scripts of run-loop operations (Source0s with
// orders, due and far timers, observers, modes and common modes, blocks, nested runs, stop,
// wakeUp, and queries: nextTimerFireDate, currentMode, allModes, contains, isValid, fireDate),
// written against `LoopDriver`, each run once on CFRunLoop and once on RunLoopKit (fresh thread,
// fresh loop each, as `diffTraceOf` does), the two traces compared. Scripts are single-threaded
// and deterministic from their seed (Support/SplitMix.swift); the generator, the interpreter and
// the minimizer are Support/DiffFuzz.swift, whose header lists what the generator leaves out by
// construction (the documented deviations, and what CF on Linux does not do deterministically).
//
// On a mismatch the script is run twice more (a difference that does not reproduce is timing
// noise on a loaded machine, and is only printed), then minimized by delta debugging (operations
// are dropped while the traces still differ), and the test fails with the minimized script as
// pseudo-code and both traces, the first difference marked.
//
// Before the fixes of the K..N divergences (FuzzFoundDiffTests.swift), seeds 0..<6000 found,
// minimized: K (a Source0 signalled by an earlier perform of the same pass), O (add(_, .common)
// after leaving one common mode), P (remove(timer, _) in a timer handler), L (nextTimerFireDate
// in a timer callout), B (equal-order Source0s), N (a collected due timer moved by an earlier
// handler), and two causes in no list, now left out by the generator (Support/DiffFuzz.swift,
// Q and R). The default seeds must pass once those are fixed.
//
// Running it:
//   swift test --filter DiffFuzzTests                  the default seeds, 0..<500
//   RLK_FUZZ_SEEDS=1000-5000 swift test --filter DiffFuzzTests
//                                                      seeds 1000 ..< 5000 (or one seed: =1234)
//   RLK_FUZZ_MAX_FAILURES=50                           report up to 50 mismatches (default 3), each
//                                                      minimized script once
//   RLK_FUZZ_PRINT=1                                   print every script and its CF trace
//   RLK_FUZZ_NEW_CAUSES=1                              also generate the patterns of divergences found
//                                                      but not decided yet (Support/DiffFuzz.swift: Q, R)
//   RLK_FUZZ_SELF_CHECK=cf (or rlk)                    compare CF with CF (RunLoopKit with RunLoopKit):
//                                                      checks that the generator makes only scripts
//                                                      the implementation runs deterministically

@Suite("Differential fuzz: random scripts on CFRunLoop and RunLoopKit", .serialized)
struct DiffFuzzTests {
    static let defaultSeeds: Range<UInt64> = 0..<500

    static func seeds() -> Range<UInt64> {
        guard let spec = ProcessInfo.processInfo.environment["RLK_FUZZ_SEEDS"], !spec.isEmpty else {
            return defaultSeeds
        }
        let parts = spec.split(separator: "-").compactMap { UInt64($0.trimmingCharacters(in: .whitespaces)) }
        if parts.count == 2, parts[0] < parts[1] { return parts[0]..<parts[1] }
        if parts.count == 1 { return parts[0]..<(parts[0] + 1) }
        Issue.record("RLK_FUZZ_SEEDS must be \"FROM-TO\" (TO excluded) or one seed; got \"\(spec)\"")
        return 0..<0
    }

    static let selfCheck = ProcessInfo.processInfo.environment["RLK_FUZZ_SELF_CHECK"] ?? ""

    static func outcome(_ script: FuzzScript) -> FuzzOutcome {
        switch selfCheck {
        case "cf": DiffFuzz.outcome(script, cf: { CFLoopDriver() }, rlk: { CFLoopDriver() })
        case "rlk": DiffFuzz.outcome(script, cf: { RLKLoopDriver() }, rlk: { RLKLoopDriver() })
        default: DiffFuzz.outcome(script, cf: { CFLoopDriver() }, rlk: { RLKLoopDriver() })
        }
    }

    /// Whether the traces still differ on `runs` more runs.
    static func reproduces(_ script: FuzzScript, runs: Int = 2) -> Bool {
        (0..<runs).allSatisfy { _ in outcome(script).differs }
    }

    @Test func randomScriptsMatchCF() {
        let env = ProcessInfo.processInfo.environment
        let maxFailures = Int(env["RLK_FUZZ_MAX_FAILURES"] ?? "") ?? 3
        let printAll = env["RLK_FUZZ_PRINT"] == "1"
        let seeds = Self.seeds()
        let clock = ContinuousClock()
        let start = clock.now
        var failures = 0
        var reported = Set<String>()
        var noise = 0
        for seed in seeds {
            let script = FuzzGenerator.script(seed: seed, newCauses: env["RLK_FUZZ_NEW_CAUSES"] == "1")
            let first = Self.outcome(script)
            if printAll {
                print("\(script.pseudoCode)\n--- CF trace:\n\(first.cf.joined(separator: "\n"))\n")
            }
            guard first.differs else { continue }
            guard Self.reproduces(script) else {
                noise += 1
                print("DiffFuzz: seed \(seed) differed once and not again (timing noise), ignored")
                continue
            }
            var minimized = DiffFuzz.minimize(script) { Self.outcome($0).differs }
            var final = Self.outcome(minimized)
            if !final.differs || !Self.reproduces(minimized) {
                minimized = script
                final = first
            }
            let key = minimized.canonicalKey
            guard reported.insert(key).inserted else {
                print("DiffFuzz: seed \(seed) minimizes to a script already reported")
                continue
            }
            let text = DiffFuzz.report(minimized, final, original: script.operationCount)
            print(text + "\n")
            Issue.record(Comment(rawValue: text))
            failures += 1
            if failures >= maxFailures { break }
        }
        let elapsed = start.duration(to: clock.now)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
        print(
            "DiffFuzz: seeds \(seeds.lowerBound)..<\(seeds.upperBound), \(failures) mismatch(es) reported, "
                + "\(noise) not reproduced, in \(String(format: "%.2f", seconds)) s")
    }
}

extension FuzzScript {
    /// The pseudo-code without the seed, items renamed in order of appearance (per kind) and the
    /// two non-default modes likewise: two seeds minimizing to the same shape give the same key.
    var canonicalKey: String {
        var names: [String: String] = [:]
        var counts: [Character: Int] = [:]
        var out = ""
        var token = ""
        func flush() {
            guard !token.isEmpty else { return }
            if let first = token.first, "STO".contains(first), token.count > 1, token.dropFirst().allSatisfy(\.isNumber)
            {
                if names[token] == nil {
                    names[token] = "\(first)\(counts[first, default: 0])"
                    counts[first, default: 0] += 1
                }
                out += names[token]!
            } else if token == "tracking" || token == "my" {
                if names[token] == nil {
                    names[token] = "mode\(counts["m", default: 0])"
                    counts["m", default: 0] += 1
                }
                out += names[token]!
            } else {
                out += token
            }
            token = ""
        }
        for ch in pseudoCode.split(separator: "\n").dropFirst().joined(separator: "\n") {
            if ch.isLetter || ch.isNumber {
                token.append(ch)
            } else {
                flush()
                out.append(ch)
            }
        }
        flush()
        return out
    }
}
