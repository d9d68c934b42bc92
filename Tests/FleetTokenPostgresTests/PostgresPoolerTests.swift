// The store behind PgBouncer (the tests' own, in front of the shared private server): in session
// mode it opens, reads, writes, leases and hears other repositories' changes as it does directly;
// in transaction or statement mode it refuses to open (sessionPoolingRequired), before touching
// the database. And the probe's decision, as a pure function.

import FleetTokenStore
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenPostgres

@Suite("The session check's decision", .paced)
struct PostgresSessionProbeTests {
    typealias Round = PostgresSessionProbe.Round

    @Test("one backend per client connection throughout (directly, or a session pooler): no evidence")
    func sessionsKept() {
        #expect(PostgresSessionProbe.evidence(in: Round(first: 100, other: 200, firstAgain: 100)) == nil)
    }

    @Test("the second connection answered by the first one's backend (PgBouncer's LIFO reuse): sessions are shared")
    func backendReused() {
        let evidence = PostgresSessionProbe.evidence(in: Round(first: 100, other: 100, firstAgain: 100))
        #expect(evidence == "server process 100 answered two client connections in turn")
        #expect(PostgresSessionProbe.evidence(in: Round(first: 100, other: 200, firstAgain: 200)) != nil)
    }

    @Test("one connection answered by two backends (round robin, a busy pool): sessions are shared")
    func connectionMoved() {
        let evidence = PostgresSessionProbe.evidence(in: Round(first: 100, other: 200, firstAgain: 300))
        #expect(evidence == "one client connection was answered by server process 100, then by 300")
    }
}

@Suite("The store through PgBouncer", .paced, .serialized, .enabled(if: PgBouncer.testsEnabled))
struct PostgresPoolerTests {
    let logger = Logger(label: "pooler")

    /// The configuration of `database` reached through `bouncer`.
    private func throughBouncer(_ bouncer: PgBouncer, _ server: PostgresServer, _ database: String) throws -> PostgresStoreConfiguration {
        var configuration = try PostgresStoreConfiguration(url: bouncer.url(database: database))
        configuration.environment = ["PGPASSWORD": server.password]
        configuration.statementTimeout = .seconds(30)
        configuration.connectTimeout = .seconds(20)
        return configuration
    }

    @Test("session mode: two repositories through PgBouncer migrate, write, read, take leases one at a time and hear each other's changes")
    func sessionMode() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let bouncer = try await PgBouncer.make(in: server, mode: .session)
        defer { bouncer.stop() }
        let configuration = try throughBouncer(bouncer, server, database)
        try await PostgresTokenRepository.withRepository(configuration, logger: logger) { store in
            #expect(store.openReport.created, "the schema was created through PgBouncer")
            try await PostgresTokenRepository.withRepository(configuration, logger: logger) { other in
                let work = Task { await store.runBackgroundWork() }
                defer { work.cancel() }
                let recorder = StreamRecorder(store.changes())
                #expect(await eventually(within: 30) { store.isListening })
                let key = try TokenKey.vehicle("through-bouncer")
                try await other.upsert(token(key, expiresIn: 600))
                #expect(await eventually(within: 5) { recorder.elements.contains(.upserted(key)) },
                        "the other repository's write was not heard through PgBouncer: \(recorder.elements)")
                #expect(try await store.entry(for: key) != nil)

                guard case .acquired = try await store.acquireRefreshLease(for: key, holder: "host-a", now: Date(), duration: 30) else {
                    Issue.record("the first lease was not acquired")
                    return
                }
                guard case .heldElsewhere(let holder, _, _) = try await other.acquireRefreshLease(for: key, holder: "host-b", now: Date(), duration: 30) else {
                    Issue.record("a second holder got the lease held by the first")
                    return
                }
                #expect(holder == "host-a")
            }
        }
        // The search_path and statement_timeout set per session, not at startup: PgBouncer
        // refuses startup parameters it does not track, and would have logged so.
        #expect(!bouncer.log.contains("unsupported startup parameter"), "\(bouncer.log.suffix(2000))")
    }

    @Test("transaction and statement mode: opening is refused with sessionPoolingRequired, and the database is left untouched", arguments: [PgBouncer.PoolMode.transaction, .statement])
    func sharingModesRefused(_ mode: PgBouncer.PoolMode) async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let bouncer = try await PgBouncer.make(in: server, mode: mode)
        defer { bouncer.stop() }
        let configuration = try throughBouncer(bouncer, server, database)
        for openMode in [StoreOpenMode.agent, .readOnly] {
            do {
                _ = try await PostgresTokenRepository.withRepository(configuration, mode: openMode, logger: logger) { _ in
                    Issue.record("the store opened through PgBouncer in \(mode) mode (\(openMode))")
                }
            } catch let error as TokenStoreError {
                #expect(error.code == .sessionPoolingRequired, "\(error)")
                #expect(error.description.contains("needs session pooling (pool_mode = session)"), "\(error)")
            }
        }
        #expect(try await server.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'fleet_token_store'", database: database) == "0",
                "the refused open created the schema")
    }
}
