import Glibc
import SystemPackage

/// The two system-call helpers the echo server needs beyond what swift-system offers.
enum Socket {
    /// Runs `body` until it does not fail with EINTR; throws the `Errno` of any other failure.
    @inline(__always)
    static func retryingOnInterrupt<T: BinaryInteger>(_ body: () -> T) throws(Errno) -> T {
        while true {
            let result = body()
            if result >= 0 { return result }
            let error = errno
            if error == EINTR { continue }
            throw Errno(rawValue: error)
        }
    }

    /// Closes `fd`; EINTR from close(2) on Linux means it is closed already, so no retry.
    static func close(_ fd: Int32) {
        _ = Glibc.close(fd)
    }
}
