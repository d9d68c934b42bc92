// The PostgreSQL tests' own server (TestSupportKit's PostgresServer), checked against the real
// thing: psql over the socket and over TCP with scram and TLS, restarts, stopping, and the sweep
// of clusters a crashed run left. Without PostgreSQL these suites are skipped, unless
// FLEET_REQUIRE_POSTGRES=1 (CI sets it after installing it), when they fail saying what is missing.

import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

private let needsPostgres = ConditionTrait.enabled(
    if: PostgresServer.testsEnabled,
    "needs PostgreSQL (apt-get install postgresql openssl); FLEET_REQUIRE_POSTGRES=1 makes its absence a failure")

@Suite("PostgresServer: CI has PostgreSQL", .paced)
struct PostgresAvailabilityTests {
    @Test("FLEET_REQUIRE_POSTGRES=1: the server binaries, psql and openssl are here",
          .enabled(if: PostgresServer.isRequired))
    func requiredMeansInstalled() {
        #expect(PostgresServer.isAvailable, "\(PostgresServer.unavailableReason ?? "")")
    }
}

@Suite("PostgresServer: the shared server", .paced, needsPostgres)
struct SharedPostgresServerTests {
    @Test("answers SELECT 1 over its Unix socket")
    func answersOverTheSocket() async throws {
        let server = try await PostgresServer.shared()
        #expect(try await server.psql("SELECT 1") == "1")
        #expect(try await PostgresServer.shared() === server)
    }

    @Test("makeDatabase gives each test a fresh database of its own")
    func freshDatabases() async throws {
        let (server, first) = try await PostgresServer.makeDatabase()
        let (_, second) = try await PostgresServer.makeDatabase()
        #expect(first != second)
        _ = try await server.psql("CREATE TABLE t (x int); INSERT INTO t VALUES (7)", database: first)
        #expect(try await server.psql("SELECT x FROM t", database: first) == "7")
        #expect(try await server.psql("SELECT count(*) FROM pg_tables WHERE tablename = 't'", database: second) == "0")
        #expect(try await server.psql("SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = '\(first)'") == "UTF8")
    }

    @Test("TCP with the password, verify-full against caFile and require: the connection is TLS",
          arguments: ["verify-full", "require"])
    func passwordOverTLS(sslmode: String) async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let sql = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        #expect(try await server.psql(sql, conninfo: server.conninfo(database: database, sslmode: sslmode), password: server.password) == "t")
        // The URLs, as libpq reads them: without the password (given apart), and with it.
        #expect(try await server.psql(sql, conninfo: server.url(database: database, sslmode: sslmode), password: server.password) == "t")
        #expect(try await server.psql(sql, conninfo: server.urlWithPassword(database: database, sslmode: sslmode), password: nil) == "t")
        #expect(server.url(database: database).hasPrefix("postgres://fleet@127.0.0.1:\(server.port)/\(database)?sslmode=verify-full&sslrootcert="))
        #expect(!server.url(database: database).contains(server.password))
    }

    @Test("a wrong password, or none, is refused over TCP")
    func wrongPasswordRefused() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let conninfo = server.conninfo(database: database, sslmode: "verify-full")
        let wrong = await #expect(throws: ProcessFailure.self) { try await server.psql("SELECT 1", conninfo: conninfo, password: server.password + "x") }
        #expect(wrong?.message.contains("password authentication failed for user \"fleet\"") == true, "\(wrong?.message ?? "")")
        let none = await #expect(throws: ProcessFailure.self) { try await server.psql("SELECT 1", conninfo: conninfo, password: nil) }
        #expect(none?.message.contains("no password supplied") == true, "\(none?.message ?? "")")
    }

    @Test("verify-full refuses a CA that did not sign the server's certificate")
    func verifyFullChecksTheCA() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let other = try await PostgresServer.make()
        defer { other.stopInBackground() }
        let conninfo = server.conninfo(database: database, sslmode: "verify-full").replacingOccurrences(of: server.caFile, with: other.caFile)
        let failure = await #expect(throws: ProcessFailure.self) { try await server.psql("SELECT 1", conninfo: conninfo, password: server.password) }
        #expect(failure?.message.contains("certificate verify failed") == true, "\(failure?.message ?? "")")
    }
}

@Suite("PostgresServer: a private server", .paced, .serialized, .exclusive, needsPostgres)
struct PrivatePostgresServerTests {
    @Test("restart() comes back on the same port with the data")
    func restartKeepsPortAndData() async throws {
        let server = try await PostgresServer.make()
        defer { server.stopInBackground() }
        _ = try await server.psql("CREATE TABLE kept (x text); INSERT INTO kept VALUES ('still here')")
        let port = server.port
        try await server.restart()
        #expect(server.port == port)
        let conninfo = server.conninfo(database: "postgres")
        #expect(try await server.psql("SELECT x FROM kept", conninfo: conninfo, password: server.password) == "still here")
    }

    @Test("shutDown(mode: .immediate) then start(): same port, the data recovered")
    func shutDownAndStart() async throws {
        let server = try await PostgresServer.make()
        defer { server.stopInBackground() }
        _ = try await server.psql("CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)")
        try await server.shutDown(mode: .immediate)
        #expect(!server.isRunning)
        #expect(!acceptsConnections(port: server.port))
        try await server.start()
        #expect(try await server.psql("SELECT x FROM kept", conninfo: server.conninfo(database: "postgres"), password: server.password) == "42")
    }

    @Test("stop() removes the directory, the port stops answering, and a second stop() does nothing")
    func stopRemovesEverything() async throws {
        let server = try await PostgresServer.make()
        #expect(server.directory.hasPrefix("/tmp/fleet-pg-"))
        // The harness's (only searchable by the server's user): the CA file in it must be one
        // no other user could replace, or the store refuses it.
        #expect(fileMode(server.directory) == 0o711)
        #expect(fileMode("\(server.directory)/server.key") == 0o600)
        #expect(acceptsConnections(port: server.port))
        try await offCooperativePool { try server.stop() }
        #expect(!FileManager.default.fileExists(atPath: server.directory))
        #expect(!acceptsConnections(port: server.port))
        try await offCooperativePool { try server.stop() }
        await #expect(throws: ProcessFailure.self) { try await server.start() }
    }

    @Test("a cluster whose test process died is stopped and removed by the sweep; live ones are left")
    func abandonedClustersAreSwept() async throws {
        let live = try await PostgresServer.make()
        defer { live.stopInBackground() }
        let abandoned = try await PostgresServer.make()
        defer { abandoned.stopInBackground() }
        // A pid that has exited (a finished child of ours), standing for a crashed test run.
        let child = try ChildProcess("/bin/true", [])
        child.waitUntilExit()
        try "\(child.processIdentifier) 1\n".write(toFile: "\(abandoned.directory)/owner.pid", atomically: true, encoding: .utf8)

        let removed = PostgresServer.removeAbandonedClusters()
        #expect(removed.contains(abandoned.directory))
        #expect(!removed.contains(live.directory))
        #expect(!FileManager.default.fileExists(atPath: abandoned.directory))
        #expect(!acceptsConnections(port: abandoned.port))
        #expect(try await live.psql("SELECT 1") == "1")
    }
}

/// Whether something accepts a TCP connection on 127.0.0.1:`port`.
private func acceptsConnections(port: Int) -> Bool {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard descriptor >= 0 else { return false }
    defer { close(descriptor) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    return withUnsafePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
}
