import FleetTokenStoreTesting
import Foundation
import Logging
import MetricsTestKit
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// Promises a mutation run found unguarded (issue 27 item 11): each test here fails with the
/// mutation named in its comment applied.
@Suite("Promises no test guarded: a queued caller released by another process's token, a stored backoff kept across a restart", .paced)
struct UnguardedPromiseTests {
    // Mutation: `slots.endWait(for:)` removed from `EngineParts.adoptIfNewer`. The caller then
    // stays queued until a slot frees, which the closed provider never lets happen.
    @Test("every fetch slot busy on slow keys, a caller queued for key K, another process stores K: the caller gets K's token before any slot frees")
    func queuedCallerReleasedByAnotherProcess() async throws {
        var policy = RefreshPolicy()
        policy.maxConcurrentFetches = 2
        let time = TestTime()
        let slow = ScriptedFetcher.minting(time)
        slow.close()
        let h = try EngineHarness(time: time, fetcher: slow, policy: policy)
        let running = h.start()
        defer { running.cancel() }
        #expect(await eventually { await h.engine.isRunning })

        let busy = try (1...2).map { try TokenKey.vehicle("slow-\($0)") }
        let key = try TokenKey.vehicle("queued")
        let busyCallers = busy.map { key in Task { try? await h.engine.token(for: key) } }
        #expect(await eventually(within: 60) { slow.waitingAtGate == 2 }, "both slots fetch the slow keys")
        let served = Mutex<StoredToken?>(nil)
        let caller = Task {
            let token = try await h.engine.token(for: key)
            served.withLock { $0 = token }
        }
        #expect(await eventually(within: 60) {
            if case .queuedForSlot = h.engine.flightPhase(of: key) { return true }
            return false
        }, "the caller queues for a fetch slot")

        // Another agent on the same store file fetches K and stores it.
        let other = ScriptedFetcher.minting(time)
        let (sibling, siblingStore) = try h.sibling(fetcher: other)
        defer { siblingStore.close() }
        let stored = try await sibling.token(for: key)
        #expect(await eventually(within: 60) { (try? await h.store.entry(for: key))?.token?.value == stored.value })

        let released = await eventually(within: 60) { served.withLock { $0 } != nil }
        #expect(released, "the caller still waits for a fetch slot although K's token is in the store")
        #expect(served.withLock { $0?.value == stored.value }, "the caller got another token than the one stored")
        // No slot freed meanwhile, and K was never fetched here.
        #expect(slow.waitingAtGate == 2)
        #expect(slow.count(key) == 0)

        slow.open()
        for task in busyCallers { _ = await task.value }
        if !released { caller.cancel() }
        _ = try? await caller.value
        await sibling.shutdown()
    }

    /// Where the engine's refresh leases live in ``restartKeepsStoredBackoff(_:)``.
    enum LeaseStore: String, CaseIterable, CustomTestStringConvertible, Sendable {
        /// The token store's own lease table.
        case available
        /// A store that fails every lease request (closed).
        case unavailable
        var testDescription: String { rawValue }
    }

    // Mutation: the stored failure dropped in `EngineParts.load` (the token installed with
    // `failure: nil`). The engine then refreshes at once: a lease request and a fetch before
    // the stored next attempt, and hits no longer count as served offline.
    @Test("a restart with a usable token past its soft point and a stored backoff: hits are served offline without a lease or a read, nothing is fetched before the stored next attempt",
          arguments: LeaseStore.allCases)
    func restartKeepsStoredBackoff(_ leaseStore: LeaseStore) async throws {
        let dir = Scratch()
        let time = TestTime()
        let metrics = TestMetrics()
        let tracked = try TokenKey.vehicle("truck-7"), untracked = try TokenKey.trip("trip-7")
        let keys = [tracked, untracked]
        let nextAttempt = time.now.addingTimeInterval(300)

        // What the process before the restart left: tokens issued 3000 s ago (past the 2790 s
        // soft point, 570 s above the floor) and a failure retried 300 s from now.
        let before = try openStore(dir.file("tokens.sqlite"))
        for key in keys {
            let issued = time.now.addingTimeInterval(-3000)
            try await before.upsert(StoredToken(key: key, value: TestJWT.make(for: key, issuedAt: issued, lifetime: 3600),
                                                expiresAt: issued.addingTimeInterval(3600), issuedAt: issued, fetchedAt: issued))
            try await before.recordFailure(RefreshFailureState(consecutiveFailures: 4, nextAttemptAt: nextAttempt, lastErrorKind: "httpStatus",
                                                               lastErrorMessage: "HTTP 503", lastFailureAt: time.now.addingTimeInterval(-20)), for: key)
        }
        let storedValues = try await before.entries(for: keys).compactMapValues { $0.token?.value }
        before.close()

        let store = CountingRepository(try openStore(dir.file("tokens.sqlite")))
        let leaseBase = leaseStore == .available ? store.base : try openStore(dir.file("leases.sqlite"))
        if leaseStore == .unavailable { leaseBase.close() }
        let leases = CountingRepository(leaseBase)
        let provider = ScriptedFetcher.minting(time) // answers at once: only the backoff holds it
        var policy = RefreshPolicy()
        policy.retention = 0 // no sweep: every store call counted below is a hit's
        let engine = TokenSyncEngine(repository: store, leases: leases, fetcher: provider, policy: policy, logger: Logger(label: "restart"),
                                     clock: time.clock, now: time.wall, random: { 0.5 }, metricsFactory: metrics)
        func offline() -> Int64 { (try? metrics.expectCounter("fleet_tokens_served_while_offline_total").totalValue) ?? 0 }

        // The restart: configured subjects tracked, run() started; a caller asks for an untracked one.
        await engine.track([tracked])
        let running = Task { try await engine.run() }
        defer { running.cancel() }
        #expect(await eventually { await engine.isRunning })
        #expect(try await engine.token(for: untracked).value == storedValues[untracked])

        // Hits, at several times before the next attempt.
        for step in [0, 100, 150, 49] as [TimeInterval] {
            await time.advance(by: step)
            #expect(await engine.settle())
            let reads = store.calls, servedOffline = offline()
            for _ in 0..<20 {
                for key in keys { #expect(try await engine.token(for: key).value == storedValues[key]) }
            }
            #expect(await engine.settle())
            #expect(store.calls == reads, "hits read or wrote the store")
            #expect(offline() - servedOffline == 40, "hits past the soft point while backing off are served offline")
            #expect(provider.total == 0, "fetched at \(time.now.timeIntervalSince(nextAttempt)) s from the stored next attempt")
            #expect(leases.calls == 0, "a lease was asked for while backing off")
        }
        #expect(time.now < nextAttempt)

        // At the next attempt the tracked key is retried (the backoff was all that held it).
        await time.advance(by: 2)
        #expect(await eventually(within: 60) { provider.count(tracked) == 1 })
        await engine.shutdown()
        running.cancel()
        _ = try? await running.value
        store.base.close()
    }
}
