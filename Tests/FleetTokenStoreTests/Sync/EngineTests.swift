import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("TokenSyncEngine: reuse, refresh, floor, offline, backoff", .paced)
struct EngineTests {
    let key = try! TokenKey.vehicle("truck-7")

    @Test("a fresh token is served from memory: one fetch, no store access on hits")
    func freshFromMemory() async throws {
        let time = TestTime()
        let dir = Scratch()
        let counting = CountingRepository(try openStore(dir.file("tokens.sqlite")))
        let fetcher = ScriptedFetcher.minting(time)
        let engine = TokenSyncEngine(repository: counting, fetcher: fetcher, logger: Logger(label: "t"),
                                     clock: time.clock, now: time.wall)
        let first = try await engine.token(for: key)
        #expect(await eventually(within: 60) { (try? await counting.base.entry(for: key)) != nil })
        // The fetch's refresh lease is released after its token's commit, a store call of its
        // own: counted before the hits begin (in a full suite it once came during them).
        #expect(await eventually(within: 60) { (try? await LeaseRows(dir.file("tokens.sqlite")))?.count == 0 })
        let callsAfterFirst = counting.calls
        for _ in 0..<1000 { #expect(try await engine.token(for: key) == first) }
        await time.advance(by: 2000) // still before the soft point (≥ 2700 s)
        #expect(try await engine.token(for: key) == first)
        #expect(fetcher.total == 1)
        #expect(counting.calls == callsAfterFirst)
    }

    @Test("past the soft point the current token is returned and exactly one background refresh runs")
    func softPoint() async throws {
        let h = try EngineHarness(random: 1) // maximum jitter: soft point at 75% = 2700 s
        let first = try await h.engine.token(for: key)
        await h.time.advance(by: 2690)
        _ = try await h.engine.token(for: key)
        #expect(await h.engine.settle())
        #expect(h.fetcher.total == 1)

        h.fetcher.close()
        await h.time.advance(by: 20) // 2710 s: past the soft point
        for _ in 0..<50 { #expect(try await h.engine.token(for: key) == first) }
        #expect(await eventually(within: 60) { h.fetcher.waitingAtGate == 1 })
        h.fetcher.open()
        #expect(await eventually(within: 60) { (try? await h.engine.token(for: key)) != first })
        #expect(h.fetcher.total == 2)
    }

    @Test("without jitter the soft point is 80%: nothing is refreshed at 79%")
    func softPointWithoutJitter() async throws {
        let h = try EngineHarness(random: 0)
        _ = try await h.engine.token(for: key)
        await h.time.advance(by: 2870)
        _ = try await h.engine.token(for: key)
        #expect(await h.engine.settle())
        #expect(h.fetcher.total == 1)
        await h.time.advance(by: 20)
        _ = try await h.engine.token(for: key)
        #expect(await eventually(within: 60) { h.fetcher.total == 2 })
    }

    @Test("below the floor callers wait for the fetch and never get the old token")
    func floor() async throws {
        let h = try EngineHarness()
        let first = try await h.engine.token(for: key)
        await h.time.advance(by: 3600 - 29) // 29 s left, floor is 30 s
        let second = try await h.engine.token(for: key)
        #expect(second != first)
        #expect(second.expiresAt > h.time.now + 3000)
        #expect(h.fetcher.total == 2)
    }

    @Test("offline: a failing refresh still serves the token above the floor, then a typed unavailable error")
    func offline() async throws {
        let h = try EngineHarness()
        let first = try await h.engine.token(for: key)
        h.fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .unreachable(detail: "connection refused") }
        await h.time.advance(by: 3000)
        #expect(try await h.engine.token(for: key) == first) // stale but usable; background refresh fails
        #expect(await eventually(within: 60) { h.fetcher.total == 2 })
        #expect(await eventually(within: 60) { (try? await h.store.entry(for: key))?.failure?.consecutiveFailures == 1 })
        #expect(try await h.engine.token(for: key) == first)

        await h.time.advance(by: 575) // 25 s left: below the floor
        let error = await #expect(throws: TokenUnavailable.self) { try await h.engine.token(for: key) }
        #expect(error?.reason == .provider(.unreachable(detail: "connection refused")))
        #expect(error?.nextAttemptAt != nil)
        #expect(error?.description.contains("connection refused") == true)
        #expect(h.log.allText.contains("serving the current token while the provider fails"))
    }

    @Test("an expired token is never served, whatever the provider does")
    func neverExpired() async throws {
        let h = try EngineHarness()
        _ = try await h.engine.token(for: key)
        h.fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .httpStatus(code: 503, retryAfter: nil) }
        for step in stride(from: 0.0, through: 4000, by: 250) {
            await h.time.advance(by: 250)
            do {
                let token = try await h.engine.token(for: key)
                #expect(token.expiresAt.timeIntervalSince(h.time.now) > 30, "served a token with too little life at +\(step)")
            } catch {
                #expect(h.time.now >= referenceNow + 3600 - 30)
            }
        }
    }

    @Test("backoff: consecutive failures wait 1, 2, 4... s (full jitter bound), persisted per key")
    func backoffSequence() async throws {
        let h = try EngineHarness(random: 1)
        h.fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .timeout(seconds: 15) }
        var expected: [TimeInterval] = []
        for failure in 1...10 {
            let error = await #expect(throws: TokenUnavailable.self) { try await h.engine.token(for: key) }
            let delay = try #require(error?.nextAttemptAt).timeIntervalSince(h.time.now)
            expected.append(min(300, pow(2, Double(failure - 1))))
            #expect(abs(delay - expected.last!) < 0.01, "failure \(failure)")
            // Inside the backoff window no fetch is made.
            let before = h.fetcher.total
            _ = try? await h.engine.token(for: key)
            #expect(h.fetcher.total == before)
            let stored = try await h.store.entry(for: key)?.failure
            #expect(stored?.consecutiveFailures == failure)
            #expect(stored?.lastErrorKind == "timeout")
            await h.time.advance(by: delay)
        }
        #expect(expected.last == 300)
    }

    @Test("Retry-After is honoured; non-retryable answers back off longer")
    func retryAfterAndNonRetryable() async throws {
        let h = try EngineHarness(random: 1)
        h.fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .httpStatus(code: 429, retryAfter: 120) }
        let limited = await #expect(throws: TokenUnavailable.self) { try await h.engine.token(for: key) }
        #expect(limited?.nextAttemptAt == h.time.now + 120)

        let other = try TokenKey.vehicle("forbidden")
        h.fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .httpStatus(code: 403, retryAfter: nil) }
        let forbidden = await #expect(throws: TokenUnavailable.self) { try await h.engine.token(for: other) }
        #expect(forbidden?.nextAttemptAt == h.time.now + 30)
    }

    @Test("a refresh that brings no newer token is no progress: back off, do not loop")
    func noProgress() async throws {
        let h = try EngineHarness(random: 1)
        let first = try await h.engine.token(for: key)
        h.fetcher.setAnswer { _, _ in FetchedToken(value: first.value) } // the provider caches
        await h.time.advance(by: 2800)
        _ = try await h.engine.token(for: key)
        #expect(await eventually(within: 60) { (try? await h.store.entry(for: key))?.failure?.lastErrorKind == "noProgress" })
        for _ in 0..<20 { #expect(try await h.engine.token(for: key) == first) }
        #expect(await h.engine.settle())
        #expect(h.fetcher.total == 2)
    }

    @Test("invalidate: the next call fetches, and the rejected token leaves the store")
    func invalidate() async throws {
        let h = try EngineHarness()
        let first = try await h.engine.token(for: key)
        #expect(await eventually(within: 60) { (try? await h.store.entry(for: key))?.token == first })
        await h.engine.invalidate(key)
        // The removal is queued with the engine's writes, not awaited by invalidate.
        #expect(await eventually(within: 60) { (try? await h.store.entry(for: key)).map { $0?.token == nil } == true })
        let second = try await h.engine.token(for: key)
        #expect(second != first)
        #expect(h.fetcher.total == 2)
    }

    @Test("invalidate keeps the backoff: no fetch while it runs")
    func invalidateKeepsBackoff() async throws {
        let h = try EngineHarness(random: 1)
        _ = try await h.engine.token(for: key)
        h.fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .httpStatus(code: 503, retryAfter: 60) }
        await h.engine.invalidate(key)
        _ = await #expect(throws: TokenUnavailable.self) { try await h.engine.token(for: key) }
        #expect(h.fetcher.total == 2)
        await h.engine.invalidate(key)
        for _ in 0..<5 {
            let error = await #expect(throws: TokenUnavailable.self) { try await h.engine.token(for: key) }
            #expect(error?.nextAttemptAt == referenceNow + 60)
        }
        #expect(h.fetcher.total == 2)
        #expect(try await h.store.entry(for: key)?.failure?.consecutiveFailures == 1)
    }

    @Test("whatever the policy's fractions, a token below the floor is never served")
    func softPointNeverPastFloor() async throws {
        var policy = RefreshPolicy()
        policy.softPointFraction = 0.999
        policy.softPointJitterFraction = 0
        let h = try EngineHarness(policy: policy)
        let first = try await h.engine.token(for: key)
        h.fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .timeout(seconds: 1) }
        await h.time.advance(by: 3580) // 20 s left: below the 30 s floor, before the 99.9% soft point
        await #expect(throws: TokenUnavailable.self) { try await h.engine.token(for: key) }
        #expect(first.expiresAt.timeIntervalSince(h.time.now) == 20)
    }

    @Test("idle untracked keys leave memory once due; a later request reads the store again")
    func idleEviction() async throws {
        var policy = RefreshPolicy()
        policy.idleWindow = 60
        let h = try EngineHarness(policy: policy)
        let running = h.start()
        let first = try await h.engine.token(for: key)
        #expect(h.engine.memory.entry(key) != nil)
        await h.time.advance(by: 2900)
        #expect(await eventually(within: 60) { h.engine.memory.entry(key) == nil })
        #expect(h.fetcher.total == 1)
        // Still in the store: served from there (past its soft point, so a refresh follows).
        #expect(try await h.engine.token(for: key) == first)
        running.cancel()
        _ = try? await running.value
    }

    @Test("an idle untracked key invalidated while held leaves memory too, and stops holding a slot")
    func idleInvalidatedEviction() async throws {
        // A trip used once, idle past the idle window, then invalidated (a client that cached
        // its token got a rejection) before its soft point: memory keeps an empty entry for it.
        // Nothing ever scheduled that entry again, so it was never evicted: it counted among
        // the held subjects (--max-dynamic-subjects) for as long as the engine ran.
        var policy = RefreshPolicy()
        policy.idleWindow = 60
        let h = try EngineHarness(policy: policy)
        let running = h.start()
        _ = try await h.engine.token(for: key)
        await h.time.advance(by: 120)
        await h.engine.invalidate(key)
        #expect(await eventually(within: 30) { !h.engine.holds(key) }, "the invalidated idle key stayed in memory")
        #expect(h.engine.heldCount == 0)
        // Past the soft point and several idle windows: still gone, and nothing was fetched for it.
        await h.time.advance(by: 3000)
        #expect(await eventually(within: 30) { !h.engine.holds(key) })
        #expect(h.fetcher.total == 1)
        running.cancel()
        _ = try? await running.value
    }

    @Test("1,000 concurrent callers of a missing key cause exactly one fetch")
    func singleFlight() async throws {
        let h = try EngineHarness()
        h.fetcher.close()
        let engine = h.engine
        let key = self.key
        let results = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<1000 { group.addTask { try await engine.token(for: key).value } }
            #expect(await eventually(within: 60) { h.fetcher.waitingAtGate == 1 })
            h.fetcher.open()
            return try await group.reduce(into: Set<String>()) { $0.insert($1) }
        }
        #expect(results.count == 1)
        #expect(h.fetcher.total == 1)
    }

    @Test("the provider's clock offset (Date header) is corrected for and logged once")
    func clockOffset() async throws {
        let time = TestTime()
        let skew: TimeInterval = 600 // the provider is 10 minutes ahead
        let fetcher = ScriptedFetcher { key, _ in
            let providerNow = time.now + skew
            return FetchedToken(value: TestJWT.make(for: key, issuedAt: providerNow), providerDate: providerNow)
        }
        let h = try EngineHarness(time: time, fetcher: fetcher)
        let token = try await h.engine.token(for: key)
        #expect(token.expiresAt == time.now + skew + 3600)
        // The expiry is in the provider's time: by our (slow) clock 625 s remain, by the
        // provider's only 25 s, below the floor, so the engine must fetch.
        await time.advance(by: 3600 - 25)
        let next = try await h.engine.token(for: key)
        #expect(next != token)
        #expect(fetcher.total == 2)
        #expect(h.log.messages(at: .warning).filter { $0.contains("clock differs") }.count == 1)
    }
}
