// A restart must not forget the provider's clock (issue 27 item 2): the offset lives in memory,
// so at start stored tokens are judged by what their own `iat` proves against the wall-clock
// time they were received at. Two engines on one real SQLite file stand for the agent before
// and after the restart; the test clock stands in for the 72 s between them.

import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("A restart judges stored tokens by the provider's clock", .paced)
struct ProviderClockRestartTests {
    let key = try! TokenKey.vehicle("skewed-1")

    /// A provider whose clock runs `ahead` seconds ahead of the test's wall clock, minting
    /// tokens of `lifetime` seconds; with `dateHeader` its answers carry its clock too.
    static func provider(_ time: TestTime, ahead: TimeInterval, lifetime: TimeInterval, dateHeader: Bool) -> ScriptedFetcher {
        ScriptedFetcher { key, _ in
            let providerNow = time.now + ahead
            return FetchedToken(value: TestJWT.make(for: key, issuedAt: providerNow, lifetime: lifetime),
                                providerDate: dateHeader ? providerNow : nil)
        }
    }

    @Test("a stored token the provider considers expired is not served after a restart; it is fetched",
          arguments: [false, true])
    func expiredOnTheProvidersClock(dateHeader: Bool) async throws {
        let ahead: TimeInterval = 3600
        let time = TestTime()
        let fetcher = Self.provider(time, ahead: ahead, lifetime: 60, dateHeader: dateHeader)
        let h = try EngineHarness(time: time, fetcher: fetcher)
        let first = try await h.engine.token(for: key)
        #expect(await eventually(within: 60) { (try? await h.store.entry(for: key))?.token == first })

        // 72 s later the token expired 12 s ago by the provider's clock (59 min left by ours).
        await time.advance(by: 72)
        let (restarted, _) = try h.sibling(fetcher: fetcher)
        let (served, source) = try await restarted.tokenWithSource(for: key)
        let providerNow = time.now + ahead
        #expect(served != first, "served the stored token (source \(source)), expired \(providerNow.timeIntervalSince(first.expiresAt)) s ago on the provider's clock")
        #expect(served.expiresAt.timeIntervalSince(providerNow) > RefreshPolicy().floor(of: served))
        #expect(fetcher.total == 2)
    }

    @Test("a stored token still valid on the provider's clock is served from the store after a restart, without a fetch")
    func stillValidOnTheProvidersClock() async throws {
        let ahead: TimeInterval = 3600
        let time = TestTime()
        let fetcher = Self.provider(time, ahead: ahead, lifetime: 3600, dateHeader: false)
        let h = try EngineHarness(time: time, fetcher: fetcher)
        let first = try await h.engine.token(for: key)
        #expect(await eventually(within: 60) { (try? await h.store.entry(for: key))?.token == first })

        await time.advance(by: 600)
        let (restarted, _) = try h.sibling(fetcher: fetcher)
        let (served, source) = try await restarted.tokenWithSource(for: key)
        #expect(served == first)
        #expect(source == .store)
        #expect(fetcher.total == 1)
        // Judged by the provider's clock: 50 minutes left there, so due at its soft point
        // (77.5 % of the hour after iat), not an hour later.
        #expect(restarted.memory.state.withLock { $0.clockOffset } == ahead)

        // Past the floor on the provider's clock (by ours 3600 + 600 s remain), a fetch.
        await time.advance(by: 3600 - 600 - 20)
        let next = try await restarted.token(for: key)
        #expect(next != first)
        #expect(fetcher.total == 2)
    }

    @Test("what a stored token proves: iat minus its local fetch time, beyond the threshold, until an answer is learnt")
    func storedEvidenceRule() {
        let t = TestTime.defaultStart
        var offset = ProviderClockOffset(threshold: 60)
        offset.learnFromStored(issuedAt: t + 30, fetchedAt: t) // within the threshold
        #expect(offset.applied == 0)
        offset.learnFromStored(issuedAt: t - 600, fetchedAt: t) // an old iat proves nothing
        #expect(offset.applied == 0)
        offset.learnFromStored(issuedAt: t + 1800, fetchedAt: t)
        #expect(offset.applied == 1800)
        offset.learnFromStored(issuedAt: t + 3600, fetchedAt: t + 10) // the most any token proves
        #expect(offset.applied == 3590)
        offset.learnFromStored(issuedAt: t + 100, fetchedAt: t) // less proof lowers nothing
        #expect(offset.applied == 3590)
        // An answer is newer proof than any stored token: it replaces theirs, and later stored
        // tokens change nothing.
        offset.learn(providerDate: t + 5000, issuedAt: nil, localNow: t + 5000)
        #expect(offset.applied == 0)
        offset.learnFromStored(issuedAt: t + 3600, fetchedAt: t)
        #expect(offset.applied == 0)
    }
}
