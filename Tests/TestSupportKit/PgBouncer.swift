// A PgBouncer of the tests' own in front of a PostgresServer: Debian's `pgbouncer` binary run in
// the foreground from a config file written to a fresh /tmp/fleet-pgbouncer-XXXXXX, listening on
// 127.0.0.1 and a free port (no Unix socket), as the `postgres` user when the tests run as root
// (as the cluster is). Stopped by its pid and its directory removed by stop() or deinit; one that a
// killed test run left behind is stopped by the next (its directory records the owning test
// process and the pid). Nothing of the machine's own pgbouncer (service, /etc/pgbouncer) is used.

import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// PgBouncer in front of a ``PostgresServer``, in the pool mode a test asks for.
public final class PgBouncer: Sendable {
    /// PgBouncer's `pool_mode`.
    public enum PoolMode: String, Sendable { case session, transaction, statement }

    public let host = "127.0.0.1"
    public let port: Int
    public let mode: PoolMode
    /// The config file, the auth file and the log are here; removed by ``stop()``.
    public let directory: String
    public let logFile: String
    private let process: ChildProcess
    private let stopped = Mutex(false)

    /// Starts PgBouncer in `mode` for every database of `server`, user ``PostgresServer/user``
    /// with its password (scram-sha-256 on both sides).
    /// - Throws: ``ProcessFailure`` when pgbouncer is missing (naming the package) or does not
    ///   listen within 10 s (with its log).
    public init(in front: PostgresServer, mode: PoolMode) throws {
        guard let executable = Self.executable else { throw ProcessFailure(message: Self.missing) }
        let tools = try PostgresBinaries.located.get()
        Self.removeAbandoned()
        var template = Array("\(ClusterLayout.parent)/\(Self.prefix)XXXXXX".utf8CString)
        guard let directory = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!).map { String(cString: $0) } }) else {
            throw ProcessFailure(message: "mkdtemp in \(ClusterLayout.parent) failed: errno \(errno)")
        }
        chmod(directory, 0o711)
        try? OwnerProcess.current.write(toFile: "\(directory)/owner.pid", atomically: true, encoding: .utf8)
        let authFile = "\(directory)/userlist.txt", configFile = "\(directory)/pgbouncer.ini"
        logFile = "\(directory)/pgbouncer.log"
        var lastFailure = ""
        do {
            // The plain password: PgBouncer then answers the client's SCRAM and does the server's.
            try tools.writeServerFile(authFile, "\"\(front.user)\" \"\(front.password)\"\n", mode: 0o600)
            for _ in 0..<5 {
                let port = try PostgresServer.freePort()
                try tools.writeServerFile(configFile, Self.config(port: port, server: front, mode: mode, authFile: authFile), mode: 0o600)
                guard FileManager.default.createFile(atPath: logFile, contents: nil) else {
                    throw ProcessFailure(message: "pgbouncer's log file \(logFile) could not be created")
                }
                let process = try ChildProcess(tools.asServerUser.first ?? executable,
                                               Array(tools.asServerUser.dropFirst()) + (tools.asServerUser.isEmpty ? [] : [executable]) + [configFile],
                                               environment: PostgresBinaries.cleanEnvironment(), stdout: .file(logFile), stderr: .standardOutput)
                try? "\(process.processIdentifier)\n".write(toFile: "\(directory)/pgbouncer.pid", atomically: true, encoding: .utf8)
                if Self.waitForListener(port: port, process: process) {
                    self.port = port
                    self.process = process
                    self.mode = mode
                    self.directory = directory
                    return
                }
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
                lastFailure = (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? ""
                guard lastFailure.contains("Address already in use") else { break }
            }
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
        try? FileManager.default.removeItem(atPath: directory)
        throw ProcessFailure(message: "pgbouncer did not listen within 10 s; its log:\n\(lastFailure)")
    }

    /// ``init(in:mode:)`` from an async test: starting PgBouncer waits (up to 10 s) on another
    /// thread, not on one of the cooperative pool's, which every other test of the process shares.
    public static func make(in front: PostgresServer, mode: PoolMode) async throws -> PgBouncer {
        try await offCooperativePool { try PgBouncer(in: front, mode: mode) }
    }

    deinit { stop() }

    /// `postgres://fleet@127.0.0.1:PORT/DATABASE?sslmode=disable` (loopback, no TLS to
    /// PgBouncer). No password: give the server's as PGPASSWORD.
    public func url(database: String) -> String {
        "postgres://fleet@\(host):\(port)/\(PostgresServer.percentEncoded(database))?sslmode=disable"
    }

    /// PgBouncer's log (its stdout and stderr).
    public var log: String { (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "" }

    /// Stops PgBouncer by its pid (SIGTERM: immediate shutdown; SIGKILL after 5 s) and removes
    /// its directory. Calling it again does nothing.
    public func stop() {
        guard !stopped.withLock({ let was = $0; $0 = true; return was }) else { return }
        kill(process.processIdentifier, SIGTERM)
        let deadline = Date().addingTimeInterval(5)
        while process.isRunning, Date() < deadline { usleep(20_000) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// The directories' prefix in /tmp.
    private static let prefix = "fleet-pgbouncer-"

    /// Stops the PgBouncer of every /tmp/fleet-pgbouncer-* directory whose owner.pid names a
    /// test process that is gone (SIGKILL to the recorded pid, only while that pid still runs
    /// this directory's config), and removes the directory.
    static func removeAbandoned() {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: ClusterLayout.parent) else { return }
        for name in names where name.hasPrefix(prefix) {
            let directory = "\(ClusterLayout.parent)/\(name)"
            guard let owner = try? String(contentsOfFile: "\(directory)/owner.pid", encoding: .utf8),
                  !OwnerProcess.isAlive(owner) else { continue }
            if let text = try? String(contentsOfFile: "\(directory)/pgbouncer.pid", encoding: .utf8),
               let pid = pid_t(text.trimmingCharacters(in: .whitespacesAndNewlines)),
               let command = try? String(contentsOfFile: "/proc/\(pid)/cmdline", encoding: .utf8),
               command.contains("\(directory)/pgbouncer.ini") {
                kill(pid, SIGKILL)
            }
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    // MARK: - Availability

    /// Debian's /usr/sbin/pgbouncer, else one on PATH.
    static let executable: String? = {
        let path = (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":").map { "\($0)/pgbouncer" }
        return (["/usr/sbin/pgbouncer"] + path).first { FileManager.default.isExecutableFile(atPath: $0) }
    }()

    private static let missing = "pgbouncer not found in /usr/sbin or PATH: apt-get install pgbouncer"

    /// Why the pooler tests cannot run here (PostgreSQL or pgbouncer missing), or nil.
    public static var unavailableReason: String? {
        PostgresServer.unavailableReason ?? (executable == nil ? missing : nil)
    }

    /// For `.enabled(if:)`: run when PostgreSQL and pgbouncer are here, or when PostgreSQL is
    /// required (`FLEET_REQUIRE_POSTGRES=1`, as in CI): then a missing pgbouncer fails the tests.
    public static var testsEnabled: Bool { unavailableReason == nil || PostgresServer.isRequired }

    // MARK: - Starting

    private static func config(port: Int, server: PostgresServer, mode: PoolMode, authFile: String) -> String {
        """
        [databases]
        * = host=\(server.host) port=\(server.port)

        [pgbouncer]
        listen_addr = 127.0.0.1
        listen_port = \(port)
        unix_socket_dir =
        auth_type = scram-sha-256
        auth_file = \(authFile)
        pool_mode = \(mode.rawValue)
        max_client_conn = 200
        default_pool_size = 40
        logfile =
        pidfile =

        """
    }

    /// True once something accepts on 127.0.0.1:`port` while `process` runs; false when it exits
    /// or 10 s pass.
    private static func waitForListener(port: Int, process: ChildProcess) -> Bool {
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline, process.isRunning {
            let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            guard descriptor >= 0 else { return false }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = in_port_t(UInt16(port).bigEndian)
            let connected = withUnsafePointer(to: &address) { pointer in
                pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
            }
            close(descriptor)
            if connected { return process.isRunning }
            usleep(50_000)
        }
        return false
    }
}
