/// One frame of a captured stack.
///
/// ``address``, ``image`` and ``imageOffset`` are always filled in, so a report from a stripped
/// binary can be symbolicated later, offline, with the same binary's debug information:
///
/// ```
/// llvm-symbolizer --obj=.build/release/MyApp 0x1a2b3 | swift demangle --simplified
/// ```
///
/// (pass ``imageOffset``, in hex, for a frame whose ``image`` is that binary).
public struct StackFrame: Sendable, Codable, Hashable {
    /// The instruction's address in this process (the interrupted instruction for the first frame,
    /// a return address for the others).
    public var address: UInt64
    /// The path of the executable or shared library that holds the address (empty when none
    /// does, e.g. the vDSO or generated code).
    public var image: String
    /// ``address`` relative to the image's load address: what `llvm-symbolizer --obj=IMAGE`
    /// takes.
    public var imageOffset: UInt64
    /// The function's name, demangled, when symbols exist.
    public var symbol: String?
    /// The source file, when debug information exists.
    public var file: String?
    /// The source line, when debug information exists.
    public var line: Int?
    /// True for a function inlined into the next frame (same address).
    public var inlined: Bool
    /// The Swift module the function belongs to, read from its mangled name (`RunLoopKit`,
    /// `Swift` for the standard library, the executable's module for its own code); nil for a C
    /// function or when symbols are missing. What tells the application's code from a library's
    /// in an optimized build, where the line table may not cover a frame's address.
    public var module: String?

    /// A frame with what is known of it.
    public init(
        address: UInt64, image: String, imageOffset: UInt64, symbol: String? = nil, file: String? = nil,
        line: Int? = nil, inlined: Bool = false
    ) {
        self.address = address
        self.image = image
        self.imageOffset = imageOffset
        self.symbol = symbol
        self.file = file
        self.line = line
        self.inlined = inlined
    }

    /// `symbol (file:line)` when known, else `image+0xoffset`.
    public var summary: String {
        let name = symbol ?? "\(image.split(separator: "/").last.map(String.init) ?? "?")+0x\(String(imageOffset, radix: 16))"
        guard let file else { return name }
        let fileName = file.split(separator: "/").last.map(String.init) ?? file
        return line.map { "\(name) (\(fileName):\($0))" } ?? "\(name) (\(fileName))"
    }

    private enum CodingKeys: String, CodingKey { case address, image, imageOffset, symbol, file, line, inlined, module }

    /// Decodes a frame; `inlined` may be absent (false).
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        address = try container.decode(UInt64.self, forKey: .address)
        image = try container.decode(String.self, forKey: .image)
        imageOffset = try container.decode(UInt64.self, forKey: .imageOffset)
        symbol = try container.decodeIfPresent(String.self, forKey: .symbol)
        file = try container.decodeIfPresent(String.self, forKey: .file)
        line = try container.decodeIfPresent(Int.self, forKey: .line)
        inlined = try container.decodeIfPresent(Bool.self, forKey: .inlined) ?? false
        module = try container.decodeIfPresent(String.self, forKey: .module)
    }

    /// The module of a Swift mangled name (`$s10RunLoopKit…` → `RunLoopKit`, `$sSa…` and
    /// `$ss…` → `Swift`); nil for any other name.
    ///
    /// - Complexity: O(length of the module's name).
    public static func module(ofMangledName name: String) -> String? {
        var rest = Substring(name)
        if rest.hasPrefix("_") { rest = rest.dropFirst() }
        guard rest.hasPrefix("$s") || rest.hasPrefix("$S") else { return nil }
        rest = rest.dropFirst(2)
        guard let first = rest.first else { return nil }
        // `s` is the standard library's module, `S` + a letter one of its well-known types.
        if first == "s" { return "Swift" }
        if first == "S", let next = rest.dropFirst().first, next.isLetter { return next == "o" || next == "C" ? "__C" : "Swift" }
        let digits = rest.prefix { $0.isASCII && $0.isNumber }
        guard let length = Int(digits), length > 0 else { return nil }
        let identifier = rest.dropFirst(digits.count).prefix(length)
        return identifier.count == length ? String(identifier) : nil
    }
}

/// Distinct stacks of one thread sampled over a stretch of time, with how often each was seen.
public struct StackSample: Sendable, Codable, Hashable {
    /// How many samples showed this stack.
    public var count: Int
    /// The stack, innermost frame first.
    public var frames: [StackFrame]

    /// A stack seen `count` times.
    public init(count: Int, frames: [StackFrame]) {
        self.count = count
        self.frames = frames
    }

    /// Where a thread was, in a word: in the first (most frequent) of `stacks`, the innermost
    /// frame of the application's own code (see ``CallTree``: a standard-library function
    /// specialized into the binary is not blamed, a frame the line table misses is), else the
    /// innermost named frame outside the system libraries and the runtimes' entry points, else
    /// the innermost frame that is no runtime's entry point. What ``StallReport/stuckIn`` and
    /// ``CPUReport/hotIn`` say when the call tree blames nothing.
    static func culprit(in stacks: [StackSample]) -> String? {
        guard let frames = stacks.first?.frames else { return nil }
        // The application's innermost frame; else the innermost named one that is no runtime's
        // entry point (a report never blames `swift_getGenericMetadata` for its caller's work).
        if let own = frames.first(where: CallTree.isApplicationCode) { return own.symbol }
        let outsideRuntimes = frames.first { frame in
            guard let symbol = frame.symbol else { return false }
            return !CallTree.isSystemImage(frame.image) && !CallTree.isRuntimeSymbol(symbol)
        }
        let notARuntime = frames.first { $0.symbol.map { !CallTree.isRuntimeSymbol($0) } ?? true }
        return (outsideRuntimes ?? notARuntime).map { $0.symbol ?? $0.summary }
    }
}

/// A stack as the signal handler wrote it: addresses only, before symbolication.
public struct RawStack: Sendable, Hashable {
    /// How the handler unwound the stack.
    public enum Unwinder: String, Sendable, Codable {
        /// The DWARF unwind tables (`.eh_frame`) of the loaded images, walked by the handler
        /// itself: works without frame pointers, and reads only the thread's stack, so tables
        /// that are wrong at the interrupted instruction end the stack early instead of crashing.
        case unwindTables
        /// The frame-pointer chain (a registered thread whose code keeps frame pointers).
        case framePointers
        /// glibc's `backtrace()`, the fallback where the bounded walk is unavailable (not
        /// x86-64, or a thread without registered bounds in a process that may not use
        /// `process_vm_readv`). libgcc trusts the tables at every instruction.
        case glibcBacktrace
        /// A thread parked in the kernel (blocked in a system call, or stopped), read without a
        /// signal: from the stack pointer and program counter the kernel shows for it
        /// (`/proc/self/task/TID/syscall`), over a copy of its stack, with the unwind tables
        /// (and stack scanning for a frame-pointer frame whose caller's rbp is unknown).
        case parkedInKernel
    }

    /// The interrupted instruction, then return addresses, innermost first.
    public var addresses: [UInt64]
    /// How they were found.
    public var unwinder: Unwinder

    /// A stack of `addresses` found by `unwinder`.
    public init(addresses: [UInt64], unwinder: Unwinder) {
        self.addresses = addresses
        self.unwinder = unwinder
    }
}
