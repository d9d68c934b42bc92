// Agent runtime: what the agent tells systemd (or any manager speaking
// the sd_notify protocol) about itself: ready, reloading, stopping, a status line, watchdog pings.
// Written against the protocol's description (one datagram of KEY=VALUE lines to the Unix socket
// named by $NOTIFY_SOCKET); no library provides it on Linux.

import Foundation
package import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Sends service-manager notifications (`READY=1`, `RELOADING=1`, `STOPPING=1`, `STATUS=…`,
/// `WATCHDOG=1`) to the socket systemd names in `$NOTIFY_SOCKET` for a `Type=notify` unit.
///
/// - **Disabled** without `NOTIFY_SOCKET` (the agent run by hand, in a container, under another
///   supervisor): every call is a cheap no-op and returns `false`.
/// - **Addresses:** an absolute path, or an abstract socket name written with a leading `@`.
/// - **Never fatal:** nothing here throws. A failed send (the socket is gone, permission denied,
///   a path too long for a Unix socket address) is logged as a `warning` the first time, with
///   the socket and the system's reason, and at `debug` after that, so a broken `NOTIFY_SOCKET`
///   neither stops start-up nor floods the log with one line per watchdog ping.
/// - **One datagram per call:** the assignments of one call arrive together, which systemd needs
///   for `RELOADING=1` with `MONOTONIC_USEC=`. The socket stays open between calls and is opened
///   again after a failure. Calls are serialized, so messages arrive in the order sent.
package final class SystemdNotifier: Sendable {
    /// The `NOTIFY_SOCKET` value, as given (nil when unset or empty).
    let notifySocket: String?
    /// How often to send ``watchdog()``: half of `WATCHDOG_USEC`, as systemd recommends, so a
    /// ping delayed by a busy moment still arrives in time. `nil` when there is no notification
    /// socket, `WATCHDOG_USEC` is missing, zero or not a number, or `WATCHDOG_PID` names another
    /// process (the variables were inherited from a parent that is the watched service).
    package let watchdogInterval: Duration?

    private let address: Result<UnixAddress, AddressProblem>?
    private let logger: Logger
    private let state = Mutex(State())

    /// The open socket and whether a failure was already reported as a warning.
    private struct State {
        var descriptor: Int32 = -1
        var warned = false
    }

    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` from `environment`. Opens
    /// nothing yet: the socket is created by the first send.
    /// - Parameters:
    ///   - environment: the variables systemd set for the service (default: this process's).
    ///   - logger: where failed sends are reported.
    package init(environment: [String: String] = ProcessInfo.processInfo.environment, logger: Logger) {
        let socket = environment["NOTIFY_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
        notifySocket = socket
        self.logger = logger
        address = socket.map(UnixAddress.parse)
        watchdogInterval = socket == nil ? nil : Self.watchdogInterval(environment)
    }

    deinit {
        let descriptor = state.withLock { $0.descriptor }
        if descriptor >= 0 { Glibc.close(descriptor) }
    }

    /// Whether a notification socket is configured. A configured socket may still be unusable;
    /// sends then fail quietly (see the type's description).
    package var isEnabled: Bool { notifySocket != nil }

    /// Sends `assignments` (each `KEY=VALUE`) in one datagram, one assignment a line. Newlines,
    /// carriage returns and NUL bytes inside an assignment become spaces, since the protocol
    /// separates assignments by newlines and systemd drops messages with NUL bytes.
    /// - Returns: whether the datagram was handed to the socket; `false` when disabled, when
    ///   there is nothing to send, or when sending failed (logged). Never throws.
    @discardableResult
    package func notify(_ assignments: [String]) -> Bool {
        guard let address else { return false }
        let lines = assignments.map(Self.singleLine).filter { !$0.isEmpty }
        guard !lines.isEmpty else { return false }
        let failure: (reason: String, firstTime: Bool)?
        switch address {
        case .failure(let problem):
            failure = state.withLock { state in (problem.description, Self.markWarned(&state)) }
        case .success(let target):
            failure = state.withLock { state in
                Self.send(Array(lines.joined(separator: "\n").utf8), to: target, state: &state)
                    .map { ($0, Self.markWarned(&state)) }
            }
        }
        guard let failure else { return true }
        // Logged outside the lock: a slow log handler must not hold up other senders.
        let metadata: Logger.Metadata = ["notify_socket": "\(notifySocket ?? "")", "error": "\(failure.reason)"]
        if failure.firstTime {
            logger.warning("cannot notify the service manager: it will not see readiness, reloads or watchdog pings, and may stop the service when its start or watchdog timeout passes; check that NOTIFY_SOCKET names the manager's socket (later failures are logged at debug level)", metadata: metadata)
        } else {
            logger.debug("cannot notify the service manager", metadata: metadata)
        }
        return false
    }

    /// Tells the manager that start-up finished (`READY=1`), optionally with a status line.
    /// Also sent when a reload is done.
    /// - Returns: see ``notify(_:)``.
    @discardableResult
    package func ready(status: String? = nil) -> Bool {
        notify(["READY=1"] + (status.map { ["STATUS=\($0)"] } ?? []))
    }

    /// Tells the manager that a reload started (`RELOADING=1` with `MONOTONIC_USEC=`, the
    /// current `CLOCK_MONOTONIC` time in microseconds, which `Type=notify-reload` requires to
    /// match the message to the reload it asked for). Send ``ready(status:)`` when the reload is
    /// done.
    /// - Returns: see ``notify(_:)``.
    @discardableResult
    package func reloading(status: String? = nil) -> Bool {
        notify(["RELOADING=1", "MONOTONIC_USEC=\(Self.monotonicMicroseconds())"] + (status.map { ["STATUS=\($0)"] } ?? []))
    }

    /// Tells the manager that the service is shutting down (`STOPPING=1`), so that it does not
    /// count the stop as a crash.
    /// - Returns: see ``notify(_:)``.
    @discardableResult
    package func stopping(status: String? = nil) -> Bool {
        notify(["STOPPING=1"] + (status.map { ["STATUS=\($0)"] } ?? []))
    }

    /// Sets the one-line status `systemctl status` shows (`STATUS=…`).
    /// - Returns: see ``notify(_:)``.
    @discardableResult
    package func status(_ text: String) -> Bool {
        notify(["STATUS=\(text)"])
    }

    /// Sends a watchdog ping (`WATCHDOG=1`). Call it every ``watchdogInterval`` from the loop
    /// whose health it vouches for; the manager ignores it when the unit has no `WatchdogSec=`.
    /// - Returns: see ``notify(_:)``.
    @discardableResult
    package func watchdog() -> Bool {
        notify(["WATCHDOG=1"])
    }

    // MARK: - Internals

    /// Sends `bytes` over the open socket (opening one first when needed); returns the reason of
    /// a failure. A failed socket is closed, so the next call starts with a fresh one.
    private static func send(_ bytes: [UInt8], to target: UnixAddress, state: inout State) -> String? {
        if state.descriptor < 0 {
            let descriptor = Glibc.socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard descriptor >= 0 else { return "socket(): \(errnoText())" }
            // A manager that stops draining its queue must not block the caller for ever (a
            // watchdog ping runs on a concurrency thread); a second is far longer than systemd
            // ever takes, and a READY=1 that waits that long is still better than a lost one.
            var timeout = timeval(tv_sec: 1, tv_usec: 0)
            _ = setsockopt(descriptor, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            state.descriptor = descriptor
        }
        var address = target.storage
        let sent = bytes.withUnsafeBytes { buffer in
            withUnsafePointer(to: &address) { pointer in
                pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress in
                    // MSG_NOSIGNAL: a vanished peer must not raise SIGPIPE in the agent.
                    sendto(state.descriptor, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL), socketAddress, target.length)
                }
            }
        }
        if sent == bytes.count { return nil }
        let reason = sent < 0 ? errnoText() : "sent \(sent) of \(bytes.count) bytes"
        Glibc.close(state.descriptor)
        state.descriptor = -1
        return reason
    }

    /// True for the first failure only, which becomes the warning.
    private static func markWarned(_ state: inout State) -> Bool {
        defer { state.warned = true }
        return !state.warned
    }

    private static func singleLine(_ assignment: String) -> String {
        String(String.UnicodeScalarView(assignment.unicodeScalars.map { ["\n", "\r", "\0"].contains($0) ? " " : $0 }))
    }

    private static func watchdogInterval(_ environment: [String: String]) -> Duration? {
        guard let text = environment["WATCHDOG_USEC"], let microseconds = UInt64(text), microseconds > 0 else { return nil }
        if let pid = environment["WATCHDOG_PID"] {
            guard let watched = pid_t(pid), watched == getpid() else { return nil }
        }
        return .microseconds(Int64(clamping: microseconds)) / 2
    }

    private static func monotonicMicroseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1_000
    }

    private static func errnoText() -> String {
        let code = errno
        return "\(String(cString: strerror(code))) (errno \(code))"
    }
}

/// Why a `NOTIFY_SOCKET` value cannot be used as a Unix socket address.
private struct AddressProblem: Error, CustomStringConvertible {
    let description: String
}

/// A Unix datagram socket address built from a `NOTIFY_SOCKET` value.
private struct UnixAddress: Sendable {
    let storage: sockaddr_un
    let length: socklen_t

    /// `/path` names a socket file; `@name` an abstract socket, whose address is a NUL byte then
    /// the name, with a length that counts exactly those bytes (no terminating NUL: the kernel
    /// would take it as part of the name).
    static func parse(_ value: String) -> Result<UnixAddress, AddressProblem> {
        var storage = sockaddr_un()
        storage.sun_family = sa_family_t(AF_UNIX)
        let pathOffset = MemoryLayout<sockaddr_un>.offset(of: \.sun_path)!
        let capacity = MemoryLayout.size(ofValue: storage.sun_path)
        let bytes: [UInt8]
        if value.hasPrefix("@") {
            bytes = [0] + Array(value.utf8.dropFirst())
            guard bytes.count <= capacity else {
                return .failure(AddressProblem(description: "abstract socket name of \(bytes.count - 1) bytes is longer than a Unix socket address allows (\(capacity - 1))"))
            }
        } else if value.hasPrefix("/") {
            bytes = Array(value.utf8) + [0]
            guard bytes.count <= capacity else {
                return .failure(AddressProblem(description: "socket path of \(bytes.count - 1) bytes is longer than a Unix socket address allows (\(capacity - 1))"))
            }
        } else {
            return .failure(AddressProblem(description: "not an absolute path or an @abstract name (other address kinds, such as vsock:, are not supported)"))
        }
        withUnsafeMutableBytes(of: &storage.sun_path) { path in path.copyBytes(from: bytes) }
        return .success(UnixAddress(storage: storage, length: socklen_t(pathOffset + bytes.count)))
    }
}
