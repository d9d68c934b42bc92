// The service manager's side of sd_notify for a measured agent: a datagram socket standing where
// systemd's would ($NOTIFY_SOCKET), read on a thread of its own so the agent's sends never wait,
// each message counted.

import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A bound `AF_UNIX` datagram socket that reads and counts what an agent sends as to systemd
/// (`READY=1`, `STATUS=…`, `WATCHDOG=1`), until ``stop()``.
public final class NotifySocket: Sendable {
    /// The socket's path, for `NOTIFY_SOCKET`.
    public let path: String
    private let descriptor: Int32
    private let state = Mutex((messages: [String: Int](), stopped: false))
    private let done = DispatchSemaphore(value: 0)

    /// Binds a datagram socket at `path` (replacing a stale file) and starts reading.
    public init(path: String) throws {
        self.path = path
        unlink(path)
        let descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        guard descriptor >= 0 else { throw MeasurementError("socket(): \(String(cString: strerror(errno)))") }
        let bound: Int32
        do {
            bound = try withUnixSocketAddress(path) { bind(descriptor, $0, $1) }
        } catch {
            close(descriptor)
            throw error
        }
        guard bound == 0 else {
            let code = errno
            close(descriptor)
            throw MeasurementError("bind(\(path)): \(String(cString: strerror(code)))")
        }
        // A receive timeout, so the reading thread sees stop() within 100 ms.
        var timeout = timeval(tv_sec: 0, tv_usec: 100_000)
        guard setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size)) == 0 else {
            let code = errno
            close(descriptor)
            unlink(path)
            throw MeasurementError("setsockopt(SO_RCVTIMEO) on \(path): \(String(cString: strerror(code)))")
        }
        self.descriptor = descriptor
        Thread.detachNewThread { [self] in readUntilStopped() }
    }

    private func readUntilStopped() {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while !state.withLock({ $0.stopped }) {
            let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress!, $0.count, 0) }
            guard count > 0 else { continue }
            let text = String(decoding: buffer[0..<count], as: UTF8.self)
            state.withLock { state in
                for line in text.split(separator: "\n") {
                    let name = String(line.prefix { $0 != "=" })
                    state.messages[name, default: 0] += 1
                }
            }
        }
        done.signal()
    }

    /// How many lines named each variable so far (`READY`, `STATUS`, `WATCHDOG`...).
    public var messages: [String: Int] { state.withLock { $0.messages } }

    /// Stops reading, closes the socket and removes its file.
    public func stop() {
        let first = state.withLock { state in
            defer { state.stopped = true }
            return !state.stopped
        }
        guard first else { return }
        done.wait()
        close(descriptor)
        unlink(path)
    }
}

/// Calls `body` with the `sockaddr` and length of the Unix socket address `path`, for `bind` or
/// `connect`. - Throws: ``MeasurementError`` when the path does not fit.
public func withUnixSocketAddress<R>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> R) throws -> R {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
        throw MeasurementError("socket path too long: \(path)")
    }
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
        for (index, byte) in bytes.enumerated() { raw[index] = byte }
    }
    return withUnsafePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
}
