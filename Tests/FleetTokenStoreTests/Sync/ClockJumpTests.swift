// Wall-clock jumps (NTP steps, manual changes) while the engine tracks many keys: the wall
// clock moves by an hour while scheduling time (the ManualClock) does not. Every served token is
// checked against the wall clock of that moment, and every fetch is counted per key.

import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// An engine tracking `keys` on a real store, whose provider mints on the test's wall clock
/// and remembers every token it handed out (for the secret scan).
final class JumpRig: Sendable {
    let dir = Scratch()
    let time = TestTime()
    let log = LogRecorder(level: .trace)
    let secrets = SecretScanner()
    let keys: [TokenKey]
    let store: SQLiteTokenRepository
    let fetcher: ScriptedFetcher
    let engine: TokenSyncEngine
    let policy = RefreshPolicy()

    init(keyCount: Int = 50) throws {
        keys = try (0..<keyCount).map { index throws(InvalidTokenKey) in
            index.isMultiple(of: 3) ? try TokenKey.trip("trip-\(index)") : try TokenKey.vehicle("vehicle-\(index)")
        }
        store = try openStore(dir.file("tokens.sqlite"), logger: log.logger)
        fetcher = .minting(time, secrets: secrets)
        // Constant jitter: every token fetched at one moment has the same soft point (77.5%).
        engine = TokenSyncEngine(repository: store, fetcher: fetcher, policy: policy, logger: log.logger,
                                 clock: time.clock, now: time.wall, random: { 0.5 })
    }

    /// Fetches per key, and whether every key was fetched exactly `expected` times.
    func counts() -> [TokenKey: Int] { Dictionary(uniqueKeysWithValues: keys.map { ($0, fetcher.count($0)) }) }

    func everyKeyFetched(_ expected: Int) -> Bool { keys.allSatisfy { fetcher.count($0) == expected } }

    /// Asks for every key from several callers at once and checks each served token against the
    /// wall clock of this moment: the right subject, its JWT `exp` matching, above the floor.
    func serveAll(_ comment: Comment) async throws {
        let engine = self.engine
        let served = try await withThrowingTaskGroup(of: StoredToken.self) { group in
            for key in keys {
                for _ in 0..<3 { group.addTask { try await engine.token(for: key) } }
            }
            return try await group.reduce(into: [StoredToken]()) { $0.append($1) }
        }
        let now = time.now
        for token in served {
            let exp = try #require(try JWTClaims.decode(token.value).expiresAt)
            #expect(exp == token.expiresAt, "\(comment)")
            #expect(token.expiresAt.timeIntervalSince(now) > policy.floor(of: token),
                    "\(comment): served \(token) at \(now.formatted(.iso8601))")
            #expect(try JWTClaims.decode(token.value).authorization?[token.key.kind.authorizationClaim] == token.key.subjectID)
        }
        #expect(served.count == keys.count * 3)
    }

    /// Gives the scheduler (sleeping at most 30 s of clock time) two turns to act.
    func letSchedulerRun() async throws {
        for _ in 0..<2 {
            await time.advance(by: 31)
            #expect(await engine.settle())
        }
    }

    /// No minted token value, payload or signature in any log entry or in `texts`.
    func checkNoSecretLeaks(_ comment: Comment, texts: [String] = []) {
        #expect(secrets.count > 0)
        #expect(log.count > 0)
        let leaks = secrets.leaks(in: log) + secrets.leaks(in: texts.map { (label: "text", text: $0) })
        #expect(leaks.isEmpty, "\(comment): \(leaks)")
    }
}

// The waits for the first 50 fetches are liveness bounds, not promises: at the start of the
// whole suite on two cores (PostgreSQL clusters being made, agents starting) they took over 10 s.
@Suite("Wall-clock jumps: nothing expired served, no refresh storm, schedules recover", .paced)
struct ClockJumpTests {
    @Test("forward an hour past expiry, then back an hour, with 50 tracked keys")
    func forwardThenBack() async throws {
        let rig = try JumpRig()
        let running = Task { try await rig.engine.run() }
        await rig.engine.track(rig.keys)
        #expect(await eventually(within: 30) { rig.everyKeyFetched(1) })
        // Fetched is not yet held: wait for every token to be installed before moving the clock,
        // or a key still in flight is validated against the jumped clock.
        #expect(await eventually(within: 30) { rig.keys.allSatisfy { rig.engine.heldToken(for: $0) != nil } })
        #expect(await eventually(within: 60) { (try? await rig.store.list(.all).count) == 50 })
        await rig.time.advance(by: 600)
        try await rig.serveAll("before the jumps")
        #expect(rig.fetcher.total == 50)

        // Forward one hour: every token is 10 minutes past expiry. Each key is fetched again,
        // once, however many callers ask, and whatever the scheduler does.
        rig.time.jumpWallClock(by: 3600)
        try await rig.serveAll("after jumping forward")
        try await rig.letSchedulerRun()
        try await rig.serveAll("after jumping forward, scheduler run")
        #expect(rig.everyKeyFetched(2), "\(rig.counts().filter { $0.value != 2 })")
        #expect(rig.fetcher.total == 100)

        // Back one hour: the tokens just fetched look two hours fresh. Nothing is fetched.
        rig.time.jumpWallClock(by: -3600)
        try await rig.serveAll("after jumping back")
        try await rig.letSchedulerRun()
        try await rig.serveAll("after jumping back, scheduler run")
        #expect(rig.fetcher.total == 100)

        // The schedule recovers: at the tokens' soft point the scheduler refreshes each key once.
        let softPoint = try #require(rig.engine.memory.entry(rig.keys[0])?.softPoint)
        await rig.time.advance(by: softPoint.timeIntervalSince(rig.time.now) - 5)
        #expect(await rig.engine.settle())
        #expect(rig.fetcher.total == 100, "refreshed before the soft point")
        await rig.time.advance(by: 10)
        #expect(await eventually(within: 30) { rig.fetcher.total == 150 })
        #expect(await rig.engine.settle())
        #expect(rig.everyKeyFetched(3), "\(rig.counts().filter { $0.value != 3 })")
        try await rig.serveAll("after the scheduled refresh")
        #expect(rig.fetcher.total == 150)
        #expect(rig.engine.memory.keys.count == 50)

        running.cancel()
        _ = try? await running.value
        rig.checkNoSecretLeaks("forward then back")
    }

    @Test("back an hour, then forward again: nothing is refetched, the original schedule holds")
    func backThenForward() async throws {
        let rig = try JumpRig()
        let running = Task { try await rig.engine.run() }
        await rig.engine.track(rig.keys)
        #expect(await eventually(within: 30) { rig.everyKeyFetched(1) })
        // Fetched is not yet held: wait for every token to be installed before moving the clock,
        // or a key still in flight is validated against the jumped clock.
        #expect(await eventually(within: 30) { rig.keys.allSatisfy { rig.engine.heldToken(for: $0) != nil } })

        rig.time.jumpWallClock(by: -3600)
        try await rig.serveAll("after jumping back")
        try await rig.letSchedulerRun()
        #expect(rig.fetcher.total == 50)

        rig.time.jumpWallClock(by: 3600)
        try await rig.serveAll("after jumping forward again")
        try await rig.letSchedulerRun()
        #expect(rig.fetcher.total == 50)

        // 0.775 × 3600 = 2790 s after the first fetch (the clock has moved 124 s since).
        let softPoint = try #require(rig.engine.memory.entry(rig.keys[0])?.softPoint)
        #expect(softPoint == rig.time.start + 2790)
        await rig.time.advance(by: softPoint.timeIntervalSince(rig.time.now) - 5)
        #expect(await rig.engine.settle())
        #expect(rig.fetcher.total == 50)
        await rig.time.advance(by: 10)
        #expect(await eventually(within: 30) { rig.fetcher.total == 100 })
        #expect(await rig.engine.settle())
        #expect(rig.everyKeyFetched(2), "\(rig.counts().filter { $0.value != 2 })")
        try await rig.serveAll("after the scheduled refresh")

        running.cancel()
        _ = try? await running.value
        rig.checkNoSecretLeaks("back then forward")
    }

    @Test("a backoff running when the wall clock steps back an hour is not stretched by the hour; no retry storm either")
    func backoffAcrossBackwardJump() async throws {
        let rig = try JumpRig(keyCount: 1)
        let key = rig.keys[0]
        let failing: ScriptedFetcher.Answer = { _, _ throws(TokenProviderError) in throw .unreachable(detail: "connection refused") }
        let minting = try #require(rig.fetcherAnswerMinting())
        rig.fetcher.setAnswer(failing)
        var errors: [TokenUnavailable] = []
        for _ in 0..<3 {
            let error = await #expect(throws: TokenUnavailable.self) { try await rig.engine.token(for: key) }
            let next = try #require(error?.nextAttemptAt)
            errors += error.map { [$0] } ?? []
            await rig.time.advance(by: next.timeIntervalSince(rig.time.now))
        }
        // The fourth failure backs off 6 s (nominal 8 s; equal jitter at 0.5 gives 3/4 of it).
        let error = await #expect(throws: TokenUnavailable.self) { try await rig.engine.token(for: key) }
        errors += error.map { [$0] } ?? []
        let delay = try #require(error?.nextAttemptAt).timeIntervalSince(rig.time.now)
        #expect(abs(delay - 6) < 0.001)
        #expect(rig.fetcher.total == 4)

        rig.time.jumpWallClock(by: -3600)
        // Right after the step the provider still fails. However often callers ask, at most one
        // attempt is made, and the next one is due per the rules (here at most the fifth
        // failure's nominal 16 s), not an hour away.
        for _ in 0..<20 { _ = try? await rig.engine.token(for: key) }
        #expect(rig.fetcher.total <= 5)
        let during = await #expect(throws: TokenUnavailable.self) { try await rig.engine.token(for: key) }
        errors += during.map { [$0] } ?? []
        let remaining = try #require(during?.nextAttemptAt).timeIntervalSince(rig.time.now)
        let bound = rig.policy.nominalBackoff(afterFailures: 5, retryable: true)
        #expect(remaining > 0 && remaining <= bound, "after stepping back, the backoff ends in \(remaining) s")
        #expect(rig.fetcher.total <= 5)

        // The provider recovers: once that wait is over, a token, with one fetch.
        rig.fetcher.setAnswer(minting)
        let before = rig.fetcher.total
        await rig.time.advance(by: remaining + 0.01)
        let token = try await rig.engine.token(for: key)
        #expect(token.expiresAt.timeIntervalSince(rig.time.now) > 3500)
        #expect(rig.fetcher.total == before + 1)
        #expect(await eventually(within: 60) { (try? await rig.store.entry(for: key))?.failure == nil })

        rig.checkNoSecretLeaks("backoff across a jump", texts: errors.flatMap { [$0.description, String(reflecting: $0)] })
    }

    @Test("a running engine retries a tracked key after its backoff even when the wall clock stepped back meanwhile")
    func scheduledBackoffAcrossBackwardJump() async throws {
        let rig = try JumpRig(keyCount: 1)
        let key = rig.keys[0]
        let minting = try #require(rig.fetcherAnswerMinting())
        rig.fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .httpStatus(code: 503, retryAfter: 20) }
        let running = Task { try await rig.engine.run() }
        await rig.engine.track([key])
        #expect(await eventually(within: 60) { (try? await rig.store.entry(for: key))?.failure != nil })
        let failure = try #require(try await rig.store.entry(for: key)?.failure)
        #expect(abs(failure.nextAttemptAt.timeIntervalSince(rig.time.now) - 20) < 0.01)

        rig.time.jumpWallClock(by: -3600)
        rig.fetcher.setAnswer(minting)
        try await rig.letSchedulerRun() // 62 s of clock time: the 20 s Retry-After is long over
        #expect(await eventually(within: 60) { rig.engine.heldToken(for: key) != nil })
        #expect(rig.fetcher.total == 2)

        running.cancel()
        _ = try? await running.value
        rig.checkNoSecretLeaks("scheduled backoff across a jump")
    }

    @Test("a step back seen first by another key's answer still reaches the scheduler: the backoff on the old clock ends")
    func backwardJumpSeenFirstByAnAnswer() async throws {
        let rig = try JumpRig(keyCount: 2)
        let (k1, k2) = (rig.keys[0], rig.keys[1])
        let minting = try #require(rig.fetcherAnswerMinting())
        rig.fetcher.setAnswer { key, attempt throws(TokenProviderError) in
            if key == k1 { throw .httpStatus(code: 503, retryAfter: 20) }
            return try await minting(key, attempt)
        }
        let running = Task { try await rig.engine.run() }
        await rig.engine.track([k1])
        #expect(await eventually(within: 60) { (try? await rig.store.entry(for: k1))?.failure != nil })

        rig.time.jumpWallClock(by: -3600)
        // An untracked miss: its answer is learnt from before the scheduler's next wake.
        _ = try await rig.engine.token(for: k2)
        rig.fetcher.setAnswer(minting)
        try await rig.letSchedulerRun() // 62 s of clock time: the 20 s Retry-After is long over
        #expect(await eventually(within: 60) { rig.engine.heldToken(for: k1) != nil },
                "k1's next refresh is due at \(rig.engine.memory.entry(k1).map { "\($0.failure?.nextAttemptAt as Any)" } ?? "-"), now \(rig.time.now)")
        // The answer wakes the scheduler, which may retry k1 before the switch: that attempt
        // fails with a 20 s Retry-After on the new clock, and the next one mints.
        #expect((2...3).contains(rig.fetcher.count(k1)), "k1 fetched \(rig.fetcher.count(k1)) times")
        #expect(rig.fetcher.count(k2) == 1)

        running.cancel()
        _ = try? await running.value
        rig.checkNoSecretLeaks("a step seen first by an answer")
    }

    @Test("the rule: a step an answer measures first is kept for the scheduler, once; later steps are measured from the answer")
    func stepSeenFirstByAnAnswerIsKept() {
        let t = TestTime.defaultStart
        var steps = WallClockSteps(wall: t, elapsed: .seconds(100), tolerance: 1)
        #expect(steps.rebase(wall: t + 10, elapsed: .seconds(110)) == nil) // an answer, time passing
        #expect(steps.takeUnhandledStep() == nil)
        #expect(steps.rebase(wall: t - 3580, elapsed: .seconds(120)) == -3600) // an answer after a step back
        #expect(steps.observe(wall: t - 3570, elapsed: .seconds(130)) == nil) // the scheduler measures nothing new
        #expect(steps.takeUnhandledStep() == -3600) // but is told of the step
        #expect(steps.takeUnhandledStep() == nil)
    }
}

extension JumpRig {
    /// The minting answer the rig's fetcher started with, to restore after a failing phase.
    func fetcherAnswerMinting() -> ScriptedFetcher.Answer? {
        let time = self.time
        return { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: time.now)) }
    }
}
