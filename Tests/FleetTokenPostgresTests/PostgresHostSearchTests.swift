// Issue 30 item 2, at the repository: a host search must not hold calls. A host that accepts
// TCP but does not answer yet (a server starting up, a hung machine) holds a search up to the
// statement timeout; a refresh's lease call that waited for it kept API callers past their
// own timeouts in the agent-level failover test. Calls fail as unavailable within their
// connection wait instead, and the search goes on by itself.

import FleetTokenStoreTesting
import Foundation
import Glibc
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenPostgres
@testable import FleetTokenStore

@Suite("PostgresAvailability: host searches", .paced, .serialized, .enabled(if: PostgresServer.testsEnabled))
struct PostgresAvailabilityHostSearchTests {
    @Test("the host in use stops and the other host accepts TCP but never answers: calls fail within their connection wait, not after the search")
    func callDoesNotWaitForASlowSearch() async throws {
        let server = try await PostgresServer.make()
        defer { server.stopInBackground() }
        try await server.createDatabase("search")
        let silent = try SilentSocket(listening: true)
        defer { silent.close() }
        // The live server first: open finds it without asking the silent one.
        var configuration = try PostgresStoreConfiguration(
            url: "postgres://fleet@127.0.0.1:\(server.port),127.0.0.1:\(silent.port)/search?sslmode=require")
        configuration.environment = ["PGPASSWORD": server.password]
        // A search asking the silent host lasts this long; the calls must not.
        configuration.statementTimeout = .seconds(30)
        configuration.connectTimeout = .seconds(20)
        let log = LogRecorder()
        let key = try TokenKey.vehicle("held")
        let clock = ContinuousClock()
        let closing = try await PostgresTokenRepository.withRepository(configuration, logger: log.logger) { store in
            try await store.upsert(token(key, expiresIn: 3600, now: Date()))
            try await server.shutDown(mode: .fast)
            var failure: TokenStoreError?
            let first = await clock.measure {
                do { _ = try await store.entry(for: key) } catch { failure = error as? TokenStoreError }
            }
            // The connection wait (1 s) and as much again for the search, not the search's 30 s;
            // the bound leaves room for a loaded machine.
            #expect(first < .seconds(8), "the first call after the server stopped took \(first)")
            #expect(failure?.code == .databaseUnavailable, "\(String(describing: failure))")
            let next = await clock.measure { _ = try? await store.acquireRefreshLease(for: key, holder: "h", now: Date(), duration: 30) }
            // At once on an idle machine; 2.65 s was seen with the whole suite running on two
            // cores. What must not happen is a wait for the search (30 s).
            #expect(next < .seconds(5), "a call while the search runs took \(next)")
            return clock.now
        }
        // Closing does not wait for the search either.
        let closed = clock.now - closing
        #expect(closed < .seconds(8), "closing took \(closed) while a search was running")
        #expect(!log.allText.contains(server.password))
    }
}
