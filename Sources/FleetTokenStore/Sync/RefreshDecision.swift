// Sync layer: the steps of one key's refresh flight. Events in, actions out; no I/O, no clock
// reads, no tasks. The rules it applies (soft point, floor, backoff, adoption) are
// RefreshMachine's; `RefreshFlight` owns one per flight and does what it says.
import Foundation

/// When an event happens: the provider-corrected time that expiry is judged by, and the local
/// wall-clock time that backoffs and leases are kept in (they coordinate this machine's
/// processes, whose estimates of the provider's clock may differ).
struct RefreshMoment: Sendable, Equatable {
    var corrected: Date
    var local: Date

    init(corrected: Date, local: Date) {
        self.corrected = corrected
        self.local = local
    }
}

/// One flight for one key, from "a caller asked" to a token or a failure: whether the held
/// token will do, when to queue for a fetch slot, take the cross-process lease, adopt what
/// another process stored, wait for another process's fetch, fetch, and back off.
///
/// The owner reports each event with the key's memory entry as it is at that moment and
/// performs the returned action, which names the next event it must report. The flight holds a
/// fetch slot and the key's lease at the points ``holdsSlot`` and ``holdsLease`` say; whatever
/// is still held when a terminal action comes is the owner's to release after it has done that
/// action's I/O (a failure is stored before the lease goes, so a waiting process finds it).
/// Every rule it applies is decided by ``RefreshMachine``; this type only orders the steps.
struct RefreshDecision: Sendable {
    /// Who started the flight.
    enum Request: Sendable, Equatable {
        /// A caller waits. A usable token past its soft point is served at once and refreshed
        /// in the background.
        case caller
        /// A caller wants a token before its soft point (one-shot runs): one fetch attempt
        /// unless backing off.
        case callerWantsFresh
        /// The scheduler, or a hit past the soft point: nobody waits.
        case background

        var isCaller: Bool { self != .background }
    }

    /// What the owner does next.
    enum Action: Sendable, Equatable {
        /// Terminal: hand `token` out; `markUsed` when a caller asked.
        case serve(StoredToken, markUsed: Bool)
        /// Terminal: hand `token` out now and start a background flight for the key.
        case serveAndRefreshInBackground(StoredToken)
        /// Terminal: no token (the owner may still serve a held one in offline mode).
        case fail(TokenUnavailable.Reason, nextAttemptAt: Date?)
        /// Queue for a fetch slot, then report ``slotGranted(held:at:)`` or, when woken
        /// without one, ``slotWaitEnded(held:at:)``.
        case acquireFetchSlot
        /// Ask for the key's lease, then report ``leaseGranted(current:held:at:)``,
        /// ``leaseBusy(holder:holderIsDead:until:current:held:at:)`` or ``leaseUnavailable(held:)``.
        case takeLease
        /// The lease's holder is a dead process of this machine: take the lease over from it
        /// (only if it still holds it), then report as for ``takeLease``.
        case takeOverLease(from: String)
        /// Install another process's `token` unless memory holds it or a newer one, then report
        /// ``adopted(held:at:)``.
        case adopt(StoredToken, failure: RefreshFailureState?)
        /// Terminal: another process's fetch failed and its backoff runs; record `failure` in
        /// memory and end failed until its next attempt.
        case failedElsewhere(RefreshFailureState)
        /// Release the fetch slot and wait, at most `seconds`, for the change feed to mention
        /// the key; then report ``holderWaitEnded(feedMentionedKey:held:at:)``.
        case waitForHolder(seconds: TimeInterval)
        /// Read the key's stored entry, then report ``storedEntryRead(_:held:at:)``.
        case readStoredEntry
        /// Fetch from the provider (renewing the lease when held), release the fetch slot,
        /// validate against `previous`, then report ``fetchSucceeded(_:)`` or
        /// ``fetchFailed(_:held:at:random:)``.
        case fetch(previous: StoredToken?)
        /// Terminal: install, persist and hand out the refreshed token; `markUsed` when a caller
        /// asked. The lease passes to the group commit, which releases it once the token is stored.
        case accept(StoredToken, markUsed: Bool)
        /// Terminal: record `failure` in memory and the store, then release the lease.
        case backOff(RefreshFailureState, TokenProviderError)
    }

    /// Where the flight is.
    enum State: Sendable, Equatable {
        case idle
        case queuedForSlot
        case askingForLease
        // Indirect: the entry is large inline and a flight is rare, yet every key's state has room
        // for one (the enum's size is its largest case's).
        indirect case adopting(stored: TokenEntry?, then: AfterAdoption)
        case waitingForHolder(until: Date)
        case readingStore(until: Date)
        case fetching
        case finished
    }

    /// What follows an adoption that did not end the flight.
    enum AfterAdoption: Sendable, Equatable {
        case fetch
        case waitForHolder(until: Date)
    }

    /// Longest wait on another process's lease between checks that its holder is alive and
    /// the lease not given up without a result (which leave no trace in the change feed).
    static let leaseCheckInterval: TimeInterval = 1

    /// Our own failure read back from the store may differ from memory's copy in the last bits
    /// of its time (stored as seconds since 1970): it is the same failure, not another process's.
    static let sameFailureTolerance: TimeInterval = 0.001

    let request: Request
    let policy: RefreshPolicy
    /// Decides the rules (soft point, floor, backoff, adoption); this type only sequences them.
    private let machine: RefreshMachine
    private(set) var state: State = .idle
    /// The token held when the flight began: any token fresher than it ends the flight.
    private(set) var startedFrom: StoredToken?
    /// Whether the flight holds a fetch slot.
    private(set) var holdsSlot = false
    /// Whether the flight holds the key's lease.
    private(set) var holdsLease = false

    init(request: Request, policy: RefreshPolicy) {
        self.request = request
        self.policy = policy
        self.machine = RefreshMachine(policy: policy)
    }

    // MARK: - Events

    /// A caller or the scheduler asked, with the key's entry loaded from the store if it was
    /// not in memory.
    mutating func start(held: MemoryEntry?, at now: RefreshMoment) -> Action {
        precondition(state == .idle, "a flight starts once")
        if let held, let token = held.token {
            if RefreshMachine.isFresh(softPoint: held.softPoint, at: now.corrected) {
                return finish(.serve(token, markUsed: request.isCaller))
            }
            if request == .caller, let usable = machine.usableToken(of: held, at: now.corrected) {
                return finish(.serveAndRefreshInBackground(usable))
            }
        }
        if let failure = held?.failure, machine.isBackingOff(failure, at: now.local) {
            let error = held?.lastError ?? Self.persistedError(failure)
            return finish(.fail(.provider(error), nextAttemptAt: failure.nextAttemptAt))
        }
        startedFrom = held?.token
        return queueForSlot(held: held, at: now)
    }

    /// A fetch slot was granted.
    mutating func slotGranted(held: MemoryEntry?, at now: RefreshMoment) -> Action {
        precondition(state == .queuedForSlot, "a slot is granted to a queued flight")
        holdsSlot = true
        // The slot before the lease: a lease must not age while its key queues.
        state = .askingForLease
        return .takeLease
    }

    /// The slot wait ended without a slot: a fresher token arrived meanwhile.
    mutating func slotWaitEnded(held: MemoryEntry?, at now: RefreshMoment) -> Action {
        precondition(state == .queuedForSlot, "only a queued flight waits for a slot")
        return queueForSlot(held: held, at: now)
    }

    /// The flight holds the lease; `current` is the key's entry read in the same transaction.
    mutating func leaseGranted(current: TokenEntry?, held: MemoryEntry?, at now: RefreshMoment) -> Action {
        precondition(state == .askingForLease, "a lease is granted to a flight that asked")
        holdsLease = true
        return consider(stored: current, held: held, at: now, then: .fetch)
    }

    /// Another holder has the lease until `until` (local time).
    mutating func leaseBusy(holder: String, holderIsDead: Bool, until: Date, current: TokenEntry?,
                            held: MemoryEntry?, at now: RefreshMoment) -> Action {
        precondition(state == .askingForLease, "a lease is refused to a flight that asked")
        // A holder killed mid-fetch would keep others waiting for the whole lease.
        if holderIsDead { return .takeOverLease(from: holder) }
        return consider(stored: current, held: held, at: now, then: .waitForHolder(until: until))
    }

    /// The lease store could not be asked: fetch without the lease rather than not at all.
    mutating func leaseUnavailable(held: MemoryEntry?) -> Action {
        precondition(state == .askingForLease, "only a flight that asked for the lease can miss it")
        state = .fetching
        return .fetch(previous: held?.token)
    }

    /// Another process's token was offered to memory (installed if it was newer).
    mutating func adopted(held: MemoryEntry?, at now: RefreshMoment) -> Action {
        guard case .adopting(let stored, let next) = state else { preconditionFailure("adopted without an adoption") }
        if let token = fresherHeld(held, at: now) { return finish(.serve(token, markUsed: false)) }
        return afterAdoption(stored: stored, held: held, at: now, then: next)
    }

    /// The wait for another process's fetch ended: the feed mentioned the key, or the check
    /// interval passed (or the feed ended, which is no signal either way).
    mutating func holderWaitEnded(feedMentionedKey: Bool, held: MemoryEntry?, at now: RefreshMoment) -> Action {
        guard case .waitingForHolder(let until) = state else { preconditionFailure("no wait to end") }
        if let token = fresherHeld(held, at: now) { return finish(.serve(token, markUsed: false)) }
        // Without news, try the lease again: it finds a holder that died or gave up.
        guard feedMentionedKey else { return queueForSlot(held: held, at: now) }
        state = .readingStore(until: until)
        return .readStoredEntry
    }

    /// The key's stored entry after the feed mentioned it (nil when absent or unreadable).
    mutating func storedEntryRead(_ stored: TokenEntry?, held: MemoryEntry?, at now: RefreshMoment) -> Action {
        guard case .readingStore(let until) = state else { preconditionFailure("no store read was asked for") }
        return consider(stored: stored, held: held, at: now, then: .waitForHolder(until: until))
    }

    /// The provider's token passed validation.
    mutating func fetchSucceeded(_ token: StoredToken) -> Action {
        precondition(state == .fetching, "only a fetching flight succeeds")
        holdsSlot = false
        let action = finish(.accept(token, markUsed: request.isCaller))
        holdsLease = false // handed to the group commit
        return action
    }

    /// The fetch failed, or its token failed validation. `random` (0...1) jitters the backoff;
    /// the failure is bound to `configurationDigest`, the fetcher's configuration that failed.
    mutating func fetchFailed(_ error: TokenProviderError, held: MemoryEntry?, at now: RefreshMoment,
                              random: Double, configurationDigest: String? = nil) -> Action {
        precondition(state == .fetching, "only a fetching flight fails")
        holdsSlot = false
        let failure = machine.failure(after: error, following: held?.failure, at: now.local, random: random,
                                      configurationDigest: configurationDigest)
        return finish(.backOff(failure, error))
    }

    /// The engine is shutting down (or the flight was cancelled).
    mutating func shutdown() -> Action {
        finish(.fail(.shuttingDown, nextAttemptAt: nil))
    }

    // MARK: - Rules

    /// Whether `held` would end the flight at once (a fresher token than it started from, before
    /// its soft point): a flight about to queue for a slot asks this in the same step.
    func isServed(by held: MemoryEntry?, at now: RefreshMoment) -> Bool {
        fresherHeld(held, at: now) != nil
    }

    private mutating func queueForSlot(held: MemoryEntry?, at now: RefreshMoment) -> Action {
        if let token = fresherHeld(held, at: now) { return finish(.serve(token, markUsed: false)) }
        state = .queuedForSlot
        return .acquireFetchSlot
    }

    /// What another process stored, as read with (or instead of) the lease.
    private mutating func consider(stored: TokenEntry?, held: MemoryEntry?, at now: RefreshMoment,
                                   then next: AfterAdoption) -> Action {
        if let token = stored?.token, machine.adopts(token, over: startedFrom, at: now.corrected) {
            state = .adopting(stored: stored, then: next)
            return .adopt(token, failure: stored?.failure)
        }
        return afterAdoption(stored: stored, held: held, at: now, then: next)
    }

    private mutating func afterAdoption(stored: TokenEntry?, held: MemoryEntry?, at now: RefreshMoment,
                                        then next: AfterAdoption) -> Action {
        // Another process failed after we last did, and its backoff runs: share it.
        if let failure = stored?.failure, machine.isBackingOff(failure, at: now.local),
           failure.lastFailureAt.timeIntervalSince(held?.failure?.lastFailureAt ?? .distantPast) > Self.sameFailureTolerance {
            return finish(.failedElsewhere(failure))
        }
        switch next {
        case .fetch:
            // What memory holds now, not when the flight began: another process may have stored
            // a newer token, which the new one must beat.
            state = .fetching
            return .fetch(previous: held?.token)
        case .waitForHolder(let until):
            holdsSlot = false
            let limit = min(Self.leaseCheckInterval, until.timeIntervalSince(now.local))
            guard limit > 0 else { return queueForSlot(held: held, at: now) }
            state = .waitingForHolder(until: until)
            return .waitForHolder(seconds: limit)
        }
    }

    /// The token held for the key when it is fresher than the one the flight started from and
    /// before its soft point: whoever installed it (a fetch, the change follower, a lease wait),
    /// the flight is over.
    private func fresherHeld(_ held: MemoryEntry?, at now: RefreshMoment) -> StoredToken? {
        guard let held, let token = held.token, RefreshMachine.isFresh(softPoint: held.softPoint, at: now.corrected),
              token.expiresAt > (startedFrom?.expiresAt ?? .distantPast) else { return nil }
        return token
    }

    private mutating func finish(_ action: Action) -> Action {
        state = .finished
        return action
    }

    /// The error reported for a failure known only from the store (another process's, or an
    /// earlier run's).
    static func persistedError(_ failure: RefreshFailureState) -> TokenProviderError {
        .other(detail: failure.lastErrorMessage ?? failure.lastErrorKind)
    }
}
