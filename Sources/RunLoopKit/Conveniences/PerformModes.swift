/// Which queued performs may run in the mode a loop is running in: those queued for that mode, or
/// for ``RunLoop/Mode/common`` when it is a common mode. Shared by the thread performs and the
/// ordered performers, which both queue work for lists of modes.
struct PerformModes {
    let mode: RunLoop.Mode
    let isCommon: Bool

    /// The mode `loop` runs in now; nil when it is not running.
    init?(runningIn loop: RunLoop) {
        guard let mode = loop.currentMode else { return nil }
        self.mode = mode
        isCommon = loop.commonModes.contains(mode)
    }

    /// Whether work queued for `modes` may run now.
    func admit(_ modes: [RunLoop.Mode]) -> Bool {
        modes.contains(mode) || (isCommon && modes.contains(.common))
    }

    /// `modes` without repeats, in their order.
    static func unique(_ modes: [RunLoop.Mode]) -> [RunLoop.Mode] {
        var unique: [RunLoop.Mode] = []
        for mode in modes where !unique.contains(mode) { unique.append(mode) }
        return unique
    }
}
