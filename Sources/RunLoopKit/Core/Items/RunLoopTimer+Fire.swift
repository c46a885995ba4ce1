// NSTimer's `fire`: a timer's handler called now, on the loop's thread, as the loop would call it
// (the firing mark and the one-shot's retirement are the timer's core semantics).

extension RunLoopTimer {
    /// Fires the timer now, without changing its schedule: NSTimer's `fire`.
    ///
    /// The handler is called as the loop would call it, on the loop's thread:
    /// - on the timer's loop's thread (or for a timer on no loop): synchronously, before `fire()`
    ///   returns;
    /// - from another thread: the call is queued as a block (see ``RunLoop/perform(inModes:_:)->()``)
    ///   for the modes the timer is in when `fire()` is called, so it runs the next time the loop
    ///   runs in one of them (when the timer itself could fire); `fire()` returns at once.
    ///
    /// A repeating timer keeps its fire date and interval. A one-shot timer is invalidated after
    /// its handler, as if it had fired. An invalid timer does nothing (also one invalidated between
    /// a cross-thread `fire()` and the loop's turn to run it).
    public func fire() {
        let (valid, loop): (Bool, RunLoop?) = state.locked { ($0.valid, $0.loop?.loop) }
        guard valid else { return }
        guard let loop, !loop.isCurrent else {
            fireNow()
            return
        }
        let modes = loop.modes(of: self)
        guard !modes.isEmpty else {
            // Removed from its loop in between: now on no loop.
            fireNow()
            return
        }
        loop.perform(inModes: modes) { [self] in fireNow() }
    }

    /// Calls the handler on the calling thread, then retires a one-shot timer.
    private func fireNow() {
        guard let handler else { return }
        // Marked as firing so a nested run does not fire it from the heap meanwhile; a fire() from
        // inside its own handler leaves the outer mark alone.
        let marked = beginFiring()
        handler(self)
        if marked { finishFiring() }
        if intervalNs == 0 { invalidate() }
    }
}

extension RunLoop {
    /// The modes `timer` is in on this loop (``Mode/common`` standing for its common membership).
    func modes(of timer: RunLoopTimer) -> [Mode] {
        state.locked { state in
            timer.state.locked { timerState in
                guard timerState.loop === self else { return [] }
                var modes: [Mode] = timerState.inCommonModes ? [.common] : []
                timerState.modes.forEach { index in
                    let name = state.modes[index].name
                    if !(timerState.inCommonModes && state.commonModes.contains(name)) { modes.append(name) }
                }
                return modes
            }
        }
    }
}
