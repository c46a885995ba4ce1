// How RunLoopKit stops the process on misuse or on a bug of its own: always with its message.
// Swift's `precondition` and `preconditionFailure` drop their message in optimized builds (the
// process traps with none), and a user of a release build needs the message most. Debug-only
// invariant checks (`checkInvariants()`) keep `precondition`: they exist only in debug builds.

/// Stops the process with `message` unless `condition` holds, in every build configuration.
@inlinable
@inline(__always)
package func fatalPrecondition(
    _ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String,
    file: StaticString = #file, line: UInt = #line
) {
    if _slowPath(!condition()) { fatalError(message(), file: file, line: line) }
}
