// What this process keeps of the refresh leases the store refused to release: enough for the
// shutdown to try again, and nothing once they would have run out anyway.

import FleetTokenStoreTesting
import Foundation
import Logging
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("Refresh lease release", .paced)
struct LeaseReleaseTests {
    // A months-long agent on a database that fails now and then: every key whose release
    // failed used to stay recorded as held until the agent stopped, and to count as held by
    // this process for its next flights.
    @Test("a lease whose release failed is kept for the shutdown until it would have run out, then forgotten; it is never held by a flight")
    func failedReleasesRunOut() async throws {
        let h = try RefusingLeaseHarness()
        defer { h.base.close() }
        let (time, base, store, lease) = (h.time, h.base, h.store, h.lease)
        store.refusing.withLock { $0 = true }
        let keys = try (0..<100).map { try TokenKey.vehicle("truck-\($0)") }
        for key in keys {
            guard case .granted = await lease.take(key) else { Issue.record("\(key) not granted"); return }
            await lease.release(key)
        }
        #expect(lease.heldKeys.count == 100, "kept for the shutdown while they may still run")
        #expect(keys.allSatisfy { !lease.holds($0) }, "no flight holds a lease whose release failed")

        // A lease later: the store holds none of them for anyone. One more failure.
        await time.advance(by: 31)
        let late = try TokenKey.vehicle("late")
        guard case .granted = await lease.take(late) else { Issue.record("late not granted"); return }
        await lease.release(late)
        let kept = lease.heldKeys
        #expect(kept.count == 1 && kept.first == late, "only the lease that may still run is kept: \(kept.count) kept")

        // The store answers again: the shutdown releases what may still run.
        store.refusing.withLock { $0 = false }
        await lease.releaseAll()
        #expect(lease.heldKeys.isEmpty)
        guard case .acquired? = try? await base.acquireRefreshLease(for: late, holder: "another-process", now: time.now, duration: 30) else {
            Issue.record("the shutdown did not release the lease that may still have run")
            return
        }
    }

    @Test("a key taken again after its release failed is held by its new flight, and released by it")
    func takenAgainAfterFailedRelease() async throws {
        let h = try RefusingLeaseHarness()
        defer { h.base.close() }
        let (store, lease) = (h.store, h.lease)
        let key = try TokenKey.vehicle("truck-1")
        store.refusing.withLock { $0 = true }
        _ = await lease.take(key)
        await lease.release(key)
        store.refusing.withLock { $0 = false }
        guard case .granted = await lease.take(key) else { Issue.record("not granted to its own holder"); return }
        #expect(lease.holds(key))
        await lease.release(key)
        #expect(lease.heldKeys.isEmpty, "released by the new flight: nothing left for the shutdown")
        #expect(!lease.holds(key))
    }
}

/// This process's leases (30 s) over a ``ReleaseRefusingStore`` on a fresh SQLite file, on test time.
private struct RefusingLeaseHarness {
    let dir = Scratch()
    let time = TestTime(start: Date())
    let base: SQLiteTokenRepository
    let store: ReleaseRefusingStore
    let lease: CrossProcessLease

    init() throws {
        let base = try openStore(dir.file("tokens.sqlite"))
        self.base = base
        store = ReleaseRefusingStore(base)
        lease = CrossProcessLease(store: store, changes: { base.changes() }, driveChanges: {}, duration: 30,
                                  clock: time.clock, now: time.wall, logger: Logger(label: "lease"))
    }
}

/// A lease store over SQLite that refuses releases while `refusing` (a database that is down
/// for a moment at the end of a fetch).
private final class ReleaseRefusingStore: RefreshLeaseStore {
    let base: SQLiteTokenRepository
    let refusing = Mutex(false)

    init(_ base: SQLiteTokenRepository) { self.base = base }

    func acquireRefreshLease(for key: TokenKey, holder: String, now: Date, duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await base.acquireRefreshLease(for: key, holder: holder, now: now, duration: duration)
    }

    func takeOverRefreshLease(for key: TokenKey, from deadHolder: String, holder: String, now: Date, duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        try await base.takeOverRefreshLease(for: key, from: deadHolder, holder: holder, now: now, duration: duration)
    }

    func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) {
        if refusing.withLock({ $0 }) { throw TokenStoreError.databaseUnavailable(path: "test", reason: "the test's database is down") }
        try await base.releaseRefreshLeases(for: keys, holder: holder)
    }
}
