/// The modes (indexes into a loop's mode table) a timer is in: a bitmask for the first 64 modes
/// and an array only beyond them, so scheduling a timer allocates nothing.
struct ModeIndexSet: Sendable {
    private var low: UInt64 = 0
    private var high: [Int] = []

    var isEmpty: Bool { low == 0 && high.isEmpty }

    func contains(_ index: Int) -> Bool {
        index < 64 ? low & (1 << UInt64(index)) != 0 : high.contains(index)
    }

    /// Adds `index`; returns false if it was there.
    ///
    /// - Complexity: O(1) for the first 64 modes.
    @discardableResult
    mutating func insert(_ index: Int) -> Bool {
        if contains(index) { return false }
        if index < 64 { low |= 1 << UInt64(index) } else { high.append(index) }
        return true
    }

    /// Removes `index`; returns false if it was not there.
    @discardableResult
    mutating func remove(_ index: Int) -> Bool {
        if index < 64 {
            let bit: UInt64 = 1 << UInt64(index)
            defer { low &= ~bit }
            return low & bit != 0
        }
        guard let position = high.firstIndex(of: index) else { return false }
        high.remove(at: position)
        return true
    }

    mutating func removeAll() {
        low = 0
        high.removeAll()
    }

    /// Calls `body` with each index, ascending. No iterator, so nothing is allocated.
    @inline(__always)
    func forEach(_ body: (Int) -> Void) {
        var bits = low
        while bits != 0 {
            body(bits.trailingZeroBitCount)
            bits &= bits - 1
        }
        var position = 0
        while position < high.count {
            body(high[position])
            position += 1
        }
    }
}
