import CRunLoopMonitor
import Foundation
import Glibc
import SharedTestSupport
@testable import RunLoopMonitor
import Synchronization
import Testing

/// The handler's own unwinder (unwind.c): the same frames as glibc's where the tables are right,
/// and no read outside the stack whatever the registers and the stack hold.
@Suite(.serialized, .exclusive(.monitor)) struct BoundedUnwindTests {
/// One interrupted context (the calibration's: the thread is in tgkill, where glibc's tables
/// are right) unwound by both: the bounded walk finds exactly backtrace()'s frames.
@Test(.enabled(if: ThreadStack.boundedUnwindAvailable))
func findsTheFramesBacktraceFinds() throws {
    let capture = try #require(CaptureEngine.calibrationCapture())
    #expect(capture.tables.count >= 5, "\(capture.tables)")
    #expect(capture.tables == capture.backtrace)
}

/// 100,000 walks from hostile contexts: registers and stack words drawn from random numbers,
/// pointers into the stack and addresses in and near real code (so that the walk finds real
/// tables and follows them with garbage). The stack lies between two inaccessible pages, so a
/// single read outside it would kill the test run, in any build.
@Test(.enabled(if: crlm_unwind_cfi_supported()))
func neverReadsOutsideTheStackWhateverItHolds() throws {
    let page = Int(sysconf(Int32(_SC_PAGESIZE)))
    let stackPages = 4
    let mapping = try #require(
        mmap(nil, page * (stackPages + 2), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), "mmap")
    #expect(mapping != MAP_FAILED)
    defer { munmap(mapping, page * (stackPages + 2)) }
    let stack = mapping + page
    #expect(mprotect(stack, page * stackPages, PROT_READ | PROT_WRITE) == 0)
    let words = stack.bindMemory(to: UInt64.self, capacity: page * stackPages / 8)
    let wordCount = page * stackPages / 8
    let low = UInt64(UInt(bitPattern: stack)), top = low + UInt64(page * stackPages)
    // Code: the test binary, libc and the Swift runtime.
    let code: [UInt64] = [
        UInt64(UInt(bitPattern: unsafeBitCast(crlm_capture as @convention(c) (Int32, Int64, Int64, UnsafeMutablePointer<UInt64>?, Int32, UnsafeMutablePointer<Int32>?, UnsafeMutablePointer<Int32>?, UnsafeMutablePointer<Int32>?) -> Int32, to: UnsafeRawPointer.self))),
        UInt64(UInt(bitPattern: dlsym(UnsafeMutableRawPointer(bitPattern: 0), "malloc"))),
        UInt64(UInt(bitPattern: dlsym(UnsafeMutableRawPointer(bitPattern: 0), "swift_retain"))),
        UInt64(UInt(bitPattern: dlsym(UnsafeMutableRawPointer(bitPattern: 0), "pthread_create"))),
    ].filter { $0 != 0 }
    #expect(code.count >= 3)
    // Seeded (printed on failure), so a failing run can be replayed.
    let seed = UInt64.random(in: 0...UInt64.max)
    var random = SplitMix(seed: seed)
    func value() -> UInt64 {
        switch random.next(upperBound: UInt64(10)) {
        case 0..<3: return random.next()
        case 3..<6: return low + random.next(upperBound: top - low + 64) &- 32  // near or in the stack
        case 6: return UInt64(random.next(upperBound: UInt64(16)))
        default: return code.randomElement(using: &random)! &+ random.next(upperBound: UInt64(1 << 20)) &- (1 << 19)
        }
    }
    var registers = [UInt64](repeating: 0, count: Int(CRLM_CFI_REGISTERS))
    var out = [UInt64](repeating: 0, count: 64)
    var depths = [Int](repeating: 0, count: 65)
    for round in 0..<100_000 {
        if round % 16 == 0 { for i in 0..<wordCount { words[i] = value() } }
        for i in registers.indices { registers[i] = value() }
        registers[7] = low + random.next(upperBound: UInt64(wordCount)) * 8  // rsp inside the stack
        let n = registers.withUnsafeBufferPointer { regs in
            out.withUnsafeMutableBufferPointer { crlm_unwind_cfi(regs.baseAddress, UInt(top), $0.baseAddress, 64) }
        }
        #expect(n >= 1 && n <= 64, "seed \(seed)")
        depths[Int(max(0, min(64, n)))] += 1
    }
    // The walk did follow real tables some of the time (not only stop at the first frame).
    #expect(depths[2...].reduce(0, +) > 0, "\(depths)")
}

/// Interrupted in a PLT stub (the jump to a shared library's function, whose CFA rule is a
/// DWARF expression), the walk still finds the caller: before the stub's push and after it.
@Test(.enabled(if: crlm_unwind_cfi_supported()))
func aContextInAPLTStubStillReachesTheCaller() throws {
    let plt = try #require(try Self.firstPLTEntry(), "no .plt section in the test executable")
    let caller = UInt64(UInt(bitPattern: unsafeBitCast(crlm_capture as @convention(c) (Int32, Int64, Int64, UnsafeMutablePointer<UInt64>?, Int32, UnsafeMutablePointer<Int32>?, UnsafeMutablePointer<Int32>?, UnsafeMutablePointer<Int32>?) -> Int32, to: UnsafeRawPointer.self))) + 16
    var stack = [UInt64](repeating: 0, count: 64)
    for (offset, slot) in [(UInt64(0), 0), (UInt64(11), 1)] {  // before and after `push $n`
        stack[slot] = caller
        if slot == 1 { stack[0] = 7 }  // the pushed relocation index
        let n = stack.withUnsafeMutableBufferPointer { buffer -> Int32 in
            let sp = UInt64(UInt(bitPattern: buffer.baseAddress))
            var registers = [UInt64](repeating: 0, count: Int(CRLM_CFI_REGISTERS))
            registers[7] = sp
            registers[16] = plt + offset
            var out = [UInt64](repeating: 0, count: 8)
            let n = crlm_unwind_cfi(registers, UInt(sp) + UInt(buffer.count * 8), &out, 8)
            #expect(n >= 2 && out[1] == caller, "offset \(offset): \(out.prefix(Int(max(n, 0))))")
            return n
        }
        #expect(n >= 2)
    }
}

/// The address of the executable's second PLT entry (the first is the resolver's), read from
/// its section headers.
static func firstPLTEntry() throws -> UInt64? {
    let data = try Data(contentsOf: URL(fileURLWithPath: "/proc/self/exe"))
    func read<T: FixedWidthInteger>(_ offset: Int, _: T.Type) -> T {
        data.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: offset, as: T.self) }
    }
    let sectionHeaders = Int(read(0x28, UInt64.self)), size = Int(read(0x3a, UInt16.self))
    let count = Int(read(0x3c, UInt16.self)), namesIndex = Int(read(0x3e, UInt16.self))
    let names = Int(read(sectionHeaders + namesIndex * size + 0x18, UInt64.self))
    for index in 0..<count {
        let header = sectionHeaders + index * size
        let nameStart = names + Int(read(header, UInt32.self))
        let name = String(decoding: data[nameStart..<(data[nameStart...].firstIndex(of: 0) ?? nameStart)], as: UTF8.self)
        guard name == ".plt" else { continue }
        var image = [CChar](repeating: 0, count: 1024), symbol = [CChar](repeating: 0, count: 8)
        var base: UInt64 = 0, symbolAddress: UInt64 = 0
        let anchor = UInt64(UInt(bitPattern: unsafeBitCast(SplitMix.self as Any.Type, to: UnsafeRawPointer.self)))
        guard crlm_dladdr(anchor, &image, image.count, &base, &symbol, symbol.count, &symbolAddress) else { return nil }
        return base + read(header + 0x10, UInt64.self) + 16
    }
    return nil
}

/// A thread that unblocked the signal but registered no stack bounds is unwound by the same
/// walk, reading its stack through process_vm_readv.
@Test(.enabled(if: ThreadStack.boundedUnwindAvailableForUnpreparedThreads))
func anUnpreparedThreadIsWalkedThroughTheKernel() throws {
    let stop = Atomic<Bool>(false)
    let calls = Atomic<Int>(0)
    let spinner = NamedThread(name: "unregistered") {
        ThreadStack.forgetCurrentThread()  // signal still unblocked; bounds forgotten
        while !stop.load(ordering: .relaxed) {
            _ = monitorTestCrunch(until: .now + .milliseconds(1))
            calls.add(1, ordering: .releasing)
        }
    }
    defer { stop.store(true, ordering: .relaxed); spinner.join() }
    var named = 0
    var unnamed: [[String]] = []
    for _ in 0..<50 {
        // Each sample after the spinner has run on: a spinner descheduled on a loaded machine
        // would otherwise give the same instruction to many samples in a row.
        awaitProgress(calls)
        let stack = try ThreadStack.captureAddresses(threadID: spinner.threadID)
        #expect(stack.unwinder == .unwindTables)
        let names = symbols(ThreadStack.symbolicate(stack))
        if names.contains("monitorTestCrunch(until:)") { named += 1 } else { unnamed.append(Array(names.prefix(6))) }
    }
    // The odd sample lands between two calls, or where the walk stops short.
    // Under a sanitizer the signal arrives at its interceptors, often outside the function.
    #expect(sanitized ? named > 0 : named >= 45, "\(unnamed)")
}
}
