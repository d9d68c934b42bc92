// Model layer: how an entry stands at a given time, as `tokenctl list` shows it.

package import Foundation

/// How an entry stands at a given time, as `tokenctl list` shows it.
public enum TokenStatus: String, Sendable, Hashable, CaseIterable, Codable {
    /// A token before its soft refresh point.
    case valid
    /// A token past its soft point: still handed out, a refresh is due.
    case refreshDue = "refresh_due"
    /// A token at or past its expiry: never handed out.
    case expired
    /// Refreshes are failing and the next attempt is in the future (or there is no token yet).
    case backoff

    /// Works out the status. Expired wins (the token is unusable whatever else holds), then
    /// backoff (an operator must see failing refreshes), then the soft point.
    package init(token: StoredToken?, failure: RefreshFailureState?, at now: Date, policy: RefreshPolicy) {
        guard let token else {
            self = .backoff
            return
        }
        if now >= token.expiresAt {
            self = .expired
        } else if let failure, failure.consecutiveFailures > 0, failure.nextAttemptAt > now {
            self = .backoff
        } else if now >= policy.softPoint(of: token, jitter: 0) {
            self = .refreshDue
        } else {
            self = .valid
        }
    }
}
