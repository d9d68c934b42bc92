import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A child process started with `posix_spawn`, for every program the tests run.
///
/// Not Foundation's `Process`: on Linux its `run()` reads `/proc/self/fd` with a 256-byte copy
/// of each `dirent` name and crashes when the record ends a buffer before an unmapped page
/// (swift-corelibs-foundation PR #5472, not in Swift 6.3.1). It crashed this suite twice, more
/// likely the more descriptors the test process holds (the API tests open 1,000 sockets).
/// Here the child also starts with no blocked signals and default dispositions (the
/// concurrency pool threads block some, and a child inherits the mask), and with every
/// descriptor above 2 closed.
public final class ChildProcess: @unchecked Sendable {
    // @unchecked: `pid` is immutable; the exit status is behind a Mutex; the pipe handles are
    // only created here and used by one test at a time.

    /// Where the child's standard input comes from.
    public enum Input: Sendable { case null, pipe }
    /// Where a standard output of the child goes.
    public enum Output: Sendable {
        case null, file(String), pipe
        /// Standard error only: wherever standard output goes.
        case standardOutput
    }
    /// How the child ended.
    public enum TerminationReason: Sendable, Equatable { case exit, uncaughtSignal }

    /// The child's process id.
    public let processIdentifier: pid_t
    /// The write end of the child's standard input (`.pipe`).
    public let standardInput: FileHandle?
    /// The read end of the child's standard output (`.pipe`).
    public let standardOutput: FileHandle?
    /// The read end of the child's standard error (`.pipe`).
    public let standardError: FileHandle?
    private let exit = Mutex<(reason: TerminationReason, status: Int32)?>(nil)

    /// Starts `executable` (an absolute path) with `arguments`, `environment` (nil: this
    /// process's) and the given standard streams.
    /// - Throws: ``ProcessFailure`` when a pipe, a file or the spawn fails.
    public init(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                stdin: Input = .null, stdout: Output = .null, stderr: Output = .null) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        // The parent's ends belong to their FileHandles, which close them when released, on
        // every path: closed here as well, a number could be closed twice (another thread's
        // socket or store file by then).
        var childEnds: [Int32] = []
        defer { for descriptor in childEnds { close(descriptor) } }
        func pipeEnds() throws -> (read: Int32, write: Int32) {
            var ends: [Int32] = [-1, -1]
            guard makePipe(&ends, O_CLOEXEC) == 0 else { throw ProcessFailure(message: "pipe2 failed: errno \(errno)") }
            return (ends[0], ends[1])
        }

        var inputHandle: FileHandle?
        switch stdin {
        case .null:
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        case .pipe:
            let ends = try pipeEnds()
            posix_spawn_file_actions_adddup2(&actions, ends.read, 0)
            childEnds.append(ends.read)
            inputHandle = FileHandle(fileDescriptor: ends.write, closeOnDealloc: true)
        }
        var outputHandles: [FileHandle?] = []
        for (target, output) in [(Int32(1), stdout), (Int32(2), stderr)] {
            switch output {
            case .null:
                posix_spawn_file_actions_addopen(&actions, target, "/dev/null", O_WRONLY, 0)
                outputHandles.append(nil)
            case .file(let path):
                posix_spawn_file_actions_addopen(&actions, target, path, O_WRONLY | O_CREAT | O_APPEND, 0o644)
                outputHandles.append(nil)
            case .pipe:
                let ends = try pipeEnds()
                posix_spawn_file_actions_adddup2(&actions, ends.write, target)
                childEnds.append(ends.write)
                outputHandles.append(FileHandle(fileDescriptor: ends.read, closeOnDealloc: true))
            case .standardOutput:
                posix_spawn_file_actions_adddup2(&actions, 1, target)
                outputHandles.append(nil)
            }
        }
        // Nothing else of the test process leaks into the child (listening sockets, stores).
        _ = addCloseFrom(&actions, 3)

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        var everySignal = sigset_t()
        sigfillset(&everySignal)
        posix_spawnattr_setsigdefault(&attributes, &everySignal)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        let environmentLines = (environment ?? ProcessInfo.processInfo.environment).map { "\($0.key)=\($0.value)" }
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = environmentLines.map { strdup($0) } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in envp { free(pointer) }
        }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        guard result == 0 else {
            throw ProcessFailure(message: "cannot start \(executable): \(String(cString: strerror(result)))")
        }
        processIdentifier = pid
        standardInput = inputHandle
        standardOutput = outputHandles[0]
        standardError = outputHandles[1]
    }

    /// Reads the piped standard output and error to their ends on other threads (so that
    /// neither pipe can fill up and stall the child), then waits for the exit.
    /// - Throws: ``ProcessFailure`` when that takes longer than `timeout` (the child is killed).
    public func collectOutput(timeout: TimeInterval = 60) throws -> (stdout: String, stderr: String) {
        let collected = Mutex<[Int: Data]>([:])
        let group = DispatchGroup()
        for (index, handle) in [standardOutput, standardError].enumerated() {
            guard let handle else { continue }
            group.enter()
            DispatchQueue.global().async {
                let data = handle.readDataToEndOfFile()
                collected.withLock { $0[index] = data }
                group.leave()
            }
        }
        if group.wait(timeout: .now() + timeout) == .timedOut {
            kill(processIdentifier, SIGKILL)
            waitUntilExit()
            throw ProcessFailure(message: "process \(processIdentifier) did not finish in \(timeout) s")
        }
        waitUntilExit()
        let data = collected.withLock { $0 }
        return (String(decoding: data[0] ?? Data(), as: UTF8.self), String(decoding: data[1] ?? Data(), as: UTF8.self))
    }

    /// True until the child has exited (reaped here).
    public var isRunning: Bool { reap(blocking: false) == nil }

    /// Waits for the child to exit.
    public func waitUntilExit() { _ = reap(blocking: true) }

    /// The exit code, or the signal that ended it. Call after it exited.
    public var terminationStatus: Int32 { reap(blocking: true)?.status ?? -1 }

    /// Whether it exited or was killed by a signal. Call after it exited.
    public var terminationReason: TerminationReason { reap(blocking: true)?.reason ?? .exit }

    private func reap(blocking: Bool) -> (reason: TerminationReason, status: Int32)? {
        if let known = exit.withLock({ $0 }) { return known }
        var status: Int32 = 0
        var result: pid_t
        repeat {
            result = waitpid(processIdentifier, &status, blocking ? 0 : WNOHANG)
        } while result == -1 && errno == EINTR
        guard result == processIdentifier else { return exit.withLock { $0 } }
        // WIFEXITED / WEXITSTATUS / WTERMSIG, which are C macros.
        let signal = status & 0x7F
        let outcome: (reason: TerminationReason, status: Int32) = signal == 0 ? (.exit, (status >> 8) & 0xFF) : (.uncaughtSignal, signal)
        exit.withLock { $0 = outcome }
        return outcome
    }

    deinit {
        if exit.withLock({ $0 }) == nil {
            kill(processIdentifier, SIGKILL)
            _ = reap(blocking: true)
        }
    }
}

/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34+), which the Glibc module does not
/// declare.
@_silgen_name("posix_spawn_file_actions_addclosefrom_np")
private func addCloseFrom(_ actions: UnsafeMutablePointer<posix_spawn_file_actions_t>, _ from: Int32) -> Int32

/// glibc's `pipe2` (a GNU extension the Glibc module does not declare).
@_silgen_name("pipe2")
private func makePipe(_ ends: UnsafeMutablePointer<Int32>, _ flags: Int32) -> Int32
