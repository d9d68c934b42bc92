// Encryption at rest (issue 17) on PostgreSQL, at the library level: EncryptedTokenRepository and
// TokenValueResealer over a real PostgresTokenRepository on the tests' private server, and the
// rows as psql sees them (the `token` column, the generated `value_key_id`, every other column).

import FleetTokenPostgres
import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit

@Suite("Encryption at rest on PostgreSQL: sealed values, tampering, missing keys, rotation, sealing plaintext", .paced,
       .enabled(if: PostgresServer.testsEnabled))
struct PostgresEncryptionTests {
    static let table = "fleet_token_store.tokens"

    // MARK: - Round trip

    @Test("values sealed through EncryptedTokenRepository: the token column holds sealed:v1:<key id>:… and no plaintext, value_key_id is the key id, reads give the plaintext back")
    func sealedRoundTrip() async throws {
        let db = try await EncryptedDatabase.make()
        let key = TokenEncryptionKey.random()
        let log = LogRecorder()
        let tokens = try Self.tokens([.vehicle("v-1"), .vehicle("v-2"), .trip("t-1"), .deliveryVehicle("dv-1"), .task("task-1")])
        try await db.withStore { store throws in
            let sealed = EncryptedTokenRepository(base: store, keyring: TokenKeyring(primary: key), logger: log.logger)
            try await sealed.upsert(Array(tokens.dropLast()))
            try await sealed.upsert(tokens.last!)          // the single-token upsert too

            for token in tokens {
                let entry = try await sealed.entry(for: token.key)
                #expect(entry?.token?.value == token.value, "\(token.key) did not read back as written")
                #expect(entry?.token?.expiresAt == token.expiresAt)
                // The bare store sees only the sealed form.
                let stored = try #require(try await store.entry(for: token.key)?.token?.value)
                #expect(stored.hasPrefix("sealed:v1:\(key.id):\(TokenFingerprint(of: token.value).description):"), "\(stored.prefix(60))")
                #expect(!stored.contains(token.value))
            }
            let all = try await sealed.entries(for: tokens.map(\.key))
            #expect(all.count == tokens.count && tokens.allSatisfy { all[$0.key]?.token?.value == $0.value })
            #expect(try await store.valueKeyIDs() == [key.id])
            #expect(try await store.valueKeyCounts() == [key.id: tokens.count])
        }
        let rows = try await db.rows("SELECT kind || '/' || subject_id, value_key_id, token FROM \(Self.table) ORDER BY 1")
        #expect(rows.count == tokens.count)
        for row in rows {
            #expect(row[1] == key.id, "\(row[0]): value_key_id \(row[1])")
            #expect(row[2].hasPrefix("sealed:v1:\(key.id):"), "\(row[0]): \(row[2].prefix(40))")
        }
        try await db.expectNoPlaintext(tokens)
        #expect(log.messages(at: .error).isEmpty, "\(log.allText)")
        #expect(!tokens.contains { log.allText.contains($0.value) })
    }

    // MARK: - Tampering

    @Test("ciphertext altered in the database (psql UPDATE): reads as missing, an error names the key and key id, the token is removed; other rows still open")
    func tamperedCiphertext() async throws {
        let db = try await EncryptedDatabase.make()
        let key = TokenEncryptionKey.random()
        let log = LogRecorder()
        let tokens = try Self.tokens([.vehicle("tampered"), .vehicle("intact")])
        try await db.withStore { store throws in
            let sealed = EncryptedTokenRepository(base: store, keyring: TokenKeyring(primary: key), logger: log.logger)
            try await sealed.upsert(tokens)
        }
        // Flip one character of the base64 payload (past the 40-character envelope), keeping it base64.
        _ = try await db.psql("""
            UPDATE \(Self.table) SET token = overlay(token PLACING
                CASE WHEN substr(token, 60, 1) = 'A' THEN 'B' ELSE 'A' END FROM 60 FOR 1)
            WHERE subject_id = 'tampered'
            """)
        #expect(try await db.psql("SELECT value_key_id FROM \(Self.table) WHERE subject_id = 'tampered'") == key.id,
                "the altered value still names the key: the failure is AES-GCM's, not a missing key")
        try await db.withStore { store throws in
            let sealed = EncryptedTokenRepository(base: store, keyring: TokenKeyring(primary: key), logger: log.logger)
            #expect(try await sealed.entry(for: tokens[0].key)?.token == nil, "an altered value was handed out")
            #expect(try await sealed.entry(for: tokens[1].key)?.token?.value == tokens[1].value)
        }
        let errors = log.entries.filter { $0.level == .error }
        #expect(errors.count == 1, "\(log.allText)")
        #expect(errors.first?.metadata["key"]?.description == "vehicle/tampered", "\(log.allText)")
        #expect(errors.first?.metadata["key_id"]?.description == key.id, "\(log.allText)")
        // removeToken: the row goes (it has no failure state to keep).
        #expect(try await db.psql("SELECT count(*) FROM \(Self.table) WHERE subject_id = 'tampered' AND token IS NOT NULL") == "0",
                "the altered token was not removed")
        #expect(try await db.psql("SELECT value_key_id FROM \(Self.table) WHERE subject_id = 'intact'") == key.id)
        #expect(!tokens.contains { log.allText.contains($0.value) })
    }

    @Test("a row's sealed value copied onto another subject, and onto the same id of another kind: those read as missing and are removed, the original still opens")
    func copiedValueDoesNotOpen() async throws {
        let db = try await EncryptedDatabase.make()
        let key = TokenEncryptionKey.random()
        let log = LogRecorder()
        let tokens = try Self.tokens([.vehicle("source"), .vehicle("target"), .trip("source")])
        try await db.withStore { store throws in
            try await EncryptedTokenRepository(base: store, keyring: TokenKeyring(primary: key), logger: log.logger).upsert(tokens)
        }
        _ = try await db.psql("""
            UPDATE \(Self.table) SET token = (SELECT token FROM \(Self.table) WHERE kind = 'vehicle' AND subject_id = 'source')
            WHERE (kind = 'vehicle' AND subject_id = 'target') OR (kind = 'trip' AND subject_id = 'source')
            """)
        #expect(try await db.psql("SELECT count(DISTINCT token) FROM \(Self.table)") == "1", "the copy did not happen")
        try await db.withStore { store throws in
            let sealed = EncryptedTokenRepository(base: store, keyring: TokenKeyring(primary: key), logger: log.logger)
            #expect(try await sealed.entry(for: tokens[1].key)?.token == nil, "vehicle/target was handed vehicle/source's token")
            let both = try await sealed.entries(for: [tokens[0].key, tokens[2].key])
            #expect(both[tokens[2].key]?.token == nil, "trip/source was handed vehicle/source's token")
            #expect(both[tokens[0].key]?.token?.value == tokens[0].value, "the original no longer opens")
        }
        let named = Set(log.entries.filter { $0.level == .error }.compactMap { $0.metadata["key"]?.description })
        #expect(named == ["vehicle/target", "trip/source"], "\(log.allText)")
        #expect(log.entries.filter { $0.level == .error }.allSatisfy { $0.metadata["key_id"]?.description == key.id })
        let left = try await db.rows("SELECT kind || '/' || subject_id, value_key_id FROM \(Self.table) WHERE token IS NOT NULL ORDER BY 1")
        #expect(left == [["vehicle/source", key.id]], "the copies were not removed, or the original was: \(left)")
    }

    // MARK: - Missing keys

    @Test("no key or the wrong key: prepare(keyring:) throws encryptionKeyMissing naming the key id and count, and the table is left unchanged (plaintext rows not sealed either)")
    func missingKeyRefused() async throws {
        let db = try await EncryptedDatabase.make()
        let key = TokenEncryptionKey.random()
        let other = TokenEncryptionKey.random()
        let log = LogRecorder()
        let sealedTokens = try Self.tokens([.vehicle("s-1"), .vehicle("s-2"), .trip("s-3")])
        let plain = try Self.tokens([.vehicle("p-1")])
        try await db.withStore { store throws in
            try await EncryptedTokenRepository(base: store, keyring: TokenKeyring(primary: key), logger: log.logger).upsert(sealedTokens)
            try await store.upsert(plain)
        }
        let before = try await db.snapshot()
        for keyring in [nil, TokenKeyring(primary: other)] {
            try await db.withStore { store throws in
                do throws(TokenStoreError) {
                    let report = try await TokenValueResealer(store: store, logger: log.logger).prepare(keyring: keyring)
                    Issue.record("prepare(keyring: \(keyring?.ids ?? [])) opened a store sealed with \(key.id): \(String(describing: report))")
                } catch {
                    #expect(error.code == .encryptionKeyMissing, "\(error)")
                    #expect(error.keyIDs == [key.id], "\(error)")
                    #expect(error.valueCount == sealedTokens.count, "\(error)")
                    #expect(error.description.contains(key.id), "\(error)")
                    #expect(!error.description.contains(other.id), "names a key it has rather than the one it lacks: \(error)")
                }
            }
            #expect(try await db.snapshot() == before, "the table changed after a refused prepare (keyring \(keyring?.ids ?? []))")
        }
        // Read with the wrong key anyway: missing, logged with the needed key id, and not removed
        // (another process may hold that key).
        log.clear()
        try await db.withStore { store throws in
            let wrong = EncryptedTokenRepository(base: store, keyring: TokenKeyring(primary: other), logger: log.logger)
            #expect(try await wrong.entry(for: sealedTokens[0].key)?.token == nil)
        }
        let errors = log.entries.filter { $0.level == .error }
        #expect(errors.count == 1 && errors.first?.metadata["key_id"]?.description == key.id
                && errors.first?.metadata["key"]?.description == "vehicle/s-1", "\(log.allText)")
        #expect(try await db.snapshot() == before, "a value under a key id the reader lacks was changed or removed")
    }

    // MARK: - Rotation

    @Test("rotation: values under the old key and the new, rekey (in batches) moves every old one, counts right; then the new key alone opens the store and every value")
    func rotation() async throws {
        let db = try await EncryptedDatabase.make()
        let old = TokenEncryptionKey.random()
        let new = TokenEncryptionKey.random()
        let log = LogRecorder()
        // Several kinds, so the batches' (kind, subject id) paging crosses kinds.
        let underOld = try Self.tokens((0..<7).map { try TokenKey.vehicle("old-\($0)") } + [.trip("old-t"), .task("old-k"), .deliveryVehicle("old-d")])
        let underNew = try Self.tokens([.vehicle("new-1"), .trip("new-2")])
        let rotating = TokenKeyring(primary: new, others: [old])
        try await db.withStore { store throws in
            try await EncryptedTokenRepository(base: store, keyring: TokenKeyring(primary: old), logger: log.logger).upsert(underOld)
            try await EncryptedTokenRepository(base: store, keyring: rotating, logger: log.logger).upsert(underNew)
            #expect(try await store.valueKeyCounts() == [old.id: underOld.count, new.id: underNew.count])
            #expect(try await store.valueKeyIDs() == [old.id, new.id])
        }
        let otherColumns = "SELECT kind, subject_id, expires_at, issued_at, fetched_at, failure_count FROM \(Self.table) ORDER BY 1, 2"
        let columnsBefore = try await db.rows(otherColumns)
        let report = try await db.withStore { store throws in
            try await TokenValueResealer(store: store, logger: log.logger, batchSize: 3).rekey(rotating)
        }
        #expect(report.resealed == [old.id: underOld.count], "\(report)")
        // Report.alreadyPrimary is documented as "values already under the primary key, left as
        // they were": the two written under the new key, not every value under it after rekey.
        #expect(report.alreadyPrimary == underNew.count, "alreadyPrimary counts the values just re-sealed too: \(report)")
        #expect(report.unopenable.isEmpty && report.changedMeanwhile == 0, "\(report)")
        #expect(try await db.psql("SELECT value_key_id || ':' || count(*) FROM \(Self.table) GROUP BY value_key_id")
                == "\(new.id):\(underOld.count + underNew.count)")
        #expect(try await db.rows(otherColumns) == columnsBefore, "rekey changed more than the token values")
        #expect(try await db.psql("SELECT count(*) FROM \(Self.table) WHERE token NOT LIKE 'sealed:v1:\(new.id):%'") == "0")

        try await db.withStore { store throws in
            let onlyNew = TokenKeyring(primary: new)
            let prepared = try await TokenValueResealer(store: store, logger: log.logger).prepare(keyring: onlyNew)
            #expect(prepared.map(Self.didNothing) == true, "prepare had something to seal: \(String(describing: prepared))")
            let sealed = EncryptedTokenRepository(base: store, keyring: onlyNew, logger: log.logger)
            let all = try await sealed.entries(for: (underOld + underNew).map(\.key))
            for token in underOld + underNew {
                #expect(all[token.key]?.token?.value == token.value, "\(token.key) does not open with the new key alone")
            }
            // And the old key alone is now refused, naming the new key.
            do throws(TokenStoreError) {
                try await TokenValueResealer(store: store, logger: log.logger).prepare(keyring: TokenKeyring(primary: old))
                Issue.record("the old key alone opened the re-keyed store")
            } catch {
                #expect(error.code == .encryptionKeyMissing && error.keyIDs == [new.id], "\(error)")
            }
        }
        #expect(log.messages(at: .error).isEmpty, "\(log.allText)")
        try await db.expectNoPlaintext(underOld + underNew)
    }

    @Test("rekey counts a value that does not open and leaves it as it is; prepare with the new key alone then still refuses, naming the old key")
    func rekeyLeavesUnopenableValues() async throws {
        let db = try await EncryptedDatabase.make()
        let old = TokenEncryptionKey.random()
        let new = TokenEncryptionKey.random()
        let log = LogRecorder()
        let tokens = try Self.tokens([.vehicle("fine-1"), .vehicle("broken"), .vehicle("fine-2")])
        try await db.withStore { store throws in
            try await EncryptedTokenRepository(base: store, keyring: TokenKeyring(primary: old), logger: log.logger).upsert(tokens)
        }
        _ = try await db.psql("""
            UPDATE \(Self.table) SET token = overlay(token PLACING
                CASE WHEN substr(token, 70, 1) = 'A' THEN 'B' ELSE 'A' END FROM 70 FOR 1)
            WHERE subject_id = 'broken'
            """)
        let brokenBefore = try await db.psql("SELECT token FROM \(Self.table) WHERE subject_id = 'broken'")
        let report = try await db.withStore { store throws in
            try await TokenValueResealer(store: store, logger: log.logger).rekey(TokenKeyring(primary: new, others: [old]))
        }
        #expect(report.resealed == [old.id: 2] && report.unopenable == [old.id: 1], "\(report)")
        #expect(try await db.psql("SELECT token FROM \(Self.table) WHERE subject_id = 'broken'") == brokenBefore)
        try await db.withStore { store throws in
            do throws(TokenStoreError) {
                try await TokenValueResealer(store: store, logger: log.logger).prepare(keyring: TokenKeyring(primary: new))
                Issue.record("the new key alone opened a store still holding a value under the old key")
            } catch {
                #expect(error.code == .encryptionKeyMissing && error.keyIDs == [old.id] && error.valueCount == 1, "\(error)")
            }
        }
    }

    @Test("replaceValues applies only where the stored value is still the one read: a value refreshed meanwhile stays")
    func replaceValuesOnlyWhereUnchanged() async throws {
        let db = try await EncryptedDatabase.make()
        let tokens = try Self.tokens([.vehicle("r-1"), .vehicle("r-2")])
        try await db.withStore { store throws in
            try await store.upsert(tokens)
            let replaced = try await store.replaceValues([
                TokenValueReplacement(key: tokens[0].key, old: tokens[0].value, new: "replacement-1"),
                TokenValueReplacement(key: tokens[1].key, old: "not what is stored", new: "replacement-2"),
            ])
            #expect(replaced == [tokens[0].key])
            #expect(try await store.entry(for: tokens[0].key)?.token?.value == "replacement-1")
            #expect(try await store.entry(for: tokens[1].key)?.token?.value == tokens[1].value)
            #expect(try await store.replaceValues([]) == [])
        }
    }

    // MARK: - Sealing an older store's plaintext

    @Test("plaintext rows written through the bare repository are sealed by prepare(keyring:) in batches; afterwards no token column holds plaintext and every value opens")
    func plaintextSealedByPrepare() async throws {
        let db = try await EncryptedDatabase.make()
        let key = TokenEncryptionKey.random()
        let log = LogRecorder()
        let plain = try Self.tokens((0..<6).map { try TokenKey.vehicle("plain-\($0)") } + [.trip("plain-t"), .task("plain-k"), .deliveryVehicle("plain-d")])
        let failureOnly = try TokenKey.vehicle("failing")
        try await db.withStore { store throws in
            try await store.upsert(plain)
            try await store.recordFailure(RefreshFailureState(consecutiveFailures: 2, nextAttemptAt: Date().addingTimeInterval(60),
                                                              lastErrorKind: "httpStatus", lastFailureAt: Date()), for: failureOnly)
        }
        #expect(try await db.psql("SELECT count(*) FROM \(Self.table) WHERE value_key_id = 'plaintext'") == "\(plain.count)")
        #expect(try await db.psql("SELECT count(*) FROM \(Self.table) WHERE value_key_id IS NULL") == "1")
        let otherColumns = "SELECT kind, subject_id, expires_at, issued_at, fetched_at, failure_count, next_attempt_at FROM \(Self.table) ORDER BY 1, 2"
        let columnsBefore = try await db.rows(otherColumns)

        let report = try await db.withStore { store throws in
            try await TokenValueResealer(store: store, logger: log.logger, batchSize: 4).prepare(keyring: TokenKeyring(primary: key))
        }
        #expect(report?.resealed == [plaintextKeyID: plain.count], "\(String(describing: report))")
        #expect(report?.unopenable.isEmpty == true && report?.changedMeanwhile == 0, "\(String(describing: report))")
        #expect(try await db.psql("SELECT count(*) FROM \(Self.table) WHERE token IS NOT NULL AND token NOT LIKE 'sealed:v1:\(key.id):%'") == "0")
        let byKeyID = try await db.rows("SELECT coalesce(value_key_id, 'NULL'), count(*) FROM \(Self.table) GROUP BY 1")
        #expect(Set(byKeyID) == [["NULL", "1"], [key.id, "\(plain.count)"]], "\(byKeyID)")
        #expect(try await db.rows(otherColumns) == columnsBefore, "sealing changed more than the token values")
        try await db.expectNoPlaintext(plain)

        try await db.withStore { store throws in
            let again = try await TokenValueResealer(store: store, logger: log.logger).prepare(keyring: TokenKeyring(primary: key))
            #expect(again.map(Self.didNothing) == true, "a second prepare sealed again: \(String(describing: again))")
            let sealed = EncryptedTokenRepository(base: store, keyring: TokenKeyring(primary: key), logger: log.logger)
            let all = try await sealed.entries(for: plain.map(\.key) + [failureOnly])
            for token in plain { #expect(all[token.key]?.token?.value == token.value, "\(token.key) does not open") }
            #expect(all[failureOnly]?.token == nil && all[failureOnly]?.failure?.consecutiveFailures == 2)
        }
        #expect(log.messages(at: .error).isEmpty, "\(log.allText)")
        #expect(!plain.contains { log.allText.contains($0.value) })
    }

    // MARK: - An engine on the sealed store

    @Test("an engine on EncryptedTokenRepository (its repository and lease store) over PostgreSQL: a newer token another host sealed, seen first in the lease's answer, is adopted opened (never served sealed), without a fetch or an error")
    func engineAdoptsOpenedTokenFromLease() async throws {
        let db = try await EncryptedDatabase.make()
        let key = TokenEncryptionKey.random()
        let log = LogRecorder()
        let time = TestTime(start: Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down)))
        let subject = try TokenKey.vehicle("adopted")
        func token(issuedAt: Date, lifetime: TimeInterval) -> StoredToken {
            StoredToken(key: subject, value: TestJWT.make(for: subject, issuedAt: issuedAt, lifetime: lifetime),
                        expiresAt: issuedAt.addingTimeInterval(lifetime), issuedAt: issuedAt, fetchedAt: issuedAt)
        }
        let first = token(issuedAt: time.now, lifetime: 1000)
        let newer = token(issuedAt: time.now, lifetime: 1200)
        let fetcher = ScriptedFetcher.minting(time, lifetime: 1000)
        try await db.withStore { store throws in
            try await db.withStore { otherHost throws in
                let writer = EncryptedTokenRepository(base: otherHost, keyring: TokenKeyring(primary: key), logger: log.logger)
                try await writer.upsert(first)
                // The wrapper is the engine's repository and its lease store, as the agent uses it.
                let sealed = EncryptedTokenRepository(base: store, keyring: TokenKeyring(primary: key), logger: log.logger)
                let engine = TokenSyncEngine(repository: sealed, leases: sealed, fetcher: fetcher, logger: log.logger, clock: time.clock,
                                             now: time.wall, random: { 0.5 })
                #expect(try await engine.token(for: subject).value == first.value)
                // The other host refreshes; this engine (no run(), so no change feed) learns of it
                // when it goes to refresh past the soft point and the lease answers with the stored entry.
                try await writer.upsert(newer)
                await time.advance(by: 850)
                var served = first.value
                let changed = await eventually(within: 30) {
                    served = (try? await engine.token(for: subject).value) ?? served
                    return served != first.value
                }
                await engine.shutdown()
                #expect(changed, "the engine neither adopted the stored token nor fetched one: \(log.allText.suffix(2000))")
                #expect(!served.hasPrefix(SealedTokenValue.prefix), "the engine handed out the sealed value \(served.prefix(40))… as the token")
                // The right outcome: the other host's token, opened with the key the engine's
                // repository holds; no fetch (one fetch per key per lifetime across hosts), no error.
                #expect(served == newer.value, "the engine did not adopt the other host's token (\(fetcher.total) fetches)")
                #expect(fetcher.total == 0, "the engine fetched although another host had just stored a newer token")
                #expect(log.messages(at: .error).isEmpty, "\(log.messages(at: .error))")
                print("engine on a sealed store: served \(served.hasPrefix(SealedTokenValue.prefix) ? "the sealed value" : served == newer.value ? "the other host's token, opened" : "a fetched token") after the lease; \(fetcher.total) fetches")
            }
        }
    }

    // MARK: - Helpers

    /// A report of a rewrite that found nothing to do.
    static func didNothing(_ report: TokenValueResealer.Report) -> Bool {
        report.resealed.isEmpty && report.unopenable.isEmpty && report.changedMeanwhile == 0 && report.alreadyPrimary == 0
    }

    /// A JWT-shaped token (256 random signature bytes) for each key, valid for an hour from now.
    static func tokens(_ keys: [TokenKey]) throws -> [StoredToken] {
        let now = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))
        return keys.map { key in
            StoredToken(key: key, value: TestJWT.make(for: key, issuedAt: now, lifetime: 3600), expiresAt: now.addingTimeInterval(3600),
                        issuedAt: now, fetchedAt: now)
        }
    }
}

/// A fresh database on the shared server, opened as the agent opens it for each step.
struct EncryptedDatabase {
    let server: PostgresServer
    let database: String
    let settings: PostgresStoreConfiguration

    static func make() async throws -> EncryptedDatabase {
        let (server, database) = try await PostgresServer.makeDatabase()
        return EncryptedDatabase(server: server, database: database, settings: try configuration(server, database))
    }

    /// Runs `body` with the repository open (its own pool), as a process would.
    func withStore<R: Sendable>(_ body: (PostgresTokenRepository) async throws -> R) async throws -> R {
        try await PostgresTokenRepository.withRepository(settings, logger: Logger(label: "encryption-tests"), body)
    }

    func psql(_ sql: String) async throws -> String { try await server.psql(sql, database: database) }

    /// psql's rows, split into fields at `|`.
    func rows(_ sql: String) async throws -> [[String]] {
        try await psql(sql).split(separator: "\n").map { $0.split(separator: "|", omittingEmptySubsequences: false).map(String.init) }
    }

    /// Every row, every column, and its row version (xmin): equal only when nothing was written.
    func snapshot() async throws -> String {
        try await psql("SELECT coalesce(string_agg(t::text || '@' || t.xmin::text, E'\\n' ORDER BY kind, subject_id), '') FROM \(PostgresEncryptionTests.table) t")
    }

    /// No row's token column holds any of `tokens`' values, nor a JWT's signature.
    func expectNoPlaintext(_ tokens: [StoredToken], sourceLocation: SourceLocation = #_sourceLocation) async throws {
        for token in tokens {
            let signature = String(token.value.split(separator: ".").last ?? "")
            let found = try await psql("""
                SELECT count(*) FROM \(PostgresEncryptionTests.table)
                WHERE strpos(token, '\(token.value)') > 0 OR strpos(token, '\(signature)') > 0
                """)
            #expect(found == "0", "\(token.key)'s plaintext value is in the token column", sourceLocation: sourceLocation)
        }
    }
}
