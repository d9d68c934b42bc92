// Service layer: the token API's policy of at most one forced refetch per key per interval.

import FleetTokenStore
import Foundation
import Synchronization

/// Limits `POST /v1/invalidate` to one forced fetch per key per ``interval``, so a client that
/// loops on a rejected token cannot turn the agent into a fetch loop against the provider.
final class InvalidationLimiter: Sendable {
    /// What the limiter decided.
    enum Decision: Sendable, Equatable {
        /// Invalidate now.
        case allowed
        /// Refused: the last forced fetch of the key was less than an interval ago; retry after this many seconds.
        case limited(retryAfter: TimeInterval)
    }

    /// The shortest time between two forced fetches of one key.
    let interval: TimeInterval
    private let last = Mutex<[TokenKey: ContinuousClock.Instant]>([:])

    /// A limiter allowing one invalidation per key per `interval` seconds.
    init(interval: TimeInterval) {
        self.interval = interval
    }

    /// Decides for `key` at `now` (monotonic, so a wall-clock step neither blocks nor frees a
    /// key), recording an allowed invalidation.
    func admit(_ key: TokenKey, now: ContinuousClock.Instant) -> Decision {
        last.withLock { last in
            if let previous = last[key] {
                let elapsed = Self.seconds(now - previous)
                if elapsed < interval { return .limited(retryAfter: interval - elapsed) }
            }
            last[key] = now
            // Bounded memory: entries older than the interval decide nothing any more.
            if last.count > 4096 { last = last.filter { Self.seconds(now - $0.value) < interval } }
            return .allowed
        }
    }

    private static func seconds(_ duration: Duration) -> TimeInterval {
        let (seconds, attoseconds) = duration.components
        return TimeInterval(seconds) + TimeInterval(attoseconds) / 1e18
    }
}
