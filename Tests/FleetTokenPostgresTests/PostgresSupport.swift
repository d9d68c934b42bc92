// FleetTokenPostgresTests' support: configurations for a fresh database on the shared private
// server, and the repository opened for the length of a test.

import FleetTokenPostgres
import FleetTokenStore
import Foundation
import Logging
import TestSupportKit

/// A configuration for `database` on `server`, over TCP with TLS verified against the
/// server's CA, the password given as `PGPASSWORD` would give it.
func configuration(_ server: PostgresServer, _ database: String, sslmode: String = "verify-full",
                   schema: String? = nil) throws -> PostgresStoreConfiguration {
    var url = server.url(database: database, sslmode: sslmode)
    if let schema { url += "&schema=\(schema)" }
    var configuration = try PostgresStoreConfiguration(url: url)
    configuration.environment = ["PGPASSWORD": server.password]
    // Generous: the whole suite starts at once on two cores, private clusters' initdb among it,
    // and a pool's first TLS connection then took over 10 s in a run. Tests of the timeouts
    // set their own.
    configuration.statementTimeout = .seconds(30)
    configuration.connectTimeout = .seconds(20)
    // A connection slower than connectionWait (1 s by default) makes the store look for a
    // host, and calls fail at once meanwhile: at the suite's start that failed an encryption
    // test in a fresh-clone run ("looking for a fitting database host"). Tests of an outage set
    // it back (PostgresFaultTests); the multi-host ones below keep the default.
    configuration.connectionWait = .seconds(10)
    return configuration
}

/// A libpq password file in `scratch` with a line per host (127.0.0.1:`port`) of `database`,
/// for a URL naming clusters with passwords of their own.
func passwordFile(_ hosts: [(port: Int, password: String)], database: String, in scratch: Scratch) throws -> String {
    let path = scratch.file("pgpass")
    try hosts.map { "127.0.0.1:\($0.port):\(database):fleet:\($0.password)\n" }.joined()
        .write(toFile: path, atomically: true, encoding: .utf8)
    return path
}

/// A configuration for `database` on `hosts` (`127.0.0.1:P1,127.0.0.1:P2`, clusters of their own:
/// TLS required, not verified against one CA), passwords from `passfile`, the generous timeouts
/// of ``configuration(_:_:sslmode:schema:)``.
func configuration(hosts: String, database: String, passfile: String) throws -> PostgresStoreConfiguration {
    var configuration = try PostgresStoreConfiguration(url: "postgres://fleet@\(hosts)/\(database)?sslmode=require&passfile=\(passfile)")
    configuration.environment = [:]
    configuration.statementTimeout = .seconds(30)
    configuration.connectTimeout = .seconds(20)
    return configuration
}

/// A fresh database on the shared server, and its configuration. Made off the cooperative pool:
/// `CREATE DATABASE` through psql takes seconds on a loaded machine.
func freshDatabase(schema: String? = nil) async throws -> (server: PostgresServer, database: String, configuration: PostgresStoreConfiguration) {
    let (server, database) = try await PostgresServer.makeDatabase()
    return (server, database, try configuration(server, database, schema: schema))
}

/// Runs `body`; when it throws, prints what `server` was doing (every session not idle, in every
/// database, with what it waits for, and the locks waited for) and its log's tail, then
/// rethrows. A check that ran out of time on the shared server then says what held it.
func reportingServerState<T>(_ server: PostgresServer, _ database: String, _ body: () async throws -> T) async throws -> T {
    do {
        return try await body()
    } catch {
        let sessions = (try? await server.psql("""
            SELECT pid, datname, backend_type, state, coalesce(wait_event_type || ':' || wait_event, '-'),
                   round(extract(epoch FROM now() - query_start)::numeric, 1), left(query, 120)
            FROM pg_stat_activity WHERE state IS DISTINCT FROM 'idle' AND pid <> pg_backend_pid()
            """)) ?? "(pg_stat_activity could not be read)"
        let waits = (try? await server.psql("""
            SELECT pid, locktype, mode, coalesce(relation::text, '-'), coalesce(database::text, '-') FROM pg_locks WHERE NOT granted
            """)) ?? "(pg_locks could not be read)"
        print("""
            \(database) failed: \(error)
            sessions not idle (pid|database|type|state|waiting for|seconds in statement|statement):
            \(sessions)
            locks waited for (pid|type|mode|relation|database):
            \(waits)
            server log's tail:
            \(server.logTail(lines: 40))
            """)
        throw error
    }
}
