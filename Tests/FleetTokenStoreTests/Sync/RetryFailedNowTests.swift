// Issue 18: after an operator fixes what made refreshes fail (credentials, trust) and reloads,
// the agent calls TokenSyncEngine.retryFailedNow() so that failing keys are tried at once, not
// at the end of a backoff of up to five minutes. Driven by a test clock: no waiting.

import FleetTokenStoreTesting
import Foundation
import Logging
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("Retrying failed keys now", .paced)
struct RetryFailedNowTests {
    @Test("a tracked key refused with 403 backs off; retryFailedNow fetches it again without the clock moving; its failure count stays")
    func retryAfterFix() async throws {
        let dir = Scratch()
        let time = TestTime()
        let store = try openStore(dir.file("tokens.sqlite"))
        let refused = try TokenKey.vehicle("refused")
        let fine = try TokenKey.vehicle("fine")
        let fetcher = ScriptedFetcher { key, _ throws(TokenProviderError) in
            if key == refused { throw .httpStatus(code: 403, retryAfter: nil) }
            return FetchedToken(value: TestJWT.make(for: key, issuedAt: time.now))
        }
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: Logger(label: "test"),
                                     clock: time.clock, now: time.wall, random: { 0.5 })
        let running = Task { try await engine.run() }
        defer { running.cancel() }
        await engine.track([refused, fine])
        #expect(await eventually(within: 30) { fetcher.count(refused) == 1 && engine.status(of: fine).isUsable })
        let backoff = try #require(engine.status(of: refused).failure)
        #expect(backoff.consecutiveFailures == 1)
        #expect(backoff.nextAttemptAt.timeIntervalSince(time.now) >= 15, "a refusal backs off for tens of seconds")

        // Nothing happens while the backoff runs.
        await time.advance(by: 1)
        #expect(await engine.settle())
        #expect(fetcher.count(refused) == 1)

        // The credentials are fixed; the agent asks for a retry now.
        fetcher.setAnswer { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: time.now)) }
        #expect(await engine.retryFailedNow() == 1, "only the key in backoff")
        #expect(await eventually(within: 30) { engine.status(of: refused).isUsable }, "fetched again without the clock moving")
        #expect(fetcher.count(refused) == 2)
        #expect(fetcher.count(fine) == 1, "a key that was not failing is not fetched again")
        #expect(engine.status(of: refused).failure == nil)
        #expect(await engine.retryFailedNow() == 0)

        // A retry that fails again goes on from the failure count it had.
        fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .httpStatus(code: 403, retryAfter: nil) }
        await engine.invalidate(refused)
        #expect(await eventually(within: 30) { engine.status(of: refused).failure != nil })
        #expect(await engine.retryFailedNow() == 1)
        #expect(await eventually(within: 30) { engine.status(of: refused).failure?.consecutiveFailures == 2 })
        running.cancel()
        _ = try? await running.value
        store.close()
    }

    @Test("a backoff the provider asked for with Retry-After is kept")
    func retryAfterKept() async throws {
        let dir = Scratch()
        let time = TestTime()
        let store = try openStore(dir.file("tokens.sqlite"))
        let key = try TokenKey.vehicle("busy")
        let fetcher = ScriptedFetcher { _, _ throws(TokenProviderError) in throw .httpStatus(code: 503, retryAfter: 600) }
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: Logger(label: "test"),
                                     clock: time.clock, now: time.wall, random: { 0.5 })
        let running = Task { try await engine.run() }
        await engine.track([key])
        #expect(await eventually(within: 30) { engine.status(of: key).failure != nil })
        #expect(await engine.retryFailedNow() == 0)
        #expect(await engine.settle())
        #expect(fetcher.count(key) == 1)
        running.cancel()
        _ = try? await running.value
        store.close()
    }
}
