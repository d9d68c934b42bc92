// Sync layer: the pure rules outside a single flight: when a key is due, whether it is still
// worth refreshing, what a store read or another process's change means for memory.
import Foundation

/// Plain-value rules for keys between flights (``RefreshDecision`` holds those of a flight):
/// the scheduler, the store loader and the change follower ask them; none reads a clock.
enum RefreshRules {
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

    /// When `held`'s key is next due (provider-corrected time): now without a usable token,
    /// else the soft point; never before a running backoff ends (judged across host clocks
    /// differing by up to `hostClockTolerance`).
    static func nextRefresh(of held: MemoryEntry?, at now: RefreshMoment, hostClockTolerance: TimeInterval) -> Date {
        var due = held?.token == nil ? now.corrected : (held?.softPoint ?? now.corrected)
        if let failure = held?.failure, failure.isBackingOff(at: now.local, hostClockTolerance: hostClockTolerance) {
            // The queue runs on corrected time; backoff is kept in local time.
            let retry = failure.nextAttemptAt.addingTimeInterval(now.corrected.timeIntervalSince(now.local))
            if retry > due { due = retry }
        }
        return due
    }

    /// Whether a key is kept fresh without anyone asking: tracked, or used within the policy's
    /// idle window. An idle untracked key (a finished trip) stops costing fetches.
    static func wantsProactiveRefresh(tracked: Bool, held: MemoryEntry?, at corrected: Date, policy: RefreshPolicy) -> Bool {
        if tracked { return true }
        guard let lastUsed = held?.lastUsed else { return false }
        return corrected.timeIntervalSince(lastUsed) < policy.idleWindow
    }

    /// Whether a stored token may be served after loading it: above its floor.
    static func isUsable(_ token: StoredToken, at corrected: Date, policy: RefreshPolicy) -> Bool {
        corrected < token.expiresAt.addingTimeInterval(-policy.floor(of: token))
    }

    /// Whether `token`, stored by another process, should replace `mine`: a different token
    /// that expires later (a slow writer's older token must not replace a newer one).
    static func shouldAdopt(_ token: StoredToken, over mine: StoredToken?) -> Bool {
        token.value != mine?.value && token.expiresAt > (mine?.expiresAt ?? .distantPast)
    }

    /// What the store's `stored` entry (nil: no row) means for the `held` entry after another
    /// process changed the key. A token of ours still waiting for its group commit is not a
    /// removal.
    static func storeChanged(held: MemoryEntry, stored: TokenEntry?, commitPending: Bool) -> StoreChange {
        if let token = stored?.token {
            return shouldAdopt(token, over: held.token) ? .adopt(token, failure: stored?.failure) : .none
        }
        // Another process wrote a value this one cannot read (another key, or none): not a
        // removal, or two such processes would refetch after each other's every write.
        if stored?.tokenUnreadable == true { return .none }
        guard held.token != nil, !commitPending else { return .none }
        return .removed(failure: stored.map { newer($0.failure, held.failure) } ?? nil)
    }

    /// The later-recorded of two failure states.
    static func newer(_ a: RefreshFailureState?, _ b: RefreshFailureState?) -> RefreshFailureState? {
        guard let a, let b else { return a ?? b }
        return a.lastFailureAt >= b.lastFailureAt ? a : b
    }
}
