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
    /// - Throws: ``ProcessFailure`` naming the call that failed.
    public init(listening: Bool) throws {
        (descriptor, port) = try boundLoopbackSocket(listening: listening ? 16 : nil)
    }

    /// Closes the socket; later calls do nothing (a second close could hit another socket that
    /// took the number).
    public func close() {
        if isOpen.exchange(false, ordering: .acquiringAndReleasing) { Glibc.close(descriptor) }
    }
}
