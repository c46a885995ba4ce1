/// An item's reference to the loop it is scheduled in, unretained.
///
/// Items (sources, timers, observers) must reach their loop to remove themselves, but must not
/// keep it alive, and a `weak` reference would give the loop a side table, which sends every
/// retain and release of the loop down the runtime's slow path. This holds the loop unretained
/// instead.
///
/// Why it is safe: a loop is freed only after its thread-exit teardown (`RunLoop.tearDown()`,
/// from the thread-local destructor that holds the last owning reference), and teardown clears
/// every `LoopRef` to it, each under the lock that guards that reference (the timer's state lock,
/// the item's registration lock). So a `LoopRef` read under its lock always points to a live loop,
/// and ``loop`` retains it there, before the lock is released. `@unchecked Sendable`: it is a
/// pointer-sized value whose only use across threads is that guarded read.
struct LoopRef: @unchecked Sendable {
    private let reference: Unmanaged<RunLoop>

    init(_ loop: RunLoop) { reference = .passUnretained(loop) }

    /// The loop, retained. Call only while holding the lock that guards this reference.
    var loop: RunLoop { reference.takeUnretainedValue() }

    /// Whether this refers to `loop`, without retaining anything.
    @inline(__always)
    func refers(to loop: RunLoop) -> Bool {
        reference.toOpaque() == Unmanaged.passUnretained(loop).toOpaque()
    }
}

/// Whether `ref` refers to `loop` (false for nil), without retaining anything.
@inline(__always)
func === (ref: LoopRef?, loop: RunLoop) -> Bool { ref?.refers(to: loop) ?? false }

/// Whether `ref` does not refer to `loop` (true for nil).
@inline(__always)
func !== (ref: LoopRef?, loop: RunLoop) -> Bool { !(ref === loop) }
