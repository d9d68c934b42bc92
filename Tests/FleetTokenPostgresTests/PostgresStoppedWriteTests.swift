// An engine stopped (its run() cancelled, as leaving a ServiceGroup's scope does) while a token's
// write waits on the PostgreSQL server. The write's call ends with the cancellation; that is the
// engine stopping, not the database failing, so no store failure may be logged or reported (it
// was, as "cannot reach the token database (no answer within 30 s)" at error level, seen in a CI
// run's log), and the shutdown's own write must still store the token.

import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenPostgres
@testable import FleetTokenStore

@Suite("An engine on PostgreSQL stopped while a write waits", .paced, .enabled(if: PostgresServer.testsEnabled))
struct PostgresStoppedWriteTests {
    @Test("run() cancelled while a token's write waits for a table lock: no store failure is logged or reported, and the shutdown writes the token once the lock goes")
    func cancelledWriteIsNotAStoreFailure() async throws {
        let (server, database, configuration) = try await freshDatabase()
        let key = try TokenKey.vehicle("written-at-stop")
        let log = LogRecorder(label: "stopped-write")
        let fetcher = ScriptedFetcher { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: Date(), lifetime: 3600)) }
        let table = "fleet_token_store.tokens"
        // Sessions waiting to write the table (a lock of SHARE mode lets reads through).
        let writersWaiting = """
            SELECT count(*) FROM pg_locks WHERE relation = '\(table)'::regclass AND mode = 'RowExclusiveLock' AND NOT granted
            """
        try await PostgresTokenRepository.withRepository(configuration, logger: log.logger) { store in
            let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: log.logger)
            let events = StreamRecorder(engine.events())
            let running = Task { try await engine.run() }
            defer { running.cancel() }
            #expect(await eventually(within: 60) { await engine.isRunning })

            // Another session holds the table against writes for at most 45 s, ended below.
            let locker = Task {
                try? await server.psql("BEGIN; LOCK TABLE \(table) IN SHARE MODE; SELECT pg_sleep(45); COMMIT;", database: database)
            }
            let locked = "SELECT count(*) FROM pg_locks WHERE relation = '\(table)'::regclass AND mode = 'ShareLock' AND granted"
            try #require(await eventually(within: 30) { (try? await server.psql(locked, database: database)) == "1" })

            let served = try await engine.token(for: key)
            try #require(await eventually(within: 30) { (try? await server.psql(writersWaiting, database: database)) == "1" },
                         "the engine's write never waited for the lock")
            running.cancel()
            // The cancelled call's statement still waits on the server; the shutdown's write
            // waits beside it: the cancellation has been dealt with.
            try #require(await eventually(within: 30) { (try? await server.psql(writersWaiting, database: database)) == "2" },
                         "the shutdown wrote nothing: \(log.allText)")
            _ = try await server.psql("SELECT pg_cancel_backend(pid) FROM pg_locks WHERE relation = '\(table)'::regclass AND mode = 'ShareLock' AND granted",
                                      database: database)
            _ = await locker.value
            _ = try? await running.value

            #expect(try await store.entry(for: key)?.token?.value == served.value, "the token fetched before the stop is not in the store")
            #expect(log.messages(at: .error).isEmpty, "\(log.messages(at: .error)) \(log.allText)")
            #expect(!events.elements.contains { if case .storeDegraded = $0 { true } else { false } }, "\(events.elements)")
        }
    }
}
