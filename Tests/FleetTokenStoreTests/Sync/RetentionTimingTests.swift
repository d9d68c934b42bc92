// Issue 27 item 8: the retention sweep runs when the earliest row becomes eligible, so a
// period of 90 s keeps rows about 90 s; it used to run 5 s after start and then every
// max(60 s, min(1 h, retention)), keeping a row up to a whole period longer (an hour, for
// periods of an hour or more). On a real SQLite store, with the engine's clock injected.

import FleetTokenStoreTesting
import Foundation
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("Retention keeps its period", .paced)
struct RetentionTimingTests {
    @Test("--retention 90 s: finished trips whose tokens expire 30 s after start are kept until 120 s, and deleted then, not at the next fixed period")
    func sweepWhenEarliestRowIsEligible() async throws {
        var policy = RefreshPolicy()
        policy.retention = 90
        let h = try EngineHarness(policy: policy)
        let trips = try (0..<20).map { try TokenKey.trip("trip-\($0)") }
        try await h.store.upsert(trips.map { token($0, expiresIn: 30, now: h.time.now) }, clearFailure: true)
        let running = h.start()
        defer { running.cancel() }
        #expect(await eventually { await h.engine.isRunning })
        // The engine's loops asleep on the test clock: once as many sleep again after the clock
        // moved, a sweep it woke up for has run (instead of sleeping for "long enough").
        #expect(await h.engine.settle())
        let asleep = h.time.clock.sleeperCount
        #expect(asleep >= 1, "the retention sweeper waits on the test clock")
        let backAsleep = { await h.engine.isSettled && h.time.clock.sleeperCount >= asleep }

        // Not before they are eligible (30 s + 90 s after start).
        for _ in 0..<110 { await h.time.advance(by: 1) }
        #expect(await eventually(within: 60) { await backAsleep() }, "the engine did not go back to sleep (\(asleep) sleepers before)")
        #expect(try await h.store.count(TokenFilter(kind: .trip)) == 20, "rows deleted before the retention period passed")

        // Eligible at 120 s: gone well before the old schedule's next sweep (5 s + 2 × 90 s).
        for _ in 110..<150 { await h.time.advance(by: 1) }
        #expect(await eventually(within: 60) { (try? await h.store.count(TokenFilter(kind: .trip))) == 0 },
                "rows still stored 60 s after their expiry plus the retention; the sweep did not run when they became eligible")

        // Rows that expire after that sweep are deleted when they become eligible in turn:
        // these at 160 s + 90 s = 250 s (the old schedule's sweeps: 185 s, then 275 s).
        let later = try (0..<5).map { try TokenKey.trip("later-\($0)") }
        try await h.store.upsert(later.map { token($0, expiresIn: 10, now: h.time.now) }, clearFailure: true)
        for _ in 150..<240 { await h.time.advance(by: 1) }
        #expect(await eventually(within: 60) { await backAsleep() }, "the engine did not go back to sleep (\(asleep) sleepers before)")
        #expect(try await h.store.count(TokenFilter(kind: .trip)) == 5, "rows deleted before the retention period passed")
        for _ in 240..<265 { await h.time.advance(by: 1) }
        #expect(await eventually(within: 60) { (try? await h.store.count(TokenFilter(kind: .trip))) == 0 },
                "rows written after a sweep were not deleted when they became eligible")
    }

    // A process killed while fetching leaves its refresh leases behind. A claim treats an
    // expired one as free, but nothing deleted the rows: a key nobody asked for again (a
    // finished trip) kept its lease row for good, one more for each key in flight at each crash.
    @Test("refresh leases left by a process that died while fetching are deleted once expired for the retention period; newer ones stay")
    func expiredLeasesSwept() async throws {
        var policy = RefreshPolicy()
        policy.retention = 90
        let h = try EngineHarness(policy: policy)
        let dead = "host/pid-1-dead@machine"
        let left = try (0..<12).map { try TokenKey.trip("crashed-\($0)") }
        for key in left {
            #expect(try await h.store.acquireRefreshLease(for: key, holder: dead, now: h.time.now, duration: 30) == .acquired(current: nil))
        }
        let running = h.start()
        defer { running.cancel() }
        #expect(await eventually { await h.engine.isRunning })
        #expect(await h.engine.settle())
        let asleep = h.time.clock.sleeperCount
        let backAsleep = { await h.engine.isSettled && h.time.clock.sleeperCount >= asleep }
        let leaseCount = { try await LeaseRows(h.dir.file("tokens.sqlite")).count }

        // With no token rows to wait for, the sweep comes at the longest interval: the leases
        // stay until then (they expired at 30 s, past the retention at 120 s).
        for _ in 0..<(3_500 / 30) { await h.time.advance(by: 30) }
        #expect(await eventually(within: 60) { await backAsleep() })
        #expect(try await leaseCount() == 12)
        // Two more, a minute before the sweep: one expired by then, but not for the retention
        // period; one still running.
        for _ in 0..<2 { await h.time.advance(by: 30) }
        let recent = try TokenKey.trip("recently-crashed"), live = try TokenKey.trip("fetching-now")
        _ = try await h.store.acquireRefreshLease(for: recent, holder: dead, now: h.time.now, duration: 1)
        _ = try await h.store.acquireRefreshLease(for: live, holder: "host/pid-2-alive@machine", now: h.time.now, duration: 300)
        for _ in 0..<3 { await h.time.advance(by: 30) }
        #expect(await eventually(within: 60) { (try? await leaseCount()) == 2 }, "the expired leases were not deleted at the hourly sweep")
        let rows = try await LeaseRows(h.dir.file("tokens.sqlite"))
        #expect(Set(rows.leases.keys) == [recent.description, live.description])
        #expect(h.log.messages(at: .info).contains { $0.contains("deleted refresh leases left by processes that ended while fetching") })
    }
}
