// A private PostgreSQL cluster for the tests: initdb into a fresh /tmp/fleet-pg-XXXXXX, TLS from a
// throwaway CA, a free loopback port and a Unix socket inside that directory, started and stopped
// with pg_ctl. Nothing of the machine's own PostgreSQL (services, clusters, config) is used.
//
// PostgreSQL refuses to run as root, so when the tests run as root (CI) every server command runs
// as Debian's `postgres` user through setpriv (runuser when setpriv is missing); otherwise as the
// current user. Every command runs with a time limit, and every error carries the server log's tail.

import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A PostgreSQL server of the tests' own, on 127.0.0.1 and a Unix socket, superuser ``user``.
///
/// Most tests take a fresh database on the process-wide server: ``makeDatabase()``. A test that
/// restarts or stops its server makes its own with ``init()`` and ends it with ``stop()``.
public final class PostgresServer: Sendable {
    /// How `pg_ctl stop` ends the server (its `-m`).
    public enum ShutdownMode: String, Sendable { case smart, fast, immediate }

    public let host = "127.0.0.1"
    /// The superuser initdb made (`-U fleet`): password over TCP, trust over the Unix socket.
    public let user = "fleet"
    /// ``user``'s password (random, alphanumeric).
    public let password: String
    public let port: Int
    /// The cluster's own directory (/tmp/fleet-pg-XXXXXX), removed by ``stop()``.
    public let directory: String
    public let dataDirectory: String
    /// The `unix_socket_directories` of the server: psql's `-h`.
    public let socketDirectory: String
    /// The CA that signed the server's certificate (CN and SAN localhost, SAN IP 127.0.0.1):
    /// `sslrootcert` for `sslmode=verify-full`.
    public let caFile: String
    public let logFile: String

    let tools: PostgresBinaries
    private let phase = Mutex<Phase>(.running)
    private enum Phase { case running, shutDown, removed }

    /// Makes a cluster and starts it on a free port (another one when that was taken meanwhile).
    /// - Throws: ``ProcessFailure`` when PostgreSQL or openssl is missing (naming the package to
    ///   install), or a step fails (with its output and the server log's tail).
    public convenience init() throws {
        let tools = try PostgresBinaries.located.get()
        let directory = try Self.makeDirectory(owner: tools)
        let layout = ClusterLayout(directory: directory)
        let password = Self.randomPassword()
        let port: Int
        do {
            try Self.initialize(layout, password: password, tools: tools)
            port = try Self.startOnFreePort(layout, tools: tools)
        } catch {
            Self.discard(layout, tools: tools)
            throw error
        }
        self.init(running: directory, port: port, password: password, tools: tools)
    }

    /// A server whose cluster is already made and running in `directory` (the one ``init()``
    /// made, or a standby: see PostgresStandby.swift).
    init(running directory: String, port: Int, password: String, tools: PostgresBinaries) {
        let layout = ClusterLayout(directory: directory)
        self.tools = tools
        self.password = password
        self.directory = directory
        self.port = port
        dataDirectory = layout.data
        socketDirectory = layout.socket
        caFile = layout.caFile
        logFile = layout.log
    }

    deinit {
        // Best effort and bounded: a test that forgot stop() does not leave a server behind.
        if phase.withLock({ $0 }) != .removed {
            _ = try? PostgresBinaries.run(pgCtl(["stop", "-m", "immediate"]), timeout: 20)
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    // MARK: - Life cycle

    public var isRunning: Bool { phase.withLock { $0 == .running } }

    /// Starts the server again after ``shutDown(mode:)``, on the same port with the same data.
    public func start() throws {
        try phase.withLock { phase in
            switch phase {
            case .running: return
            case .removed: throw ProcessFailure(message: "PostgresServer at \(directory) was stopped and removed")
            case .shutDown:
                try pgCtlChecked(["-l", logFile, "start"], what: "start")
                phase = .running
            }
        }
    }

    /// Stops the server and keeps the cluster (``start()`` brings it back). `.immediate` is a
    /// crash as far as the clients and the server's recovery are concerned.
    public func shutDown(mode: ShutdownMode = .fast) throws {
        try phase.withLock { phase in
            guard phase == .running else { return }
            try pgCtlChecked(["-m", mode.rawValue, "stop"], what: "stop")
            phase = .shutDown
        }
    }

    /// `pg_ctl restart -m fast`: every connection is cut, then the server is back on the same port
    /// with the same data.
    public func restart() throws {
        try phase.withLock { phase in
            guard phase != .removed else { throw ProcessFailure(message: "PostgresServer at \(directory) was stopped and removed") }
            try pgCtlChecked(["-m", "fast", "-l", logFile, "restart"], what: "restart")
            phase = .running
        }
    }

    /// Stops the server (fast) and removes its directory. Calling it again does nothing.
    public func stop() throws {
        try phase.withLock { phase in
            if phase == .running { try pgCtlChecked(["-m", "fast", "stop"], what: "stop") }
            if phase != .removed { try FileManager.default.removeItem(atPath: directory) }
            phase = .removed
        }
    }

    /// ``stop()`` on a thread of its own, not waited for: an async test's `defer` (which cannot
    /// await) ends its server this way, because `pg_ctl stop` waits for the shutdown checkpoint,
    /// seconds on a loaded machine, and a cooperative thread blocked that long stalls every test
    /// of the process. The process's exit waits for these stops (60 s at most); a cluster one
    /// leaves behind is swept by the next run (``removeAbandonedClusters()``).
    public func stopInBackground() {
        Self.backgroundStops.enter()
        Self.waitForBackgroundStopsAtExit
        Thread { [self] in
            try? stop()
            Self.backgroundStops.leave()
        }.start()
    }

    private static let backgroundStops = DispatchGroup()
    private static let waitForBackgroundStopsAtExit: Void = {
        atexit { _ = PostgresServer.backgroundStops.wait(timeout: .now() + 60) }
    }()

    // MARK: - Connecting

    /// `postgres://fleet@127.0.0.1:PORT/DATABASE?sslmode=…`, with `sslrootcert=` ``caFile`` for
    /// `verify-ca` and `verify-full` (as libpq reads it). No password: see ``urlWithPassword(database:sslmode:)``.
    public func url(database: String, sslmode: String = "verify-full") -> String {
        url(database: database, sslmode: sslmode, userInfo: Self.percentEncoded(user))
    }

    /// ``url(database:sslmode:)`` with the password, percent-encoded, in the user part.
    public func urlWithPassword(database: String, sslmode: String = "verify-full") -> String {
        url(database: database, sslmode: sslmode, userInfo: "\(Self.percentEncoded(user)):\(Self.percentEncoded(password))")
    }

    private func url(database: String, sslmode: String, userInfo: String) -> String {
        var query = "sslmode=\(Self.percentEncoded(sslmode))"
        if sslmode.hasPrefix("verify") { query += "&sslrootcert=\(Self.percentEncoded(caFile))" }
        return "postgres://\(userInfo)@\(host):\(port)/\(Self.percentEncoded(database))?\(query)"
    }

    /// A libpq keyword/value string for TCP: `host=127.0.0.1 port=… user=fleet dbname=… sslmode=…`
    /// (and `sslrootcert=` for the verify modes). No password.
    public func conninfo(database: String, sslmode: String = "verify-full") -> String {
        var parts = ["host=\(host)", "port=\(port)", "user=\(user)", "dbname='\(Self.quotedValue(database))'", "sslmode=\(sslmode)"]
        if sslmode.hasPrefix("verify") { parts.append("sslrootcert='\(Self.quotedValue(caFile))'") }
        return parts.joined(separator: " ")
    }

    /// Runs `sql` with psql over the Unix socket (trust), unaligned and tuples only (`-At`).
    /// - Returns: the output, without its final newline.
    public func psql(_ sql: String, database: String = "postgres") throws -> String {
        try runPsql(sql, target: ["-h", socketDirectory, "-p", "\(port)", "-U", user, "-d", database], password: nil)
    }

    /// Runs `sql` with psql connecting by `conninfo` (a keyword/value string or a URL), with
    /// `password` as PGPASSWORD. Never reads a ~/.pgpass.
    public func psql(_ sql: String, conninfo: String, password: String?) throws -> String {
        try runPsql(sql, target: ["-d", conninfo], password: password)
    }

    /// `CREATE DATABASE "name"`.
    public func createDatabase(_ name: String) throws {
        _ = try psql("CREATE DATABASE \"\(name.replacingOccurrences(of: "\"", with: "\"\""))\"")
    }

    /// The last `lines` lines of the server log.
    public func logTail(lines: Int = 30) -> String { ClusterLayout(directory: directory).logTail(lines: lines) }

    private func runPsql(_ sql: String, target: [String], password: String?) throws -> String {
        var environment = PostgresBinaries.cleanEnvironment()
        environment["PGPASSFILE"] = "/dev/null"     // a stored password must not make a wrong one pass
        environment["PGCONNECT_TIMEOUT"] = "10"
        if let password { environment["PGPASSWORD"] = password }
        let result = try PostgresBinaries.run([tools.psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"] + target + ["-c", sql],
                                           environment: environment, timeout: 60)
        guard result.status == 0 else {
            throw ProcessFailure(message: "psql exited with \(result.status): \(result.stderr)\nserver log:\n\(logTail())")
        }
        return result.stdout.hasSuffix("\n") ? String(result.stdout.dropLast()) : result.stdout
    }

    // MARK: - pg_ctl

    private func pgCtl(_ arguments: [String]) -> [String] {
        tools.asServerUser + ["\(tools.bin)/pg_ctl", "-D", dataDirectory, "-w", "-t", "30"] + arguments
    }

    func pgCtlChecked(_ arguments: [String], what: String) throws {
        let result = try PostgresBinaries.run(pgCtl(arguments), timeout: 60)
        guard result.status == 0 else {
            throw ProcessFailure(message: "pg_ctl \(what) exited with \(result.status): \(result.stdout)\(result.stderr)\nserver log:\n\(logTail())")
        }
    }

    // MARK: - Availability

    /// Whether the server binaries, psql and openssl (and, as root, the `postgres` user) are here.
    public static var isAvailable: Bool { unavailableReason == nil }

    /// Why the tests cannot start a server here, or nil.
    public static var unavailableReason: String? {
        if case .failure(let failure) = PostgresBinaries.located { return failure.message }
        return nil
    }

    /// `FLEET_REQUIRE_POSTGRES=1` (CI sets it): a missing PostgreSQL fails the tests.
    public static var isRequired: Bool { ProcessInfo.processInfo.environment["FLEET_REQUIRE_POSTGRES"] == "1" }

    /// For `.enabled(if:)`: run when PostgreSQL is here, or when required (then its absence fails).
    public static var testsEnabled: Bool { isAvailable || isRequired }

    // MARK: - The shared server

    private static let sharedServer = Mutex<Result<PostgresServer, ProcessFailure>?>(nil)

    /// The process-wide server, started on first use (after removing clusters that crashed test
    /// runs left behind) and stopped when the process exits. A failure to start is remembered, so
    /// every test fails at once with the same error.
    public static func shared() throws -> PostgresServer {
        try sharedServer.withLock { state in
            if let state { return try state.get() }
            let result: Result<PostgresServer, ProcessFailure>
            do {
                _ = try PostgresBinaries.located.get()
                removeAbandonedClusters()
                result = .success(try PostgresServer())
            } catch let failure as ProcessFailure {
                result = .failure(failure)
            } catch {
                result = .failure(ProcessFailure(message: "\(error)"))
            }
            if case .success = result { atexit { PostgresServer.stopSharedServer() } }
            state = result
            return try result.get()
        }
    }

    /// A new database, uniquely named, on the shared server: one per test.
    public static func makeDatabase() throws -> (server: PostgresServer, database: String) {
        let server = try shared()
        let name = "t_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(16).lowercased()
        try server.createDatabase(name)
        return (server, name)
    }

    private static func stopSharedServer() {
        // At exit: bounded, and the directory stays (for the next run's sweep) when the stop failed.
        // Not withLock: an exit while another thread is inside shared() must not hang.
        guard let server = sharedServer.withLockIfAvailable({ try? $0?.get() }) ?? nil else { return }
        try? server.stop()
    }

    /// Stops (`-m immediate`) and removes every /tmp/fleet-pg-* cluster whose owner.pid names a
    /// test process that no longer exists (only such directories are touched), and the
    /// harness's command output files such a process left.
    /// - Returns: the directories removed.
    @discardableResult
    public static func removeAbandonedClusters() -> [String] {
        guard let tools = try? PostgresBinaries.located.get(),
              let names = try? FileManager.default.contentsOfDirectory(atPath: ClusterLayout.parent) else { return [] }
        var removed: [String] = []
        // The output files of commands a killed run was waiting for: fleet-pgcmd-PID-….
        for name in names where name.hasPrefix(PostgresBinaries.outputPrefix) {
            let pid = name.dropFirst(PostgresBinaries.outputPrefix.count).split(separator: "-").first.flatMap { pid_t($0) }
            if let pid, kill(pid, 0) != 0, errno == ESRCH { try? FileManager.default.removeItem(atPath: "\(ClusterLayout.parent)/\(name)") }
        }
        for name in names where name.hasPrefix(ClusterLayout.prefix) {
            let layout = ClusterLayout(directory: "\(ClusterLayout.parent)/\(name)")
            guard let owner = try? String(contentsOfFile: layout.ownerFile, encoding: .utf8),
                  !OwnerProcess.isAlive(owner) else { continue }
            if FileManager.default.fileExists(atPath: "\(layout.data)/postmaster.pid") {
                let pgCtl = tools.asServerUser + ["\(tools.bin)/pg_ctl", "-D", layout.data, "-w", "-t", "20"]
                _ = try? PostgresBinaries.run(pgCtl + ["-m", "immediate", "stop"], timeout: 40)
                // 3: no server running (stopped now, or its postmaster.pid was stale).
                guard (try? PostgresBinaries.run(pgCtl + ["status"], timeout: 20))?.status == 3 else { continue }
            }
            if (try? FileManager.default.removeItem(atPath: layout.directory)) != nil { removed.append(layout.directory) }
        }
        return removed
    }
}

// MARK: - From async tests

/// The async forms of the blocking calls above, for tests (which are async): `initdb`,
/// `pg_ctl` and psql run for up to seconds, and blocking one of a two-core machine's two
/// cooperative threads that long stalled every other test in the process (engine tests' 10 s
/// waits ran out at the start of the whole suite). These wait on another thread instead.
extension PostgresServer {
    /// Makes a cluster and starts it (see ``init()``).
    public static func make() async throws -> PostgresServer {
        try await offCooperativePool { try PostgresServer() }
    }

    /// The process-wide server (see ``shared()``).
    public static func shared() async throws -> PostgresServer {
        try await offCooperativePool { try PostgresServer.shared() }
    }

    /// A new database on the shared server (see ``makeDatabase()``).
    public static func makeDatabase() async throws -> (server: PostgresServer, database: String) {
        try await offCooperativePool { try PostgresServer.makeDatabase() }
    }

    /// See ``start()``.
    public func start() async throws {
        try await offCooperativePool { try self.start() }
    }

    /// See ``shutDown(mode:)``.
    public func shutDown(mode: ShutdownMode = .fast) async throws {
        try await offCooperativePool { try self.shutDown(mode: mode) }
    }

    /// See ``restart()``.
    public func restart() async throws {
        try await offCooperativePool { try self.restart() }
    }

    /// See ``createDatabase(_:)``.
    public func createDatabase(_ name: String) async throws {
        try await offCooperativePool { try self.createDatabase(name) }
    }

    /// See ``psql(_:database:)``.
    public func psql(_ sql: String, database: String = "postgres") async throws -> String {
        try await offCooperativePool { try self.psql(sql, database: database) }
    }

    /// See ``psql(_:conninfo:password:)``.
    public func psql(_ sql: String, conninfo: String, password: String?) async throws -> String {
        try await offCooperativePool { try self.psql(sql, conninfo: conninfo, password: password) }
    }
}

/// Runs blocking `body` on a thread of its own and waits for it without holding a thread of
/// Swift's cooperative pool.
public func offCooperativePool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
        Thread { continuation.resume(with: Result { try body() }) }.start()
    }
}
