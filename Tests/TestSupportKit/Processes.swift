import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Where SwiftPM put this package's executables: beside the test bundle.
public let productsDirectory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()

/// A fresh directory under the system temporary directory, removed (with its contents) when
/// released.
public final class Scratch: Sendable {
    /// The directory's absolute path.
    public let path: String

    public init() {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("fts-test-\(UUID().uuidString.prefix(8))").path
        try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }

    /// The path of `name` in the directory.
    public func file(_ name: String) -> String { "\(path)/\(name)" }

    /// Names of the entries in the directory, sorted.
    public var contents: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).sorted()
    }
}

/// The permission bits (`0o7777`) of the file at `path`, following a symlink; nil when there
/// is no file.
public func fileMode(_ path: String) -> mode_t? {
    var info = stat()
    guard stat(path, &info) == 0 else { return nil }
    return info.st_mode & 0o7777
}

/// One of this package's executables run as a real process, its output captured in files (no
/// pipe can fill up and stall it). Killed at the end of the test if still running.
public final class RunningProcess: @unchecked Sendable {
    // @unchecked: `process` is only signalled and waited on (its exit status is behind a lock),
    // and the output files are read after it exits or by polling.
    public let process: ChildProcess
    public let stdoutPath: String
    public let stderrPath: String

    /// `executable` is one of this package's products, or an absolute path (sqlite3, setpriv, unshare).
    public init(_ executable: String, _ arguments: [String], environment: [String: String] = [:], in scratch: Scratch) throws {
        let id = UUID().uuidString.prefix(8)
        let name = (executable as NSString).lastPathComponent
        stdoutPath = scratch.file("\(name)-\(id).out")
        stderrPath = scratch.file("\(name)-\(id).err")
        for path in [stdoutPath, stderrPath] where !FileManager.default.createFile(atPath: path, contents: nil) {
            throw ProcessFailure(message: "cannot create \(path) for the output of \(executable)")
        }
        let path = executable.hasPrefix("/") ? executable : productsDirectory.appendingPathComponent(executable).path
        var env = ProcessInfo.processInfo.environment
        env.removeValue(forKey: "TOKEN_STORE_DB")
        env.merge(environment) { $1 }
        process = try ChildProcess(path, arguments, environment: env, stdout: .file(stdoutPath), stderr: .file(stderrPath))
    }

    public var pid: Int32 { process.processIdentifier }
    public var stdout: String { (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? "" }
    public var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    /// Its output so far, labelled "`label` stdout" and "`label` stderr" (for a secret scan).
    public func outputs(labelled label: String) -> [(label: String, text: String)] {
        [("\(label) stdout", stdout), ("\(label) stderr", stderr)]
    }
    public var isRunning: Bool { process.isRunning }

    public func signal(_ signal: Int32) { kill(pid, signal) }

    /// Waits up to `seconds` for the exit; returns the status, or nil if still running.
    public func wait(upTo seconds: Double) async -> Int32? {
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning && Date() < deadline { try? await Task.sleep(for: .milliseconds(20)) }
        return process.isRunning ? nil : process.terminationStatus
    }

    /// Waits (polling, bounded) until stdout or stderr contains `text`.
    public func waitForOutput(_ text: String, within seconds: Double) async -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if stdout.contains(text) || stderr.contains(text) { return true }
            if !process.isRunning { return stdout.contains(text) || stderr.contains(text) }
            try? await Task.sleep(for: .milliseconds(25))
        }
        return false
    }

    deinit {
        if process.isRunning {
            kill(pid, SIGKILL)
            process.waitUntilExit()
        }
    }
}

/// Runs an executable to completion (bounded) and returns status and output.
public func runToEnd(_ executable: String, _ arguments: [String], environment: [String: String] = [:],
              in scratch: Scratch, timeout: Double = 60) async throws -> (status: Int32, stdout: String, stderr: String) {
    let process = try RunningProcess(executable, arguments, environment: environment, in: scratch)
    guard let status = await process.wait(upTo: timeout) else {
        process.signal(SIGKILL)
        throw ProcessFailure(message: "\(executable) \(arguments) did not finish in \(timeout) s; stderr: \(process.stderr)")
    }
    return (status, process.stdout, process.stderr)
}

public struct ProcessFailure: Error, CustomStringConvertible {
    public let message: String
    public init(message: String) { self.message = message }
    public var description: String { message }
}

/// A dev-token-server process on a free port.
public final class IssuerProcess: Sendable {
    public let process: RunningProcess
    public let template: String
    public let base: String

    /// `recordTokens` keeps every issued token for ``issuedTokens()``.
    /// `keyFile`: a PEM RSA private key to sign with (a test that verifies signatures).
    public init(scratch: Scratch, lifetime: Int = 3600, recordTokens: Bool = false, keyFile: String? = nil) async throws {
        process = try RunningProcess("dev-token-server", ["--port", "0", "--lifetime", "\(lifetime)", "--log-level", "warning"]
                                     + (recordTokens ? ["--record-issued-tokens"] : []) + (keyFile.map { ["--key-file", $0] } ?? []), in: scratch)
        guard await process.waitForOutput("listening on ", within: 30),
              let line = process.stdout.split(separator: "\n").first(where: { $0.contains("listening on ") }),
              let url = line.split(separator: " ").last.map(String.init) else {
            throw ProcessFailure(message: "dev-token-server did not start: \(process.stderr)")
        }
        template = url
        base = String(url.prefix(upTo: url.range(of: "/token/")!.lowerBound))
    }

    /// The issuer's counters from GET /stats.
    public func stats() async throws -> (issued: Int, requests: Int) {
        let (data, _) = try await URLSession.shared.data(from: URL(string: base + "/stats")!)
        let object = try JSONSerialization.jsonObject(with: data) as? [String: Int] ?? [:]
        return (object["issued"] ?? -1, object["requests"] ?? -1)
    }

    /// When each subject's tokens were issued, by `kind/id`, from GET /stats/issued.
    public func issuedTimes() async throws -> [String: [Double]] {
        let (data, _) = try await URLSession.shared.data(from: URL(string: base + "/stats/issued")!)
        return try JSONSerialization.jsonObject(with: data) as? [String: [Double]] ?? [:]
    }

    /// The shortest gap between two fetches of one subject that single flight allows: the
    /// earliest soft point (0.8 of the lifetime less the full 0.05 jitter) counted from the
    /// token's `iat`, which this issuer writes in whole seconds (up to 1 s before the fetch).
    /// Two fetches of one subject closer than this are two fetches for one lifetime.
    public static func shortestRefetchGap(lifetime: Double) -> Double {
        0.75 * lifetime - 1
    }

    /// The gaps in `times` (one subject's issue times, any order) shorter than
    /// ``shortestRefetchGap(lifetime:)``, as `(earlier, gap)` pairs.
    public static func refetchesTooSoon(_ times: [Double], lifetime: Double) -> [(earlier: Double, gap: Double)] {
        let sorted = times.sorted()
        return zip(sorted, sorted.dropFirst()).compactMap { earlier, later in
            later - earlier < shortestRefetchGap(lifetime: lifetime) ? (earlier, later - earlier) : nil
        }
    }

    /// Every token issued, by `kind/id`, from GET /stats/tokens (started with `recordTokens`).
    /// - Throws: ``ProcessFailure`` when the issuer does not record tokens.
    public func issuedTokens() async throws -> [String: [String]] {
        let (data, response) = try await URLSession.shared.data(from: URL(string: base + "/stats/tokens")!)
        guard (response as? HTTPURLResponse)?.statusCode == 200,
              let tokens = try JSONSerialization.jsonObject(with: data) as? [String: [String]] else {
            throw ProcessFailure(message: "GET /stats/tokens: \(String(decoding: data, as: UTF8.self))")
        }
        return tokens
    }
}

/// Runs a command (an absolute path, then its arguments) to completion and captures its output.
/// - Throws: ``ProcessFailure`` when it cannot start, or takes longer than `timeout` seconds
///   (it is killed).
public func runCapturing(_ command: [String], timeout: TimeInterval = 30) throws -> (status: Int32, stdout: String, stderr: String) {
    let process = try ChildProcess(command[0], Array(command.dropFirst()), stdout: .pipe, stderr: .pipe)
    let output = try process.collectOutput(timeout: timeout)
    return (process.terminationStatus, output.stdout, output.stderr)
}

/// ``runCapturing(_:timeout:)`` for async code: the command is waited for on a thread of its
/// own. Two tests blocking a cooperative thread each (a 15 s probe waited for by two child tasks)
/// stalled every other test of a 2-core machine's process for 14 s.
public func runCapturing(_ command: [String], timeout: TimeInterval = 30) async throws -> (status: Int32, stdout: String, stderr: String) {
    try await offCooperativePool { try runCapturing(command, timeout: timeout) }
}

/// The first of `candidates` that is an executable file.
public func executable(_ candidates: [String]) -> String? {
    candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
}

/// The stock sqlite3 shell.
public let sqlite3Path = executable(["/usr/bin/sqlite3", "/usr/local/bin/sqlite3"]) ?? "/usr/bin/sqlite3"

/// Runs stock sqlite3 on `path` and returns its output, trimmed. `readOnly` opens with
/// `-readonly` (waiting up to 5 s for a lock), which leaves a crashed process's `-wal` as it was
/// (a read-write shell checkpoints and deletes it on close).
/// - Throws: ``ProcessFailure`` with sqlite3's error output when it fails.
public func sqlite3(_ path: String, _ sql: String, readOnly: Bool = false) throws -> String {
    let result = try runCapturing([sqlite3Path] + (readOnly ? ["-readonly", "-cmd", ".timeout 5000"] : []) + [path, sql], timeout: 60)
    guard result.status == 0 else { throw ProcessFailure(message: "sqlite3 exited with \(result.status): \(result.stderr)") }
    return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
}

/// ``sqlite3(_:_:readOnly:)`` for async code, waited for off the cooperative pool (a read-only
/// shell may wait up to 5 s for a lock).
public func sqlite3(_ path: String, _ sql: String, readOnly: Bool = false) async throws -> String {
    try await offCooperativePool { try sqlite3(path, sql, readOnly: readOnly) }
}

/// Parses `token-agent --once --json` output.
public func onceResults(_ stdout: String) throws -> [[String: String]] {
    guard let line = stdout.split(separator: "\n").last(where: { $0.hasPrefix("[") }),
          let array = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [[String: String]] else {
        throw ProcessFailure(message: "no JSON array in: \(stdout)")
    }
    return array
}
