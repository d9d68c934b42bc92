// The standing of many subjects in one pass (TokenMemory.forEachStanding, what /readyz and the
// service manager's STATUS= read): every key gets what status(_:tracked:localNow:) says of it,
// in order, across the chunks the lock is taken for. Plain values and a fixed time: no clock.

import Foundation
import Testing
@testable import FleetTokenStore

@Suite("The standing of many subjects in one pass", .paced)
struct SubjectStandingTests {
    let issued = Date(timeIntervalSince1970: 1_800_000_000)
    /// No jitter: the soft point is at 80% of the hour (2,880 s), the floor 30 s before expiry.
    let memory = TokenMemory(policy: RefreshPolicy(), random: { 0 })

    func failure(nextAttemptAt: Date) -> RefreshFailureState {
        RefreshFailureState(consecutiveFailures: 2, nextAttemptAt: nextAttemptAt, lastErrorKind: "httpStatus",
                            lastErrorMessage: "HTTP 503", lastFailureAt: issued)
    }

    @Test("each key, in order and across chunks, stands as its status says: fresh, due, below the floor, backing off, failing without a token, not held")
    func sameAsStatus() throws {
        let now = issued + 3000  // past the soft point of tokens issued at `issued`
        let count = TokenMemory.standingChunk * 2 + 300
        let keys = try (0..<count).map { try TokenKey.vehicle(String(format: "v%05d", $0)) }
        for (index, key) in keys.enumerated() {
            switch index % 6 {
            case 0:  // fresh: issued 1,000 s before `now`
                memory.install(StoredToken(key: key, value: "a.b.c", expiresAt: now + 2600, issuedAt: now - 1000, fetchedAt: now - 1000), source: .provider)
            case 1:  // past its soft point, above the floor
                memory.install(StoredToken(key: key, value: "a.b.c", expiresAt: issued + 3600, issuedAt: issued, fetchedAt: issued), source: .store)
            case 2:  // below the floor
                memory.install(StoredToken(key: key, value: "a.b.c", expiresAt: now + 10, issuedAt: issued, fetchedAt: issued), source: .store)
            case 3:  // a usable token while refreshes fail and back off
                memory.install(StoredToken(key: key, value: "a.b.c", expiresAt: issued + 3600, issuedAt: issued, fetchedAt: issued), source: .store,
                               failure: failure(nextAttemptAt: now + 60))
            case 4:  // failing, no token
                memory.recordFailure(key, failure: failure(nextAttemptAt: now + 60), error: .httpStatus(code: 503, retryAfter: nil))
            default:  // nothing held
                break
            }
        }

        var seen: [(TokenKey, SubjectStanding)] = []
        memory.forEachStanding(among: keys, localNow: now) { seen.append(($0, $1)) }

        #expect(seen.map(\.0) == keys, "every key once, in the order given")
        for (key, standing) in seen {
            let status = memory.status(key, tracked: false, localNow: now)
            let expected = SubjectStanding(state: status?.state ?? .unavailable, isUsable: status?.isUsable ?? false, failure: status?.failure)
            #expect(standing == expected, "\(key)")
        }
        // Each kind of standing is there, so the comparison above covers them all.
        let states = Dictionary(grouping: seen.map(\.1), by: \.state).mapValues(\.count)
        #expect(states[.valid] == count / 6 + (count % 6 > 0 ? 1 : 0))
        #expect(states[.refreshDue] ?? 0 > 0 && states[.backoff] ?? 0 > 0 && states[.unavailable] ?? 0 > 0)
        #expect(seen.filter { !$0.1.isUsable && $0.1.failure != nil }.count > 0, "a failing subject without a token")
        #expect(seen.filter { $0.1.isUsable && $0.1.state == .backoff }.count > 0, "a usable token while backing off")
    }

    @Test("no keys: body is never called")
    func noKeys() {
        var calls = 0
        memory.forEachStanding(among: [], localNow: issued) { _, _ in calls += 1 }
        #expect(calls == 0)
    }
}
