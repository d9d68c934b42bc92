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
}
