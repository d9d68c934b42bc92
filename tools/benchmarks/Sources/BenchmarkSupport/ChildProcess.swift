// Child processes and the small shared pieces of the measurement executables: a monotonic
// clock, their error type and their notes on stderr.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Monotonic time in nanoseconds (CLOCK_MONOTONIC).
@inline(__always) public func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// A measurement that could not be made, and why.
public struct MeasurementError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// A file of /proc read whole. Foundation's `String(contentsOfFile:)` trusts the size a file
/// states, and /proc's state 0: it returns the first read only, about 4 KiB (of /proc/PID/smaps,
/// the first few mappings of hundreds). Empty when the file cannot be read.
public func procFile(_ path: String) -> String {
    let fd = open(path, O_RDONLY)
    guard fd >= 0 else { return "" }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else { break }
        bytes += buffer[..<count]
    }
    return String(decoding: bytes, as: UTF8.self)
}

/// A line on stderr, named by the program.
public func note(_ text: String) {
    let program = (CommandLine.arguments.first ?? "measurements").split(separator: "/").last.map(String.init) ?? "measurements"
    FileHandle.standardError.write(Data("\(program): \(text)\n".utf8))
}

/// A process started with posix_spawn; stdout and stderr go to `log`.
public final class Child {
    /// The process id.
    public let pid: pid_t
    /// The file its stdout and stderr go to.
    public let log: String
    /// The wait status once it has exited and been reaped.
    public private(set) var exitStatus: Int32?

    /// Starts `executable` with `arguments`, this process's environment with `environment`
    /// added (or replacing), stdin from /dev/null.
    public init(_ executable: String, _ arguments: [String], log: String, environment: [String: String] = [:]) throws {
        self.log = log
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        // Nothing else of this process's: without this, nginx and the agents held copies of the
        // measurement's own sockets (its clients' and its stand-in upstream's connections), and a
        // connection this process closed stayed open in them.
        _ = addCloseFrom(&actions, 3)
        // The child starts with default handlers and nothing blocked, whatever this process set.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGCHLD] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var unblocked = sigset_t()
        sigemptyset(&unblocked)
        posix_spawnattr_setsigmask(&attributes, &unblocked)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))

        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        let merged = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let envp: [UnsafeMutablePointer<CChar>?] = merged.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { for pointer in argv + envp { free(pointer) } }
        var pid: pid_t = 0
        let code = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        guard code == 0 else { throw MeasurementError("cannot start \(executable): \(String(cString: strerror(code)))") }
        self.pid = pid
        Child.running.insert(pid)
    }

    /// Pids started here and not yet reaped, for stopping them when a measurement fails.
    nonisolated(unsafe) public static var running: Set<pid_t> = []

    /// True until the process has exited (and is reaped).
    public var isRunning: Bool {
        guard exitStatus == nil else { return false }
        var status: Int32 = 0
        if waitpid(pid, &status, WNOHANG) == pid {
            exitStatus = status
            Child.running.remove(pid)
            return false
        }
        return true
    }

    /// SIGTERM, then SIGKILL after `timeout` seconds; waits for the exit.
    public func stop(timeout: Double = 15) {
        guard isRunning else { return }
        kill(pid, SIGTERM)
        let deadline = monotonicNanoseconds() + UInt64(timeout * 1e9)
        while isRunning {
            if monotonicNanoseconds() > deadline {
                note("pid \(pid) ignored SIGTERM for \(timeout) s; killing it")
                kill(pid, SIGKILL)
                var status: Int32 = 0
                waitpid(pid, &status, 0)
                exitStatus = status
                Child.running.remove(pid)
                return
            }
            usleep(2000)
        }
    }

    /// The last lines of the log, for an error message.
    public var logTail: String {
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        return text.split(separator: "\n").suffix(15).joined(separator: "\n")
    }

    /// CPU time used so far (user and system), in seconds.
    public func cpuSeconds() -> Double {
        let stat = procFile("/proc/\(pid)/stat")
        // The fields after the command name, which is in parentheses and may hold spaces.
        guard let close = stat.lastIndex(of: ")") else { return 0 }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Resident memory now, in KiB (VmRSS), its peak (VmHWM), and the current split between
    /// anonymous memory (RssAnon: heap, stacks) and mapped files (RssFile: the binary, libraries).
    public func residentKiB() -> (current: Int, peak: Int, anonymous: Int, files: Int) {
        let status = procFile("/proc/\(pid)/status")
        func field(_ name: String) -> Int {
            guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix(name + ":") }) else { return 0 }
            return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? 0
        }
        return (field("VmRSS"), field("VmHWM"), field("RssAnon"), field("RssFile"))
    }

    /// Clears the accessed bits of every page the process has mapped (`/proc/PID/clear_refs`), so
    /// that ``referencedFileKiB()`` later counts only what it used since. False when the kernel
    /// refused (another user's process, or no such file).
    public func clearReferencedPages() -> Bool {
        guard let handle = FileHandle(forWritingAtPath: "/proc/\(pid)/clear_refs") else { return false }
        defer { try? handle.close() }
        return (try? handle.write(contentsOf: Array("1".utf8))) != nil
    }

    /// Pages of mapped files (the binary, libraries) used since ``clearReferencedPages()``, in
    /// KiB: the sum of `Referenced` over the file mappings in `/proc/PID/smaps`. RssFile also
    /// counts pages the kernel mapped around each one faulted in (fault-around) and pages used
    /// only while starting; this is the part the process went on using.
    public func referencedFileKiB() -> Int {
        let smaps = procFile("/proc/\(pid)/smaps")
        var total = 0
        var inFile = false
        for line in smaps.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard let first = fields.first else { continue }
            if first.contains("-") && !first.hasSuffix(":") {
                // A mapping's header: address range, permissions, offset, device, inode, path.
                inFile = fields.count >= 6 && fields[5].hasPrefix("/")
            } else if inFile && first == "Referenced:", fields.count >= 2 {
                total += Int(fields[1]) ?? 0
            }
        }
        return total
    }

    /// Waits for the exit (reaping it); the exit code, or 128 + the signal.
    @discardableResult
    public func wait() -> Int32 {
        var status: Int32 = exitStatus ?? 0
        if exitStatus == nil {
            while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
            exitStatus = status
            Child.running.remove(pid)
        }
        let signal = status & 0x7f
        return signal == 0 ? (status >> 8) & 0xff : 128 + signal
    }

    /// Everything it wrote so far.
    public var output: String { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" }
}

/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34+), which the Glibc module does not
/// declare.
@_silgen_name("posix_spawn_file_actions_addclosefrom_np")
private func addCloseFrom(_ actions: UnsafeMutablePointer<posix_spawn_file_actions_t>, _ from: Int32) -> Int32
