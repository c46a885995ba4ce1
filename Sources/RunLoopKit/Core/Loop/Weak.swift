/// A weak reference in a value, for what only a loop may keep alive: an item a scheduling object
/// or a publisher adds to a loop, a timer a sleep waits for, a handler's target. When the loop
/// lets go of the item (its invalidation, or the thread's exit tearing its loop down), nothing
/// else may hold it, or its letting go could never be noticed. One type for every module of the
/// package.
package struct Weak<Object: AnyObject> {
    package weak var value: Object?

    package init(_ value: Object? = nil) { self.value = value }
}

extension Weak: Sendable where Object: Sendable {}
