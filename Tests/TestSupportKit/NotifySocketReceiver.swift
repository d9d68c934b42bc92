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
/// A thread of its own receives and time-stamps each datagram as it arrives, so the times are
/// right however busy the test's tasks are, and no wait blocks Swift's cooperative threads.
///
/// Either a socket file in a directory the test owns, or an abstract socket (no file at all;
/// per network namespace, so a child process in the same namespace reaches it too).
public final class NotifySocketReceiver: Sendable {
    /// The `NOTIFY_SOCKET` value that reaches this receiver (`/dir/name` or `@name`).
    public let notifySocket: String
    /// Messages received and not yet taken, oldest first; and whether ``close()`` was called.
    private let inbox = Inbox()
    /// Signalled by the receiving thread once it has closed the socket.
    private let stopped = DispatchSemaphore(value: 0)

    private final class Inbox: Sendable {
        let state = Mutex<(messages: [(message: String, at: ContinuousClock.Instant)], closed: Bool)>(([], false))
        func withLock<T>(_ body: (inout (messages: [(message: String, at: ContinuousClock.Instant)], closed: Bool)) -> T) -> T {
            state.withLock { body(&$0) }
        }
    }
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
        let (inbox, stopped) = (self.inbox, self.stopped)
        Thread.detachNewThread {
            Self.receive(descriptor, filePath: filePath, into: inbox)
            stopped.signal()
        }
    }

    /// The receiving thread: polls in short rounds so that it sees ``close()`` soon, then closes
    /// the socket and removes its file itself.
    private static func receive(_ descriptor: Int32, filePath: String?,
                                into inbox: Inbox) {
        // systemd reads at most a page per message; 64 KiB leaves room for anything a test
        // might send, and a datagram is never split.
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while !inbox.withLock({ $0.closed }) {
            var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            guard poll(&entry, 1, 50) > 0 else { continue }
            let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            guard count >= 0 else { continue }
            let message = String(decoding: buffer[..<count], as: UTF8.self)
            let at = ContinuousClock.now
            inbox.withLock { $0.messages.append((message, at)) }
        }
        Glibc.close(descriptor)
        if let filePath { unlink(filePath) }
    }

    /// The next message (one datagram, as text) and when it was received, waiting at most
    /// `timeout`; nil when nothing arrived in time or the receiver is closed.
    public func next(timeout: Duration) async -> (message: String, at: ContinuousClock.Instant)? {
        let deadline = ContinuousClock.now + timeout
        while true {
            let (taken, closed) = inbox.withLock { inbox in (inbox.messages.isEmpty ? nil : inbox.messages.removeFirst(), inbox.closed) }
            if let taken { return taken }
            if closed || ContinuousClock.now >= deadline { return nil }
            try? await Task.sleep(for: .milliseconds(5))
        }
    }

    /// The next message that `matches`, skipping (and dropping) others, waiting at most
    /// `timeout` in all; for a test that waits for `READY=1` among `STATUS=` updates.
    public func next(timeout: Duration, where matches: (String) -> Bool) async -> (message: String, at: ContinuousClock.Instant)? {
        let deadline = ContinuousClock.now + timeout
        while let received = await next(timeout: max(.zero, deadline - .now)) {
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

    /// Stops receiving: returns once the socket is closed and its file removed (within about
    /// 50 ms); later ``next(timeout:)`` calls return what had arrived, then nil.
    public func close() {
        let first = inbox.withLock { inbox in
            defer { inbox.closed = true }
            return !inbox.closed
        }
        if first { stopped.wait() }
    }

    deinit { close() }
}

/// A receiver could not be set up.
public struct NotifySocketFailure: Error, CustomStringConvertible {
    public let message: String
    public init(message: String) { self.message = message }
    public var description: String { message }
}
