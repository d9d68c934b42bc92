// Sync layer: what the engine holds for one subject, for status pages and readiness checks.

package import Foundation
import Synchronization

/// What the engine holds for one subject, for status pages and readiness checks: never the
/// token value. Read from memory only (no I/O).
package struct SubjectStatus: Sendable, Equatable {
    /// How the subject stands.
    package enum State: String, Sendable, Equatable {
        /// A token before its soft point.
        case valid
        /// A usable token past its soft point: a refresh is due or running.
        case refreshDue = "refresh_due"
        /// Refreshes are failing and the next attempt waits; a usable token may still be held.
        case backoff
        /// No usable token (none fetched yet, or the held one is below the floor).
        case unavailable
    }

    /// The subject.
    package let key: TokenKey
    /// Kept fresh proactively (``TokenSyncEngine/track(_:)``), not only while used.
    package let tracked: Bool
    /// How it stands now.
    package let state: State
    /// The held token's expiry, if one is held.
    package let expiresAt: Date?
    /// The held token's fingerprint, if one is held.
    package let fingerprint: TokenFingerprint?
    /// Where the held token came from.
    package let source: TokenSource?
    /// The failure state while refreshes fail.
    package let failure: RefreshFailureState?

    /// Creates a status (the engine makes them; package-wide for tests and the token API).
    package init(key: TokenKey, tracked: Bool, state: State, expiresAt: Date?, fingerprint: TokenFingerprint?,
                source: TokenSource?, failure: RefreshFailureState?) {
        self.key = key
        self.tracked = tracked
        self.state = state
        self.expiresAt = expiresAt
        self.fingerprint = fingerprint
        self.source = source
        self.failure = failure
    }

    /// True when a token can be handed out now (one above the floor is held).
    package var isUsable: Bool { expiresAt != nil }
}

extension TokenMemory {
    /// The status of `key` at `localNow`, or nil when memory holds nothing for it.
    func status(_ key: TokenKey, tracked: Bool, localNow: Date) -> SubjectStatus? {
        state.withLock { state in
            guard let entry = state[entry: key] else { return nil }
            let now = RefreshMoment(corrected: localNow.addingTimeInterval(state.clockOffset), local: localNow)
            let (condition, usable) = machine.standing(of: entry, at: now)
            let token = usable ? entry.token : nil
            return SubjectStatus(key: key, tracked: tracked, state: condition, expiresAt: token?.expiresAt,
                                 fingerprint: token?.fingerprint, source: token == nil ? nil : entry.source, failure: entry.failure)
        }
    }
}
