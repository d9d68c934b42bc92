import FleetTokenStoreTesting
import Foundation
import Logging
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// The README's promises under contention, clock steps and long uptime (issue 12, items 1-7).
@Suite("Promises under contention, clock steps and months of uptime", .paced)
struct PromiseTests {
    // MARK: - Cross-process single flight (items 1-3)

    // On test time: while the provider holds its answers, the clock moves past several lease
    // lengths (the holder renews; waiters' waits end and they wait again); once it answers, the
    // clock stands still, so a waiter can only end through the change feed, never by waiting
    // out a lease. No real sleep, no bound on real time but a generous one for a loaded machine.
    // Each engine has its own provider, so the test knows which engine fetches a key: after each
    // quarter of a lease every fetch in flight must hold its key's lease, renewed past the next
    // step, as a third process reading the lease table sees it (each engine's fetch slots are
    // all busy, so a lapsed lease alone would not show as a second fetch).
    @Test("two running engines on one store, 100 keys, a provider slower than the lease: one fetch per key, waiters end with the holder's answer")
    func twoRunningEnginesFetchEachKeyOnce() async throws {
        let dir = Scratch()
        var policy = RefreshPolicy()
        policy.leaseDuration = 1 // shorter than the provider's answer: the holder must renew it
        let time = TestTime(start: Date())
        let providerA = ScriptedFetcher.minting(time), providerB = ScriptedFetcher.minting(time)
        providerA.close()
        providerB.close()
        func fetches(_ key: TokenKey) -> Int { providerA.count(key) + providerB.count(key) }
        let keys = try (0..<100).map { try TokenKey.vehicle("truck-\($0)") }
        let logA = LogRecorder(), logB = LogRecorder()
        let storeA = try openStore(dir.file("tokens.sqlite")), storeB = try openStore(dir.file("tokens.sqlite"))
        defer { storeA.close(); storeB.close() }
        let a = TokenSyncEngine(repository: storeA, fetcher: providerA, policy: policy, logger: logA.logger,
                                clock: time.clock, now: time.wall)
        let b = TokenSyncEngine(repository: storeB, fetcher: providerB, policy: policy, logger: logB.logger,
                                clock: time.clock, now: time.wall)
        let runA = Task { try await a.run() }, runB = Task { try await b.run() }
        defer { runA.cancel(); runB.cancel() }
        #expect(await eventually { let both = await (a.isRunning, b.isRunning); return both.0 && both.1 })
        await a.track(keys)
        // Callers on B ask for every key at once, while both schedulers fetch.
        let waits = Task {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for key in keys { group.addTask { _ = try await b.token(for: key) } }
                await b.track(keys)
                try await group.waitForAll()
            }
        }
        #expect(await eventually(within: 60) { providerA.waitingAtGate + providerB.waitingAtGate >= policy.maxConcurrentFetches })
        // Three lease lengths pass while the provider holds every answer; each fetch keeps its lease.
        let fetching = [(providerA, a.coordinator.effects.lease.holder), (providerB, b.coordinator.effects.lease.holder)]
        var renewed = true
        for _ in 0..<12 {
            await time.advance(by: 0.25)
            guard renewed else { continue }
            let horizon = time.now.addingTimeInterval(0.25)
            renewed = await eventually(within: 60) {
                guard let leases = try? await LeaseRows(dir.file("tokens.sqlite")) else { return false }
                return fetching.allSatisfy { provider, holder in
                    keys.filter { provider.count($0) == 1 }.allSatisfy { leases.holds($0, holder, past: horizon) }
                }
            }
            #expect(renewed, "at \(time.now.timeIntervalSince(time.start)) s a fetch in flight did not hold its key's lease past the next quarter lease: another process could fetch the key")
        }
        #expect(keys.allSatisfy { fetches($0) <= 1 }, "a lease lapsed and another engine fetched a held key")
        providerA.open()
        providerB.open()
        // The clock stands still from here: every caller ends through the feed or its own fetch.
        let served = await eventually(within: 30) { keys.allSatisfy { a.heldToken(for: $0) != nil && b.heldToken(for: $0) != nil } }
        // Not served: callers still wait (a lost notification); the engines' shutdown ends them.
        guard served else {
            Issue.record("callers on B did not end with the holder's answer while the clock stood still")
            waits.cancel()
            return
        }
        try await waits.value
        // Both engines idle: a wrongful second fetch would have happened by now.
        #expect(await a.settle())
        #expect(await b.settle())
        let twice = keys.filter { fetches($0) != 1 }
        #expect(twice.isEmpty, "fetched other than once: \(twice.map { "\($0)=\(fetches($0))" })")
        for log in [logA, logB] {
            #expect(!log.allText.contains("noProgress") && !log.allText.contains("expires no later than"))
            #expect(log.messages(at: .warning).filter { $0.contains("refresh failed") }.isEmpty)
        }
    }

    @Test("a waiter whose holder gave up its lease without a result fetches at once instead of waiting out the lease")
    func leaseReleasedWithoutResult() async throws {
        let dir = Scratch()
        let key = try TokenKey.vehicle("truck-1")
        let held = ScriptedFetcher { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: Date())) }
        held.close()
        let storeA = try openStore(dir.file("tokens.sqlite")), storeB = try openStore(dir.file("tokens.sqlite"))
        defer { storeA.close(); storeB.close() }
        let a = TokenSyncEngine(repository: storeA, fetcher: held, logger: Logger(label: "a"))
        let fresh = ScriptedFetcher { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: Date())) }
        let b = TokenSyncEngine(repository: storeB, fetcher: fresh, logger: Logger(label: "b"))
        let callerA = Task { try? await a.token(for: key) }
        // Setup, not the promise under test: on a loaded CI machine A's first open, read and lease
        // took over 5 s once. The promise is the bound after the release, below.
        #expect(await eventually(within: 60) { held.waitingAtGate == 1 })
        let done = Mutex<Date?>(nil)
        let callerB = Task { _ = try await b.token(for: key); done.withLock { $0 = Date() } }
        #expect(await eventually(within: 30) { b.flightPhase(of: key)?.isWaitingForHolder == true }, "B waits on A's lease")
        #expect(fresh.total == 0)
        let released = Date()
        await a.shutdown() // cancels A's fetch and releases its lease, storing nothing
        _ = await callerA.value
        #expect(await eventually(within: 30) { done.withLock { $0 } != nil })
        // The promise is "not the lease's 30 s": alone B fetches within about a second (its lease
        // check); under a full suite on 2 cores it took 3.26 s and 3.45 s once each.
        if let at = done.withLock({ $0 }) {
            #expect(at.timeIntervalSince(released) < 10, "B waited \(at.timeIntervalSince(released)) s after the lease was released (lease 30 s)")
        }
        #expect(fresh.total == 1)
        callerB.cancel()
    }

    // MARK: - Never serve an expired token (items 4, 5)

    @Test("after NTP steps a fast clock back, a stale provider offset never makes an expired token usable")
    func clockStepClearsStaleOffset() async throws {
        // Our clock runs an hour fast: the provider's Date header and iat are an hour behind it.
        let time = TestTime(start: referenceNow.addingTimeInterval(3600))
        let fast = Mutex<TimeInterval>(3600)
        let fetcher = ScriptedFetcher { key, n throws(TokenProviderError) in
            if n > 1 { throw .httpStatus(code: 503, retryAfter: nil) }
            let providerNow = time.now.addingTimeInterval(-fast.withLock { $0 })
            return FetchedToken(value: TestJWT.make(for: key, issuedAt: providerNow), providerDate: providerNow)
        }
        let h = try EngineHarness(time: time, fetcher: fetcher)
        let key = try TokenKey.vehicle("truck-7")
        let first = try await h.engine.token(for: key)
        let running = h.start()
        defer { running.cancel() }
        // NTP corrects our clock: it is stepped back an hour.
        time.jumpWallClock(by: -3600)
        fast.withLock { $0 = 0 }
        for _ in 0..<40 {
            await time.advance(by: 100)
            await Task.yield()
            if let served = try? await h.engine.token(for: key) {
                #expect(served.expiresAt > time.now, "served a token that expired at \(served.expiresAt) at \(time.now)")
            }
        }
        #expect(time.now > first.expiresAt)
    }

    @Test("an offset learnt from an iat in our future is cleared by a later answer that shows none")
    func iatOffsetIsCleared() async throws {
        let time = TestTime()
        let ahead = Mutex<TimeInterval>(600)
        let fetcher = ScriptedFetcher { key, _ in
            FetchedToken(value: TestJWT.make(for: key, issuedAt: time.now.addingTimeInterval(ahead.withLock { $0 })))
        }
        let h = try EngineHarness(time: time, fetcher: fetcher)
        _ = try await h.engine.token(for: try .vehicle("v1"))
        #expect(h.engine.memory.state.withLock { $0.clockOffset } == 600)
        ahead.withLock { $0 = 0 }
        _ = try await h.engine.token(for: try .vehicle("v2"))
        #expect(h.engine.memory.state.withLock { $0.clockOffset } == 0)
    }

    @Test("the provider clock offset: learnt from each answer, shrunk by steps towards the provider, cleared by others")
    func offsetRules() {
        let t = referenceNow
        var offset = ProviderClockOffset(threshold: 60)
        offset.learn(providerDate: t - 3600, issuedAt: nil, localNow: t)
        #expect(offset.applied == -3600)
        offset.wallClockStepped(by: -1800) // NTP corrects half of it
        #expect(offset.applied == -1800)
        offset.wallClockStepped(by: -1800)
        #expect(offset.applied == 0)
        offset.learn(providerDate: t - 3600, issuedAt: nil, localNow: t)
        offset.wallClockStepped(by: 600) // away from the provider: nothing proves the rest
        #expect(offset.applied == 0)
        offset.learn(providerDate: nil, issuedAt: t + 600, localNow: t)
        #expect(offset.applied == 600)
        offset.learn(providerDate: nil, issuedAt: t - 10, localNow: t) // an old iat shows no skew
        #expect(offset.applied == 0)
        offset.learn(providerDate: t + 30, issuedAt: nil, localNow: t) // within the threshold
        #expect(offset.applied == 0)
        offset.wallClockStepped(by: -3600) // a correct clock stepped back: no offset from nothing
        #expect(offset.applied == 0)
    }

    @Test("wall-clock steps: told from time passing, measured from the last baseline")
    func wallClockSteps() {
        let t = referenceNow
        var steps = WallClockSteps(wall: t, elapsed: .seconds(100), tolerance: 1)
        #expect(steps.observe(wall: t + 30, elapsed: .seconds(130)) == nil) // time passed
        #expect(steps.observe(wall: t + 30.5, elapsed: .seconds(130)) == nil) // jitter
        #expect(steps.observe(wall: t - 3570, elapsed: .seconds(160)) == -3630.5)
        steps.rebase(wall: t + 3600, elapsed: .seconds(200)) // an answer learnt after a step
        #expect(steps.observe(wall: t + 3610, elapsed: .seconds(210)) == nil)
    }

    @Test("a JWT without iat (absent or null) or without the authorization claim is rejected unless opaque tokens are allowed")
    func claimsAreRequired() throws {
        let key = try TokenKey.vehicle("truck-7")
        let now = referenceNow
        let exp = Int(now.timeIntervalSince1970) + 3600
        let noIat = TestJWT.raw(payload: #"{"exp":\#(exp + 30 * 86400),"authorization":{"vehicleid":"truck-7"}}"#)
        let nullIat = TestJWT.raw(payload: #"{"iat":null,"exp":\#(exp),"authorization":{"vehicleid":"truck-7"}}"#)
        let noAuthorization = TestJWT.make(for: key, issuedAt: now, includeAuthorization: false)
        let strict = TokenValidator(policy: RefreshPolicy())
        for token in [noIat, nullIat] {
            #expect(throws: TokenValidationError.missingIssuedAt) { try strict.validate(FetchedToken(value: token), for: key, now: now) }
        }
        #expect(throws: TokenValidationError.missingAuthorization(claim: "vehicleid")) {
            try strict.validate(FetchedToken(value: noAuthorization), for: key, now: now)
        }
        var lenient = RefreshPolicy()
        lenient.allowOpaqueTokens = true
        for token in [nullIat, noAuthorization] {
            _ = try TokenValidator(policy: lenient).validate(FetchedToken(value: token), for: key, now: now)
        }
    }

    // MARK: - Do not hammer a failing provider (item 6)

    @Test("purging expired tokens keeps the failure state, in the store and in a running engine")
    func purgeKeepsBackoff() async throws {
        let h = try EngineHarness()
        let key = try TokenKey.vehicle("truck-7")
        _ = try await h.engine.token(for: key)
        h.fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .httpStatus(code: 503, retryAfter: 300) }
        await h.time.advance(by: 3700) // expired; the provider is down
        _ = await #expect(throws: TokenUnavailable.self) { try await h.engine.token(for: key) }
        let nextAttempt = h.time.now.addingTimeInterval(300)
        #expect(await eventually(within: 60) { (try? await h.store.entry(for: key))?.failure?.nextAttemptAt == nextAttempt })
        await h.engine.track([key])
        let running = h.start()
        defer { running.cancel() }

        // An operator's cron job purges expired tokens through another connection, once the
        // engine follows the store's changes (seen by it adopting another process's token).
        let admin = try openStore(h.dir.file("tokens.sqlite"))
        defer { admin.close() }
        let other = try TokenKey.vehicle("truck-8")
        _ = try? await h.engine.token(for: other) // fails (the provider is down), but the engine holds the key
        let marker = token(other, expiresIn: 3000, now: h.time.now)
        try await admin.upsert(marker)
        #expect(await eventually(within: 60) { h.engine.heldToken(for: other)?.token == marker })
        let fetchesBefore = h.fetcher.total
        #expect(try await admin.purge(TokenFilter(validity: .expired(asOf: h.time.now))) == 1)
        let kept = try await admin.entry(for: key)
        #expect(kept?.token == nil)
        #expect(kept?.failure?.nextAttemptAt == nextAttempt)

        // The engine sees the removal, but keeps its backoff: no fetch before the next attempt.
        #expect(await eventually(within: 60) { h.engine.memory.entry(key)?.token == nil })
        #expect(h.engine.memory.entry(key)?.failure?.nextAttemptAt == nextAttempt)
        await h.time.advance(by: 200)
        #expect(await h.engine.settle())
        #expect(h.fetcher.total == fetchesBefore)
        await h.time.advance(by: 110)
        #expect(await eventually(within: 60) { h.fetcher.total == fetchesBefore + 1 })
    }

    // MARK: - Months of uptime (item 7)

    @Test("rows of 10,000 finished trips are deleted after the retention period; tracked keys are untouched")
    func retentionDeletesFinishedTrips() async throws {
        let h = try EngineHarness()
        let trips = try (0..<10_000).map { try TokenKey.trip("trip-\($0)") }
        try await h.store.upsert(trips.map { token($0, expiresIn: 600) }, clearFailure: true)
        let tracked = try TokenKey.vehicle("truck-1"), down = try TokenKey.vehicle("truck-down")
        h.fetcher.setAnswer { key, _ throws(TokenProviderError) in
            if key == down { throw .httpStatus(code: 503, retryAfter: nil) }
            return FetchedToken(value: TestJWT.make(for: key, issuedAt: h.time.now))
        }
        // A tracked key whose provider has failed for days: its row (and backoff) must stay.
        try await h.store.upsert(token(down, expiresIn: 60), clearFailure: true)
        await h.engine.track([tracked, down])
        let running = h.start()
        defer { running.cancel() }
        for _ in 0..<26 {
            await h.time.advance(by: 3600)
            await Task.yield()
        }
        // Time goes on (the sweep runs hourly on the engine's clock) until the rows are gone.
        #expect(await eventually(within: 60) {
            await h.time.advance(by: 600)
            return (try? await h.store.count(TokenFilter(kind: .trip))) == 0
        })
        #expect(try await h.store.entry(for: tracked)?.token != nil)
        #expect(try await h.store.entry(for: down) != nil)
    }

    @Test("retention 0 keeps every row")
    func retentionZeroKeepsRows() async throws {
        var policy = RefreshPolicy()
        policy.retention = 0
        let h = try EngineHarness(policy: policy)
        let trips = try (0..<20).map { try TokenKey.trip("trip-\($0)") }
        try await h.store.upsert(trips.map { token($0, expiresIn: 600) }, clearFailure: true)
        let running = h.start()
        defer { running.cancel() }
        for _ in 0..<30 {
            await h.time.advance(by: 3600)
            await Task.yield()
        }
        #expect(await h.engine.settle())
        #expect(try await h.store.count(TokenFilter(kind: .trip)) == 20)
    }
}
