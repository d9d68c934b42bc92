// Sync layer: every refresh rule of one key, each decided in one function. Pure: no clock
// reads, no I/O, no locks, no tasks. TokenMemory keeps each key's state (a MemoryEntry) and
// applies the machine to it under its lock; the coordinator and the flights (RefreshDecision)
// ask it for everything else and do the I/O its answers name.
import Foundation

/// The refresh rules of one key: soft point, floor, backoff, offline serving, adopting another
/// process's token, invalidation, proactive refresh. Each rule is decided in exactly one
/// function here (the DocC article "How refresh works" lists which); the key's state is a
/// ``MemoryEntry`` and times come in as a ``RefreshMoment``: provider-corrected for expiry, local
/// for backoffs. ``RefreshDecision`` drives one flight through the same functions.
struct RefreshMachine: Sendable {
    let policy: RefreshPolicy

    init(policy: RefreshPolicy) {
        self.policy = policy
    }

    // MARK: - Floor and soft point

    /// Past this (provider-corrected) time `token` is never handed out: its expiry minus the
    /// floor, `min(floorSeconds, floorFraction × lifetime)`.
    func usableUntil(of token: StoredToken) -> Date {
        token.expiresAt.addingTimeInterval(-policy.floor(of: token))
    }

    /// Whether `token` may be handed out at provider-corrected `now`: above its floor.
    func isAboveFloor(_ token: StoredToken, at now: Date) -> Bool {
        now < usableUntil(of: token)
    }

    /// When a refresh of `token` is due: the policy's soft point moved earlier by `jitter`
    /// (0...1), never later than the floor whatever the policy's fractions (the hot path checks
    /// only the soft point).
    func softPoint(of token: StoredToken, jitter: Double) -> Date {
        min(policy.softPoint(of: token, jitter: jitter), usableUntil(of: token))
    }

    /// Whether a token whose soft point is `softPoint` is served at `now` without anything else
    /// to decide. On the hot path: inlined, two dates compared, nothing allocated.
    @inline(__always)
    static func isFresh(softPoint: Date, at now: Date) -> Bool {
        now < softPoint
    }

    /// The state of a key that now holds `token` (fetched, loaded, or adopted): soft point and
    /// floor worked out once here, `failure` kept (with `lastError` only while there is one).
    func installing(_ token: StoredToken, source: TokenSource, failure: RefreshFailureState?,
                    lastError: TokenProviderError?, lastUsed: Date, jitter: Double) -> MemoryEntry {
        MemoryEntry(token: token, source: source, softPoint: softPoint(of: token, jitter: jitter),
                    usableUntil: usableUntil(of: token), failure: failure,
                    lastError: failure == nil ? nil : lastError, lastUsed: lastUsed, refreshRequested: false)
    }

    // MARK: - Caller hit

    /// A caller asked and `entry` is held: a fresh token; a usable one past its soft point, the
    /// first such caller starting the one background refresh (none while backing off, when the
    /// token is served in offline mode); else a miss. Records the use.
    func hit(_ entry: inout MemoryEntry, at now: RefreshMoment) -> MemoryLookup {
        guard let token = entry.token else { return .miss }
        if Self.isFresh(softPoint: entry.softPoint, at: now.corrected) {
            entry.lastUsed = now.corrected
            return .fresh(token)
        }
        guard now.corrected < entry.usableUntil else { return .miss }
        entry.lastUsed = now.corrected
        let inBackoff = isBackingOff(entry.failure, at: now.local)
        let start = !entry.refreshRequested && !inBackoff
        if start { entry.refreshRequested = true }
        return .stale(token, startRefresh: start, offline: inBackoff)
    }

    // MARK: - Offline serving

    /// What a caller whose flight failed gets.
    enum FailedFlightAction: Sendable, Equatable {
        /// The held token, still above its floor (offline mode).
        case serveOffline(StoredToken)
        /// No token: the caller gets ``TokenUnavailable``.
        case unavailable
    }

    /// The held token while it is above the floor, else nil: offline serving, and what
    /// ``TokenSyncEngine/heldToken(for:)`` shows.
    func usableToken(of entry: MemoryEntry?, at now: Date) -> StoredToken? {
        guard let entry, isUsable(entry, at: now) else { return nil }
        return entry.token
    }

    /// Whether `entry` holds a token above the floor at `now`: the rule of
    /// ``usableToken(of:at:)``, without copying the token out (a readiness pass over 100,000
    /// entries retained and released each token for nothing).
    func isUsable(_ entry: MemoryEntry, at now: Date) -> Bool {
        entry.token != nil && now < entry.usableUntil
    }

    /// A caller's flight failed (provider failing, backoff running): serve the held token while it
    /// is above the floor, never past it.
    func flightFailed(held entry: MemoryEntry?, at now: Date) -> FailedFlightAction {
        usableToken(of: entry, at: now).map(FailedFlightAction.serveOffline) ?? .unavailable
    }

    // MARK: - Backoff

    /// Whether fetching must still wait at local `now`.
    ///
    /// A failure recorded up to ``RefreshPolicy/hostClockTolerance`` after `now` was recorded by
    /// a host whose clock is that much ahead of ours (what the lease protocol tolerates), and its
    /// backoff holds. One recorded later means our wall clock was stepped back since: its backoff
    /// was computed on the old clock, and honouring it would stretch it by the size of the step
    /// (an hour's step: an hour without a token). Such a backoff is over; the next attempt, if it
    /// fails, records a failure on the current clock and backs off from there.
    func isBackingOff(_ failure: RefreshFailureState?, at now: Date) -> Bool {
        guard let failure else { return false }
        return failure.nextAttemptAt > now && failure.lastFailureAt <= now.addingTimeInterval(policy.hostClockTolerance)
    }

    /// The failure state after a fetch failed with `error` at local `now`, following `previous`:
    /// the count goes on, the next attempt waits the policy's jittered backoff (or `Retry-After`),
    /// and the failure is bound to `configurationDigest`, the provider configuration that failed.
    func failure(after error: TokenProviderError, following previous: RefreshFailureState?, at now: Date,
                 random: Double, configurationDigest: String?) -> RefreshFailureState {
        let failures = (previous?.consecutiveFailures ?? 0) + 1
        let delay = policy.retryDelay(afterFailures: failures, retryable: error.isRetryable,
                                      retryAfter: error.retryAfter, random: random)
        return RefreshFailureState(consecutiveFailures: failures, nextAttemptAt: now.addingTimeInterval(delay),
                                   lastErrorKind: error.kind, lastErrorMessage: error.description,
                                   lastFailureAt: now, configurationDigest: configurationDigest)
    }

    /// A stored `failure` judged at local `now` under the provider configuration `current`: one
    /// recorded under another configuration (a flag or a file fixed since) keeps its count and
    /// message, but its backoff is over; unknown on either side (a fetcher without a digest, a
    /// failure an older build stored) is not "another": the backoff holds.
    func judged(_ failure: RefreshFailureState?, under current: String?, at now: Date) -> RefreshFailureState? {
        guard var failure, Self.isOfAnotherConfiguration(failure, than: current), failure.nextAttemptAt > now else { return failure }
        failure.nextAttemptAt = now
        return failure
    }

    private static func isOfAnotherConfiguration(_ failure: RefreshFailureState, than current: String?) -> Bool {
        guard let mine = failure.configurationDigest, let current else { return false }
        return mine != current
    }

    /// "Retry now" (an operator fixed something and reloaded): ends `entry`'s running backoff at
    /// local `now`, keeping the failure count. A backoff the provider asked for (`Retry-After`)
    /// is kept, unless it was asked of another configuration than `configurationDigest`, the one
    /// in force. Returns whether it ended one.
    func retryNow(_ entry: inout MemoryEntry, at now: Date, configurationDigest: String?) -> Bool {
        guard var failure = entry.failure, isBackingOff(failure, at: now),
              entry.lastError?.retryAfter == nil || Self.isOfAnotherConfiguration(failure, than: configurationDigest)
        else { return false }
        failure.nextAttemptAt = now
        entry.failure = failure
        return true
    }

    // MARK: - Deadline (proactive refresh)

    /// When `held`'s key is next due (provider-corrected time): now without a token, else the
    /// soft point; never before a running backoff ends.
    func nextRefresh(of held: MemoryEntry?, at now: RefreshMoment) -> Date {
        var due = held?.token == nil ? now.corrected : (held?.softPoint ?? now.corrected)
        if let failure = held?.failure, isBackingOff(failure, at: now.local) {
            // The queue runs on corrected time; backoff is kept in local time.
            let retry = failure.nextAttemptAt.addingTimeInterval(now.corrected.timeIntervalSince(now.local))
            if retry > due { due = retry }
        }
        return due
    }

    /// Whether a key is kept fresh without anyone asking: tracked, or used within the policy's
    /// idle window. An idle untracked key (a finished trip) stops costing fetches.
    func wantsProactiveRefresh(tracked: Bool, held: MemoryEntry?, at now: Date) -> Bool {
        if tracked { return true }
        guard let lastUsed = held?.lastUsed else { return false }
        return now.timeIntervalSince(lastUsed) < policy.idleWindow
    }

    // MARK: - Another process's token

    /// Whether `token`, stored by another process, replaces `mine` at provider-corrected `now`:
    /// a different token that expires later (a slow writer's older token must not replace a newer
    /// one) and is above its floor (a token that may not be handed out is no reason to stop).
    /// The one adoption rule: a flight compares with the token it started from, the change
    /// follower and the install with the one memory holds.
    func adopts(_ token: StoredToken, over mine: StoredToken?, at now: Date) -> Bool {
        token.value != mine?.value && token.expiresAt > (mine?.expiresAt ?? .distantPast) && isAboveFloor(token, at: now)
    }

    /// Whether `token`, read from the store, replaces what the key's `state` holds at
    /// provider-corrected `now`: never while the key's invalidation waits for the store (the
    /// stored token is then the invalidated one), else as ``adopts(_:over:at:)`` says.
    func adopts(_ token: StoredToken, into state: KeyRefreshState, at now: Date) -> Bool {
        !state.invalidationPending && adopts(token, over: state.held?.token, at: now)
    }

    /// What memory does with a key's stored entry read because it held nothing of the key.
    enum LoadAction: Sendable, Equatable {
        /// Memory already holds the key (a flight or the change follower was first): keep it.
        case keep
        /// Hold the stored token, with the stored failure.
        case install(StoredToken, failure: RefreshFailureState?)
        /// Hold no token, keeping the stored failure, so a miss does not read the store again.
        case empty(failure: RefreshFailureState?)
    }

    /// What the key's `stored` entry (nil: no row) becomes in memory when its `state` holds no
    /// entry: its token while above the floor at provider-corrected `now`, unless the key's
    /// invalidation waits for the store (the stored token is the invalidated one); else no
    /// token, keeping the stored failure.
    func loaded(_ stored: TokenEntry?, into state: KeyRefreshState, at now: Date) -> LoadAction {
        guard state.held == nil else { return .keep }
        if let token = stored?.token, isAboveFloor(token, at: now), !state.invalidationPending {
            return .install(token, failure: stored?.failure)
        }
        return .empty(failure: stored?.failure)
    }

    /// What another process's change to the store means for a key held in memory.
    enum StoreChange: Sendable, Equatable {
        /// Install the stored token (it is newer than memory's).
        case adopt(StoredToken, failure: RefreshFailureState?)
        /// Another process removed the token: hold none, keeping `failure` (a purge keeps the
        /// backoff; a deleted row took it along, on purpose).
        case removed(failure: RefreshFailureState?)
        /// Nothing to do.
        case none
    }

    /// What the store's `stored` entry (nil: no row) means for the `held` entry after another
    /// process changed the key. A token of ours still waiting for its group commit is not a
    /// removal.
    func storeChanged(held: MemoryEntry, stored: TokenEntry?, commitPending: Bool, at now: Date) -> StoreChange {
        if let token = stored?.token {
            return adopts(token, over: held.token, at: now) ? .adopt(token, failure: stored?.failure) : .none
        }
        // Another process wrote a value this one cannot read (another key, or none): not a
        // removal, or two such processes would refetch after each other's every write.
        if stored?.tokenUnreadable == true { return .none }
        guard held.token != nil, !commitPending else { return .none }
        return .removed(failure: stored.map { Self.newer($0.failure, held.failure) } ?? nil)
    }

    /// The later-recorded of two failure states.
    static func newer(_ a: RefreshFailureState?, _ b: RefreshFailureState?) -> RefreshFailureState? {
        guard let a, let b else { return a ?? b }
        return a.lastFailureAt >= b.lastFailureAt ? a : b
    }

    // MARK: - Invalidate

    /// What `invalidate(key)` does to memory.
    enum InvalidateAction: Sendable, Equatable {
        /// Drop the token, keeping `failure`: invalidating must not become a way around a backoff.
        case dropToken(keeping: RefreshFailureState?)
        /// Create nothing: callers could otherwise grow memory with ids nobody uses.
        case nothingHeld
    }

    /// Fleet Engine rejected the key's token: the next call fetches. A key neither held nor
    /// tracked gets no entry.
    func invalidate(held: MemoryEntry?, tracked: Bool) -> InvalidateAction {
        if let held { return .dropToken(keeping: held.failure) }
        return tracked ? .dropToken(keeping: nil) : .nothingHeld
    }

    // MARK: - Status

    /// How `entry` stands at `now`, and whether its token may be handed out.
    func standing(of entry: MemoryEntry, at now: RefreshMoment) -> (state: SubjectStatus.State, usable: Bool) {
        let usable = isUsable(entry, at: now.corrected)
        if isBackingOff(entry.failure, at: now.local) { return (.backoff, usable) }
        guard usable else { return (.unavailable, false) }
        return (Self.isFresh(softPoint: entry.softPoint, at: now.corrected) ? .valid : .refreshDue, true)
    }
}
