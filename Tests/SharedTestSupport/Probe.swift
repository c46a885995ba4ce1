import Testing

/// Runs the test-support executable `name` (built beside the test binary) with `arguments`, with
/// Swift's backtracer and LeakSanitizer off (a probe that must trap would otherwise hang or
/// report); returns its exit status (negative: killed by that signal), standard output and
/// standard error. Killed after `timeout` (then the status is `-SIGKILL`).
///
/// Throws ``ProbeLaunchFailure`` when the executable cannot be started (an issue is recorded too).
public func runProbe(
    _ name: String, _ arguments: [String], timeout: Duration = .seconds(60),
    sourceLocation: SourceLocation = #_sourceLocation
) throws -> (status: Int32, stdout: String, stderr: String) {
    guard
        let output = runTestExecutable(
            name, arguments, timeout: timeout, crashQuietly: true, sourceLocation: sourceLocation)
    else { throw ProbeLaunchFailure(name: name) }
    let status: Int32
    switch output.ending {
    case .exited(let code): status = code
    case .signalled(let signal): status = -signal
    case .timedOut: status = -9
    }
    return (status, output.stdout, output.stderr)
}

/// A probe executable could not be launched (not built, or `posix_spawn` failed).
public struct ProbeLaunchFailure: Error, CustomStringConvertible {
    public let name: String
    public var description: String { "cannot launch \(name)" }
}
