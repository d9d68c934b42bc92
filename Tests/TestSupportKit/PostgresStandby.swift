// A streaming standby of a test cluster, for failover tests: pg_basebackup -R from the primary
// into a fresh /tmp/fleet-pg-XXXXXX (so the sweep knows it), started on a port of its own with
// the primary's certificates (one CA, one `sslrootcert=` for both hosts), promoted by pg_ctl.
// Replication uses initdb's own pg_hba.conf line (`local replication all trust`) over the
// primary's Unix socket, and the default wal_level (replica); replication is asynchronous.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

extension PostgresServer {
    /// Makes and starts a hot standby streaming from this server (`pg_basebackup -R`): same
    /// superuser and password, same CA, its own port and socket directory. Stop it with
    /// ``stop()`` as any server.
    /// - Throws: ``ProcessFailure`` when a step fails (with its output and the standby's log).
    public func makeStandby() throws -> PostgresServer {
        let directory = try Self.makeDirectory(owner: tools)
        let layout = ClusterLayout(directory: directory)
        do {
            let backup = try PostgresBinaries.run(tools.asServerUser + [
                "\(tools.bin)/pg_basebackup", "-D", layout.data, "-h", socketDirectory, "-p", "\(port)", "-U", user,
                "-R", "-X", "stream", "--no-sync", "-c", "fast",
            ], timeout: 120)
            guard backup.status == 0 else { throw ProcessFailure(message: "pg_basebackup exited with \(backup.status): \(backup.stdout)\(backup.stderr)") }
            // The primary's certificate names localhost and 127.0.0.1, which fit the standby too.
            for (from, to, mode) in [(caFile, layout.caFile, 0o644), ("\(self.directory)/server.crt", layout.serverCertificate, 0o644),
                                     ("\(self.directory)/server.key", layout.serverKey, 0o600)] as [(String, String, mode_t)] {
                let contents = try String(contentsOfFile: from, encoding: .utf8)
                try tools.writeServerFile(to, contents, mode: mode)
            }
            chmod(layout.caFile, 0o644)
            // The copied fleet-test.conf names the primary's port and socket; startOnFreePort writes the standby's.
            let port = try Self.startOnFreePort(layout, tools: tools)
            return PostgresServer(running: directory, port: port, password: password, tools: tools)
        } catch {
            let log = layout.logTail(lines: 30)
            Self.discard(layout, tools: tools)
            throw ProcessFailure(message: "\(error)\nstandby log:\n\(log)")
        }
    }

    /// `pg_ctl promote`: the standby leaves recovery and takes writes; returns once it does.
    public func promote() throws {
        try pgCtlChecked(["promote"], what: "promote")
    }

    /// True while the server is a standby (`pg_is_in_recovery()`).
    public func isInRecovery() throws -> Bool {
        try psql("SELECT pg_is_in_recovery()") == "t"
    }
}

extension PostgresServer {
    /// See ``makeStandby()``.
    public func makeStandby() async throws -> PostgresServer {
        try await offCooperativePool { try self.makeStandby() }
    }

    /// See ``promote()``.
    public func promote() async throws {
        try await offCooperativePool { try self.promote() }
    }
}
