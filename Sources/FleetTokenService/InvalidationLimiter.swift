// Service layer: the token API's policy of at most one forced refetch per key per interval.

package import FleetTokenStore
package import Foundation
import Synchronization

/// Limits `POST /v1/invalidate` to one forced fetch per key per ``interval``, so a client that
/// loops on a rejected token cannot turn the agent into a fetch loop against the provider.
package final class InvalidationLimiter: Sendable {
    /// What the limiter decided.
    package enum Decision: Sendable, Equatable {
        /// Invalidate now.
        case allowed
        /// Refused: the last forced fetch of the key was less than an interval ago; retry after this many seconds.
        case limited(retryAfter: TimeInterval)
    }

    /// The shortest time between two forced fetches of one key.
    package let interval: TimeInterval
    private let state = Mutex(Recent())

    /// The invalidations of the last interval: by key, and in the order they were allowed
    /// (which is the order of their times, as the clock is monotonic), so expired ones are
    /// dropped from the front, a few per call, and no call walks the whole table.
    private struct Recent {
        var last: [TokenKey: ContinuousClock.Instant] = [:]
        var order: [(key: TokenKey, at: ContinuousClock.Instant)] = []
        var head = 0

        /// Drops up to `budget` of the oldest invalidations made `interval` or more before
        /// `now`; gives the storage back once the tables are empty (neither a dictionary nor an
        /// array grows smaller by removal), or compacts the order when most of it is dropped.
        mutating func forget(olderThan interval: TimeInterval, at now: ContinuousClock.Instant, atMost budget: Int) {
            var dropped = 0
            while dropped < budget, head < order.count {
                let oldest = order[head]
                guard InvalidationLimiter.seconds(now - oldest.at) >= interval else { break }
                if last[oldest.key] == oldest.at { last.removeValue(forKey: oldest.key) }
                head += 1
                dropped += 1
            }
            if head == order.count {
                // Emptied: the tables keep the capacity of the largest burst they held (and
                // removal never shrinks them), so a burst's storage goes back now.
                if order.capacity > 1024 || last.capacity > 1024 {
                    self = Recent()
                } else if head > 0 {
                    order.removeAll(keepingCapacity: true)
                    head = 0
                }
            } else if head > 1024 && head * 2 > order.count {
                order.removeFirst(head)
                head = 0
            }
        }
    }

    /// A limiter allowing one invalidation per key per `interval` seconds.
    init(interval: TimeInterval) {
        self.interval = interval
    }

    /// Decides for `key` at `now` (monotonic, so a wall-clock step neither blocks nor frees a
    /// key), recording an allowed invalidation. Amortized constant time, however many keys it
    /// remembers.
    package func admit(_ key: TokenKey, now: ContinuousClock.Instant) -> Decision {
        state.withLock { recent in
            // Each call drops at most two expired entries: amortized, every entry is dropped
            // once, and the table holds at most the keys of the last interval (plus a few).
            recent.forget(olderThan: interval, at: now, atMost: 2)
            if let previous = recent.last[key] {
                let elapsed = Self.seconds(now - previous)
                if elapsed < interval { return .limited(retryAfter: interval - elapsed) }
            }
            recent.last[key] = now
            recent.order.append((key, now))
            return .allowed
        }
    }

    /// Drops up to `budget` invalidations older than the interval, and gives the table's
    /// storage back once it is empty after a burst: called by the API's other routes, so that
    /// a burst of invalidations is forgotten even when no invalidation follows it.
    package func sweep(now: ContinuousClock.Instant, budget: Int = 64) {
        state.withLock { $0.forget(olderThan: interval, at: now, atMost: budget) }
    }

    /// Sweeps once a second until cancelled, so a burst of invalidations is forgotten once its
    /// interval has passed even when no request follows it (the routes' own sweeps only run
    /// when requests come). A sweep with nothing to drop is a lock and one comparison.
    func sweepUntilCancelled() async {
        while true {
            do { try await Task.sleep(for: .seconds(1)) } catch { return }
            sweep(now: .now, budget: 4096)
        }
    }

    /// How many keys the limiter remembers (for tests of its bound).
    var rememberedCount: Int { state.withLock { $0.last.count } }

    /// How many entries the limiter's tables have room for (for tests that storage comes back).
    var storageCapacity: Int { state.withLock { $0.last.capacity + $0.order.capacity } }

    fileprivate static func seconds(_ duration: Duration) -> TimeInterval {
        let (seconds, attoseconds) = duration.components
        return TimeInterval(seconds) + TimeInterval(attoseconds) / 1e18
    }
}
