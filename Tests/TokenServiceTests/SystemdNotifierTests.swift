// SystemdNotifier against real Unix datagram sockets (a socket file and an abstract name), read
// by TestSupportKit's NotifySocketReceiver standing in for systemd. Waits are bounded receives.

import FleetTokenStoreTesting
@testable import FleetTokenService
@testable import TokenAgentRuntime
import Foundation
import Logging
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("SystemdNotifier: the sd_notify protocol", .paced)
struct SystemdNotifierTests {
    static let wait = Duration.seconds(5)

    static func notifier(_ environment: [String: String], _ log: LogRecorder = LogRecorder()) -> SystemdNotifier {
        SystemdNotifier(environment: environment, logger: log.logger)
    }

    static func monotonicMicroseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1_000
    }

    @Test("READY, STATUS, WATCHDOG and STOPPING arrive at a socket file as sent, one datagram each")
    func pathSocket() async throws {
        let scratch = Scratch()
        let receiver = try NotifySocketReceiver(directory: scratch.path)
        let log = LogRecorder()
        let notifier = Self.notifier(["NOTIFY_SOCKET": receiver.notifySocket], log)
        #expect(notifier.isEnabled)
        #expect(notifier.notifySocket == scratch.file("notify.sock"))

        #expect(notifier.ready(status: "serving 3 subjects"))
        #expect(await receiver.next(timeout: Self.wait)?.message == "READY=1\nSTATUS=serving 3 subjects")
        #expect(notifier.status("provider failing: HTTP 503"))
        #expect(await receiver.next(timeout: Self.wait)?.message == "STATUS=provider failing: HTTP 503")
        #expect(notifier.watchdog())
        #expect(await receiver.next(timeout: Self.wait)?.message == "WATCHDOG=1")
        #expect(notifier.stopping())
        #expect(await receiver.next(timeout: Self.wait)?.message == "STOPPING=1")
        #expect(notifier.notify(["EXTEND_TIMEOUT_USEC=5000000", "", "STATUS=migrating"]))
        #expect(await receiver.next(timeout: Self.wait)?.message == "EXTEND_TIMEOUT_USEC=5000000\nSTATUS=migrating")
        // Nothing more was sent: no stray or split datagrams.
        #expect(await receiver.next(timeout: .milliseconds(50)) == nil)
        #expect(log.count == 0)
    }

    @Test("newlines, carriage returns and NUL bytes inside a value become spaces")
    func valuesStayOnOneLine() async throws {
        let scratch = Scratch()
        let receiver = try NotifySocketReceiver(directory: scratch.path)
        let notifier = Self.notifier(["NOTIFY_SOCKET": receiver.notifySocket])
        #expect(notifier.status("line one\nREADY=1\r\nend\u{0}"))
        #expect(await receiver.next(timeout: Self.wait)?.message == "STATUS=line one READY=1  end ")
    }

    @Test("an abstract socket (@name) receives the messages")
    func abstractSocket() async throws {
        let receiver = try NotifySocketReceiver()
        #expect(receiver.notifySocket.hasPrefix("@"))
        let notifier = Self.notifier(["NOTIFY_SOCKET": receiver.notifySocket])
        #expect(notifier.ready())
        #expect(await receiver.next(timeout: Self.wait)?.message == "READY=1")
        #expect(notifier.watchdog())
        #expect(await receiver.next(timeout: Self.wait)?.message == "WATCHDOG=1")
    }

    @Test("RELOADING=1 carries MONOTONIC_USEC, the CLOCK_MONOTONIC time of the call")
    func reloadingCarriesMonotonicTime() async throws {
        let receiver = try NotifySocketReceiver()
        let notifier = Self.notifier(["NOTIFY_SOCKET": receiver.notifySocket])
        let before = Self.monotonicMicroseconds()
        #expect(notifier.reloading(status: "reloading subjects"))
        let after = Self.monotonicMicroseconds()
        let message = try #require(await receiver.next(timeout: Self.wait)?.message)
        let lines = message.split(separator: "\n").map(String.init)
        #expect(lines.count == 3)
        #expect(lines.first == "RELOADING=1")
        #expect(lines.last == "STATUS=reloading subjects")
        let stamp = try #require(NotifySocketReceiver.assignments(message)["MONOTONIC_USEC"].flatMap { UInt64($0) })
        #expect(stamp >= before && stamp <= after, "MONOTONIC_USEC \(stamp) outside [\(before), \(after)]")
    }

    @Test("watchdogInterval is half of WATCHDOG_USEC, for this process only", arguments: [
        (["WATCHDOG_USEC": "30000000"], Duration.seconds(15)),
        (["WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "\(getpid())"], Duration.seconds(15)),
        (["WATCHDOG_USEC": "3"], Duration.microseconds(1.5)),
    ] as [([String: String], Duration)])
    func watchdogInterval(environment: [String: String], expected: Duration) {
        let notifier = Self.notifier(environment.merging(["NOTIFY_SOCKET": "@fts-unused"]) { $1 })
        #expect(notifier.watchdogInterval == expected)
    }

    @Test("no watchdog for another WATCHDOG_PID, a missing, zero or garbage WATCHDOG_USEC, or without NOTIFY_SOCKET", arguments: [
        ["NOTIFY_SOCKET": "@fts-unused", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "\(getpid() + 1)"],
        ["NOTIFY_SOCKET": "@fts-unused", "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "main"],
        ["NOTIFY_SOCKET": "@fts-unused", "WATCHDOG_USEC": "30s"],
        ["NOTIFY_SOCKET": "@fts-unused", "WATCHDOG_USEC": "-5"],
        ["NOTIFY_SOCKET": "@fts-unused", "WATCHDOG_USEC": "0"],
        ["NOTIFY_SOCKET": "@fts-unused", "WATCHDOG_USEC": ""],
        ["NOTIFY_SOCKET": "@fts-unused"],
        ["WATCHDOG_USEC": "30000000"],
    ])
    func noWatchdog(environment: [String: String]) {
        #expect(Self.notifier(environment).watchdogInterval == nil)
    }

    /// NOTIFY_SOCKET values that cannot be written to, and a piece of the reason each logs.
    enum Unwritable: String, CaseIterable, CustomTestStringConvertible {
        case missingPath, regularFile, pathTooLong, relativePath
        var testDescription: String { rawValue }

        func socket(in scratch: Scratch) -> (value: String, reason: String) {
            switch self {
            case .missingPath:
                return (scratch.file("no-such-dir/notify.sock"), "No such file or directory")
            case .regularFile:
                _ = FileManager.default.createFile(atPath: scratch.file("plain-file"), contents: Data("x".utf8))
                return (scratch.file("plain-file"), "Connection refused")
            case .pathTooLong:
                return (scratch.path + "/" + String(repeating: "n", count: 120), "longer than a Unix socket address allows")
            case .relativePath:
                return ("run/notify.sock", "not an absolute path")
            }
        }
    }

    @Test("an unwritable NOTIFY_SOCKET never throws and logs one warning over many sends", arguments: Unwritable.allCases)
    func unwritableSocket(kind: Unwritable) {
        let scratch = Scratch()
        let (socket, reason) = kind.socket(in: scratch)
        let log = LogRecorder()
        let notifier = Self.notifier(["NOTIFY_SOCKET": socket, "WATCHDOG_USEC": "30000000"], log)
        #expect(notifier.isEnabled)
        #expect(notifier.watchdogInterval == .seconds(15))

        #expect(!notifier.ready(status: "ready"))
        #expect(!notifier.status("still here"))
        for _ in 0..<5 { #expect(!notifier.watchdog()) }
        #expect(!notifier.reloading())
        #expect(!notifier.stopping())

        let warnings = log.entries.filter { $0.level == .warning }
        #expect(warnings.count == 1)
        let warning = warnings.map { "\($0.message) \($0.metadata)" }.joined()
        #expect(warning.contains(socket), "the warning names the socket: \(warning)")
        #expect(warning.contains(reason), "the warning says why: \(warning)")
        // Every later failure is still recorded, quietly.
        #expect(log.messages(at: .debug).count == 8)
        #expect(log.count == 9)
    }

    @Test("a manager socket that appears late, or goes away and comes back, gets the next message")
    func recoversAfterFailure() async throws {
        let scratch = Scratch()
        let path = scratch.file("notify.sock")
        let log = LogRecorder()
        let notifier = Self.notifier(["NOTIFY_SOCKET": path], log)
        #expect(!notifier.ready())
        #expect(log.messages(at: .warning).count == 1)

        let receiver = try NotifySocketReceiver(directory: scratch.path)
        #expect(notifier.ready())
        #expect(await receiver.next(timeout: Self.wait)?.message == "READY=1")
        // The manager went away and came back (a new socket at the same path).
        receiver.close()
        #expect(!notifier.watchdog())
        let second = try NotifySocketReceiver(directory: scratch.path)
        #expect(notifier.watchdog())
        #expect(await second.next(timeout: Self.wait)?.message == "WATCHDOG=1")
        #expect(log.messages(at: .warning).count == 1)
    }

    @Test("without NOTIFY_SOCKET the notifier is disabled and every call does nothing", arguments: [
        [:], ["NOTIFY_SOCKET": ""], ["WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "\(getpid())"],
    ] as [[String: String]])
    func disabled(environment: [String: String]) {
        let log = LogRecorder()
        let notifier = Self.notifier(environment, log)
        #expect(!notifier.isEnabled)
        #expect(notifier.notifySocket == nil)
        #expect(notifier.watchdogInterval == nil)
        #expect(!notifier.ready(status: "x"))
        #expect(!notifier.reloading())
        #expect(!notifier.status("x"))
        #expect(!notifier.watchdog())
        #expect(!notifier.stopping())
        #expect(!notifier.notify(["X=1"]))
        #expect(log.count == 0)
    }
}
