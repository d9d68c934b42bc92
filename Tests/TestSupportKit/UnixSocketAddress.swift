// A Unix socket path as the `sockaddr` that bind(2) and connect(2) take, for tests that open
// sockets by hand (the raw HTTP client, readiness and socket-path tests).

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Calls `body` with `path` as a `sockaddr_un` (a path too long for it is cut to fit, so the
/// call fails as the system would for a wrong path) and the address's length.
public func withUnixSocketAddress<R>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) throws -> R) rethrows -> R {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { buffer in
        for (index, byte) in path.utf8.enumerated() where index < buffer.count - 1 { buffer[index] = byte }
    }
    return try withUnsafePointer(to: &address) {
        try $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { try body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
}
