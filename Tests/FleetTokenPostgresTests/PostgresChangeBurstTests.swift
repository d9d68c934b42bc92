// The PostgreSQL change feed under a burst (a purge of more rows than a subscriber keeps
// unread) and at an engine's start (a change committed between track()'s load and run()'s
// LISTEN): every reader ends up re-reading what it holds, and no purged token is served.

import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenPostgres
@testable import FleetTokenStore

@Suite("The PostgreSQL change feed in a burst and at start-up", .paced, .enabled(if: PostgresServer.testsEnabled))
struct PostgresChangeBurstTests {
    let logger = Logger(label: "burst")

    /// A fetcher minting hour-long tokens of the real clock.
    static func minting() -> ScriptedFetcher {
        ScriptedFetcher { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: Date(), lifetime: 3600)) }
    }

    /// Hour-long tokens of `keys`, stored as another agent would have.
    static func stored(_ keys: [TokenKey]) -> [StoredToken] {
        let now = Date()
        return keys.map { key in
            StoredToken(key: key, value: TestJWT.make(for: key, issuedAt: now, lifetime: 3600), expiresAt: now + 3600,
                        issuedAt: now, fetchedAt: now)
        }
    }

    @Test("a purge of 15,500 rows from another connection: each of the 500 subjects an engine holds is refetched, none served purged")
    func purgeBurst() async throws {
        let (server, database, configuration) = try await freshDatabase()
        let held = try (0..<500).map { try TokenKey.vehicle("h\($0)") }
        let fetcher = Self.minting()
        try await PostgresTokenRepository.withRepository(configuration, logger: logger) { store in
            try await PostgresTokenRepository.withRepository(configuration, logger: logger) { other in
                // The held rows first: a purge announces them first, the oldest of the burst.
                let before = Self.stored(held)
                try await other.upsert(before)
                // 15,000 more rows (more changes than the feed kept before: 10,000).
                _ = try await server.psql("""
                    INSERT INTO fleet_token_store.tokens (kind, subject_id, token, expires_at, issued_at, fetched_at)
                    SELECT 'vehicle', 'filler-' || i, 'filler-token-' || i, extract(epoch FROM now()) + 3600,
                           extract(epoch FROM now()), extract(epoch FROM now())
                    FROM generate_series(1, 15000) AS i
                    """, database: database)

                let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: logger)
                await engine.track(held)
                #expect(held.allSatisfy { engine.heldToken(for: $0)?.source == .store })
                let running = Task { try await engine.run() }
                defer { running.cancel() }
                #expect(await eventually(within: 60) { await engine.isRunning && store.isListening })
                #expect(await eventually(within: 60) { await engine.isSettled })
                #expect(fetcher.total == 0, "every held subject was served from the store before the purge")

                #expect(try await other.purge(TokenFilter()) == 15_500)
                let refetched = { held.filter { fetcher.count($0) >= 1 }.count }
                #expect(await eventually(within: 45) { refetched() == held.count },
                        "\(refetched()) of \(held.count) held subjects refetched after the purge")
                let purged = Dictionary(uniqueKeysWithValues: before.map { ($0.key, $0.value) })
                let stillServed = held.filter { engine.heldToken(for: $0)?.token.value == purged[$0] }
                #expect(stillServed.count == 0, "held subjects still serving their purged token, among them \(stillServed.prefix(3))")
                #expect(held.allSatisfy { fetcher.count($0) == 1 }, "one refetch per subject")
                #expect(fetcher.total == held.count, "nothing but the held subjects is fetched")
                running.cancel()
                _ = try? await running.value
            }
        }
    }

    @Test("a purge committed between track()'s load and run(): the purged token is not served once run() listens")
    func purgeBeforeRun() async throws {
        let (_, _, configuration) = try await freshDatabase()
        let key = try TokenKey.vehicle("start-gap")
        let fetcher = Self.minting()
        try await PostgresTokenRepository.withRepository(configuration, logger: logger) { store in
            try await PostgresTokenRepository.withRepository(configuration, logger: logger) { other in
                let before = Self.stored([key])[0]
                try await other.upsert(before)
                let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: logger)
                let events = StreamRecorder(engine.events())
                await engine.track([key])
                #expect(engine.heldToken(for: key)?.token.value == before.value)
                // The window: loaded, not yet following the store.
                #expect(try await other.purge(.key(key)) == 1)

                let running = Task { try await engine.run() }
                defer { running.cancel() }
                #expect(await eventually(within: 60) { await engine.isRunning && store.isListening })
                #expect(await eventually(within: 30) { events.elements.contains(.removedExternally(key: key)) },
                        "the purge before run() was never seen")
                #expect(await eventually(within: 30) { fetcher.count(key) == 1 })
                #expect(await eventually(within: 30) {
                    let served = engine.heldToken(for: key)?.token.value
                    return served != nil && served != before.value
                })
                running.cancel()
                _ = try? await running.value
            }
        }
    }

    @Test("a change committed after changes() and before the background work's LISTEN is reported (itemized or .unknown)")
    func changeBeforeListen() async throws {
        let (_, _, configuration) = try await freshDatabase()
        try await PostgresTokenRepository.withRepository(configuration, logger: logger) { store in
            try await PostgresTokenRepository.withRepository(configuration, logger: logger) { other in
                let recorder = StreamRecorder(store.changes())
                let key = try TokenKey.trip("before-listen")
                try await other.upsert(Self.stored([key]))
                #expect(!store.isListening)
                let work = Task { await store.runBackgroundWork() }
                defer { work.cancel() }
                #expect(await eventually(within: 60) { store.isListening })
                #expect(await eventually(within: 30) {
                    recorder.elements.contains(.unknown) || recorder.elements.contains(.upserted(key))
                }, "\(recorder.elements)")
            }
        }
    }
}
