// The test kit (FleetTokenStoreTesting) itself: the tools every engine test stands on must do
// what they say, or a test built on them proves nothing.

import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Logging
import Synchronization
import Testing
import TestSupportKit

@Suite("Test kit: time, scripted fetcher, JWTs, log recorder, secret scanner, in-memory repository", .paced)
struct TestKitTests {
    @Test("TestTime: advancing moves both clocks and wakes sleepers; a jump moves only the wall clock")
    func time() async throws {
        let time = TestTime()
        #expect(time.now == TestTime.defaultStart)
        let woke = Mutex(false)
        let sleeper = Task { [clock = time.clock] in
            try await clock.sleep(for: .seconds(10))
            woke.withLock { $0 = true }
        }
        #expect(await eventually { time.clock.sleeperCount == 1 })
        await time.advance(by: 9.9996) // rounded to the nearest millisecond: 10 s
        try await sleeper.value
        #expect(woke.withLock { $0 })
        #expect(time.now == TestTime.defaultStart + 10)
        let before = time.clock.now
        time.jumpWallClock(by: -3600)
        #expect(time.clock.now == before)
        #expect(time.wall() == TestTime.defaultStart + 10 - 3600)
        await time.advance(by: .milliseconds(500))
        #expect(time.now == TestTime.defaultStart + 10.5 - 3600)
    }

    // The CI failure this pins: swift-clocks' TestClock suspends a sleep whose deadline equals
    // its time, until a later advance. A scheduler that fixed its wake-up time, saw the test
    // advance to exactly that time, and only then began to sleep, slept on past it.
    @Test("ManualClock: a sleep whose deadline came before it began returns at once, also exactly now; each deadline on the way is resumed in order; cancellation ends a sleep")
    func manualClock() async throws {
        let clock = ManualClock()
        let due = clock.now.advanced(by: .seconds(5))
        await clock.advance(by: .seconds(5))
        let ended = Mutex(false)
        let exactlyNow = Task { [clock] in
            try await clock.sleep(until: due)
            ended.withLock { $0 = true }
        }
        #expect(await eventually(within: 5) { ended.withLock { $0 } }, "a deadline equal to now has come")
        exactlyNow.cancel()
        try await clock.sleep(until: clock.now.advanced(by: .seconds(-1)))

        let order = WakeOrder()
        let sleepers = [3, 1, 2].map { seconds in
            Task { [clock] in
                try await clock.sleep(for: .seconds(seconds))
                order.record(seconds)
            }
        }
        #expect(await eventually { clock.sleeperCount == 3 })
        await clock.advance(by: .milliseconds(2500))
        #expect(await eventually { order.seen == [1, 2] })
        #expect(clock.sleeperCount == 1, "the 3 s sleeper waits: 2.5 s have passed")
        await clock.advance(by: .milliseconds(500))
        for sleeper in sleepers { try await sleeper.value }
        #expect(order.seen == [1, 2, 3])
        #expect(clock.now == ManualClock.Instant(offset: .seconds(8)))

        let cancelled = Task { [clock] in try await clock.sleep(for: .seconds(60)) }
        #expect(await eventually { clock.sleeperCount == 1 })
        cancelled.cancel()
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        #expect(clock.sleeperCount == 0)
    }

    @Test("TestJWT: every kind's claim, iat and exp, the header's kid; subjects with quotes survive")
    func jwts() throws {
        let issued = TestTime.defaultStart
        for kind in TokenKind.allCases {
            let key = try TokenKey(kind: kind, subjectID: #"id "7" \ x"#)
            let claims = try JWTClaims.decode(TestJWT.make(for: key, issuedAt: issued, lifetime: 600))
            #expect(claims.authorization == [kind.authorizationClaim: key.subjectID])
            #expect(claims.issuedAt == issued)
            #expect(claims.expiresAt == issued + 600)
            #expect(claims.keyID == TestJWT.keyID && claims.algorithm == "RS256")
            #expect(claims.audience == TestJWT.audience && claims.issuer == TestJWT.serviceAccount)
        }
        let key = try TokenKey.trip("trip-1")
        #expect(try JWTClaims.decode(TestJWT.make(for: key, issuedAt: issued, authorizationSubject: "*")).authorization == ["tripid": "*"])
        #expect(try JWTClaims.decode(TestJWT.make(for: key, issuedAt: issued, includeAuthorization: false)).authorization == nil)
        #expect(TestJWT.make(for: key, issuedAt: issued) != TestJWT.make(for: key, issuedAt: issued), "signatures are random")
        #expect(TestJWT.raw(payload: "{}") == "eyJhbGciOiJSUzI1NiJ9.e30.c2lnbmF0dXJl")
    }

    @Test("ScriptedFetcher: answers as scripted, counts per key, holds fetches at a closed gate, remembers answers")
    func scriptedFetcher() async throws {
        let time = TestTime()
        let secrets = SecretScanner()
        let fetcher = ScriptedFetcher.minting(time, secrets: secrets)
        let truck = try TokenKey.vehicle("truck-1"), trip = try TokenKey.trip("trip-1")
        _ = try await fetcher.fetchToken(for: truck)
        _ = try await fetcher.fetchToken(for: truck)
        _ = try await fetcher.fetchToken(for: trip)
        #expect(fetcher.count(truck) == 2 && fetcher.count(trip) == 1 && fetcher.total == 3)
        #expect(secrets.count == 3)

        fetcher.setAnswer { _, n throws(TokenProviderError) in throw .httpStatus(code: 500 + n, retryAfter: nil) }
        await #expect(throws: TokenProviderError.httpStatus(code: 503, retryAfter: nil)) { try await fetcher.fetchToken(for: truck) }

        fetcher.setAnswer { key, _ in FetchedToken(value: "opaque-\(key.subjectID)") }
        fetcher.close()
        let held = Task { try await fetcher.fetchToken(for: trip) }
        let cancelled = Task { try await fetcher.fetchToken(for: truck) }
        #expect(await eventually(within: 5) { fetcher.waitingAtGate == 2 })
        cancelled.cancel()
        await #expect(throws: TokenProviderError.self) { try await cancelled.value }
        #expect(fetcher.waitingAtGate == 1)
        fetcher.open()
        #expect(try await held.value.value == "opaque-trip-1")
        #expect(try await fetcher.fetchToken(for: trip).value == "opaque-trip-1", "an open gate holds nothing")
    }

    @Test("LogRecorder and SecretScanner: a token, its payload or its signature found in messages, metadata and errors")
    func recorderAndScanner() throws {
        let token = TestJWT.make(for: try .vehicle("truck-1"), issuedAt: TestTime.defaultStart)
        let parts = token.split(separator: ".").map(String.init)
        let secrets = SecretScanner()
        secrets.remember(token)
        secrets.remember("short") // too short to search: would match by chance
        let log = LogRecorder(level: .debug)
        log.logger.trace("not kept")
        log.logger.info("fetched", metadata: ["fp": "\(TokenFingerprint(of: token))"])
        #expect(log.count == 1 && log.messages(at: .info) == ["fetched"])
        #expect(secrets.leaks(in: log).isEmpty)
        #expect(secrets.leaks(in: "a short word").isEmpty)

        log.logger.debug("claims", metadata: ["payload": "\(parts[1])"])
        log.logger.error("failed", error: TokenProviderError.other(detail: "sig \(parts[2])"))
        let fingerprint = TokenFingerprint(of: token)
        #expect(Set(secrets.leaks(in: log)) == [SecretLeak(part: .payload, fingerprint: fingerprint, label: "log"),
                                                SecretLeak(part: .signature, fingerprint: fingerprint, label: "log")])
        #expect(secrets.leaks(in: "x\(token)x", label: "stdout").map(\.description)
                == ["token", "payload", "signature"].map { "the \($0) of token fp=\(fingerprint) appears in stdout" })
        #expect(!secrets.leaks(in: log).description.contains(parts[2]))
        log.clear()
        #expect(log.entries.isEmpty)
    }

    // The README's sample ("Testing with the test kit"), as written there but for removing the
    // store files at the end.
    @Test("the README's sample: the current token served while the provider fails, no token logged")
    func servesTheCurrentTokenWhileTheProviderFails() async throws {
        let time = TestTime()                                   // starts at a fixed moment
        let secrets = SecretScanner()
        let fetcher = ScriptedFetcher.minting(time, lifetime: 3600, secrets: secrets)  // remembers each token
        let log = LogRecorder()                                 // trace level: sees everything
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("\(UUID()).sqlite").path
        let store = try SQLiteTokenRepository(path: path, logger: log.logger)
        defer {
            store.close()
            for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
        }
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: log.logger,
                                     clock: time.clock, now: time.wall)
        let key = try TokenKey.vehicle("truck-7")

        let first = try await engine.token(for: key)
        fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .httpStatus(code: 503, retryAfter: nil) }
        await time.advance(by: 2900)                            // past the soft point (80% of the hour)
        #expect(try await engine.token(for: key) == first)      // still served while refreshes fail
        #expect(fetcher.count(key) >= 1)
        time.jumpWallClock(by: -3600)                           // an NTP step: only the wall clock moves
        #expect(secrets.leaks(in: log).isEmpty)                 // no token, payload or signature logged
        await engine.shutdown()
    }

    @Test("InMemoryTokenRepository: an engine on it stores what it fetches and adopts what another view stores")
    func inMemoryRepository() async throws {
        let time = TestTime()
        let fetcher = ScriptedFetcher.minting(time)
        let store = InMemoryTokenRepository()
        let otherProcess = store.makeView()
        defer { store.close(); otherProcess.close() }
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: Logger(label: "test"),
                                     clock: time.clock, now: time.wall)
        let running = Task { try await engine.run() }
        defer { running.cancel() }
        let key = try TokenKey.vehicle("truck-7")

        let first = try await engine.token(for: key)
        #expect(await eventually(within: 5) { (try? await otherProcess.entry(for: key))?.token?.value == first.value })
        // Another process stores a newer token: the engine adopts it from the change feed, no fetch.
        // (Newer and newer ones until the engine's follower, which starts with run(), reports one.)
        var adopted = false
        for attempt in 1...50 where !adopted {
            let issued = time.now + Double(attempt)
            let newer = StoredToken(key: key, value: TestJWT.make(for: key, issuedAt: issued), expiresAt: issued + 3600,
                                    issuedAt: issued, fetchedAt: time.now)
            try await otherProcess.upsert(newer)
            adopted = await eventually(within: 0.2) { (try? await engine.token(for: key))?.value == newer.value }
        }
        #expect(adopted)
        #expect(fetcher.total == 1)
        await engine.shutdown()
    }
}

/// The order in which sleepers woke.
private final class WakeOrder: Sendable {
    private let order = Mutex<[Int]>([])
    func record(_ value: Int) { order.withLock { $0.append(value) } }
    var seen: [Int] { order.withLock { $0 } }
}
