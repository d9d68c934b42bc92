import Foundation
import Testing
@testable import FleetTokenStore

/// The refresh state machine with plain values: every rule of the README's "How refresh works"
/// that concerns one key's flight is a test here. No clock, no store, no task.
@Suite("RefreshDecision: one key's flight, events in, actions out", .paced)
struct RefreshDecisionTests {
    let key = try! TokenKey.vehicle("truck-7")
    let policy = RefreshPolicy()
    let t0 = Date(timeIntervalSince1970: 1_800_000_000)
    var now: RefreshMoment { RefreshMoment(corrected: t0, local: t0) }

    /// A one-hour token issued `age` seconds before t0.
    func token(age: TimeInterval, _ value: String = "v1") -> StoredToken {
        let issued = t0.addingTimeInterval(-age)
        return StoredToken(key: key, value: value, expiresAt: issued.addingTimeInterval(3600), issuedAt: issued, fetchedAt: issued)
    }

    /// Memory's entry for `token` with its unjittered soft point (80%) and floor (30 s).
    func held(_ token: StoredToken?, failure: RefreshFailureState? = nil, lastError: TokenProviderError? = nil) -> MemoryEntry {
        MemoryEntry(token: token, source: .store,
                    softPoint: token.map { policy.softPoint(of: $0, jitter: 0) } ?? .distantPast,
                    usableUntil: token.map { $0.expiresAt.addingTimeInterval(-policy.floor(of: $0)) } ?? .distantPast,
                    failure: failure, lastError: lastError, lastUsed: .distantPast, refreshRequested: false)
    }

    func failure(failures: Int = 1, next: TimeInterval, at: TimeInterval = -1) -> RefreshFailureState {
        RefreshFailureState(consecutiveFailures: failures, nextAttemptAt: t0.addingTimeInterval(next), lastErrorKind: "timeout",
                            lastErrorMessage: "token provider did not answer within 5.0 s", lastFailureAt: t0.addingTimeInterval(at))
    }

    /// A flight that has reached the lease: started on `start`, slot granted.
    func atLease(_ request: RefreshDecision.Request = .caller, start: MemoryEntry?) -> RefreshDecision {
        var flight = RefreshDecision(request: request, policy: policy)
        #expect(flight.start(held: start, at: now) == .acquireFetchSlot)
        #expect(flight.slotGranted(held: start, at: now) == .takeLease)
        #expect(flight.holdsSlot)
        return flight
    }

    // MARK: - Soft point, floor, missing

    @Test("a token before its soft point is served without a fetch; a caller's use is recorded")
    func freshIsServed() {
        let fresh = token(age: 600)
        var caller = RefreshDecision(request: .caller, policy: policy)
        #expect(caller.start(held: held(fresh), at: now) == .serve(fresh, markUsed: true))
        var background = RefreshDecision(request: .background, policy: policy)
        #expect(background.start(held: held(fresh), at: now) == .serve(fresh, markUsed: false))
        #expect(!background.holdsSlot && !background.holdsLease)
    }

    @Test("past the soft point a caller gets the current token and one background refresh starts")
    func pastSoftPointServesAndRefreshes() {
        let due = token(age: 3000) // 83% of its life
        var caller = RefreshDecision(request: .caller, policy: policy)
        #expect(caller.start(held: held(due), at: now) == .serveAndRefreshInBackground(due))
        var background = RefreshDecision(request: .background, policy: policy)
        #expect(background.start(held: held(due), at: now) == .acquireFetchSlot)
        var fresh = RefreshDecision(request: .callerWantsFresh, policy: policy)
        #expect(fresh.start(held: held(due), at: now) == .acquireFetchSlot, "a one-shot run refreshes first")
    }

    @Test("below the floor, or with nothing held, callers wait for a fetch")
    func belowFloorOrMissingFetches() {
        for entry in [held(token(age: 3580)), held(nil), nil] {
            var flight = RefreshDecision(request: .caller, policy: policy)
            #expect(flight.start(held: entry, at: now) == .acquireFetchSlot)
            #expect(flight.state == .queuedForSlot)
        }
    }

    @Test("the whole path of a first fetch: slot, lease, fetch, accept; the lease passes to the commit")
    func firstFetch() {
        var flight = atLease(start: nil)
        #expect(flight.leaseGranted(current: nil, held: nil, at: now) == .fetch(previous: nil))
        #expect(flight.holdsLease)
        let new = token(age: 0, "v2")
        #expect(flight.fetchSucceeded(new) == .accept(new, markUsed: true))
        #expect(!flight.holdsSlot && !flight.holdsLease && flight.state == .finished)
        var background = atLease(.background, start: nil)
        _ = background.leaseGranted(current: nil, held: nil, at: now)
        #expect(background.fetchSucceeded(new) == .accept(new, markUsed: false))
    }

    // MARK: - Failures and backoff

    @Test("while a backoff runs, callers get the last provider error and the next attempt time")
    func backoffRunning() {
        let running = failure(next: 20)
        var flight = RefreshDecision(request: .caller, policy: policy)
        #expect(flight.start(held: held(nil, failure: running, lastError: .timeout(seconds: 5)), at: now)
            == .fail(.provider(.timeout(seconds: 5)), nextAttemptAt: running.nextAttemptAt))
        var restarted = RefreshDecision(request: .caller, policy: policy)
        #expect(restarted.start(held: held(nil, failure: running), at: now)
            == .fail(.provider(.other(detail: "token provider did not answer within 5.0 s")), nextAttemptAt: running.nextAttemptAt),
                "a backoff persisted by an earlier run is honoured, with its stored message")
    }

    @Test("a backoff recorded after now (the wall clock was stepped back) is over")
    func steppedBackBackoffIsOver() {
        var flight = RefreshDecision(request: .caller, policy: policy)
        #expect(flight.start(held: held(nil, failure: failure(next: 3600, at: 1800)), at: now) == .acquireFetchSlot)
    }

    @Test("a failed fetch backs off 1 s doubling to 5 min with equal jitter, counting on from the held failures")
    func backoffArithmetic() {
        func backoff(after held: RefreshFailureState?, _ error: TokenProviderError, random: Double) -> RefreshFailureState? {
            var flight = atLease(start: self.held(nil, failure: held))
            _ = flight.leaseGranted(current: nil, held: self.held(nil, failure: held), at: now)
            guard case .backOff(let state, let reported) = flight.fetchFailed(error, held: self.held(nil, failure: held), at: now, random: random)
            else { return nil }
            #expect(reported == error)
            #expect(flight.holdsLease && !flight.holdsSlot, "the lease is released after the failure is stored")
            return state
        }
        let first = backoff(after: nil, .timeout(seconds: 5), random: 0)
        #expect(first?.consecutiveFailures == 1)
        #expect(first?.nextAttemptAt == t0.addingTimeInterval(0.5), "never below half the nominal delay")
        #expect(first?.lastFailureAt == t0 && first?.lastErrorKind == "timeout")
        #expect(backoff(after: nil, .timeout(seconds: 5), random: 1)?.nextAttemptAt == t0.addingTimeInterval(1))
        let old = failure(failures: 3, next: -1, at: -10)
        #expect(backoff(after: old, .timeout(seconds: 5), random: 1)?.nextAttemptAt == t0.addingTimeInterval(8))
        #expect(backoff(after: old, .timeout(seconds: 5), random: 1)?.consecutiveFailures == 4)
        #expect(backoff(after: failure(failures: 20, next: -1, at: -10), .timeout(seconds: 5), random: 1)?.nextAttemptAt
            == t0.addingTimeInterval(300), "capped at 5 min")
        #expect(backoff(after: nil, .httpStatus(code: 403, retryAfter: nil), random: 1)?.nextAttemptAt
            == t0.addingTimeInterval(30), "answers retrying will not fix start at 30 s")
        #expect(backoff(after: nil, .httpStatus(code: 503, retryAfter: 120), random: 1)?.nextAttemptAt
            == t0.addingTimeInterval(120), "Retry-After honoured")
        #expect(backoff(after: nil, .httpStatus(code: 429, retryAfter: 86_400), random: 1)?.nextAttemptAt
            == t0.addingTimeInterval(3600), "Retry-After capped at an hour")
        #expect(backoff(after: nil, .invalidToken(.noProgress(expiresAt: t0)), random: 1)?.nextAttemptAt
            == t0.addingTimeInterval(1), "no progress backs off like a retryable failure")
    }

    // MARK: - Single flight across processes

    @Test("another live holder: the slot goes, the flight waits for the change feed a second at a time")
    func waitsForHolder() {
        var flight = atLease(start: nil)
        #expect(flight.leaseBusy(holder: "pid-2@m", holderIsDead: false, until: t0.addingTimeInterval(30), current: nil,
                                 held: nil, at: now) == .waitForHolder(seconds: 1))
        #expect(!flight.holdsSlot && !flight.holdsLease)
        #expect(flight.holderWaitEnded(feedMentionedKey: false, held: nil, at: now) == .acquireFetchSlot,
                "no news: try the lease again, which finds a holder that died or gave up")
        _ = flight.slotGranted(held: nil, at: now)
        #expect(flight.leaseBusy(holder: "pid-2@m", holderIsDead: false, until: t0.addingTimeInterval(0.25), current: nil,
                                 held: nil, at: now) == .waitForHolder(seconds: 0.25), "never past the lease's end")
        _ = flight.holderWaitEnded(feedMentionedKey: false, held: nil, at: now)
        _ = flight.slotGranted(held: nil, at: now)
        #expect(flight.leaseBusy(holder: "pid-2@m", holderIsDead: false, until: t0, current: nil, held: nil, at: now)
            == .acquireFetchSlot, "a lease that ran out is tried again at once")
    }

    @Test("the holder's token ends the wait as soon as the feed shows it")
    func holderResultIsAdopted() {
        var flight = atLease(start: nil)
        _ = flight.leaseBusy(holder: "pid-2@m", holderIsDead: false, until: t0.addingTimeInterval(30), current: nil, held: nil, at: now)
        #expect(flight.holderWaitEnded(feedMentionedKey: true, held: nil, at: now) == .readStoredEntry)
        let theirs = token(age: 1, "theirs")
        let stored = TokenEntry(key: key, token: theirs, failure: nil)
        #expect(flight.storedEntryRead(stored, held: nil, at: now) == .adopt(theirs, failure: nil))
        #expect(flight.adopted(held: held(theirs), at: now) == .serve(theirs, markUsed: false))
    }

    @Test("a token installed in memory meanwhile (by the change follower) ends the wait too")
    func fresherInMemoryEndsWait() {
        let old = token(age: 3590)
        var flight = atLease(start: held(old))
        _ = flight.leaseBusy(holder: "pid-2@m", holderIsDead: false, until: t0.addingTimeInterval(30), current: nil,
                             held: held(old), at: now)
        let theirs = token(age: 1, "theirs")
        #expect(flight.holderWaitEnded(feedMentionedKey: false, held: held(theirs), at: now) == .serve(theirs, markUsed: false))
    }

    @Test("a queued flight whose key got a fresher token is let go without a slot and served")
    func slotWaitEndsWithToken() {
        var flight = RefreshDecision(request: .caller, policy: policy)
        _ = flight.start(held: nil, at: now)
        let theirs = token(age: 1, "theirs")
        #expect(flight.slotWaitEnded(held: held(theirs), at: now) == .serve(theirs, markUsed: false))
        var other = RefreshDecision(request: .caller, policy: policy)
        _ = other.start(held: nil, at: now)
        #expect(other.slotWaitEnded(held: nil, at: now) == .acquireFetchSlot, "no token: queue again")
    }

    @Test("a dead holder's lease is taken over at once, not waited out")
    func deadHolderIsTakenOver() {
        var flight = atLease(start: nil)
        #expect(flight.leaseBusy(holder: "pid-9@m", holderIsDead: true, until: t0.addingTimeInterval(30), current: nil,
                                 held: nil, at: now) == .takeOverLease(from: "pid-9@m"))
        #expect(flight.leaseGranted(current: nil, held: nil, at: now) == .fetch(previous: nil))
    }

    @Test("a fresher token read with the lease is adopted instead of fetched; the lease is then the owner's to release")
    func adoptsWithLease() {
        let old = token(age: 3590)
        var flight = atLease(start: held(old))
        let theirs = token(age: 5, "theirs")
        #expect(flight.leaseGranted(current: TokenEntry(key: key, token: theirs, failure: nil), held: held(old), at: now)
            == .adopt(theirs, failure: nil))
        #expect(flight.adopted(held: held(theirs), at: now) == .serve(theirs, markUsed: false))
        #expect(flight.holdsLease && flight.holdsSlot)
    }

    @Test("a stored token no fresher than the flight's start, or below its floor, is not adopted")
    func staleStoredIsIgnored() {
        let old = token(age: 3590)
        var same = atLease(start: held(old))
        #expect(same.leaseGranted(current: TokenEntry(key: key, token: old, failure: nil), held: held(old), at: now)
            == .fetch(previous: old))
        var belowFloor = atLease(start: nil)
        #expect(belowFloor.leaseGranted(current: TokenEntry(key: key, token: old, failure: nil), held: nil, at: now)
            == .fetch(previous: nil))
    }

    @Test("an adopted token already past its soft point is fetched over, and must be beaten")
    func adoptedButDueIsRefetched() {
        var flight = atLease(.background, start: nil)
        let theirs = token(age: 3000, "theirs")
        #expect(flight.leaseGranted(current: TokenEntry(key: key, token: theirs, failure: nil), held: nil, at: now)
            == .adopt(theirs, failure: nil))
        #expect(flight.adopted(held: held(theirs), at: now) == .fetch(previous: theirs))
    }

    @Test("another process's running backoff is shared, unless ours is newer")
    func failureElsewhere() {
        let theirs = failure(failures: 2, next: 10, at: -1)
        var flight = atLease(start: nil)
        #expect(flight.leaseBusy(holder: "pid-2@m", holderIsDead: false, until: t0.addingTimeInterval(30),
                                 current: TokenEntry(key: key, token: nil, failure: theirs), held: nil, at: now)
            == .failedElsewhere(theirs))
        var known = atLease(start: held(nil, failure: failure(next: -5, at: -1)))
        #expect(known.leaseGranted(current: TokenEntry(key: key, token: nil, failure: failure(next: 10, at: -1)),
                                   held: held(nil, failure: failure(next: -5, at: -1)), at: now) == .fetch(previous: nil),
                "a failure we already know is no news")
        // Ours, read back from the store: its time may differ in the last bits (seconds since 1970).
        let ours = failure(next: -5, at: -1)
        var readBack = ours
        readBack.nextAttemptAt = t0.addingTimeInterval(10)
        readBack.lastFailureAt = Date(timeIntervalSince1970: ours.lastFailureAt.timeIntervalSince1970.nextUp)
        var same = atLease(start: held(nil, failure: ours))
        #expect(same.leaseGranted(current: TokenEntry(key: key, token: nil, failure: readBack), held: held(nil, failure: ours), at: now)
            == .fetch(previous: nil), "our own failure, read back, is no news")
    }

    @Test("a lease store that cannot be asked does not stop the fetch")
    func leaseUnavailable() {
        var flight = atLease(start: nil)
        #expect(flight.leaseUnavailable(held: nil) == .fetch(previous: nil))
        #expect(!flight.holdsLease)
    }

    @Test("shutdown ends a flight anywhere, leaving what it holds for the owner to release")
    func shutdownEndsFlight() {
        var flight = atLease(start: nil)
        _ = flight.leaseGranted(current: nil, held: nil, at: now)
        #expect(flight.shutdown() == .fail(.shuttingDown, nextAttemptAt: nil))
        #expect(flight.holdsSlot && flight.holdsLease && flight.state == .finished)
    }
}
