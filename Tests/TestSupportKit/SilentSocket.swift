// Test kit: a TCP port on 127.0.0.1 that never answers, for fault tests of the HTTP fetcher and
// of the PostgreSQL store's host search.

import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A TCP socket on 127.0.0.1 that never answers. Not listening: connections are refused. Listening
/// but never accepting: the kernel completes the handshake and queues the connection, so the
/// client's request is taken and no answer ever comes (accept, then hang).
public final class SilentSocket: Sendable {
    /// The bound port.
    public let port: Int
    private let descriptor: Int32
    private let isOpen = Atomic(true)

    /// Binds a free port of 127.0.0.1, listening (connections hang) or not (refused).
    public init(listening: Bool) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw SocketError(step: "socket") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0, !listening || listen(fd, 16) == 0 else {
            Glibc.close(fd)
            throw SocketError(step: "bind/listen")
        }
        var actual = sockaddr_in()
        var actualLength = length
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &actualLength) }
        }
        descriptor = fd
        port = Int(UInt16(bigEndian: actual.sin_port))
    }

    /// Closes the socket; later calls do nothing (a second close could hit another socket that
    /// took the number).
    public func close() {
        if isOpen.exchange(false, ordering: .acquiringAndReleasing) { Glibc.close(descriptor) }
    }

    /// The step of binding that failed.
    public struct SocketError: Error { public let step: String }
}
