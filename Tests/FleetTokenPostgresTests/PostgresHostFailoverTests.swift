// Issue 30 item 2, at the repository: which host of a multi-host URL the store uses, and its
// move to another host when the one in use refuses writes (SQLSTATE 25006), against real private
// clusters. The agents' failover after a crash is PostgresFailoverTests (AgentOperationsTests).

import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenPostgres
@testable import FleetTokenStore

@Suite("PostgresTokenRepository on several hosts", .paced, .serialized, .enabled(if: PostgresServer.testsEnabled))
struct PostgresHostFailoverTests {
    @Test("read-write skips a standby listed first: the store opens on the primary and writes there")
    func standbyListedFirstIsSkipped() async throws {
        let primary = try await PostgresServer.make()
        defer { primary.stopInBackground() }
        try await primary.createDatabase("hosts")
        let standby = try await primary.makeStandby()
        defer { standby.stopInBackground() }
        var configuration = try PostgresStoreConfiguration(
            url: "postgres://fleet@127.0.0.1:\(standby.port),127.0.0.1:\(primary.port)/hosts?sslmode=verify-full&sslrootcert=\(primary.caFile)")
        configuration.environment = ["PGPASSWORD": primary.password]
        #expect(configuration.location.targetSessionAttributes == .readWrite)
        let log = LogRecorder()
        let key = try TokenKey.vehicle("first")
        try await PostgresTokenRepository.withRepository(configuration, logger: log.logger) { store in
            try await store.upsert(token(key, expiresIn: 3600, now: Date()))
        }
        let stored = "SELECT count(*) FROM fleet_token_store.tokens WHERE subject_id = 'first'"
        #expect(try await primary.psql(stored, database: "hosts") == "1")
        #expect(await eventually(within: 30) { (try? standby.psql(stored, database: "hosts")) == "1" }, "replicated to the standby")
        #expect(!log.allText.contains(primary.password))
    }

    @Test("the host in use turns read-only (a write refused with 25006): the next calls find the writable host and write there, one warning naming both")
    func readOnlyHostIsLeft() async throws {
        let first = try await PostgresServer.make()
        defer { first.stopInBackground() }
        let second = try await PostgresServer.make()
        defer { second.stopInBackground() }
        for server in [first, second] { try await server.createDatabase("moves") }
        // Two clusters, two passwords: a libpq password file with a line per host.
        let scratch = Scratch()
        let passfile = try passwordFile([(first.port, first.password), (second.port, second.password)], database: "moves", in: scratch)
        func configuration(_ hosts: String) throws -> PostgresStoreConfiguration {
            try FleetTokenPostgresTests.configuration(hosts: hosts, database: "moves", passfile: passfile)
        }
        let log = LogRecorder()
        // The second server's schema, made as an agent would make it there.
        try await PostgresTokenRepository.withRepository(try configuration("127.0.0.1:\(second.port)"), logger: log.logger) { _ in }

        let both = try configuration("127.0.0.1:\(first.port),127.0.0.1:\(second.port)")
        let before = try TokenKey.vehicle("before"), after = try TokenKey.vehicle("after")
        try await PostgresTokenRepository.withRepository(both, logger: log.logger) { store in
            try await store.upsert(token(before, expiresIn: 3600, now: Date()))
            _ = try await first.psql("ALTER SYSTEM SET default_transaction_read_only = on")
            _ = try await first.psql("SELECT pg_reload_conf()")
            var refusals: [String] = []
            let moved = await eventually(within: 15) {
                do {
                    try await store.upsert(token(after, expiresIn: 3600, now: Date()))
                    return true
                } catch {
                    let failure = error as? TokenStoreError
                    refusals.append(failure?.sqlState ?? failure?.code.description ?? "\(error)")
                    return false
                }
            }
            #expect(moved, "no write succeeded within 15 s: \(refusals) \(log.messages(at: .warning))")
            #expect(refusals.first == "25006", "the first refusal: \(refusals)")
        }
        let stored = "SELECT string_agg(subject_id, ',' ORDER BY subject_id) FROM fleet_token_store.tokens"
        #expect(try await first.psql(stored, database: "moves") == "before")
        #expect(try await second.psql(stored, database: "moves") == "after")
        let warnings = log.messages(at: .warning).joined(separator: "\n")
        #expect(warnings.contains("refused a write as read-only"), "\(warnings)")
        #expect(warnings.contains("token database moved to another host"), "\(warnings)")
        #expect(log.allText.contains("127.0.0.1:\(second.port)"), "\(warnings)")
        #expect(!log.allText.contains(first.password) && !log.allText.contains(second.password))
    }
}
