// The hot path in memory: a fresh hit is served by TokenMemory.freshToken alone, everything else
// (past the soft point, below the floor, nothing held) falls through to the full decision of
// TokenMemory.lookup. These pin that the split decides exactly as lookup alone did.

import Foundation
import Testing
@testable import FleetTokenStore

@Suite("TokenMemory's hot path", .paced)
struct TokenMemoryHitTests {
    let key = try! TokenKey.vehicle("hot")
    let issued = Date(timeIntervalSince1970: 1_800_000_000)
    /// No jitter: the soft point is at 80% of the hour (2,880 s), the floor 30 s before expiry.
    let memory = TokenMemory(policy: RefreshPolicy(), random: { 0 })

    var token: StoredToken {
        StoredToken(key: key, value: "header.payload.signature", expiresAt: issued + 3600, issuedAt: issued, fetchedAt: issued)
    }

    @Test("before the soft point the token is served and its use stamped, as lookup does")
    func fresh() {
        memory.install(token, source: .provider)
        let now = issued + 100
        #expect(memory.freshToken(key, localNow: now) == token)
        #expect(memory.entry(key)?.lastUsed == now)
        guard case .fresh(let held) = memory.lookup(key, localNow: now + 1) else {
            Issue.record("lookup did not see a fresh token"); return
        }
        #expect(held == token)
    }

    @Test("past the soft point freshToken leaves the decision to lookup, which starts one refresh")
    func stale() {
        memory.install(token, source: .provider)
        let now = issued + 3000
        #expect(memory.freshToken(key, localNow: now) == nil)
        #expect(memory.entry(key)?.lastUsed == .distantPast) // not stamped: lookup stamps it
        guard case .stale(let first, startRefresh: true, offline: false) = memory.lookup(key, localNow: now) else {
            Issue.record("the first caller past the soft point was not told to refresh"); return
        }
        #expect(first == token)
        #expect(memory.entry(key)?.lastUsed == now)
        guard case .stale(_, startRefresh: false, offline: false) = memory.lookup(key, localNow: now) else {
            Issue.record("a second caller was told to refresh too"); return
        }
    }

    @Test("below the floor, without a token and for an unknown key both miss")
    func misses() {
        memory.install(token, source: .provider)
        #expect(memory.freshToken(key, localNow: issued + 3580) == nil)
        guard case .miss = memory.lookup(key, localNow: issued + 3580) else { Issue.record("served below the floor"); return }

        memory.installEmpty(key, failure: nil)
        #expect(memory.freshToken(key, localNow: issued + 100) == nil)
        guard case .miss = memory.lookup(key, localNow: issued + 100) else { Issue.record("served without a token"); return }

        let unknown = try! TokenKey.vehicle("unknown")
        #expect(memory.freshToken(unknown, localNow: issued + 100) == nil)
        guard case .miss = memory.lookup(unknown, localNow: issued + 100) else { Issue.record("served an unknown key"); return }
    }

    @Test("the provider clock offset moves the soft point for freshToken as for lookup")
    func clockOffset() {
        memory.install(token, source: .provider)
        memory.state.withLock { $0.clockOffset = 200 } // the provider's clock is 200 s ahead
        let local = issued + 2800 // 2,800 s local is 3,000 s on the provider's clock: past the soft point
        #expect(memory.freshToken(key, localNow: local) == nil)
        guard case .stale = memory.lookup(key, localNow: local) else { Issue.record("the offset was not applied"); return }
        #expect(memory.entry(key)?.lastUsed == issued + 3000) // stamped in provider time
    }

    @Test("the coarse wall clock reads the real time, to within its resolution")
    func coarseWallClock() {
        let before = Date()
        let coarse = TokenSyncEngine.coarseWallClock()
        let after = Date()
        // The coarse clock lags by up to one kernel tick (a few ms); 50 ms leaves room for a
        // descheduled test thread.
        #expect(coarse >= before.addingTimeInterval(-0.05))
        #expect(coarse <= after.addingTimeInterval(0.05))
    }
}
