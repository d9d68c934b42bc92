// When a fetch in flight renews its key's refresh lease: on the lease's schedule, from when it
// was taken, not from when the fetch got going.

import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("Refresh lease renewal", .paced)
struct LeaseRenewalTests {
    @Test("the renewal is due a third of a lease after the last take: at once when that is past, never later than a third")
    func renewalDelay() {
        let t = TestTime.defaultStart
        #expect(CrossProcessLease.renewalDelay(after: t, now: t, leaseDuration: 30) == .seconds(10))
        #expect(CrossProcessLease.renewalDelay(after: t, now: t + 4, leaseDuration: 30) == .seconds(6))
        #expect(CrossProcessLease.renewalDelay(after: t, now: t + 10, leaseDuration: 30) == .zero)
        #expect(CrossProcessLease.renewalDelay(after: t, now: t + 25, leaseDuration: 30) == .zero, "late: at once")
        #expect(CrossProcessLease.renewalDelay(after: t, now: t - 3600, leaseDuration: 30) == .seconds(10),
                "a wall clock stepped back an hour still renews within a third of a lease")
        #expect(CrossProcessLease.renewalDelay(after: t, now: t, leaseDuration: 0) == .milliseconds(10))
    }

    // The fetch starts half a lease after the lease was taken (on a loaded machine the fetch's
    // task can start late while test time moves on). The clock then stands still: the lease
    // must be renewed at once, not a third of a lease after the fetch started, or a third
    // process sees it end in half a lease. In the fresh-clone CI the old schedule made
    // PromiseTests' two-engine test see a lease not renewed past the next quarter lease.
    @Test("a fetch that starts half a lease after its lease was taken renews the lease at once, as another process sees it")
    func lateFetchRenewsAtOnce() async throws {
        let dir = Scratch()
        let time = TestTime(start: Date())
        let store = try openStore(dir.file("tokens.sqlite"))
        defer { store.close() }
        let lease = CrossProcessLease(store: store, changes: { store.changes() }, driveChanges: {}, duration: 1,
                                      clock: time.clock, now: time.wall, logger: Logger(label: "lease"))
        let key = try TokenKey.vehicle("truck-1")
        guard case .granted = await lease.take(key) else {
            Issue.record("the lease of a key nobody holds was not granted")
            return
        }
        let takenAt = time.now
        await time.advance(by: 0.5)
        let gate = AsyncStream<Void>.makeStream()
        let fetch = Task { await lease.renewing(key) { for await _ in gate.stream { break }; return 7 } }
        func leaseEnd() async -> Date? {
            guard case .heldElsewhere(let holder, let until, _)? = try? await store.acquireRefreshLease(
                for: key, holder: "another-process", now: time.now, duration: 1), holder == lease.holder else { return nil }
            return until
        }
        let renewed = await eventually(within: 30) { (await leaseEnd()).map { $0 > takenAt + 1.25 } ?? false }
        let end = await leaseEnd()
        #expect(renewed, "the lease still ends \(String(describing: end)) for a lease taken at \(takenAt): not renewed while the clock stood half a lease on")
        gate.continuation.yield()
        #expect(await fetch.value == 7)
        await lease.release(key)
        let afterRelease = await leaseEnd()
        #expect(afterRelease == nil, "released")
    }
}
