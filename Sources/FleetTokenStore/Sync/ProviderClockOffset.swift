// Sync layer: the offset to the provider's clock that expiry is judged by, as a pure value.

import Foundation

/// The offset from our wall clock to the token provider's (provider minus local), by which
/// expiry is judged: a pure value, updated by the provider's answers and by steps of our clock.
///
/// Two rules keep it from ever making an expired token usable:
/// - every successful answer re-estimates it (an answer that shows no skew clears it), and
/// - when our wall clock is stepped, the offset keeps only the part the step did not explain:
///   a step that corrects our clock towards the provider's (NTP fixing a clock that ran fast or
///   slow) shrinks it, and any other step clears it, so expiry is judged on the local clock until
///   the next answer proves a skew again. It never goes below what the provider's last answer
///   proved: a negative offset makes tokens look younger, so only proof may do that.
///
/// Until the provider has answered in this process (after a restart), tokens read from the
/// store prove a lower bound of their own (``learnFromStored(issuedAt:fetchedAt:)``): a
/// restarted agent must not serve a token the provider considers expired.
struct ProviderClockOffset: Sendable, Equatable {
    /// Offsets up to this size are not applied (they are noise, or within Fleet Engine's tolerance).
    let threshold: TimeInterval
    /// The offset applied to local time.
    private(set) var applied: TimeInterval = 0
    /// The skew the provider's last answer showed, measured against our clock at that time.
    private(set) var proven: TimeInterval = 0
    /// An answer of the provider's was learnt from: it is newer proof than any stored token.
    private(set) var answered = false

    init(threshold: TimeInterval) {
        self.threshold = threshold
    }

    /// Learns from a successful answer: its `Date` header when present; else an `iat` in our
    /// future beyond the threshold (an old `iat` proves nothing: providers cache tokens); else
    /// the answer shows no skew and the offset is cleared.
    mutating func learn(providerDate: Date?, issuedAt: Date?, localNow: Date) {
        answered = true
        var estimate: TimeInterval = 0
        if let providerDate {
            estimate = providerDate.timeIntervalSince(localNow)
        } else if let issuedAt, issuedAt.timeIntervalSince(localNow) > threshold {
            estimate = issuedAt.timeIntervalSince(localNow)
        }
        proven = estimate
        applied = abs(estimate) > threshold ? estimate : 0
    }

    /// Learns from a token read from the store, until an answer is learnt from. The provider
    /// minted it at `issuedAt` (its clock) no later than `fetchedAt`, the wall-clock time the
    /// fetching host received it: the provider's clock was at least `issuedAt - fetchedAt`
    /// ahead. Beyond the threshold that raises the offset, which it never lowers (the largest
    /// proof stands; each token proves only a lower bound). An `iat` older than its fetch proves
    /// nothing (providers cache tokens), so a provider behind us is left to its next answer: until
    /// then tokens look older than they are, which only costs a fetch.
    mutating func learnFromStored(issuedAt: Date, fetchedAt: Date) {
        guard !answered else { return }
        let estimate = issuedAt.timeIntervalSince(fetchedAt)
        guard estimate > threshold, estimate > applied else { return }
        applied = estimate
        proven = estimate
    }

    /// Our wall clock moved `step` seconds more than elapsed time (positive: stepped forward).
    mutating func wallClockStepped(by step: TimeInterval) {
        let remaining = applied - step
        // Kept only when the step moved our clock towards the provider's, and not past it.
        let towardsProvider = remaining * applied > 0 && abs(remaining) < abs(applied)
        applied = towardsProvider && abs(remaining) > threshold ? max(remaining, min(0, proven)) : 0
    }
}
