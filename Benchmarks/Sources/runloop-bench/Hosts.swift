import CBenchSupport
import CoreFoundation
import Foundation
import NIOCore
import NIOPosix
import RunLoopKit

import class RunLoopKit.RunLoop

// A running loop on its own thread, for each implementation, with a way to run code on it and to
// shut it down. Work that adds timers runs on the loop's own thread, inside a callback of the
// running loop (a performed block, or `execute` for NIO), the same way for all three.

/// A RunLoopKit loop running `run()` on its own thread, kept alive by a never-signalled source.
final class RunLoopKitHost: @unchecked Sendable {
    let loop: RunLoop
    private let thread: BenchThread

    init() {
        let ready = DispatchSemaphore(value: 0)
        let box = Box<RunLoop?>(nil)
        thread = BenchThread {
            let loop = RunLoop.current
            let keepAlive = RunLoopSource {}
            loop.add(keepAlive, forMode: .default)
            box.value = loop
            loop.perform { ready.signal() }  // runs once run() has started
            loop.run()
            keepAlive.invalidate()
        }
        ready.wait()
        loop = box.value!
    }

    /// Runs `body` on the loop's thread, inside the running loop, and returns its result.
    func sync<T>(_ body: @escaping @Sendable () -> T) -> T {
        let loop = self.loop
        return runAndWait(body) { block in loop.perform(block) }
    }

    /// Stops the loop from inside (so the stop cannot be dropped) and joins its thread.
    func shutdown() {
        loop.perform { RunLoop.current.stop() }
        thread.join()
    }
}

/// A CF version-0 source whose perform callback calls a Swift closure through the context's
/// `info` pointer (owned by the source).
final class CFSource0: @unchecked Sendable {
    private final class Callback {
        let perform: @Sendable () -> Void
        init(_ perform: @escaping @Sendable () -> Void) { self.perform = perform }
    }

    let source: CFRunLoopSource

    init(order: Int = 0, perform: @escaping @Sendable () -> Void) {
        var context = CFRunLoopSourceContext()
        context.version = 0
        context.info = Unmanaged.passRetained(Callback(perform)).toOpaque()
        context.release = { info in Unmanaged<Callback>.fromOpaque(info!).release() }
        context.perform = { info in Unmanaged<Callback>.fromOpaque(info!).takeUnretainedValue().perform() }
        source = CFRunLoopSourceCreate(kCFAllocatorDefault, order, &context)
    }

    func signal() { CFRunLoopSourceSignal(source) }
    func invalidate() { CFRunLoopSourceInvalidate(source) }
}

/// A CFRunLoop running `CFRunLoopRun()` on its own thread, kept alive by a never-signalled source.
final class CFHost: @unchecked Sendable {
    let loop: CFRunLoop
    private let thread: BenchThread

    init() {
        let ready = DispatchSemaphore(value: 0)
        let box = Box<CFRunLoop?>(nil)
        thread = BenchThread {
            let loop = CFRunLoopGetCurrent()!
            let keepAlive = CFSource0 {}
            CFRunLoopAddSource(loop, keepAlive.source, kCFRunLoopDefaultMode)
            box.value = loop
            CFRunLoopPerformBlock(loop, kCFRunLoopDefaultMode) { ready.signal() }
            CFRunLoopRun()
            keepAlive.invalidate()
        }
        ready.wait()
        loop = box.value!
    }

    /// Runs `body` on the loop's thread, inside the running loop, and returns its result.
    func sync<T>(_ body: @escaping @Sendable () -> T) -> T {
        runAndWait(body) { block in
            CFRunLoopPerformBlock(loop, kCFRunLoopDefaultMode, block)
            CFRunLoopWakeUp(loop)
        }
    }

    func shutdown() {
        CFRunLoopPerformBlock(loop, kCFRunLoopDefaultMode) { CFRunLoopStop(CFRunLoopGetCurrent()) }
        CFRunLoopWakeUp(loop)
        thread.join()
    }
}

/// A one-thread SwiftNIO event loop group.
final class NIOHost: Sendable {
    let group: MultiThreadedEventLoopGroup
    let loop: any EventLoop

    init() {
        group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        loop = group.next()
    }

    /// Runs `body` on the loop's thread (`execute`) and returns its result.
    func sync<T>(_ body: @escaping @Sendable () -> T) -> T {
        let loop = self.loop
        return runAndWait(body) { block in loop.execute(block) }
    }

    func shutdown() {
        try! group.syncShutdownGracefully()
    }
}

/// CF's clock: seconds since 2001 (CF timers take absolute times on this clock).
@inline(__always) func cfNow() -> Double { CFAbsoluteTimeGetCurrent() }

/// Nanoseconds between two instants of the same clock.
@inline(__always) func nanoseconds(_ d: Duration) -> Double {
    let (s, atto) = d.components
    return Double(s) * 1e9 + Double(atto) / 1e9
}

/// Hands `body` to a loop with `submit` and blocks until it has run there; returns its result.
/// The one "run on the loop and wait" that every host's `sync` uses.
func runAndWait<T>(_ body: @escaping @Sendable () -> T, submit: (@escaping @Sendable () -> Void) -> Void) -> T {
    let result = Box<T?>(nil)
    let done = DispatchSemaphore(value: 0)
    submit {
        result.value = body()
        done.signal()
    }
    done.wait()
    return result.value!
}
