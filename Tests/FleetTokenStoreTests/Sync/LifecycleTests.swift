import FleetTokenStoreTesting
import Foundation
import Logging
import ServiceLifecycle
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("TokenSyncEngine: restarts, proactive refresh, other processes, lifecycle", .paced)
struct LifecycleTests {
    let keys = (0..<3).map { try! TokenKey.vehicle("v\($0)") } + [try! TokenKey.trip("t0")]

    @Test("a restarted engine serves stored tokens with zero fetches and reschedules tracked keys from stored expiries")
    func restartReuses() async throws {
        let h = try EngineHarness()
        let served = try await withThrowingTaskGroup(of: StoredToken.self) { group in
            for key in keys { group.addTask { try await h.engine.token(for: key) } }
            return try await group.reduce(into: [TokenKey: StoredToken]()) { $0[$1.key] = $1 }
        }
        #expect(await eventually(within: 60) { (try? await h.store.list(.all).count) == keys.count })
        h.store.close()

        // "Restart": a new repository and engine on the same file, a fresh fetcher.
        let fetcher = ScriptedFetcher.minting(h.time)
        let store = try openStore(h.dir.file("tokens.sqlite"))
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: Logger(label: "restart"),
                                     clock: h.time.clock, now: h.time.wall, random: { 0.5 })
        await engine.track(keys)
        let running = Task { try await engine.run() }
        for key in keys {
            let result = try await engine.tokenWithSource(for: key)
            #expect(result.token == served[key])
            #expect(result.source == .store)
        }
        #expect(fetcher.total == 0)

        // Tracked keys are refreshed at their soft point (77.5% of 3600 s with jitter 0.5) without anyone asking.
        await h.time.advance(by: 2780)
        #expect(await engine.settle())
        #expect(fetcher.total == 0)
        await h.time.advance(by: 20)
        #expect(await eventually(within: 60) { fetcher.total == keys.count })
        running.cancel()
        _ = try? await running.value
    }

    @Test("a stored token past its soft point is served at once and refreshed in the background, even without run()")
    func restartPastSoftPoint() async throws {
        let h = try EngineHarness()
        let key = keys[0]
        let first = try await h.engine.token(for: key)
        #expect(await eventually(within: 60) { (try? await h.store.entry(for: key))?.token == first })
        h.store.close()
        await h.time.advance(by: 3000) // past the soft point, above the floor

        let fetcher = ScriptedFetcher.minting(h.time)
        let store = try openStore(h.dir.file("tokens.sqlite"))
        defer { store.close() }
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: Logger(label: "restart"),
                                     clock: h.time.clock, now: h.time.wall)
        #expect(try await engine.token(for: key) == first)
        #expect(await eventually(within: 60) { fetcher.total == 1 })
        #expect(await eventually(within: 60) { (try? await engine.token(for: key)) != first })
    }

    @Test("a restarted engine honours the stored backoff instead of fetching")
    func restartHonoursBackoff() async throws {
        let h = try EngineHarness()
        let key = keys[0]
        h.fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .httpStatus(code: 503, retryAfter: 300) }
        _ = await #expect(throws: TokenUnavailable.self) { try await h.engine.token(for: key) }
        h.store.close()

        let fetcher = ScriptedFetcher.minting(h.time)
        let store = try openStore(h.dir.file("tokens.sqlite"))
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: Logger(label: "restart"),
                                     clock: h.time.clock, now: h.time.wall)
        let error = await #expect(throws: TokenUnavailable.self) { try await engine.token(for: key) }
        #expect(error?.nextAttemptAt == referenceNow + 300)
        #expect(fetcher.total == 0)
        await h.time.advance(by: 301)
        _ = try await engine.token(for: key)
        #expect(fetcher.total == 1)
    }

    @Test("idle untracked keys are not refreshed; recently used ones and tracked ones are")
    func idleKeys() async throws {
        var policy = RefreshPolicy()
        policy.idleWindow = 600
        let h = try EngineHarness(policy: policy)
        let running = h.start()
        let idle = keys[0], busy = keys[1], tracked = keys[2]
        await h.engine.track([tracked])
        for key in [idle, busy] { _ = try await h.engine.token(for: key) }
        #expect(await eventually(within: 60) { h.fetcher.count(tracked) == 1 })
        // `busy` keeps being used; `idle` is not touched again.
        for _ in 0..<5 {
            await h.time.advance(by: 500)
            _ = try await h.engine.token(for: busy)
        }
        await h.time.advance(by: 400) // 2900 s: every soft point has passed
        #expect(await eventually(within: 60) { h.fetcher.count(busy) == 2 && h.fetcher.count(tracked) == 2 })
        #expect(await h.engine.settle())
        #expect(h.fetcher.count(idle) == 1)
        running.cancel()
        _ = try? await running.value
    }

    @Test("two engines on one store fetch a missing key once between them")
    func twoEnginesOneFetch() async throws {
        let h = try EngineHarness()
        let (other, otherStore) = try h.sibling()
        defer { otherStore.close() }
        let key = keys[0]
        h.fetcher.close()
        async let a = h.engine.token(for: key)
        #expect(await eventually(within: 60) { h.fetcher.waitingAtGate == 1 })
        async let b = other.token(for: key)
        #expect(await eventually(within: 30) { other.flightPhase(of: key)?.isWaitingForHolder == true },
                "b waits on the lease instead of fetching")
        #expect(h.fetcher.total == 1)
        h.fetcher.open()
        let (first, second) = try await (a, b)
        #expect(first.value == second.value)
        #expect(h.fetcher.total == 1)
    }

    // Issue 15's last read: a wait on another process's lease drove the repository's whole
    // background work, so a wait longer than the check's start delay began the deferred
    // integrity check, and the wait's end cut it short for good. A wait follows the feed only.
    @Test("an engine without run() waiting on another process's lease follows the feed only; the deferred check waits for run()")
    func leaseWaitFollowsFeedOnly() async throws {
        let dir = Scratch()
        let seed = try openStore(dir.file("tokens.sqlite"))
        seed.close() // closed cleanly: the next open defers its full check
        let feedClock = ManualClock()
        let h = try EngineHarness(dir: dir, feedClock: feedClock)
        #expect(!h.store.openReport.checkedBeforeOpening)
        let (other, otherStore) = try h.sibling()
        defer { otherStore.close() }
        let key = keys[0]
        h.fetcher.close()
        let holder = Task { try await other.token(for: key) }
        #expect(await eventually(within: 60) { h.fetcher.waitingAtGate == 1 })
        let ended = EndFlag()
        let engine = h.engine
        let waiter = Task {
            defer { ended.set() }
            return try await engine.token(for: key)
        }
        #expect(await eventually(within: 30) { h.engine.flightPhase(of: key)?.isWaitingForHolder == true })
        // Past the check's start delay on the store's clock, with the wait still going on.
        _ = await eventually(within: 1) { feedClock.sleeperCount >= 2 }
        await feedClock.advance(by: .seconds(3))
        #expect(!(await eventually(within: 1) { h.store.backgroundCheckBeginnings > 0 }),
                "a lease wait began the integrity check deferred from start-up")

        h.fetcher.open()
        let first = try await holder.value
        #expect(await h.store.deliversWithinOneSecond(feedClock) { ended.isSet },
                "the waiter learns the holder's result through the feed it follows")
        #expect(try await waiter.value.value == first.value)
        #expect(h.fetcher.total == 1)

        // The store's work, as run() runs it, still does the check whole.
        let work = Task { await h.store.runBackgroundWork() }
        defer { work.cancel() }
        var ran = false
        for _ in 0..<20 where !ran {
            await feedClock.advance(by: .milliseconds(500))
            ran = await eventually(within: 1) { h.store.backgroundCheckHasRun }
        }
        #expect(ran, "the deferred integrity check ran once the store's work ran")
        #expect(h.store.backgroundCheckBeginnings == 1)
    }

    @Test("a purge by another process is seen within a second and a tracked key is refetched")
    func externalPurge() async throws {
        let feedClock = ManualClock()
        let h = try EngineHarness(feedClock: feedClock)
        let key = keys[0]
        await h.engine.track([key])
        let events = StreamRecorder(h.engine.events())
        let running = h.start()
        #expect(await eventually(within: 60) { (try? await h.store.entry(for: key))?.token != nil })
        let first = try await h.engine.token(for: key)

        let admin = try openStore(h.dir.file("tokens.sqlite"), mode: .adminReadWrite)
        defer { admin.close() }
        #expect(await eventually(within: 30) { await h.engine.isRunning }, "the engine follows the store's changes")
        #expect(try await admin.purge(.key(key)) == 1)
        #expect(await h.store.deliversWithinOneSecond(feedClock) { events.elements.contains(.removedExternally(key: key)) })
        #expect(await eventually(within: 30) { h.fetcher.count(key) == 2 })
        #expect(await eventually(within: 30) { (try? await admin.entry(for: key))?.token != nil })
        #expect(try await h.engine.token(for: key) != first)
        running.cancel()
        _ = try? await running.value
    }

    @Test("a token replaced by another process is adopted within a second")
    func externalReplace() async throws {
        let feedClock = ManualClock()
        let h = try EngineHarness(feedClock: feedClock)
        let key = keys[1]
        let running = h.start()
        _ = try await h.engine.token(for: key)
        #expect(await eventually(within: 60) { (try? await h.store.entry(for: key))?.token != nil })
        #expect(await eventually(within: 30) { await h.engine.isRunning }, "the engine follows the store's changes")

        let other = try openStore(h.dir.file("tokens.sqlite"))
        defer { other.close() }
        let replacement = StoredToken(key: key, value: TestJWT.make(for: key, issuedAt: h.time.now + 10),
                                      expiresAt: h.time.now + 3610, issuedAt: h.time.now + 10, fetchedAt: h.time.now)
        try await other.upsert(replacement)
        #expect(await h.store.deliversWithinOneSecond(feedClock) { h.engine.heldToken(for: key)?.token.value == replacement.value })
        #expect(try await h.engine.tokenWithSource(for: key).source == .otherProcess)
        #expect(h.fetcher.total == 1)
        running.cancel()
        _ = try? await running.value
    }

    @Test("graceful shutdown cancels fetches in flight, finishes store writes and returns")
    func gracefulShutdown() async throws {
        let h = try EngineHarness()
        let first = keys[0], stuck = keys[1]
        _ = try await h.engine.token(for: first)
        h.fetcher.close()
        let waiting = Task { try await h.engine.token(for: stuck) }
        #expect(await eventually(within: 60) { h.fetcher.waitingAtGate == 1 })

        let group = ServiceGroup(configuration: .init(services: [.init(service: h.engine)], logger: Logger(label: "group")))
        let running = Task { try await group.run() }
        #expect(await eventually(within: 30) { await h.engine.isRunning })
        await group.triggerGracefulShutdown()
        try await running.value // returns although the fetch never answered: it was cancelled
        let error = await #expect(throws: TokenUnavailable.self) { try await waiting.value }
        #expect(error?.reason == .shuttingDown)
        #expect(try await h.store.entry(for: first)?.token != nil)
        #expect(try await h.store.entry(for: stuck)?.failure == nil) // a cancelled fetch is not a provider failure
    }

    @Test("the samples' completion-handler API: missingAuthorizationContext, missingData, and tokens")
    func seedCompatible() async throws {
        let h = try EngineHarness()
        let results = Mutex<[String]>([])
        func call(_ body: (@escaping @Sendable (String?, (any Error)?) -> Void) -> Void) async -> (String?, (any Error)?) {
            await withCheckedContinuation { continuation in
                body { token, error in continuation.resume(returning: (token, error)) }
            }
        }
        let (noToken, noContext) = await call { h.engine.fetchToken(with: VehicleAuthorizationContext(vehicleID: nil), completion: $0) }
        #expect(noToken == nil)
        #expect(noContext as? AuthorizationProviderError == .missingAuthorizationContext)

        let (token, error) = await call { h.engine.fetchToken(with: TripAuthorizationContext(tripID: "trip-9"), completion: $0) }
        #expect(error == nil)
        #expect(try JWTClaims.decode(try #require(token)).authorization?["tripid"] == "trip-9")

        h.fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .missingData(field: "VEHICLE_TOKEN_KEY") }
        let (_, missing) = await call { h.engine.fetchToken(with: VehicleAuthorizationContext(vehicleID: "v-new"), completion: $0) }
        #expect(missing as? AuthorizationProviderError == .missingData)
        _ = results
    }

    @Test("no token value or signature reaches the logs, at trace level, through refreshes and failures")
    func logsAreRedacted() async throws {
        let h = try EngineHarness()
        h.log.clear()
        var served: [String] = []
        for key in keys { served.append(try await h.engine.token(for: key).value) }
        h.fetcher.setAnswer { key, _ throws(TokenProviderError) in
            throw .invalidToken(.subjectMismatch(expected: key.subjectID, claim: "vehicleid", found: "x"))
        }
        await h.engine.invalidate(keys[0])
        _ = try? await h.engine.token(for: keys[0])
        await h.time.advance(by: 3000)
        for key in keys { _ = try? await h.engine.token(for: key) }
        #expect(await h.engine.settle())
        #expect(h.log.count > 0)
        let secrets = SecretScanner()
        secrets.remember(contentsOf: served)
        #expect(secrets.count == served.count)
        #expect(secrets.leaks(in: h.log).isEmpty, "\(secrets.leaks(in: h.log))")
    }
}
