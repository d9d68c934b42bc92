// Shared by the test targets: the receiving end of the sd_notify protocol, standing in for
// systemd, so tests can see what a notifier or a whole token-agent process tells its manager.

import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A bound Unix datagram socket that collects sd_notify messages: hand ``notifySocket`` to the
/// code under test as `NOTIFY_SOCKET` and read what arrives with ``next(timeout:)``.
///
/// Either a socket file in a directory the test owns, or an abstract socket (no file at all;
/// per network namespace, so a child process in the same namespace reaches it too).
public final class NotifySocketReceiver: Sendable {
    /// The `NOTIFY_SOCKET` value that reaches this receiver (`/dir/name` or `@name`).
    public let notifySocket: String
    /// The descriptor, -1 once closed. Reads hold the lock, so `close()` cannot pull the
    /// descriptor away (and the number be reused) in the middle of a wait.
    private let descriptor: Mutex<Int32>
    private let filePath: String?

    /// Binds a socket file `name` in `directory` (an existing one left there is replaced).
    /// - Throws: ``NotifySocketFailure`` when the path is too long or the socket cannot be bound.
    public convenience init(directory: String, name: String = "notify.sock") throws {
        let path = (directory as NSString).appendingPathComponent(name)
        unlink(path)
        try self.init(value: path, filePath: path)
    }

    /// Binds an abstract socket `name` (without the `@`; default: a fresh unique name).
    /// - Throws: ``NotifySocketFailure`` when the name is taken or too long.
    public convenience init(abstractName name: String = "fts-notify-\(UUID().uuidString.prefix(12))") throws {
        try self.init(value: "@" + name, filePath: nil)
    }

    private init(value: String, filePath: String?) throws {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        // A path ends with a NUL; an abstract name starts with one and has none at the end.
        let bytes: [UInt8] = filePath == nil ? [0] + Array(value.utf8.dropFirst()) : Array(value.utf8) + [0]
        guard bytes.count <= MemoryLayout.size(ofValue: address.sun_path) else {
            throw NotifySocketFailure(message: "\(value) is too long for a Unix socket address")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        let length = socklen_t(MemoryLayout<sockaddr_un>.offset(of: \.sun_path)! + bytes.count)

        let descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw NotifySocketFailure(message: "socket(): errno \(errno)") }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) }
        }
        guard bound == 0 else {
            let code = errno
            Glibc.close(descriptor)
            throw NotifySocketFailure(message: "cannot bind \(value): \(String(cString: strerror(code)))")
        }
        notifySocket = value
        self.filePath = filePath
        self.descriptor = Mutex(descriptor)
    }

    /// The next message (one datagram, as text) and when it was received, waiting at most
    /// `timeout`; nil when nothing arrived in time or the receiver is closed.
    public func next(timeout: Duration) -> (message: String, at: ContinuousClock.Instant)? {
        let deadline = ContinuousClock.now + timeout
        return descriptor.withLock { descriptor in
            guard descriptor >= 0 else { return nil }
            while true {
                let left = deadline - .now
                let milliseconds = max(0, Int32(clamping: left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000))
                var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
                let ready = poll(&entry, 1, milliseconds)
                if ready < 0 && errno == EINTR { continue }
                guard ready > 0 else { return nil }
                // systemd reads at most a page per message; 64 KiB leaves room for anything a
                // test might send, and a datagram is never split.
                var buffer = [UInt8](repeating: 0, count: 65_536)
                let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                if count < 0 && (errno == EAGAIN || errno == EINTR) { continue }
                guard count >= 0 else { return nil }
                return (String(decoding: buffer[..<count], as: UTF8.self), ContinuousClock.now)
            }
        }
    }

    /// The next message that `matches`, skipping (and dropping) others, waiting at most
    /// `timeout` in all; for a test that waits for `READY=1` among `STATUS=` updates.
    public func next(timeout: Duration, where matches: (String) -> Bool) -> (message: String, at: ContinuousClock.Instant)? {
        let deadline = ContinuousClock.now + timeout
        while let received = next(timeout: max(.zero, deadline - .now)) {
            if matches(received.message) { return received }
        }
        return nil
    }

    /// A message's assignments by key (a later assignment of a key wins).
    public static func assignments(_ message: String) -> [String: String] {
        var result: [String: String] = [:]
        for line in message.split(separator: "\n") {
            guard let equals = line.firstIndex(of: "=") else { continue }
            result[String(line[..<equals])] = String(line[line.index(after: equals)...])
        }
        return result
    }

    /// Closes the socket and removes its file; later ``next(timeout:)`` calls return nil.
    public func close() {
        descriptor.withLock { descriptor in
            guard descriptor >= 0 else { return }
            Glibc.close(descriptor)
            descriptor = -1
            if let filePath { unlink(filePath) }
        }
    }

    deinit { close() }
}

/// A receiver could not be set up.
public struct NotifySocketFailure: Error, CustomStringConvertible {
    public let message: String
    public init(message: String) { self.message = message }
    public var description: String { message }
}
