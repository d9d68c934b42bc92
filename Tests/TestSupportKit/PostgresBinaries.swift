// The programs PostgresServer runs and how: found once (FLEET_PG_BIN, Debian's per-version
// directory, PATH), as the unprivileged server user when the tests run as root, each with a time
// limit.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The programs the harness runs, found once per process.
struct PostgresBinaries: Sendable {
    /// The directory of initdb, pg_ctl and postgres.
    let bin: String
    let psql: String
    let openssl: String
    /// Put before a command the server user must run: setpriv (or runuser) to `postgres` when
    /// root, nothing otherwise.
    let asServerUser: [String]
    let serverUser: (uid: uid_t, gid: gid_t)?

    static let located: Result<PostgresBinaries, ProcessFailure> = locate()
    /// The names of ``run(_:environment:timeout:)``'s output files in /tmp, before the pid.
    static let outputPrefix = "fleet-pgcmd-"

    private static func locate() -> Result<PostgresBinaries, ProcessFailure> {
        let files = FileManager.default
        let environment = ProcessInfo.processInfo.environment
        let path = (environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin").split(separator: ":").map(String.init)
        func hasServer(_ directory: String) -> Bool {
            ["initdb", "pg_ctl", "postgres"].allSatisfy { files.isExecutableFile(atPath: "\(directory)/\($0)") }
        }
        func onPath(_ name: String) -> String? {
            path.map { "\($0)/\(name)" }.first { files.isExecutableFile(atPath: $0) }
        }
        let bin: String
        if let override = environment["FLEET_PG_BIN"], !override.isEmpty {
            guard hasServer(override) else {
                return .failure(ProcessFailure(message: "FLEET_PG_BIN=\(override) holds no initdb, pg_ctl and postgres"))
            }
            bin = override
        } else {
            // Debian installs the server binaries per major version, off PATH; take the newest.
            let versions = ((try? files.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? [])
                .compactMap { name in Double(name).map { (version: $0, bin: "/usr/lib/postgresql/\(name)/bin") } }
                .filter { hasServer($0.bin) }
            guard let found = versions.max(by: { $0.version < $1.version })?.bin ?? path.first(where: hasServer) else {
                return .failure(ProcessFailure(message: "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found in "
                    + "/usr/lib/postgresql/*/bin or PATH: apt-get install postgresql (or set FLEET_PG_BIN to their directory)"))
            }
            bin = found
        }
        guard let psql = files.isExecutableFile(atPath: "\(bin)/psql") ? "\(bin)/psql" : onPath("psql") else {
            return .failure(ProcessFailure(message: "psql not found beside \(bin)/initdb or on PATH: apt-get install postgresql-client"))
        }
        guard let openssl = onPath("openssl") ?? executable(["/usr/bin/openssl"]) else {
            return .failure(ProcessFailure(message: "openssl not found (the harness makes the server's certificates with it): apt-get install openssl"))
        }
        guard geteuid() == 0 else { return .success(PostgresBinaries(bin: bin, psql: psql, openssl: openssl, asServerUser: [], serverUser: nil)) }
        // PostgreSQL will not run as root: the cluster belongs to the user Debian's package makes.
        guard let entry = getpwnam("postgres") else {
            return .failure(ProcessFailure(message: "running as root, and there is no user postgres to run the server as: apt-get install postgresql"))
        }
        let user = (uid: entry.pointee.pw_uid, gid: entry.pointee.pw_gid)
        let switchUser: [String]
        if let setpriv = executable(["/usr/bin/setpriv", "/bin/setpriv"]) {
            switchUser = [setpriv, "--reuid=\(user.uid)", "--regid=\(user.gid)", "--clear-groups"]
        } else if let runuser = executable(["/usr/sbin/runuser", "/sbin/runuser"]) {
            switchUser = [runuser, "-u", "postgres", "--"]
        } else {
            return .failure(ProcessFailure(message: "running as root, and neither setpriv nor runuser is here to run the server as postgres: apt-get install util-linux"))
        }
        return .success(PostgresBinaries(bin: bin, psql: psql, openssl: openssl, asServerUser: switchUser, serverUser: user))
    }

    /// Hands a file or directory the harness made (as root) to the server user.
    func giveToServerUser(_ path: String) throws {
        guard let serverUser else { return }
        guard chown(path, serverUser.uid, serverUser.gid) == 0 else { throw ProcessFailure(message: "chown \(path) failed: errno \(errno)") }
    }

    /// Writes a file the server reads: mode `mode`, owned by the server user.
    func writeServerFile(_ path: String, _ contents: String, mode: mode_t) throws {
        try contents.write(toFile: path, atomically: false, encoding: .utf8)
        chmod(path, mode)
        try giveToServerUser(path)
    }

    /// This process's environment without libpq's and the locale's variables (a PGHOST or
    /// PGSSLMODE of the caller's must not change what the tests connect to), in the C locale.
    static func cleanEnvironment() -> [String: String] {
        var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("PG") && !$0.key.hasPrefix("LC_") }
        environment["LC_ALL"] = "C"
        environment["LANG"] = "C"
        return environment
    }

    /// Runs `command` to its end, at most `timeout` seconds (then it is killed), its output in
    /// files rather than pipes: no reader threads, so this also works from atexit and deinit.
    static func run(_ command: [String], environment: [String: String]? = nil, timeout: TimeInterval) throws -> (status: Int32, stdout: String, stderr: String) {
        let base = "\(ClusterLayout.parent)/\(outputPrefix)\(getpid())-\(UUID().uuidString.prefix(8))"
        let (outputFile, errorFile) = ("\(base).out", "\(base).err")
        defer {
            try? FileManager.default.removeItem(atPath: outputFile)
            try? FileManager.default.removeItem(atPath: errorFile)
        }
        let process = try ChildProcess(command[0], Array(command.dropFirst()), environment: environment ?? cleanEnvironment(),
                                       stdout: .file(outputFile), stderr: .file(errorFile))
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning {
            if Date() >= deadline {
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
                let output = (try? String(contentsOfFile: errorFile, encoding: .utf8)) ?? ""
                throw ProcessFailure(message: "\(command.joined(separator: " ")) did not finish in \(timeout) s: \(output)")
            }
            usleep(10_000)
        }
        return (process.terminationStatus,
                (try? String(contentsOfFile: outputFile, encoding: .utf8)) ?? "",
                (try? String(contentsOfFile: errorFile, encoding: .utf8)) ?? "")
    }
}
