import Foundation
import SharedTestSupport

// The differential fuzzer's machinery (the test is Differential/DiffFuzzTests.swift): a script
// model (items declared up front, a tree of operations), a seeded generator, an interpreter that
// runs a script against any `LoopDriver` and records a trace, a pretty-printer (readable
// pseudo-code) and a delta-debugging minimizer. Nothing here imports RunLoopKit.
//
// What the generator never produces, and why (each is a documented deviation, or a place where CF
// on Linux is not deterministic, so a difference there says nothing):
// - Equal timer fire dates, tolerance (deviations from CF listed in the RunLoopKit DocC overview). Timers are either "due"
//   (a date in the past) or "far" (hours ahead), all dates distinct. Due dates grow with each use
//   (creation, setFireDate), so CF's clamp of a past date to "now" (CFRunLoopTimerCreate,
//   CFRunLoopTimerSetNextFireDate) orders them exactly as their dates do. Repeating intervals are
//   >= 1000 s, so no timer fires twice by the clock within a script.
// - Reliance on a timer firing without a timer-port wakeup (deviation F), on spurious timerfd
//   wakeups (D) and on a timeout wakeup a nested run can eat (E): a script either has due timers
//   and never sleeps (the `timers` flavour: every run has timeout 0, no wakeUp()/stop(), so CF's
//   eventfd is never written and every poll that can see a due timer reads the timerfd), or it
//   sleeps and has no due timers (the `wakeups` flavour: far timers only, sleeping runs only at
//   the top level, nested runs only with timeout 0 and only where the enclosing run cannot sleep
//   before its next timeout check: in an afterWaiting or exit observer).
// - `perform` in a script that sleeps (deviation 1: RunLoopKit's perform wakes the loop): blocks
//   exist only in the `timers` flavour, which never sleeps.
// - A Source0 pass whose last collected source is not performed (deviation I): a Source0's
//   perform never invalidates a source and never runs a nested run (which could perform a source
//   the outer pass collected).
// - Equal observer orders (CF copies common items into a mode in hash-set order, so equal orders
//   would come out in an arbitrary order): observer orders are distinct.
// - The mode named kCFRunLoopCommonModes that CF makes for perform(.common) (G): allModes is
//   printed without it. The fire date of a dead timer (H): fireDate is read only while the timer
//   is valid.
// - Raw times: dates are printed as "due", or rounded to whole seconds (far dates are >= 10 s
//   apart), so CF's clamp (which moves a due date by milliseconds) does not show.
//
// Two more exclusions cover divergences the fuzzer found that are in no list yet (they are
// reported to whoever decides about them; RLK_FUZZ_NEW_CAUSES=1 generates them again):
// - "Q": CF leaves an item in the common items (`_commonModeItems`) when it is invalidated after
//   it left every mode (its `_runLoop` is NULL then, so CFRunLoop*Invalidate does not reach the
//   loop); and CFRunLoopContainsTimer answers false for .common while the timer is in no mode.
//   A common item is always in the default mode unless removed from it, so the generator never
//   removes from the default mode an item that the script adds to .common (it removes it from
//   .common instead).
// - "R": a nested run started in a timer's handler fires the other due timers the outer pass has
//   collected (CF re-arms the timerfd before the callout and collects again from the mode's
//   list); RunLoopKit leaves them to the outer pass. The generator starts no nested run directly
//   in a timer's handler.

// MARK: - Script model

enum FuzzFlavour: String, Sendable {
    /// Due and far timers, blocks, nested runs; every run has timeout 0 (no sleep).
    case timers
    /// Sleeping runs, wakeUp(), stop(); far timers only; no blocks.
    case wakeups
}

enum FuzzMode: Int, Sendable, CaseIterable {
    case `default`, tracking, my, common

    var name: String {
        switch self {
        case .default: DiffMode.default
        case .tracking: DiffMode.tracking
        case .my: DiffMode.my
        case .common: DiffMode.common
        }
    }
    var short: String {
        switch self {
        case .default: "default"
        case .tracking: "tracking"
        case .my: "my"
        case .common: ".common"
        }
    }
    static func short(_ name: String?) -> String {
        guard let name else { return "nil" }
        return allCases.first { $0.name == name }?.short ?? name
    }
}

enum FuzzItem: Hashable, Sendable {
    case source(Int)
    case timer(Int)
    case observer(Int)

    var name: String {
        switch self {
        case .source(let i): "S\(i)"
        case .timer(let i): "T\(i)"
        case .observer(let i): "O\(i)"
        }
    }
}

enum FuzzQuery: Hashable, Sendable {
    case nextTimerFireDate(FuzzMode)
    case currentMode
    case allModes
    case contains(FuzzItem, FuzzMode)
    case isValid(FuzzItem)
    case fireDate(Int)
}

indirect enum FuzzOp: Hashable, Sendable {
    case add(FuzzItem, FuzzMode)
    case remove(FuzzItem, FuzzMode)
    case invalidate(FuzzItem)
    case signal(Int)
    /// A fresh due date (in the past) or a fresh far date.
    case setFireDate(Int, due: Bool)
    case addCommonMode(FuzzMode)
    case perform([FuzzMode], [FuzzNode])
    /// Timeout 0, or (wakeups flavour, top level) a short sleeping run.
    case run(FuzzMode, sleeps: Bool, returnAfterSourceHandled: Bool)
    case stop
    case wakeUp
    case query(FuzzQuery)
}

/// One operation with a stable identity (the minimizer removes nodes by id).
struct FuzzNode: Hashable, Sendable {
    let id: Int
    var op: FuzzOp
}

struct FuzzSourceDecl: Hashable, Sendable {
    var order: Int
    /// Runs on the first perform only; later performs only log.
    var body: [FuzzNode]
}

struct FuzzTimerDecl: Hashable, Sendable {
    var due: Bool
    /// 0: one-shot; otherwise a repeating interval in seconds (>= 1000).
    var interval: Int
    /// Runs in the first call only.
    var body: [FuzzNode]
}

struct FuzzObserverDecl: Hashable, Sendable {
    var activities: UInt
    var order: Int
    var repeats: Bool
    /// The body runs the first time the observer is called for this activity.
    var trigger: UInt
    var body: [FuzzNode]
}

struct FuzzScript: Hashable, Sendable {
    var seed: UInt64
    var flavour: FuzzFlavour
    var sources: [FuzzSourceDecl] = []
    var timers: [FuzzTimerDecl] = []
    var observers: [FuzzObserverDecl] = []
    var main: [FuzzNode] = []

    /// Seconds a sleeping run waits at most (wakeups flavour).
    static let sleepTimeout = 0.02
    /// The due date of the k-th due timer at creation (setFireDate's due dates come after).
    static func dueDate(_ k: Int) -> Double { -0.2 + 0.001 * Double(k) }
    static func farDate(_ k: Int) -> Double { 3600 + 10 * Double(k) }

    /// Every node, depth first (declarations' bodies first, then main).
    var allNodes: [FuzzNode] {
        var out: [FuzzNode] = []
        func walk(_ nodes: [FuzzNode]) {
            for n in nodes {
                out.append(n)
                if case .perform(_, let body) = n.op { walk(body) }
            }
        }
        for s in sources { walk(s.body) }
        for t in timers { walk(t.body) }
        for o in observers { walk(o.body) }
        walk(main)
        return out
    }

    var operationCount: Int { allNodes.count }

    /// The script without the nodes in `ids` (and their sub-trees).
    func removing(_ ids: Set<Int>) -> FuzzScript {
        func prune(_ nodes: [FuzzNode]) -> [FuzzNode] {
            nodes.compactMap { n in
                if ids.contains(n.id) { return nil }
                if case .perform(let modes, let body) = n.op {
                    return FuzzNode(id: n.id, op: .perform(modes, prune(body)))
                }
                return n
            }
        }
        var s = self
        for i in s.sources.indices { s.sources[i].body = prune(s.sources[i].body) }
        for i in s.timers.indices { s.timers[i].body = prune(s.timers[i].body) }
        for i in s.observers.indices { s.observers[i].body = prune(s.observers[i].body) }
        s.main = prune(s.main)
        return s
    }

    /// The items some operation names (a declared item no operation names is never added to the
    /// loop; it is still created, but the pretty-printer leaves it out).
    var referencedItems: Set<FuzzItem> {
        var items = Set<FuzzItem>()
        for n in allNodes {
            switch n.op {
            case .add(let i, _), .remove(let i, _), .invalidate(let i): items.insert(i)
            case .signal(let s): items.insert(.source(s))
            case .setFireDate(let t, _): items.insert(.timer(t))
            case .query(.contains(let i, _)), .query(.isValid(let i)): items.insert(i)
            case .query(.fireDate(let t)): items.insert(.timer(t))
            default: break
            }
        }
        return items
    }
}

// MARK: - Generator

/// Builds a random script from a seed; the same seed always gives the same script.
struct FuzzGenerator {
    private var rng: SplitMix
    private var nextID = 0
    private var script: FuzzScript
    private var sleepingRuns = 0

    /// Where an operation list runs: it decides which operations are allowed (see the header).
    enum Context: Equatable {
        case top
        case source(Int)
        case timer(Int)
        case observer(Int, trigger: UInt)
        case block
    }

    /// Whether to generate the patterns of divergences found but not yet decided (see the
    /// header: Q and R).
    private let newCauses: Bool

    init(seed: UInt64, newCauses: Bool = false) {
        rng = SplitMix(seed: seed &* 0x9E37_79B9_7F4A_7C15 &+ 0x1234_5678)
        script = FuzzScript(seed: seed, flavour: .timers)
        self.newCauses = newCauses
    }

    static func script(seed: UInt64, newCauses: Bool = false) -> FuzzScript {
        var generator = FuzzGenerator(seed: seed, newCauses: newCauses)
        return generator.make()
    }

    private mutating func make() -> FuzzScript {
        script.flavour = rng.below(3) == 0 ? .wakeups : .timers
        let flavour = script.flavour
        let nSources = 1 + rng.below(4)
        for _ in 0..<nSources {
            // Equal orders happen (then CF orders by signal time).
            script.sources.append(FuzzSourceDecl(order: rng.below(4), body: []))
        }
        let nTimers = rng.below(4)
        for i in 0..<nTimers {
            let due = flavour == .timers && rng.below(3) != 0
            let interval = rng.below(2) == 0 ? 0 : 1000 + 10 * i
            script.timers.append(FuzzTimerDecl(due: due, interval: interval, body: []))
        }
        let nObservers = rng.below(3)
        var orders = [-1, 0, 1, 2, 3]
        orders.shuffle(using: &rng)
        let acts: [UInt] = [
            DiffActivity.entry, DiffActivity.beforeTimers, DiffActivity.beforeSources, DiffActivity.beforeWaiting,
            DiffActivity.afterWaiting, DiffActivity.exit,
        ]
        for i in 0..<nObservers {
            var mask: UInt = 0
            if rng.below(3) == 0 {
                mask = DiffActivity.all
            } else {
                for a in acts where rng.below(2) == 0 { mask |= a }
                if mask == 0 { mask = acts[rng.below(acts.count)] }
            }
            let candidates = acts.filter { mask & $0 != 0 }
            let trigger = candidates[rng.below(candidates.count)]
            script.observers.append(
                FuzzObserverDecl(
                    activities: mask, order: orders[i], repeats: rng.below(5) != 0, trigger: trigger, body: []))
        }
        // Bodies.
        for i in script.sources.indices where rng.below(3) != 0 {
            script.sources[i].body = ops(.source(i), count: 1 + rng.below(3), depth: 1)
        }
        for i in script.timers.indices where rng.below(3) != 0 {
            script.timers[i].body = ops(.timer(i), count: 1 + rng.below(3), depth: 1)
        }
        for i in script.observers.indices where rng.below(2) == 0 {
            let trigger = script.observers[i].trigger
            script.observers[i].body = ops(.observer(i, trigger: trigger), count: 1 + rng.below(3), depth: 1)
        }
        // Main: set the scene, then random operations with runs among them.
        var main: [FuzzNode] = []
        for i in script.sources.indices where rng.below(5) != 0 {
            main.append(node(.add(.source(i), mode())))
            if rng.below(2) == 0 { main.append(node(.signal(i))) }
        }
        for i in script.timers.indices where rng.below(5) != 0 { main.append(node(.add(.timer(i), mode()))) }
        for i in script.observers.indices where rng.below(5) != 0 { main.append(node(.add(.observer(i), mode()))) }
        main += ops(.top, count: 4 + rng.below(10), depth: 0)
        if rng.below(4) == 0 {
            // Leave a common mode and come back through .common.
            let m: FuzzMode = rng.below(2) == 0 ? .tracking : .my
            let i = item(.top)
            let pattern: [FuzzOp] = [
                .addCommonMode(m), .add(i, .common), .remove(i, m), .add(i, .common),
                rng.below(2) == 0 ? .query(.contains(i, m)) : .run(m, sleeps: false, returnAfterSourceHandled: false),
            ]
            main.insert(contentsOf: pattern.map { node($0) }, at: rng.below(main.count + 1))
        }
        if !main.contains(where: { if case .run = $0.op { return true } else { return false } }) {
            main.append(node(runOp(.top)))
        }
        script.main = main
        if !newCauses { avoidRemovingCommonItemsFromDefault() }
        return script
    }

    /// Q (see the header): an item the script adds to .common is removed from .common instead of
    /// from the default mode.
    private mutating func avoidRemovingCommonItemsFromDefault() {
        var common = Set<FuzzItem>()
        for n in script.allNodes { if case .add(let i, .common) = n.op { common.insert(i) } }
        func rewrite(_ nodes: [FuzzNode]) -> [FuzzNode] {
            nodes.map { n in
                switch n.op {
                case .remove(let i, .default) where common.contains(i):
                    return FuzzNode(id: n.id, op: .remove(i, .common))
                case .perform(let modes, let body):
                    return FuzzNode(id: n.id, op: .perform(modes, rewrite(body)))
                default:
                    return n
                }
            }
        }
        for i in script.sources.indices { script.sources[i].body = rewrite(script.sources[i].body) }
        for i in script.timers.indices { script.timers[i].body = rewrite(script.timers[i].body) }
        for i in script.observers.indices { script.observers[i].body = rewrite(script.observers[i].body) }
        script.main = rewrite(script.main)
    }

    private mutating func node(_ op: FuzzOp) -> FuzzNode {
        nextID += 1
        return FuzzNode(id: nextID, op: op)
    }

    private mutating func ops(_ ctx: Context, count: Int, depth: Int) -> [FuzzNode] {
        (0..<count).map { _ in node(op(ctx, depth: depth)) }
    }

    /// default 35 %, .common 30 %, tracking 20 %, my 15 %.
    private mutating func mode() -> FuzzMode {
        let r = rng.below(20)
        if r < 7 { return .default }
        if r < 13 { return .common }
        if r < 17 { return .tracking }
        return .my
    }

    /// A real mode to run in (running .common only returns finished).
    private mutating func runMode() -> FuzzMode {
        let r = rng.below(20)
        if r < 11 { return .default }
        if r < 16 { return .tracking }
        if r < 19 { return .my }
        return .common
    }

    private mutating func item(_ ctx: Context) -> FuzzItem {
        // Bodies name their own item half the time.
        if rng.below(2) == 0 {
            switch ctx {
            case .source(let i): return .source(i)
            case .timer(let i): return .timer(i)
            case .observer(let i, _): return .observer(i)
            default: break
            }
        }
        var kinds: [Int] = [0]
        if !script.timers.isEmpty { kinds.append(1) }
        if !script.observers.isEmpty { kinds.append(2) }
        switch kinds[rng.below(kinds.count)] {
        case 1: return .timer(rng.below(script.timers.count))
        case 2: return .observer(rng.below(script.observers.count))
        default: return .source(rng.below(script.sources.count))
        }
    }

    private mutating func timerIndex(_ ctx: Context) -> Int? {
        if case .timer(let i) = ctx, rng.below(2) == 0 { return i }
        return script.timers.isEmpty ? nil : rng.below(script.timers.count)
    }

    /// Whether a nested run (always timeout 0) may start here (see the header).
    private func nestedRunAllowed(_ ctx: Context, depth: Int) -> Bool {
        guard depth < 3 else { return false }
        switch ctx {
        case .top, .block: return true
        case .source: return false
        case .timer: return newCauses  // R
        case .observer(_, let trigger):
            if script.flavour == .timers { return true }
            return trigger == DiffActivity.afterWaiting || trigger == DiffActivity.exit
        }
    }

    private mutating func runOp(_ ctx: Context) -> FuzzOp {
        var sleeps = false
        if ctx == .top && script.flavour == .wakeups && sleepingRuns < 2 && rng.below(2) == 0 {
            sleeps = true
            sleepingRuns += 1
        }
        return .run(runMode(), sleeps: sleeps, returnAfterSourceHandled: rng.below(3) == 0)
    }

    private mutating func op(_ ctx: Context, depth: Int) -> FuzzOp {
        let flavour = script.flavour
        while true {
            let r = rng.below(100)
            switch r {
            case 0..<18:
                if nestedRunAllowed(ctx, depth: depth) && (ctx == .top || rng.below(2) == 0) { return runOp(ctx) }
            case 18..<34:
                return .signal(rng.below(script.sources.count))
            case 34..<50:
                return .add(item(ctx), mode())
            case 50..<60:
                return .remove(item(ctx), mode())
            case 60..<63:
                let i = item(ctx)
                if case .source = i, case .source = ctx { continue }  // deviation I
                return .invalidate(i)
            case 63..<69:
                if let t = timerIndex(ctx) { return .setFireDate(t, due: flavour == .timers && rng.below(2) == 0) }
            case 69..<73:
                return .addCommonMode(rng.below(2) == 0 ? .tracking : .my)
            case 73..<79:
                if flavour == .timers && depth < 3 {
                    var modes = [mode()]
                    if rng.below(4) == 0 { modes.append(mode()) }
                    let body = ops(.block, count: 1 + rng.below(2), depth: depth + 1)
                    return .perform(modes, body)
                }
            case 79..<84:
                if flavour == .wakeups { return .stop }
            case 84..<88:
                if flavour == .wakeups { return .wakeUp }
            default:
                return .query(query(ctx))
            }
        }
    }

    private mutating func query(_ ctx: Context) -> FuzzQuery {
        switch rng.below(7) {
        case 0: return .nextTimerFireDate(runMode())
        case 1: return .currentMode
        case 2: return .allModes
        case 3: return .isValid(item(ctx))
        case 4:
            if let t = timerIndex(ctx) { return .fireDate(t) }
            return .contains(item(ctx), mode())
        default: return .contains(item(ctx), mode())
        }
    }
}

// MARK: - Interpreter

/// Runs one script against one driver, on the driver's thread, recording a trace.
///
/// `@unchecked Sendable`: the loop calls every callback (source performs, timer handlers,
/// observers, blocks) on the thread that runs it, which is the thread that created this object
/// and runs `start()` (scripts never hand an item to another thread). So all its state is touched
/// by one thread only; the closures that capture it are `@Sendable` only because the driver API
/// asks for that.
final class FuzzInterpreter: @unchecked Sendable {
    let driver: any LoopDriver
    let trace: DiffTrace
    let script: FuzzScript
    private var sources: [any DiffSource] = []
    private var timers: [any DiffTimer] = []
    private var observers: [any DiffObserver] = []
    private var sourceCalls: [Int] = []
    private var timerCalls: [Int] = []
    private var observerBodyDone: [Bool] = []
    private var dueCounter = 0
    private var farCounter = 0
    private var runDepth = 0
    private var live = true

    init(_ driver: any LoopDriver, _ trace: DiffTrace, _ script: FuzzScript) {
        self.driver = driver
        self.trace = trace
        self.script = script
    }

    private func log(_ line: String) {
        guard live else { return }
        trace(String(repeating: "  ", count: runDepth) + line)
    }

    private func mode() -> String { FuzzMode.short(driver.currentMode) }

    func start() {
        // Items in declaration order; due timers get growing due dates (see the header).
        for (i, decl) in script.sources.enumerated() {
            sourceCalls.append(0)
            sources.append(
                driver.makeSource(order: decl.order) { [unowned self] in
                    guard live else { return }
                    sourceCalls[i] += 1
                    log("S\(i) performed in \(mode())")
                    if sourceCalls[i] == 1 { exec(decl.body) }
                })
        }
        for (i, decl) in script.timers.enumerated() {
            timerCalls.append(0)
            let date: Double
            if decl.due {
                date = FuzzScript.dueDate(dueCounter)
                dueCounter += 1
            } else {
                date = FuzzScript.farDate(i)
            }
            timers.append(
                driver.makeTimer(fireAt: date, interval: Double(decl.interval), tolerance: 0, order: 0) {
                    [unowned self] _ in
                    guard live else { return }
                    timerCalls[i] += 1
                    log("T\(i) fired in \(mode())")
                    if timerCalls[i] == 1 { exec(decl.body) }
                })
        }
        for (i, decl) in script.observers.enumerated() {
            observerBodyDone.append(false)
            observers.append(
                driver.makeObserver(decl.activities, repeats: decl.repeats, order: decl.order) {
                    [unowned self] _, activity in
                    guard live else { return }
                    log("O\(i) \(DiffActivity.name(activity)) in \(mode())")
                    if activity == decl.trigger && !observerBodyDone[i] {
                        observerBodyDone[i] = true
                        exec(decl.body)
                    }
                })
        }
        exec(script.main)
        live = false
        // Break the item -> closure -> interpreter cycles and leave the loop empty.
        for source in sources { source.invalidate() }
        for timer in timers { timer.invalidate() }
        for observer in observers { observer.invalidate() }
        sources.removeAll()
        timers.removeAll()
        observers.removeAll()
    }

    private func exec(_ nodes: [FuzzNode]) {
        for node in nodes {
            guard live else { return }
            exec(node.op)
        }
    }

    private func exec(_ op: FuzzOp) {
        switch op {
        case .add(let item, let m):
            switch item {
            case .source(let i): driver.add(sources[i], m.name)
            case .timer(let i): driver.add(timers[i], m.name)
            case .observer(let i): driver.add(observers[i], m.name)
            }
        case .remove(let item, let m):
            switch item {
            case .source(let i): driver.remove(sources[i], m.name)
            case .timer(let i): driver.remove(timers[i], m.name)
            case .observer(let i): driver.remove(observers[i], m.name)
            }
        case .invalidate(let item):
            switch item {
            case .source(let i): sources[i].invalidate()
            case .timer(let i): timers[i].invalidate()
            case .observer(let i): observers[i].invalidate()
            }
        case .signal(let i):
            sources[i].signal()
        case .setFireDate(let i, let due):
            if due {
                timers[i].setFireDate(FuzzScript.dueDate(dueCounter))
                dueCounter += 1
            } else {
                timers[i].setFireDate(5000 + 10 * Double(farCounter))
                farCounter += 1
            }
        case .addCommonMode(let m):
            driver.addCommonMode(m.name)
        case .perform(let modes, let body):
            let label = modes.map(\.short).joined(separator: "+")
            driver.perform(modes.map(\.name)) { [unowned self] in
                guard live else { return }
                log("block(\(label)) in \(mode())")
                exec(body)
            }
        case .run(let m, let sleeps, let returnAfterSourceHandled):
            let label =
                "run(\(m.short), \(sleeps ? "\(FuzzScript.sleepTimeout)" : "0")\(returnAfterSourceHandled ? ", rash" : ""))"
            log(label)
            runDepth += 1
            let result = driver.run(
                m.name, sleeps ? FuzzScript.sleepTimeout : 0, returnAfterSourceHandled: returnAfterSourceHandled)
            runDepth -= 1
            log("\(label) -> \(result)")
        case .stop:
            driver.stop()
        case .wakeUp:
            driver.wakeUp()
        case .query(let query):
            log(answer(query))
        }
    }

    private func answer(_ query: FuzzQuery) -> String {
        switch query {
        case .nextTimerFireDate(let m):
            return "nextTimerFireDate(\(m.short)) = \(Self.dateText(driver.nextTimerFireDate(m.name)))"
        case .currentMode:
            return "currentMode = \(mode())"
        case .allModes:
            let modes = driver.allModes.filter { $0 != DiffMode.common }.map { FuzzMode.short($0) }
            return "allModes = \(modes)"
        case .contains(let item, let m):
            let has: Bool
            switch item {
            case .source(let i): has = driver.contains(sources[i], m.name)
            case .timer(let i): has = driver.contains(timers[i], m.name)
            case .observer(let i): has = driver.contains(observers[i], m.name)
            }
            return "contains(\(item.name), \(m.short)) = \(has)"
        case .isValid(let item):
            let valid: Bool
            switch item {
            case .source(let i): valid = sources[i].isValid
            case .timer(let i): valid = timers[i].isValid
            case .observer(let i): valid = observers[i].isValid
            }
            return "\(item.name).isValid = \(valid)"
        case .fireDate(let i):
            guard timers[i].isValid else { return "T\(i).fireDate: (invalid)" }
            return "T\(i).fireDate = \(Self.dateText(timers[i].fireDate))"
        }
    }

    /// "due" for any date before 100 s (all due dates are around the epoch), else whole seconds.
    static func dateText(_ seconds: Double?) -> String {
        guard let seconds else { return "nil" }
        if seconds < 100 { return "due" }
        return String(format: "%.0f", seconds)
    }
}

// MARK: - Pretty-printer

extension FuzzScript {
    /// The script as readable pseudo-code.
    var pseudoCode: String {
        var out: [String] = ["// seed \(seed), flavour \(flavour.rawValue)"]
        let used = referencedItems
        func actNames(_ mask: UInt) -> String {
            if mask == DiffActivity.all { return "all" }
            let acts: [UInt] = [
                DiffActivity.entry, DiffActivity.beforeTimers, DiffActivity.beforeSources, DiffActivity.beforeWaiting,
                DiffActivity.afterWaiting, DiffActivity.exit,
            ]
            return acts.filter { mask & $0 != 0 }.map(DiffActivity.name).joined(separator: "|")
        }
        func body(_ nodes: [FuzzNode], _ indent: String) {
            for n in nodes { line(n.op, indent) }
        }
        func line(_ op: FuzzOp, _ indent: String) {
            switch op {
            case .add(let i, let m): out.append("\(indent)add(\(i.name), \(m.short))")
            case .remove(let i, let m): out.append("\(indent)remove(\(i.name), \(m.short))")
            case .invalidate(let i): out.append("\(indent)\(i.name).invalidate()")
            case .signal(let s): out.append("\(indent)S\(s).signal()")
            case .setFireDate(let t, let due):
                out.append("\(indent)T\(t).fireDate = \(due ? "<a new due date (past)>" : "<a new far date>")")
            case .addCommonMode(let m): out.append("\(indent)addCommonMode(\(m.short))")
            case .perform(let modes, let b):
                out.append("\(indent)perform([\(modes.map(\.short).joined(separator: ", "))]) {")
                body(b, indent + "    ")
                out.append("\(indent)}")
            case .run(let m, let sleeps, let returnAfterSourceHandled):
                let timeout = sleeps ? "\(FuzzScript.sleepTimeout)" : "0"
                out.append(
                    "\(indent)run(\(m.short), timeout: \(timeout)\(returnAfterSourceHandled ? ", returnAfterSourceHandled" : ""))"
                )
            case .stop: out.append("\(indent)stop()")
            case .wakeUp: out.append("\(indent)wakeUp()")
            case .query(let q):
                switch q {
                case .nextTimerFireDate(let m): out.append("\(indent)print(nextTimerFireDate(\(m.short)))")
                case .currentMode: out.append("\(indent)print(currentMode)")
                case .allModes: out.append("\(indent)print(allModes)")
                case .contains(let i, let m): out.append("\(indent)print(contains(\(i.name), \(m.short)))")
                case .isValid(let i): out.append("\(indent)print(\(i.name).isValid)")
                case .fireDate(let t): out.append("\(indent)print(T\(t).fireDate)")
                }
            }
        }
        for (i, s) in sources.enumerated() where used.contains(.source(i)) {
            if s.body.isEmpty {
                out.append("S\(i) = source(order: \(s.order))")
            } else {
                out.append("S\(i) = source(order: \(s.order)) { first perform:")
                body(s.body, "    ")
                out.append("}")
            }
        }
        for (i, tm) in timers.enumerated() where used.contains(.timer(i)) {
            let date = tm.due ? "due (a past date)" : "far (\(Int(FuzzScript.farDate(i))) s)"
            let repeats = tm.interval == 0 ? "one-shot" : "every \(tm.interval) s"
            if tm.body.isEmpty {
                out.append("T\(i) = timer(\(date), \(repeats))")
            } else {
                out.append("T\(i) = timer(\(date), \(repeats)) { first call:")
                body(tm.body, "    ")
                out.append("}")
            }
        }
        for (i, o) in observers.enumerated() where used.contains(.observer(i)) {
            let head = "O\(i) = observer([\(actNames(o.activities))], order: \(o.order)\(o.repeats ? "" : ", once"))"
            if o.body.isEmpty {
                out.append(head)
            } else {
                out.append("\(head) { first \(DiffActivity.name(o.trigger)):")
                body(o.body, "    ")
                out.append("}")
            }
        }
        out.append("main:")
        body(main, "    ")
        return out.joined(separator: "\n")
    }
}

// MARK: - Comparing and minimizing

/// A script's two traces.
struct FuzzOutcome: Sendable {
    var cf: [String]
    var rlk: [String]
    var differs: Bool { cf != rlk }
}

enum DiffFuzz {
    /// Runs `script` on both drivers; `make` gives (CF, RunLoopKit) driver factories.
    static func outcome(
        _ script: FuzzScript,
        cf: @escaping @Sendable () -> any LoopDriver,
        rlk: @escaping @Sendable () -> any LoopDriver
    ) -> FuzzOutcome {
        let scenario: DiffScenario = { driver, trace in FuzzInterpreter(driver, trace, script).start() }
        return FuzzOutcome(cf: diffTraceOf(cf, scenario), rlk: diffTraceOf(rlk, scenario))
    }

    /// Delta debugging (ddmin) over the script's operations: returns a script, as small as this
    /// finds, for which `fails` still holds.
    static func minimize(_ script: FuzzScript, _ fails: (FuzzScript) -> Bool) -> FuzzScript {
        var current = script
        var granularity = 2
        while true {
            let ids = current.allNodes.map(\.id)
            if ids.count < 2 {
                if ids.count == 1, fails(current.removing(Set(ids))) { current = current.removing(Set(ids)) }
                break
            }
            let n = min(granularity, ids.count)
            let chunk = (ids.count + n - 1) / n
            var reduced = false
            var start = 0
            while start < ids.count {
                let drop = Set(ids[start..<min(start + chunk, ids.count)])
                let candidate = current.removing(drop)
                if fails(candidate) {
                    current = candidate
                    granularity = max(granularity - 1, 2)
                    reduced = true
                    break
                }
                start += chunk
            }
            if !reduced {
                if n >= ids.count { break }
                granularity = min(n * 2, ids.count)
            }
        }
        // Declarations no operation names any more.
        let used = current.referencedItems
        let trimmed = current.withoutUnusedTrailingItems(used)
        if trimmed != current, fails(trimmed) { current = trimmed }
        return current
    }

    /// A report: the pseudo-code and both traces, numbered, the first difference marked.
    static func report(_ script: FuzzScript, _ outcome: FuzzOutcome, original: Int) -> String {
        let firstDiff =
            zip(outcome.cf, outcome.rlk).enumerated().first { $0.element.0 != $0.element.1 }?.offset
            ?? min(outcome.cf.count, outcome.rlk.count)
        func numbered(_ lines: [String]) -> String {
            lines.enumerated().map { i, l in
                (i == firstDiff ? "» " : "  ") + String(format: "%3d ", i + 1) + l
            }.joined(separator: "\n")
        }
        return """
            Differential fuzz mismatch (seed \(script.seed); minimized from \(original) to \
            \(script.operationCount) operations; replay: RLK_FUZZ_SEEDS=\(script.seed)):
            \(script.pseudoCode)
            --- CF trace:
            \(numbered(outcome.cf))
            --- RunLoopKit trace:
            \(numbered(outcome.rlk))
            (first difference at line \(firstDiff + 1))
            """
    }
}

extension FuzzScript {
    /// Drops trailing declarations that nothing names (indices of the others stay the same).
    fileprivate func withoutUnusedTrailingItems(_ used: Set<FuzzItem>) -> FuzzScript {
        var s = self
        while let last = s.sources.indices.last, !used.contains(.source(last)), s.sources.count > 1 {
            s.sources.removeLast()
        }
        while let last = s.timers.indices.last, !used.contains(.timer(last)) { s.timers.removeLast() }
        while let last = s.observers.indices.last, !used.contains(.observer(last)) { s.observers.removeLast() }
        return s
    }
}
