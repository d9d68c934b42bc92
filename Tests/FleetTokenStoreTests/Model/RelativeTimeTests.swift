import Foundation
import Testing
import TestSupportKit
import FleetTokenStore

@Suite("Relative time descriptions", .paced)
struct RelativeTimeTests {
    let now = referenceNow

    @Test("seconds, minutes, hours and days, ahead and behind")
    func ordinary() {
        #expect(RelativeTime.describe(now, now: now) == "in 0s")
        #expect(RelativeTime.describe(now + 119, now: now) == "in 1m59s")
        #expect(RelativeTime.describe(now + 41 * 60, now: now) == "in 41m")
        #expect(RelativeTime.describe(now - (3 * 3600 + 2 * 60), now: now) == "3h2m ago")
        #expect(RelativeTime.describe(now + 2 * 86400 + 3600, now: now) == "in 2d1h")
    }

    // Found by tools/fuzz (provider-response): an opaque token whose provider-stated expiry was
    // 1.18e21 s after 1970 (see FuzzRegressionTests) reached the agent's "expires ... (in ...)"
    // line, and converting the difference to Int trapped. Any date must be describable:
    // tokenctl shows whatever the store holds.
    @Test("dates too far apart for Int seconds are described, not trapped on")
    func extremes() {
        #expect(RelativeTime.describe(Date(timeIntervalSince1970: 1e300), now: now) == "in 11574074d1h")
        #expect(RelativeTime.describe(Date(timeIntervalSince1970: -1e300), now: now) == "11574074d1h ago")
        #expect(RelativeTime.describe(Date(timeIntervalSince1970: 9.3e18), now: now) == "in 11574074d1h")
        #expect(RelativeTime.describe(.distantFuture, now: .distantPast) == "in 1460972d0h")
        #expect(RelativeTime.describe(Date(timeIntervalSince1970: .nan), now: now) == "in 0s")
    }
}
