// Model layer: the rules the sync engine follows to reuse, refresh and retry tokens, and the
// arithmetic that applies them (internal: the engine's, not an API).

public import Foundation

/// The rules the sync engine follows to reuse, refresh and retry tokens. Every value is
/// configurable; the defaults suit Fleet Engine's one-hour tokens.
///
/// - Soft point: `softPointFraction` of the lifetime, minus a random jitter of up to
///   `softPointJitterFraction` of it. Past it, callers still get the token and one background
///   refresh starts.
/// - Floor: a token with less than `min(floorSeconds, floorFraction × lifetime)` left is never
///   handed out.
/// - Backoff: `backoffBase`, doubling per consecutive failure, capped at `backoffCap`, with
///   "equal jitter" (never less than half the nominal delay). Answers that will not improve by
///   retrying (4xx other than 408/429, invalid tokens) start at `nonRetryableBackoffBase`.
public struct RefreshPolicy: Sendable, Equatable {
    /// Fraction of the lifetime after which a refresh is due. Default 0.8.
    public var softPointFraction: Double = 0.8
    /// Largest random advance of the soft point, as a fraction of the lifetime. Default 0.05.
    public var softPointJitterFraction: Double = 0.05
    /// The floor's absolute part: never hand out a token with less than this left. Default 30 s.
    public var floorSeconds: TimeInterval = 30
    /// The floor's relative part, for short-lived tokens. Default 0.1 of the lifetime.
    public var floorFraction: Double = 0.1
    /// First retry delay after a failure. Default 1 s.
    public var backoffBase: TimeInterval = 1
    /// Longest retry delay. Default 300 s.
    public var backoffCap: TimeInterval = 300
    /// First retry delay after a non-retryable answer. Default 30 s.
    public var nonRetryableBackoffBase: TimeInterval = 30
    /// Longest accepted `exp − iat`: Fleet Engine rejects more than one hour. Default 3600 s.
    public var maximumLifetime: TimeInterval = 3600
    /// Tolerance on top of ``maximumLifetime`` and on `iat` in the future. Default 60 s.
    public var lifetimeTolerance: TimeInterval = 60
    /// A key used within this window is refreshed proactively even if not tracked. Default 600 s.
    public var idleWindow: TimeInterval = 600
    /// Most fetches in flight at once across all keys. Default 8.
    public var maxConcurrentFetches: Int = 8
    /// Offsets to the provider's clock larger than this are corrected for. Default 60 s.
    public var clockSkewThreshold: TimeInterval = 60
    /// How long a cross-process refresh lease lasts before others may take over. Default 30 s.
    public var leaseDuration: TimeInterval = 30
    /// Accept tokens that are not JWTs (the provider must then state the expiry), and JWTs
    /// without `iat` or the `authorization` claim (their lifetime or subject is then not
    /// checked). Default false.
    public var allowOpaqueTokens: Bool = false
    /// Rows of subjects this engine neither tracks nor holds, whose token expired (and whose
    /// last failure happened) longer ago than this, are deleted while ``TokenSyncEngine/run()``
    /// runs, so finished trips do not grow the store without bound. 0 keeps everything.
    /// Default 24 h.
    public var retention: TimeInterval = 86_400

    /// The default policy.
    public init() {}

    /// The time after which `token` should be refreshed: `softPointFraction` of its lifetime,
    /// moved earlier by `jitter` (0...1) × `softPointJitterFraction` of its lifetime.
    func softPoint(of token: StoredToken, jitter: Double) -> Date {
        let start = token.issuedAt ?? token.fetchedAt
        let lifetime = token.lifetime
        let fraction = softPointFraction - min(max(jitter, 0), 1) * softPointJitterFraction
        return start.addingTimeInterval(lifetime * max(0, fraction))
    }

    /// Seconds of remaining life under which `token` is never handed out.
    func floor(of token: StoredToken) -> TimeInterval {
        min(floorSeconds, floorFraction * token.lifetime)
    }

    /// How far apart the wall clocks of hosts sharing a store may be: what the lease protocol
    /// tolerates (a lease renewed every third of ``leaseDuration`` stays live for a host whose
    /// clock is up to two thirds of it ahead of the holder's; 20 s by default). A failure
    /// recorded up to this far after our "now" is another host's, and its backoff holds.
    var hostClockTolerance: TimeInterval { leaseDuration * 2 / 3 }

    /// The nominal delay before retry number `failures` (1 = first failure), before jitter.
    func nominalBackoff(afterFailures failures: Int, retryable: Bool) -> TimeInterval {
        let base = retryable ? backoffBase : max(backoffBase, nonRetryableBackoffBase)
        let exponent = Double(min(max(failures - 1, 0), 62))
        return min(backoffCap, base * pow(2, exponent))
    }

    /// The delay with equal jitter: half the nominal delay plus a random part up to the other
    /// half, so the random part never shortens it below half. `random` is in 0...1.
    func jitteredBackoff(afterFailures failures: Int, retryable: Bool, random: Double) -> TimeInterval {
        let nominal = nominalBackoff(afterFailures: failures, retryable: retryable)
        return nominal / 2 + nominal / 2 * min(max(random, 0), 1)
    }

    /// Longest `Retry-After` honoured, so a hostile or broken header cannot stop refreshes for days.
    static let maximumRetryAfter: TimeInterval = 3600

    /// The delay before the next attempt after `failures` failures in a row: the jittered
    /// backoff, or the provider's `Retry-After` (up to ``maximumRetryAfter``) when longer.
    func retryDelay(afterFailures failures: Int, retryable: Bool, retryAfter: TimeInterval?,
                    random: Double) -> TimeInterval {
        let delay = jitteredBackoff(afterFailures: failures, retryable: retryable, random: random)
        guard let retryAfter else { return delay }
        return max(delay, min(retryAfter, Self.maximumRetryAfter))
    }
}
