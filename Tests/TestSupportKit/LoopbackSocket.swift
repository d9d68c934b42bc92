// Test kit: a TCP socket on a free port of 127.0.0.1, for the kit's small servers (the silent
// socket, the freezing relay, the tests' own one-connection servers).

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A TCP socket bound to a port of 127.0.0.1 the kernel picks, listening with `backlog` when
/// one is given: its descriptor, which the caller owns and closes, and its port.
/// - Throws: ``ProcessFailure`` naming the call that failed and its errno.
public func boundLoopbackSocket(listening backlog: Int32?) throws -> (descriptor: Int32, port: Int) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw ProcessFailure(message: "socket() failed: errno \(errno)") }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = 0
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let failedStep = withUnsafeMutablePointer(to: &address) { pointer -> String? in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { generic in
            if bind(fd, generic, length) != 0 { return "bind" }
            if let backlog, listen(fd, backlog) != 0 { return "listen" }
            if getsockname(fd, generic, &length) != 0 { return "getsockname" }
            return nil
        }
    }
    if let failedStep {
        let code = errno
        close(fd)
        throw ProcessFailure(message: "\(failedStep)() on 127.0.0.1 failed: errno \(code)")
    }
    return (fd, Int(UInt16(bigEndian: address.sin_port)))
}
