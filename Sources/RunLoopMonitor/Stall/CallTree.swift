import Foundation

/// Stack samples merged into a call tree, root to leaf, with how many samples passed through each
/// node: what a stall's blame (``StallReport/stuckIn``) and its flame graph come from.
///
/// Nodes are functions: two samples that differ only in the instruction or line inside the same
/// functions share their nodes, and so do the innermost frames of samples taken in different
/// leaves (`clock_gettime` in one sample, `swift_get_time` in another) up to where they part.
public struct CallTree: Sendable, Hashable {
    /// One function on a path from the root.
    public struct Node: Sendable, Hashable {
        /// The function (``StackFrame/symbol``, else `image+0xoffset`).
        public var name: String
        /// A frame of it, as first sampled (image, file and line).
        public var frame: StackFrame
        /// Samples whose stack passes through this node.
        public var count: Int
        /// Callees, in the order first seen.
        public var children: [Node]
    }

    /// The outermost functions (usually the thread's entry), in the order first seen.
    public private(set) var roots: [Node] = []
    /// Samples merged in.
    public private(set) var sampleCount = 0

    /// An empty tree.
    public init() {}

    /// A tree of `samples` (each stack innermost frame first, as captured).
    public init(_ samples: [StackSample]) {
        for sample in samples { add(sample.frames, count: sample.count) }
    }

    /// Merges a stack (innermost frame first) seen `count` times.
    ///
    /// - Complexity: O(depth × fan-out).
    public mutating func add(_ frames: [StackFrame], count: Int) {
        guard count > 0, !frames.isEmpty else { return }
        sampleCount += count
        Self.insert(frames.reversed()[...], count: count, into: &roots)
    }

    private static func insert(_ path: ArraySlice<StackFrame>, count: Int, into nodes: inout [Node]) {
        guard let frame = path.first else { return }
        let name = Self.name(of: frame)
        if let index = nodes.firstIndex(where: { $0.name == name }) {
            nodes[index].count += count
            insert(path.dropFirst(), count: count, into: &nodes[index].children)
        } else {
            var node = Node(name: name, frame: frame, count: count, children: [])
            insert(path.dropFirst(), count: count, into: &node.children)
            nodes.append(node)
        }
    }

    static func name(of frame: StackFrame) -> String {
        frame.symbol ?? "\(frame.image.split(separator: "/").last.map(String.init) ?? "?")+0x\(String(frame.imageOffset, radix: 16))"
    }

    /// The heaviest path: from the root, the heaviest child (the first seen among equals) as long
    /// as it holds at least half of all samples.
    public var heaviestPath: [Node] {
        var path: [Node] = []
        var level = roots
        while let heaviest = level.enumerated().max(by: { ($0.element.count, -$0.offset) < ($1.element.count, -$1.offset) })?.element,
            heaviest.count * 2 >= sampleCount
        {
            path.append(heaviest)
            level = heaviest.children
        }
        return path
    }

    /// Where the samples say the thread was stuck: the deepest frame of the application's own code
    /// (not the C library, the Swift runtime and standard library, libdispatch, Foundation, a
    /// sanitizer's runtime, or RunLoopKit's own modules) on the ``heaviestPath``; nil when that
    /// path holds none (see ``StallReport/stuckIn`` for what is said then).
    public var blamed: String? {
        heaviestPath.last { Self.isApplicationCode($0.frame) }?.name
    }

    /// What identifies the stall across processes (``StallReport/fingerprint``): a 64-bit FNV-1a
    /// hash, in 16 hex digits, of the names of the application's functions on the
    /// ``heaviestPath`` (inlined ones left out), outermost first; nil when it holds none. Names only (a rebuilt binary
    /// moves every address), and stable across runs (no per-process hash seed).
    public var fingerprint: String? {
        // Inlined frames are left out: a stall's first report may name functions without them
        // (see StallReport.isSymbolicated) and must carry the same fingerprint as its end.
        let names = heaviestPath.filter { !$0.frame.inlined && Self.isApplicationCode($0.frame) }.map(\.name)
        guard !names.isEmpty else { return nil }
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in names.joined(separator: "\n").utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01b3
        }
        let digits = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }

    /// Whether `frame` is the application's own code: named, in an image that is not a system or
    /// toolchain library, not a runtime entry point, not in the standard library or RunLoopKit's
    /// own modules (by its mangled name's module, or its source file), and from a source file that
    /// is not the Swift toolchain's or compiler-made when it has one. A frame without line
    /// information counts: in an optimized build the line table often does not cover a return
    /// address (the call is followed by inlined standard-library code), and the caller must not
    /// be blamed for its callee.
    static func isApplicationCode(_ frame: StackFrame) -> Bool {
        guard let symbol = frame.symbol, !frame.image.isEmpty else { return false }
        if isSystemImage(frame.image) || isRuntimeSymbol(symbol) { return false }
        if let module = frame.module, module == "Swift" || module == "__C" || module.hasPrefix("_") || libraryModules.contains(module) {
            return false
        }
        guard let file = frame.file else { return !isCompilerWrittenName(symbol) }
        if file.contains("/swift/stdlib/") || file.contains(Symbolicator.generatedFile) || file.hasPrefix("/usr/") { return false }
        for module in libraryModules where file.contains("/Sources/\(module)/") { return false }
        return true
    }

    /// Whether a function known by its name only (no line information: a stall's first report made
    /// before its line tables were read) is one the compiler writes: a value witness, an outlined
    /// copy, a thunk, or a requirement a derived conformance implements (`encode(to:)`,
    /// `init(from:)`, `hash(into:)`, `==`). The last cannot be told from a hand-written one by name,
    /// and counts as the compiler's until the line tables say otherwise: a stall in a hand-written
    /// `encode(to:)` is then blamed on the application's code that called the encoder.
    static func isCompilerWrittenName(_ symbol: String) -> Bool {
        var name = Substring(symbol)
        if name.hasPrefix("specialized ") { name = name.dropFirst("specialized ".count) }
        if compilerWrittenPrefixes.contains(where: { name.hasPrefix($0) }) || name.contains("__derived_") { return true }
        return derivableRequirementSuffixes.contains { name.hasSuffix($0) } || name.contains(".== infix(")
    }

    static let compilerWrittenPrefixes = [
        "outlined ", "initializeWithCopy for ", "initializeWithTake for ", "assignWithCopy for ", "assignWithTake for ",
        "destroy for ", "initializeBufferWithCopyOfBuffer for ", "storeEnumTagSinglePayload for ", "getEnumTagSinglePayload for ",
        "value witness ", "type metadata accessor for ", "lazy protocol witness table accessor for ", "protocol witness for ",
        "reabstraction thunk ", "thunk for ", "merged ",
    ]
    static let derivableRequirementSuffixes = [".encode(to:)", ".init(from:)", ".hash(into:)", ".hashValue.getter"]

    /// Whether `image` (a path) is a system or toolchain library.
    static func isSystemImage(_ image: String) -> Bool {
        let name = image.split(separator: "/").last.map(String.init) ?? ""
        return systemImagePrefixes.contains { name.hasPrefix($0) }
    }

    /// Whether `symbol` is a runtime's entry point (the Swift runtime's C and C++ functions, a
    /// sanitizer's, the C library's internals, RunLoopKit's C shims), wherever it is linked (a
    /// static standard library puts the Swift runtime in the executable).
    static func isRuntimeSymbol(_ symbol: String) -> Bool {
        runtimeSymbolPrefixes.contains { symbol.hasPrefix($0) }
    }

    static let systemImagePrefixes = [
        "libc.so", "libc-", "libm.so", "libpthread", "ld-linux", "linux-vdso", "libgcc_s", "libstdc++", "libswiftCore",
        "libswift_", "libswiftDispatch", "libswiftGlibc", "libswiftSynchronization", "libdispatch", "libBlocksRuntime",
        "libswiftSwiftOnoneSupport", "libFoundation", "libswiftFoundation", "lib_Foundation", "libFoundationEssentials", "libFoundationNetworking",
        "libFoundationXML", "libswiftRuntime", "libicu",
    ]
    static let runtimeSymbolPrefixes = [
        "__interceptor_", "___interceptor_", "__tsan", "__asan", "__sanitizer", "atomic_load<__sanitizer", "swift_",
        "__GI_", "__libc_", "clock_gettime", "__clock_gettime", "_swift_", "__swift", "swift::", "(anonymous namespace)::",
        "crlk_", "crlm_",
    ]
    static let libraryModules = ["RunLoopKit", "RunLoopMonitor", "RunLoopScheduling", "RunLoopTesting", "CRunLoopKit", "CRunLoopMonitor"]

    /// The tree as folded stacks, one line per distinct root-to-leaf path, `outer;…;inner count`:
    /// what `flamegraph.pl`, speedscope and Perfetto read. Semicolons in names become colons.
    public var folded: String {
        var lines: [String] = []
        func walk(_ node: Node, _ prefix: String) {
            let path = prefix.isEmpty ? Self.foldedName(node.name) : prefix + ";" + Self.foldedName(node.name)
            let below = node.children.reduce(0) { $0 + $1.count }
            if node.count > below { lines.append("\(path) \(node.count - below)") }
            for child in node.children { walk(child, path) }
        }
        for root in roots { walk(root, "") }
        return lines.joined(separator: "\n")
    }

    private static func foldedName(_ name: String) -> String {
        name.replacingOccurrences(of: ";", with: ":").replacingOccurrences(of: "\n", with: " ")
    }
}
