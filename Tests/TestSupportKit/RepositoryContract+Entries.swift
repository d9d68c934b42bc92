// Shared by the test targets: the repository contract's checks of entries: reads and writes,
// failure state, listing, purging, retention and statistics.

import FleetTokenStore
import Foundation
import Testing

extension RepositoryContract {
    func entryRoundTrip(_ store: any ContractRepository) async throws {
        let key = try TokenKey.vehicle("truck-7")
        #expect(try await store.entry(for: key) == nil)
        #expect(try await store.entries(for: [key]).isEmpty)
        let first = token(key, expiresIn: 600)
        try await store.upsert(first)
        #expect(try await store.entry(for: key)?.token == first)
        let second = token(key, expiresIn: 3000, value: fakeToken("second", length: 900))
        try await store.upsert(second)
        #expect(try await store.entry(for: key)?.token == second)
        #expect(try await store.list(.all).count == 1)

        let trip = try TokenKey.trip("trip-1"), absent = try TokenKey.task("absent")
        let tripToken = token(trip, expiresIn: 900)
        try await store.upsert(tripToken)
        #expect(try await store.entries(for: [key, trip, absent]) == [
            key: TokenEntry(key: key, token: second, failure: nil),
            trip: TokenEntry(key: trip, token: tripToken, failure: nil),
        ])
        #expect(try await store.entries(for: []).isEmpty)
    }

    func laterExpiringTokenWins(_ store: any ContractRepository) async throws {
        let key = try TokenKey.trip("t")
        let newer = token(key, expiresIn: 3000, value: fakeToken("newer"))
        try await store.upsert(newer)
        try await store.upsert(token(key, expiresIn: 1000, value: fakeToken("older")))
        #expect(try await store.entry(for: key)?.token == newer)
        try await store.upsert([token(key, expiresIn: 2000, value: fakeToken("older in a batch"))])
        #expect(try await store.entry(for: key)?.token == newer)
        // A losing write changes nothing, failure state included.
        let failure = Self.failure(1, retryIn: 5)
        try await store.recordFailure(failure, for: key)
        try await store.upsert(token(key, expiresIn: 1000), clearFailure: true)
        #expect(try await store.entry(for: key) == TokenEntry(key: key, token: newer, failure: failure))
        // The same expiry replaces (a re-fetch that got the same lifetime).
        let same = token(key, expiresIn: 3000, value: fakeToken("same expiry"))
        try await store.upsert(same)
        #expect(try await store.entry(for: key) == TokenEntry(key: key, token: same, failure: nil))
    }

    func groupUpsertAllOrNothing(_ store: any ContractRepository) async throws {
        let batch = (0..<500).map { token(try! .trip("trip-\($0)"), expiresIn: 900) }
        try await store.upsert(batch)
        #expect(try await store.list(.all, page: .everything).count == 500)
        try await store.upsert([])
        #expect(try await store.list(.all, page: .everything).count == 500)

        // A row the store refuses (a subject id TokenKey never builds) fails the batch whole.
        var poisoned = (0..<100).map { token(try! .vehicle("poison-\($0)"), expiresIn: 900) }
        poisoned.insert(token(subject.refusedKey, expiresIn: 900), at: 50)
        await #expect(throws: TokenStoreError.self) { try await store.upsert(poisoned) }
        #expect(try await store.list(TokenFilter(kind: .vehicle)).isEmpty)
        // Replacements in a failed batch are undone too.
        let replacing = [token(try .trip("trip-0"), expiresIn: 1900), token(subject.refusedKey, expiresIn: 900)]
        await #expect(throws: TokenStoreError.self) { try await store.upsert(replacing) }
        #expect(try await store.entry(for: try .trip("trip-0"))?.token == batch[0])
    }

    func failureState(_ store: any ContractRepository) async throws {
        let key = try TokenKey.vehicle("v")
        let failure = Self.failure(3, retryIn: 8, kind: "httpStatus", message: "HTTP 503")
        try await store.recordFailure(failure, for: key)
        #expect(try await store.entry(for: key) == TokenEntry(key: key, token: nil, failure: failure))
        try await store.clearFailure(for: key)
        #expect(try await store.entry(for: key) == nil)
        try await store.clearFailure(for: key) // nothing to clear: no error, no entry
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
        // clearFailure on an entry with a token keeps the token.
        try await store.recordFailure(failure, for: key)
        try await store.clearFailure(for: key)
        #expect(try await store.entry(for: key) == TokenEntry(key: key, token: stored, failure: nil))
        // A later failure replaces the earlier one; at least one failure is counted.
        let other = try TokenKey.trip("t")
        try await store.recordFailure(failure, for: other)
        try await store.recordFailure(Self.failure(0, retryIn: 2, kind: "timeout", at: 1), for: other)
        #expect(try await store.entry(for: other)?.failure == Self.failure(1, retryIn: 2, kind: "timeout", at: 1))
    }

    func removeTokenKeepsFailureState(_ store: any ContractRepository) async throws {
        let key = try TokenKey.trip("t")
        try await store.upsert(token(key, expiresIn: 3000))
        let failure = Self.failure(2, retryIn: 4)
        try await store.recordFailure(failure, for: key)
        try await store.removeToken(for: key)
        #expect(try await store.entry(for: key) == TokenEntry(key: key, token: nil, failure: failure))
        // Without failure state the entry goes entirely.
        let other = try TokenKey.trip("u")
        try await store.upsert(token(other, expiresIn: 100))
        try await store.removeToken(for: other)
        #expect(try await store.entry(for: other) == nil)
        try await store.removeToken(for: try .trip("never-stored"))
        #expect(try await store.list(.all).map(\.key) == [key])
    }

    func listFiltersAndPaging(_ store: any ContractRepository) async throws {
        try await Self.seed(store)
        let now = Self.now
        #expect(try await store.list(.all).count == 9)
        #expect(try await store.list(TokenFilter(kind: .vehicle)).count == 5)
        #expect(try await store.list(TokenFilter(kind: .trip)).count == 4)
        #expect(try await store.list(TokenFilter(subjectID: "v-valid-1")).map(\.key) == [try .vehicle("v-valid-1")])
        #expect(try await store.list(.key(try .trip("t-failing"))).map(\.key) == [try .trip("t-failing")])
        #expect(try await store.list(TokenFilter(validity: .expired(asOf: now))).count == 3)
        #expect(try await store.list(TokenFilter(validity: .valid(asOf: now))).count == 5)
        #expect(try await store.list(TokenFilter(kind: .vehicle, validity: .expired(asOf: now))).count == 2)
        // Validity moves with the time asked about; a token expiring at that time is expired.
        #expect(try await store.list(TokenFilter(validity: .expired(asOf: now + 3600))).count == 8)
        #expect(try await store.list(TokenFilter(validity: .expired(asOf: now - 2))).count == 2)

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
        #expect(try await store.list(.all, page: .everything).map(\.key) == pages.flatMap { $0 })
        #expect(try await store.list(TokenFilter(kind: .vehicle), page: TokenPage(limit: 2)).map(\.key)
                == [try .vehicle("v-expired-0"), try .vehicle("v-expired-1")])
        #expect(try await store.list(.all, page: TokenPage(limit: 0)).isEmpty)
    }

    func purgeScopesAndCounts(_ store: any ContractRepository) async throws {
        try await Self.seed(store)
        let now = Self.now
        #expect(try await store.count(TokenFilter(kind: .vehicle, validity: .expired(asOf: now)), scope: .tokens) == 2)
        #expect(try await store.purge(TokenFilter(kind: .vehicle, validity: .expired(asOf: now))) == 2)
        #expect(try await store.purge(TokenFilter(kind: .trip, subjectID: "t-valid-0")) == 1)
        #expect(try await store.purge(TokenFilter(subjectID: "nobody")) == 0)
        #expect(try await store.deleteExpired(before: now) == 1)
        #expect(try await store.list(.all).map(\.key.subjectID).sorted()
                == ["t-failing", "t-valid-1", "v-valid-0", "v-valid-1", "v-valid-2"])
        // A purge removes tokens; failure state (a running backoff) survives unless named too.
        #expect(try await store.count(.all, scope: .tokens) == 4)
        #expect(try await store.count(.all, scope: .tokensAndFailureState) == 5)
        #expect(try await store.count(.all) == 5)
        #expect(try await store.purge(.all) == 4)
        #expect(try await store.list(.all).map(\.key.subjectID) == ["t-failing"])
        #expect(try await store.purge(.all, scope: .tokensAndFailureState) == 1)
        #expect(try await store.list(.all).isEmpty)

        // Purging a failing key's token keeps its backoff; naming the failure state removes it too.
        let key = try TokenKey.vehicle("truck-7")
        let failure = Self.failure(3, retryIn: 240, kind: "httpStatus")
        try await store.upsert(token(key, expiresIn: -60))
        try await store.recordFailure(failure, for: key)
        #expect(try await store.purge(TokenFilter(validity: .expired(asOf: now))) == 1)
        let kept = try await store.entry(for: key)
        #expect(kept?.token == nil)
        #expect(kept?.failure == failure)
        #expect(try await store.count(.key(key), scope: .tokens) == 0)
        #expect(try await store.count(.key(key), scope: .tokensAndFailureState) == 1)
        #expect(try await store.purge(.key(key), scope: .tokensAndFailureState) == 1)
        #expect(try await store.entry(for: key) == nil)
    }

    func retiredKeys(_ store: any ContractRepository) async throws {
        let cutoff = Self.now
        let old = try (0..<5).map { try TokenKey.trip("old-\($0)") }
        try await store.upsert(old.map { token($0, expiresIn: -3600) })
        let fresh = try TokenKey.trip("fresh"), failing = try TokenKey.trip("failing-recently")
        let backingOff = try TokenKey.trip("backing-off")
        try await store.upsert([token(fresh, expiresIn: 60), token(failing, expiresIn: -3600),
                                token(backingOff, expiresIn: -7200)])
        try await store.recordFailure(Self.failure(1, retryIn: 30, at: 1), for: failing)
        // Failed long ago, but its Retry-After runs past the cutoff: its backoff must survive.
        try await store.recordFailure(Self.failure(4, retryIn: 600, kind: "httpStatus", at: -3000), for: backingOff)
        let firstPage = try await store.retiredKeys(before: cutoff, after: nil, limit: 3)
        #expect(firstPage == Array(old.prefix(3)))
        #expect(try await store.retiredKeys(before: cutoff, after: firstPage.last, limit: 3) == Array(old.suffix(2)))
        #expect(try await store.retiredKeys(before: cutoff, after: nil, limit: 0).isEmpty)
        // A key refreshed since it was listed is not deleted.
        try await store.upsert(token(old[0], expiresIn: 600))
        #expect(try await store.deleteRetired(old + [fresh, failing, backingOff], before: cutoff) == 4)
        #expect(try await store.list(.all).map(\.key).sorted { $0.subjectID < $1.subjectID } == [backingOff, failing, fresh, old[0]])
        #expect(try await store.deleteRetired([], before: cutoff) == 0)
    }

    func deleteExpired(_ store: any ContractRepository) async throws {
        let expired = try TokenKey.vehicle("expired"), expiredFailing = try TokenKey.vehicle("expired-failing")
        let failureOnly = try TokenKey.vehicle("failure-only"), valid = try TokenKey.vehicle("valid")
        let atTheDate = try TokenKey.vehicle("expires-at-the-date")
        try await store.upsert([token(expired, expiresIn: -10), token(expiredFailing, expiresIn: -10),
                                token(valid, expiresIn: 10), token(atTheDate, expiresIn: 0)])
        try await store.recordFailure(Self.failure(1, retryIn: 60), for: expiredFailing)
        try await store.recordFailure(Self.failure(1, retryIn: -60, at: -100), for: failureOnly)
        #expect(try await store.deleteExpired(before: Self.now) == 2)
        #expect(Set(try await store.list(.all).map(\.key)) == [failureOnly, valid, atTheDate])
        #expect(try await store.deleteExpired(before: Self.now) == 0)
    }

    func stats(_ store: any ContractRepository) async throws {
        try await Self.seed(store)
        // Add refresh-due and backoff-with-token entries.
        try await store.upsert(token(try .vehicle("v-due"), expiresIn: 300)) // 3600 s lifetime, 92% used
        try await store.upsert(token(try .vehicle("v-backoff"), expiresIn: 1200))
        try await store.recordFailure(Self.failure(1, retryIn: 5), for: try .vehicle("v-backoff"))
        let now = Self.now
        for time in [now, now + 10, now + 1000, now + 4000] {
            let stats = try await store.stats(at: time)
            var expected: [TokenKind: [TokenStatus: Int]] = [:]
            for entry in try await store.list(.all, page: .everything) {
                expected[entry.key.kind, default: [:]][entry.status(at: time), default: 0] += 1
            }
            #expect(stats.counts == expected, "at \(time)")
            #expect(stats.total == 11)
        }
        let stats = try await store.stats(at: now)
        #expect(stats.count(.vehicle, .refreshDue) == 1)
        #expect(stats.count(.vehicle, .backoff) == 1)
        #expect(stats.count(.trip, .backoff) == 1)
        #expect(stats.count(.vehicle, .expired) == 2)
        #expect(stats.count(.task, .valid) == 0)
        #expect(stats.schemaVersion == (try await store.schemaVersion()))
        #expect(stats.oldestExpiry == now - 60)
        #expect(stats.newestExpiry == now + 1800)
        // A later soft point (another policy) changes what is due.
        var policy = RefreshPolicy()
        policy.softPointFraction = 0.95
        #expect(try await store.stats(at: now, policy: policy).count(.vehicle, .refreshDue) == 0)
    }
}
