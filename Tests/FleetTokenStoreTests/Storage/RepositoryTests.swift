import TestSupportKit
import Foundation
import GRDB
import Testing
@testable import FleetTokenStore

@Suite("SQLiteTokenRepository: reads, writes, filters")
struct RepositoryTests {
    let dir = Scratch()
    var path: String { dir.file("tokens.sqlite") }

    /// 3 valid vehicles, 2 expired vehicles, 2 valid trips, 1 expired trip, 1 trip with only failure state.
    func seeded() async throws -> SQLiteTokenRepository {
        let store = try openStore(path)
        var tokens: [StoredToken] = []
        for i in 0..<3 { tokens.append(token(try .vehicle("v-valid-\(i)"), expiresIn: 1800)) }
        for i in 0..<2 { tokens.append(token(try .vehicle("v-expired-\(i)"), expiresIn: -60)) }
        for i in 0..<2 { tokens.append(token(try .trip("t-valid-\(i)"), expiresIn: 1800)) }
        tokens.append(token(try .trip("t-expired-0"), expiresIn: -1))
        try await store.upsert(tokens)
        try await store.recordFailure(RefreshFailureState(consecutiveFailures: 2, nextAttemptAt: referenceNow + 30,
                                                          lastErrorKind: "timeout", lastFailureAt: referenceNow),
                                      for: try .trip("t-failing"))
        return store
    }

    @Test("upsert, get and replace one entry; the token round-trips exactly")
    func upsertAndGet() async throws {
        let store = try openStore(path)
        defer { store.close() }
        let key = try TokenKey.vehicle("truck-7")
        #expect(try await store.entry(for: key) == nil)
        let first = token(key, expiresIn: 600)
        try await store.upsert(first)
        #expect(try await store.entry(for: key)?.token == first)
        let second = token(key, expiresIn: 3000, value: fakeToken("second", length: 900))
        try await store.upsert(second)
        #expect(try await store.entry(for: key)?.token == second)
        #expect(try await store.list(.all).count == 1)
    }

    @Test("an older token never replaces a newer one (a slow writer loses); removeToken keeps the backoff")
    func newerTokenWins() async throws {
        let store = try openStore(path)
        defer { store.close() }
        let key = try TokenKey.trip("t")
        let newer = token(key, expiresIn: 3000, value: fakeToken("newer"))
        try await store.upsert(newer)
        try await store.upsert(token(key, expiresIn: 1000, value: fakeToken("older")))
        #expect(try await store.entry(for: key)?.token == newer)

        let failure = RefreshFailureState(consecutiveFailures: 2, nextAttemptAt: referenceNow + 4, lastErrorKind: "timeout",
                                          lastFailureAt: referenceNow)
        try await store.recordFailure(failure, for: key)
        try await store.removeToken(for: key)
        #expect(try await store.entry(for: key) == TokenEntry(key: key, token: nil, failure: failure))
        // Without failure state the entry goes entirely.
        let other = try TokenKey.trip("u")
        try await store.upsert(token(other, expiresIn: 100))
        try await store.removeToken(for: other)
        #expect(try await store.entry(for: other) == nil)
    }

    @Test("list filters by kind, subject, expired and valid, and pages by key")
    func listFilters() async throws {
        let store = try await seeded()
        defer { store.close() }
        #expect(try await store.list(.all).count == 9)
        #expect(try await store.list(TokenFilter(kind: .vehicle)).count == 5)
        #expect(try await store.list(TokenFilter(kind: .trip)).count == 4)
        #expect(try await store.list(TokenFilter(subjectID: "v-valid-1")).map(\.key) == [try .vehicle("v-valid-1")])
        #expect(try await store.list(TokenFilter(validity: .expired(asOf: referenceNow))).count == 3)
        #expect(try await store.list(TokenFilter(validity: .valid(asOf: referenceNow))).count == 5)
        #expect(try await store.list(TokenFilter(kind: .vehicle, validity: .expired(asOf: referenceNow))).count == 2)
        // Validity moves with the time asked about.
        #expect(try await store.list(TokenFilter(validity: .expired(asOf: referenceNow + 3600))).count == 8)

        var pages: [[TokenKey]] = []
        var after: TokenKey?
        repeat {
            let page = try await store.list(.all, page: TokenPage(after: after, limit: 4)).map(\.key)
            if page.isEmpty { break }
            pages.append(page)
            after = page.last
        } while true
        #expect(pages.map(\.count) == [4, 4, 1])
        #expect(pages.flatMap { $0 } == pages.flatMap { $0 }.sorted())
        #expect(Set(pages.flatMap { $0 }).count == 9)
    }

    @Test("purge applies the same filters in one transaction and returns the count")
    func purgeFilters() async throws {
        let store = try await seeded()
        defer { store.close() }
        #expect(try await store.purge(TokenFilter(kind: .vehicle, validity: .expired(asOf: referenceNow))) == 2)
        #expect(try await store.purge(TokenFilter(kind: .trip, subjectID: "t-valid-0")) == 1)
        #expect(try await store.purge(TokenFilter(subjectID: "nobody")) == 0)
        #expect(try await store.deleteExpired(before: referenceNow) == 1)
        #expect(try await store.list(.all).map(\.key.subjectID).sorted()
                == ["t-failing", "t-valid-1", "v-valid-0", "v-valid-1", "v-valid-2"])
        // A purge removes tokens; failure state (a running backoff) survives unless named too.
        #expect(try await store.count(.all, scope: .tokens) == 4)
        #expect(try await store.purge(.all) == 4)
        #expect(try await store.list(.all).map(\.key.subjectID) == ["t-failing"])
        #expect(try await store.purge(.all, scope: .tokensAndFailureState) == 1)
        #expect(try await store.list(.all).isEmpty)
    }

    @Test("purging a failing key's token keeps its backoff; naming the failure state removes it too")
    func purgeKeepsFailureState() async throws {
        let store = try openStore(path)
        defer { store.close() }
        let key = try TokenKey.vehicle("truck-7")
        let failure = RefreshFailureState(consecutiveFailures: 3, nextAttemptAt: referenceNow + 240,
                                          lastErrorKind: "httpStatus", lastFailureAt: referenceNow)
        try await store.upsert(token(key, expiresIn: -60))
        try await store.recordFailure(failure, for: key)
        #expect(try await store.purge(TokenFilter(validity: .expired(asOf: referenceNow))) == 1)
        let kept = try await store.entry(for: key)
        #expect(kept?.token == nil)
        #expect(kept?.failure == failure)
        #expect(try await store.purge(.key(key), scope: .tokensAndFailureState) == 1)
        #expect(try await store.entry(for: key) == nil)
    }

    @Test("retired keys: dead since the cutoff (expired and not failing since), paged in key order; deletion re-checks")
    func retiredKeys() async throws {
        let store = try openStore(path)
        defer { store.close() }
        let cutoff = referenceNow
        let old = try (0..<5).map { try TokenKey.trip("old-\($0)") }
        try await store.upsert(old.map { token($0, expiresIn: -3600) })
        let fresh = try TokenKey.trip("fresh"), failing = try TokenKey.trip("failing-recently")
        let backingOff = try TokenKey.trip("backing-off")
        try await store.upsert([token(fresh, expiresIn: 60), token(failing, expiresIn: -3600), token(backingOff, expiresIn: -7200)])
        try await store.recordFailure(RefreshFailureState(consecutiveFailures: 1, nextAttemptAt: cutoff + 30,
                                                          lastErrorKind: "timeout", lastFailureAt: cutoff + 1), for: failing)
        // Failed long ago, but its Retry-After runs past the cutoff: its backoff must survive.
        try await store.recordFailure(RefreshFailureState(consecutiveFailures: 4, nextAttemptAt: cutoff + 600,
                                                          lastErrorKind: "httpStatus", lastFailureAt: cutoff - 3000), for: backingOff)
        let firstPage = try await store.retiredKeys(before: cutoff, after: nil, limit: 3)
        #expect(firstPage == Array(old.prefix(3)))
        #expect(try await store.retiredKeys(before: cutoff, after: firstPage.last, limit: 3) == Array(old.suffix(2)))
        // A key refreshed since it was listed is not deleted.
        try await store.upsert(token(old[0], expiresIn: 600))
        #expect(try await store.deleteRetired(old + [fresh, failing, backingOff], before: cutoff) == 4)
        #expect(try await store.list(.all).map(\.key).sorted { $0.subjectID < $1.subjectID } == [backingOff, failing, fresh, old[0]])
    }

    @Test("a batch upsert is one transaction: all of it or none of it")
    func groupCommit() async throws {
        let store = try openStore(path)
        defer { store.close() }
        let batch = (0..<500).map { token(try! .trip("trip-\($0)"), expiresIn: 900) }
        try await store.upsert(batch)
        #expect(try await store.list(.all, page: .everything).count == 500)
        // One commit: the change log got all 500 rows from one transaction, seen as one data_version step
        // by a second connection.
        let probe = try DatabaseQueue(path: path)
        let before = try await probe.read { try Int.fetchOne($0, sql: "PRAGMA data_version") }
        try await store.upsert((0..<50).map { token(try! .trip("more-\($0)"), expiresIn: 900) })
        let after = try await probe.read { try Int.fetchOne($0, sql: "PRAGMA data_version") }
        #expect(after != before)

        // A row the schema rejects (an empty subject id, which TokenKey never builds) fails the batch whole.
        var poisoned = (0..<100).map { token(try! .vehicle("poison-\($0)"), expiresIn: 900) }
        poisoned.insert(token(TokenKey(uncheckedKind: .vehicle, subjectID: ""), expiresIn: 900), at: 50)
        await #expect(throws: TokenStoreError.self) { try await store.upsert(poisoned) }
        #expect(try await store.list(TokenFilter(kind: .vehicle)).isEmpty)
    }

    @Test("failure state is recorded with or without a token, and cleared")
    func failureState() async throws {
        let store = try openStore(path)
        defer { store.close() }
        let key = try TokenKey.vehicle("v")
        let failure = RefreshFailureState(consecutiveFailures: 3, nextAttemptAt: referenceNow + 8,
                                          lastErrorKind: "httpStatus", lastErrorMessage: "HTTP 503",
                                          lastFailureAt: referenceNow)
        try await store.recordFailure(failure, for: key)
        #expect(try await store.entry(for: key) == TokenEntry(key: key, token: nil, failure: failure))
        try await store.clearFailure(for: key)
        #expect(try await store.entry(for: key) == nil)

        let stored = token(key, expiresIn: 600)
        try await store.upsert(stored)
        try await store.recordFailure(failure, for: key)
        #expect(try await store.entry(for: key) == TokenEntry(key: key, token: stored, failure: failure))
        // A refresh that keeps the failure (no progress) leaves it; a successful one clears it.
        try await store.upsert(stored, clearFailure: false)
        #expect(try await store.entry(for: key)?.failure == failure)
        try await store.upsert(stored, clearFailure: true)
        #expect(try await store.entry(for: key) == TokenEntry(key: key, token: stored, failure: nil))
    }

    @Test("stats count by kind and status exactly as TokenStatus judges each entry")
    func statsMatchStatusRule() async throws {
        let store = try await seeded()
        defer { store.close() }
        // Add refresh-due and backoff-with-token entries.
        try await store.upsert(token(try .vehicle("v-due"), expiresIn: 300)) // 3600 s lifetime, 92% used
        try await store.upsert(token(try .vehicle("v-backoff"), expiresIn: 1200))
        try await store.recordFailure(RefreshFailureState(consecutiveFailures: 1, nextAttemptAt: referenceNow + 5,
                                                          lastErrorKind: "timeout", lastFailureAt: referenceNow),
                                      for: try .vehicle("v-backoff"))
        for now in [referenceNow, referenceNow + 10, referenceNow + 1000, referenceNow + 4000] {
            let stats = try await store.stats(at: now)
            var expected: [TokenKind: [TokenStatus: Int]] = [:]
            for entry in try await store.list(.all, page: .everything) {
                expected[entry.key.kind, default: [:]][entry.status(at: now), default: 0] += 1
            }
            #expect(stats.counts == expected, "at \(now)")
            #expect(stats.total == 11)
        }
        let stats = try await store.stats(at: referenceNow)
        #expect(stats.count(.vehicle, .refreshDue) == 1)
        #expect(stats.count(.vehicle, .backoff) == 1)
        #expect(stats.count(.trip, .backoff) == 1)
        #expect(stats.count(.vehicle, .expired) == 2)
        #expect(stats.schemaVersion == 2)
        #expect(stats.fileSizeBytes > 0)
        #expect(stats.oldestExpiry == referenceNow - 60)
        #expect(stats.newestExpiry == referenceNow + 1800)
    }

    @Test("stock sqlite3 reads the store and finds it sound")
    func stockSQLiteReads() async throws {
        let store = try await seeded()
        #expect(try sqlite3(path, "PRAGMA integrity_check") == "ok")
        #expect(try sqlite3(path, "SELECT count(*) FROM tokens WHERE token IS NOT NULL") == "8")
        store.close()
        #expect(try sqlite3(path, "PRAGMA integrity_check") == "ok")
    }

    @Test("a full disk fails the write whole with diskFull")
    func diskFull() async throws {
        let store = try openStore(path)
        defer { store.close() }
        try await store.upsert((0..<10).map { token(try! .vehicle("base-\($0)"), expiresIn: 600) })
        // Cap the file at its current size: the next growth hits SQLITE_FULL.
        try await store.pool.write { db in
            let pages = try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0
            _ = try Int.fetchOne(db, sql: "PRAGMA max_page_count = \(pages)")
        }
        let big = (0..<200).map { token(try! .trip("big-\($0)"), expiresIn: 600, value: fakeToken("big\($0)", length: 2000)) }
        let error = await #expect(throws: TokenStoreError.self) { try await store.upsert(big) }
        #expect(error == .diskFull(path: path))
        #expect(error?.description.contains("full") == true)
        #expect(try await store.list(TokenFilter(kind: .trip)).isEmpty)
        #expect(try await store.list(.all).count == 10)
    }
}
