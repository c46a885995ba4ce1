#if GLib
internal import CGLib
import RunLoopKit

// The reverse direction: a GSource that serves the loop while someone else iterates GLib on the
// loop's thread (a nested g_main_loop_run in a callback, a library's sync helper, a dialog's
// loop). The bridge cannot iterate GLib then; GLib's loop sleeps in its own poll, so the loop's
// work must wake that poll and be run from it.
//
//   prepare   inert in the bridge's own iteration. Otherwise a foreign wait begins
//             (RunLoop+ForeignWait.swift): the innermost run's epoll set becomes this source's
//             poll descriptor (g_source_add_poll), the mode's next timer its timeout; work already
//             pending -> ready
//   check     the foreign wait ends; ready if the loop has work (the set was readable for more
//             than a stale wakeup, or a timer is due)
//   dispatch  one pass of the innermost run's mode (`run(mode:for: .zero)`), in which the bridge
//             does not iterate GLib (GLib is iterating, one level up)
//
// The two busy-loop traps measured for this design (the notes on the GLib bridge): the descriptor
// is added with g_source_add_poll, not g_source_add_unix_fd, so that check decides (a unix fd's
// readiness makes a source ready whatever check says); and the source can recurse, so GLib does
// not block and unblock it around each dispatch, which removes and re-adds its descriptor and
// signals GLib's wakeup eventfd each time. That eventfd is in the bridge's epoll set, which is in
// the loop's: the bridge's epoll source stops watching while GLib iterates itself
// (`GLibDriver.foreignIterationBegins`), so GLib's own descriptors never make this source ready.

/// The reverse GSource, owned by its driver, which destroys it before it goes.
final class ReverseSource {
    /// The driver; valid until ``destroy()`` (the driver calls it before it goes).
    unowned(unsafe) let driver: GLibDriver
    let source: UnsafeMutablePointer<GSource>
    /// The poll record, inside the source's own memory (GLib keeps a pointer to it).
    private let pollFD: UnsafeMutablePointer<GPollFD>
    @exclusivity(unchecked) private var pollAdded = false
    /// A foreign wait is in progress (begun in prepare, ended in check, dispatch or the next
    /// prepare, or by the bridge's own next iteration).
    @exclusivity(unchecked) private var waiting = false
    @exclusivity(unchecked) private var deadline: ContinuousClock.Instant?

    /// GSource, then this object's address, then the poll record.
    private static let slotOffset = (MemoryLayout<GSource>.size + 7) & ~7
    private static let pollOffset = slotOffset + MemoryLayout<UnsafeRawPointer>.size
    private static let size = pollOffset + MemoryLayout<GPollFD>.size

    /// The source functions (GLib keeps a pointer to them for the source's life: made once).
    /// `nonisolated(unsafe)`: written once, by its initializer, and only read after (by GLib).
    nonisolated(unsafe) private static let funcs: UnsafeMutablePointer<GSourceFuncs> = {
        let funcs = UnsafeMutablePointer<GSourceFuncs>.allocate(capacity: 1)
        funcs.initialize(
            to: GSourceFuncs(
                // Prepare and check run in every GLib iteration, the bridge's own included: no
                // reference counting (the driver destroys the source before the object goes).
                prepare: { source, timeout in
                    ReverseSource.unretained(source)?._withUnsafeGuaranteedRef { $0.prepare(timeout) } ?? 0
                },
                check: { source in ReverseSource.unretained(source)?._withUnsafeGuaranteedRef { $0.check() } ?? 0 },
                dispatch: { source, _, _ in ReverseSource.of(source)?.dispatch() ?? 1 },
                finalize: nil, closure_callback: nil, closure_marshal: nil))
        return funcs
    }()

    /// The object a GSource of this kind belongs to; nil once destroyed.
    private static func of(_ source: UnsafeMutablePointer<GSource>?) -> ReverseSource? {
        unretained(source)?.takeUnretainedValue()
    }

    private static func unretained(_ source: UnsafeMutablePointer<GSource>?) -> Unmanaged<ReverseSource>? {
        guard let source else { return nil }
        let slot = (UnsafeMutableRawPointer(source) + slotOffset).assumingMemoryBound(to: UnsafeMutableRawPointer?.self)
        return slot.pointee.map { Unmanaged<ReverseSource>.fromOpaque($0) }
    }

    init(driver: GLibDriver) {
        self.driver = driver
        source = g_source_new(Self.funcs, UInt32(Self.size))
        let raw = UnsafeMutableRawPointer(source)
        pollFD = (raw + Self.pollOffset).bindMemory(to: GPollFD.self, capacity: 1)
        pollFD.initialize(to: GPollFD(fd: -1, events: 0, revents: 0))
        (raw + Self.slotOffset).bindMemory(to: UnsafeMutableRawPointer?.self, capacity: 1)
            .initialize(to: Unmanaged.passUnretained(self).toOpaque())
        g_source_set_name(source, "RunLoopKit loop (nested GLib loops)")
        g_source_set_priority(source, G_PRIORITY_DEFAULT)
        g_source_set_can_recurse(source, 1)
        g_source_attach(source, driver.context)
    }

    /// The descriptor GLib polls for the loop (the innermost run's epoll set), -1 before the
    /// first foreign wait: the bridge's own query leaves it out.
    var pollDescriptor: Int32 { pollFD.pointee.fd }

    /// Removes the source from the context; its callbacks do nothing from here (a dispatch in
    /// progress finishes). Loop thread.
    func destroy() {
        endWait(readable: false)
        (UnsafeMutableRawPointer(source) + Self.slotOffset).assumingMemoryBound(to: UnsafeMutableRawPointer?.self)
            .pointee = nil
        g_source_destroy(source)
        g_source_unref(source)
    }

    /// The bridge iterates GLib again: a foreign wait its loop left unchecked ends, and the
    /// source is inert (no events: the bridge's query leaves it out).
    func deactivate() {
        endWait(readable: false)
        pollFD.pointee.events = 0
    }

    @discardableResult
    private func endWait(readable: Bool) -> Bool {
        guard waiting else { return false }
        waiting = false
        return driver.loop.endForeignWait(descriptorReadable: readable)
    }

    private func prepare(_ timeout: UnsafeMutablePointer<Int32>?) -> gboolean {
        timeout?.pointee = -1
        // The bridge's own prepare (its iteration runs the loop's work already), or detached.
        guard !driver.ownIteration, driver.isAttached else { return 0 }
        // A prepare its loop did not check (GLib skips the checks of sources below a ready one).
        endWait(readable: false)
        driver.foreignIterationBegins()
        guard let wait = driver.loop.beginForeignWait() else {
            pollFD.pointee.events = 0
            return 0
        }
        if !pollAdded || pollFD.pointee.fd != wait.descriptor {
            // A new epoll set (the first wait, another mode's set, or a set made anew): GLib
            // then runs one more iteration (its descriptors changed), nothing more.
            if pollAdded { g_source_remove_poll(source, pollFD) }
            pollFD.pointee.fd = wait.descriptor
            g_source_add_poll(source, pollFD)
            pollAdded = true
        }
        pollFD.pointee.events = UInt16(G_IO_IN.rawValue)
        waiting = true
        deadline = wait.timerDeadline
        if wait.mustNotBlock {
            endWait(readable: false)
            return 1
        }
        guard let deadline else { return 0 }
        let remaining = RunLoop.nanoseconds(of: deadline) &- RunLoop.clockNanoseconds
        if remaining <= 0 {
            endWait(readable: false)
            return 1
        }
        // Rounded up, so that the wait never ends before the timer is due.
        timeout?.pointee = Int32(clamping: (remaining &+ 999_999) / 1_000_000)
        return 0
    }

    private func check() -> gboolean {
        guard waiting else { return 0 }
        let work = endWait(readable: pollFD.pointee.revents != 0)
        let due = deadline.map { $0 <= RunLoop.now } ?? false
        return work || due ? 1 : 0
    }

    private func dispatch() -> gboolean {
        endWait(readable: false)
        // Held for the pass: a callout in it may invalidate the bridge and let go of the driver.
        let driver = self.driver
        return withExtendedLifetime(driver) {
            guard driver.isAttached, let mode = driver.loop.currentMode else { return 1 }
            let saved = driver.suspendedDepth
            driver.suspendedDepth = driver.loop.runDepthOnOwnThread + 1
            driver.loop.run(mode: mode, for: .zero)
            driver.suspendedDepth = saved
            return 1
        }
    }
}
#endif
