// Shared by the test targets: the repository contract's checks of what processes sharing a
// store rely on (refresh leases, the change feed) and of the health check.

import FleetTokenStore
import Foundation
import Synchronization
import Testing

extension RepositoryContract {
    /// Lease requests from `store` (holder A) and `other` (holders B, C, as another process).
    func leaseHeldElsewhere(_ store: any ContractRepository, _ other: any ContractRepository) async throws {
        let now = Self.now
        let key = try TokenKey.vehicle("truck-7")
        #expect(try await store.acquireRefreshLease(for: key, holder: "A", now: now, duration: 30) == .acquired(current: nil))
        let token = token(key, expiresIn: 600)
        try await store.upsert(token)
        let entry = TokenEntry(key: key, token: token, failure: nil)
        // Another holder is refused while the lease runs, and sees the entry read with the answer.
        #expect(try await other.acquireRefreshLease(for: key, holder: "B", now: now + 1, duration: 30)
                == .heldElsewhere(holder: "A", until: now + 30, current: entry))
        // The holder renews it (as it does while its fetch runs): it runs from the renewal.
        #expect(try await store.acquireRefreshLease(for: key, holder: "A", now: now + 10, duration: 30) == .acquired(current: entry))
        #expect(try await other.acquireRefreshLease(for: key, holder: "B", now: now + 31, duration: 30)
                == .heldElsewhere(holder: "A", until: now + 40, current: entry))
        // Leases are per key.
        let trip = try TokenKey.trip("trip-1")
        #expect(try await other.acquireRefreshLease(for: trip, holder: "B", now: now + 1, duration: 30) == .acquired(current: nil))
        #expect(try await store.acquireRefreshLease(for: trip, holder: "A", now: now + 2, duration: 30)
                == .heldElsewhere(holder: "B", until: now + 31, current: nil))
        // A lease is no entry: the store lists none for it.
        #expect(try await store.list(.all).map(\.key) == [key])
    }

    func leaseRelease(_ store: any ContractRepository, _ other: any ContractRepository) async throws {
        let now = Self.now
        let keys = try (0..<3).map { try TokenKey.trip("trip-\($0)") }
        for key in keys { #expect(try await store.acquireRefreshLease(for: key, holder: "A", now: now, duration: 30) == .acquired(current: nil)) }
        // Releasing in another holder's name leaves A's leases alone.
        try await other.releaseRefreshLeases(for: keys, holder: "B")
        #expect(try await other.acquireRefreshLease(for: keys[0], holder: "B", now: now + 1, duration: 30)
                == .heldElsewhere(holder: "A", until: now + 30, current: nil))
        try await store.releaseRefreshLeases(for: Array(keys.prefix(2)), holder: "A")
        #expect(try await other.acquireRefreshLease(for: keys[0], holder: "B", now: now + 1, duration: 30) == .acquired(current: nil))
        #expect(try await other.acquireRefreshLease(for: keys[1], holder: "B", now: now + 1, duration: 30) == .acquired(current: nil))
        #expect(try await other.acquireRefreshLease(for: keys[2], holder: "B", now: now + 1, duration: 30)
                == .heldElsewhere(holder: "A", until: now + 30, current: nil))
        // A's late release (say, after B took the lease) does not free B's.
        try await store.releaseRefreshLeases(for: keys, holder: "A")
        #expect(try await store.acquireRefreshLease(for: keys[0], holder: "A", now: now + 2, duration: 30)
                == .heldElsewhere(holder: "B", until: now + 31, current: nil))
        try await store.releaseRefreshLeases(for: [], holder: "A")
    }

    func leaseExpiry(_ store: any ContractRepository, _ other: any ContractRepository) async throws {
        let now = Self.now
        let key = try TokenKey.vehicle("truck-7")
        #expect(try await store.acquireRefreshLease(for: key, holder: "A", now: now, duration: 30) == .acquired(current: nil))
        #expect(try await other.acquireRefreshLease(for: key, holder: "B", now: now + 29, duration: 30)
                == .heldElsewhere(holder: "A", until: now + 30, current: nil))
        // At its end the lease is free: whoever asks first gets it.
        #expect(try await other.acquireRefreshLease(for: key, holder: "B", now: now + 30, duration: 30) == .acquired(current: nil))
        #expect(try await store.acquireRefreshLease(for: key, holder: "A", now: now + 31, duration: 30)
                == .heldElsewhere(holder: "B", until: now + 60, current: nil))
        // A lapsed lease can be taken by its former holder too.
        #expect(try await store.acquireRefreshLease(for: key, holder: "A", now: now + 61, duration: 5) == .acquired(current: nil))
    }

    func expiredLeaseSweep(_ store: any ContractRepository, _ other: any ContractRepository) async throws {
        let now = Self.now
        // Five leases of a holder that died (never released), ending at now + 30.
        let left = try (0..<5).map { try TokenKey.trip("crashed-\($0)") }
        for key in left { #expect(try await store.acquireRefreshLease(for: key, holder: "A", now: now, duration: 30) == .acquired(current: nil)) }
        let recent = try TokenKey.trip("recent"), live = try TokenKey.vehicle("truck-7")
        #expect(try await other.acquireRefreshLease(for: recent, holder: "B", now: now + 50, duration: 30) == .acquired(current: nil))
        #expect(try await other.acquireRefreshLease(for: live, holder: "B", now: now + 55, duration: 300) == .acquired(current: nil))
        // The cutoff is strict: a lease ending at it is not before it.
        #expect(try await store.deleteExpiredRefreshLeases(before: now + 30, limit: 100) == 0)
        // At most the limit at a time, from any view.
        #expect(try await other.deleteExpiredRefreshLeases(before: now + 60, limit: 3) == 3)
        #expect(try await store.deleteExpiredRefreshLeases(before: now + 60, limit: 3) == 2)
        #expect(try await store.deleteExpiredRefreshLeases(before: now + 60, limit: 3) == 0)
        // The others are as they were: still held until their ends.
        #expect(try await store.acquireRefreshLease(for: recent, holder: "C", now: now + 60, duration: 30)
                == .heldElsewhere(holder: "B", until: now + 80, current: nil))
        #expect(try await store.acquireRefreshLease(for: live, holder: "C", now: now + 60, duration: 30)
                == .heldElsewhere(holder: "B", until: now + 355, current: nil))
        // Past every end, every lease goes.
        #expect(try await other.deleteExpiredRefreshLeases(before: now + 356, limit: 100) == 2)
    }

    func leaseTakeOver(_ store: any ContractRepository, _ other: any ContractRepository) async throws {
        let now = Self.now
        let key = try TokenKey.vehicle("truck-7")
        let token = token(key, expiresIn: 600)
        try await store.upsert(token)
        let entry = TokenEntry(key: key, token: token, failure: nil)
        #expect(try await store.acquireRefreshLease(for: key, holder: "A", now: now, duration: 30) == .acquired(current: entry))
        // Only from the holder named: C judged B dead, but A holds the lease.
        #expect(try await other.takeOverRefreshLease(for: key, from: "B", holder: "C", now: now + 1, duration: 30)
                == .heldElsewhere(holder: "A", until: now + 30, current: entry))
        // C judged A dead: the lease is C's at once, long before A's would end, with the entry.
        #expect(try await other.takeOverRefreshLease(for: key, from: "A", holder: "C", now: now + 1, duration: 30)
                == .acquired(current: entry))
        // A second process that judged A dead too comes second: C holds the lease now.
        #expect(try await store.takeOverRefreshLease(for: key, from: "A", holder: "D", now: now + 2, duration: 30)
                == .heldElsewhere(holder: "C", until: now + 31, current: entry))
        // A, alive after all, finds its renewal refused.
        #expect(try await store.acquireRefreshLease(for: key, holder: "A", now: now + 3, duration: 30)
                == .heldElsewhere(holder: "C", until: now + 31, current: entry))
        // A free lease (never taken, or released) is taken as acquire would.
        let trip = try TokenKey.trip("trip-1")
        #expect(try await store.takeOverRefreshLease(for: trip, from: "X", holder: "D", now: now, duration: 30) == .acquired(current: nil))
        try await store.releaseRefreshLeases(for: [trip], holder: "D")
        #expect(try await other.takeOverRefreshLease(for: trip, from: "D", holder: "C", now: now, duration: 30) == .acquired(current: nil))
    }

    /// `store` listens, running its background work as an engine would; `other` writes as
    /// another process would.
    func changeFeed(_ store: any ContractRepository, _ other: any ContractRepository) async throws {
        let backgroundWork = Task { await store.runBackgroundWork() }
        let ended = EndFlag()
        defer { backgroundWork.cancel() }
        let recorder = StreamRecorder(store.changes())
        // The feed is live once it reports a write made after it started: a store may take a
        // moment to begin watching (SQLite's polls start from the log's end).
        let probe = try TokenKey.task("feed-probe")
        var live = false
        for attempt in 1...40 where !live {
            try await other.upsert(token(probe, expiresIn: 600 + Double(attempt)))
            live = await eventually(within: 0.25) { recorder.elements.contains(.upserted(probe)) }
        }
        try #require(live, "the change feed never reported another view's write")
        // A store may report `.unknown` as its feed begins (PostgreSQL: changes committed
        // before LISTEN took effect cannot be itemized); once live, nothing is unknown.
        let sinceLive = { recorder.elements.drop { $0 != .upserted(probe) } }

        let own = try TokenKey.vehicle("own"), theirs = try TokenKey.vehicle("theirs")
        try await store.upsert(token(own, expiresIn: 600))
        try await other.upsert(token(theirs, expiresIn: 600))
        #expect(await eventually(within: 30) { recorder.elements.contains(.upserted(theirs)) })
        // Changes arrive in commit order: what this view wrote before would have come first.
        #expect(!recorder.elements.contains(.upserted(own)))

        // Removals by the other view, of any origin: a purge, a removed token.
        #expect(try await other.purge(TokenFilter(subjectID: "own")) == 1)
        #expect(await eventually(within: 30) { recorder.elements.contains(.removed(own)) })
        try await other.removeToken(for: theirs)
        #expect(await eventually(within: 30) { recorder.elements.contains(.removed(theirs)) })

        // Failure bookkeeping is no news: a token change after it arrives, it does not.
        let failing = try TokenKey.trip("failing"), marker = try TokenKey.trip("marker")
        try await other.recordFailure(Self.failure(1, retryIn: 30), for: failing)
        try await other.upsert(token(marker, expiresIn: 600))
        #expect(await eventually(within: 30) { recorder.elements.contains(.upserted(marker)) })
        #expect(!recorder.elements.contains { $0 == .upserted(failing) || $0 == .removed(failing) })

        // This view's own removal is not reported back either.
        try await store.upsert(token(own, expiresIn: 900))
        #expect(await eventually(within: 30) { (try? await other.entry(for: own)) != nil })
        try await store.removeToken(for: own)
        try await other.upsert(token(marker, expiresIn: 900))
        #expect(await eventually(within: 30) { recorder.elements.filter { $0 == .upserted(marker) }.count == 2 })
        #expect(recorder.elements.filter { $0 == .removed(own) }.count == 1)
        #expect(!sinceLive().contains(.unknown))

        // The work ends with its task: the engine's run() ends with it.
        backgroundWork.cancel()
        let waiter = Task { await backgroundWork.value; ended.set() }
        #expect(await eventually(within: 30) { ended.isSet }, "runBackgroundWork() went on after its task was cancelled")
        waiter.cancel()

        // Following the feed alone (a lease wait of an engine without run()) makes it report
        // too, and ends with its task.
        let following = Task { await store.followChanges() }
        let followed = try TokenKey.task("followed")
        var reported = false
        for attempt in 1...40 where !reported {
            try await other.upsert(token(followed, expiresIn: 600 + Double(attempt)))
            reported = await eventually(within: 0.25) { recorder.elements.contains(.upserted(followed)) }
        }
        #expect(reported, "followChanges() did not make the feed report another view's write")
        following.cancel()
        let followEnded = EndFlag()
        let followWaiter = Task { await following.value; followEnded.set() }
        #expect(await eventually(within: 30) { followEnded.isSet }, "followChanges() went on after its task was cancelled")
        followWaiter.cancel()
    }

    func healthCheck(_ store: any ContractRepository) async {
        try? await store.upsert(token(try! .vehicle("v"), expiresIn: 600))
        let report = await store.check()
        #expect(report.isHealthy, "\(report.problems)")
        #expect(report.problems.isEmpty)
        #expect(report.integrityProblems == [])
        #expect(report.backgroundIntegrityFinding == nil)
        #expect(report.schemaVersion == (try? await store.schemaVersion()))
        #expect(report.schemaVersion == report.buildSchemaVersion)
    }
}
