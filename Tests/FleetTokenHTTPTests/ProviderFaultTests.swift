// Provider faults driven through the whole engine: TokenSyncEngine + HTTPTokenFetcher + a real
// SQLite store file + a real loopback provider (the development issuer's `?fault=`, or a small
// misbehaving server). Each test first gets a good token, then points the engine's fetcher at
// the fault and moves the injected clock past the soft point so refreshes hit it.

import FleetTokenStoreTesting
import DevTokenIssuer
@testable import FleetTokenHTTP
@testable import FleetTokenStore
import Foundation
import Logging
import Synchronization
import Testing
import TestSupportKit

/// One way a provider can fail, and what the engine must make of it.
struct ProviderFault: Sendable, CustomTestStringConvertible {
    enum Endpoint: Sendable {
        /// The development issuer with this query (its `?fault=`).
        case issuer(query: String)
        /// A loopback port nothing listens on.
        case refused
        /// A loopback socket that takes the connection and never answers.
        case acceptThenHang
        /// The canned server with this answer (built when the test runs).
        case canned(@Sendable () -> CannedAnswer)
    }

    let name: String
    let endpoint: Endpoint
    /// Whether the rules treat the error as retryable (1 s base) or not (30 s base).
    let retryable: Bool
    /// The `Retry-After` the provider sends, as a range of seconds (an HTTP date is relative to
    /// the real clock, so it shrinks a little before the fetch).
    var retryAfter: ClosedRange<TimeInterval>?
    /// Failures provoked in a row; bounded so every retry is due before the good token's floor.
    var repeats = 4
    /// The fetcher's whole-exchange timeout for this fault.
    var timeout: TimeInterval = 10
    /// The fetcher's connect timeout for this fault.
    var connectTimeout: TimeInterval = 5
    /// Whether the surfaced error is the right one.
    let matches: @Sendable (TokenProviderError) -> Bool

    var testDescription: String { name }

    static let subject = "truck-7"

    static let all: [ProviderFault] = [
        // AsyncHTTPClient retries a refused connection until the connect timeout, then reports
        // the refusal. It reports a timeout instead when no attempt has failed by then, which a
        // loaded machine can make happen within a fraction of a second: 2 s keeps the first
        // refusal well inside the deadline, and each attempt within a few seconds of real time.
        ProviderFault(name: "connection refused", endpoint: .refused, retryable: true, repeats: 2, connectTimeout: 2) {
            $0.code == .unreachable
        },
        ProviderFault(name: "accept, then hang", endpoint: .acceptThenHang, retryable: true, repeats: 2, timeout: 0.5) {
            $0 == .timeout(seconds: 0.5)
        },
        ProviderFault(name: "slow body", endpoint: .issuer(query: "fault=slow-body&delay_ms=100"), retryable: true,
                      repeats: 2, timeout: 0.5) {
            $0 == .timeout(seconds: 0.5)
        },
        ProviderFault(name: "HTTP 500", endpoint: .issuer(query: "fault=status&status=500"), retryable: true) {
            $0 == .httpStatus(code: 500, retryAfter: nil)
        },
        ProviderFault(name: "HTTP 503 with Retry-After 7", endpoint: .issuer(query: "fault=status&status=503&retry_after=7"),
                      retryable: true, retryAfter: 7...7) {
            $0 == .httpStatus(code: 503, retryAfter: 7)
        },
        ProviderFault(name: "HTTP 429 with Retry-After 120", endpoint: .issuer(query: "fault=status&status=429&retry_after=120"),
                      retryable: true, retryAfter: 120...120) {
            $0 == .httpStatus(code: 429, retryAfter: 120)
        },
        // The engine honours at most an hour, so the token runs below its floor during this one.
        ProviderFault(name: "HTTP 503 with a Retry-After of days", endpoint: .issuer(query: "fault=status&status=503&retry_after=999999"),
                      retryable: true, retryAfter: 3600...3600, repeats: 1) {
            $0 == .httpStatus(code: 503, retryAfter: 86_400)
        },
        retryAfterInNinetySeconds(as: "an HTTP date", httpDate),
        // RFC 9110: a recipient must accept the obsolete forms too (the fetcher once ignored them).
        retryAfterInNinetySeconds(as: "an asctime date", asctimeDate),
        ProviderFault(name: "HTTP 401", endpoint: .issuer(query: "fault=status&status=401"), retryable: false) {
            $0 == .httpStatus(code: 401, retryAfter: nil)
        },
        ProviderFault(name: "HTTP 403", endpoint: .issuer(query: "fault=status&status=403"), retryable: false) {
            $0 == .httpStatus(code: 403, retryAfter: nil)
        },
        ProviderFault(name: "HTML instead of JSON", endpoint: .issuer(query: "fault=html"), retryable: false) {
            $0.code == .notJSON && $0.detail?.contains("HTML") == true
        },
        ProviderFault(name: "no token field", endpoint: .issuer(query: "fault=missing-token"), retryable: false) {
            $0 == .missingData(field: "VEHICLE_TOKEN_KEY")
        },
        ProviderFault(name: "an expiration field that is no number", endpoint: .canned {
            let token = TestJWT.make(kind: .vehicle, subject: subject, issuedAt: Date())
            return CannedAnswer(body: .text(#"{"VEHICLE_TOKEN_KEY":"\#(token)","TOKEN_EXPIRATION":"soon"}"#), secrets: [token])
        }, retryable: false) {
            $0 == .missingData(field: "TOKEN_EXPIRATION")
        },
        ProviderFault(name: "wrong subject claim", endpoint: .issuer(query: "fault=wrong-subject"), retryable: false) {
            $0 == .invalidToken(.subjectMismatch(expected: subject, claim: "vehicleid", found: subject + "-other"))
        },
        ProviderFault(name: "expired token", endpoint: .issuer(query: "fault=expired"), retryable: false) {
            $0.validationError?.code == .expired
        },
        ProviderFault(name: "exp more than an hour after iat", endpoint: .issuer(query: "fault=too-long"), retryable: false) {
            $0 == .invalidToken(.lifetimeTooLong(seconds: 7200, limit: 3600))
        },
        ProviderFault(name: "token with bad base64", endpoint: .issuer(query: "fault=bad-base64"), retryable: false) {
            $0 == .invalidToken(.malformed(detail: "payload is not base64url"))
        },
        ProviderFault(name: "4 MiB body, streamed", endpoint: .issuer(query: "fault=huge-body"), retryable: true) {
            $0 == .bodyTooLarge(limitBytes: 1 << 20)
        },
        ProviderFault(name: "4 MiB body, length declared", endpoint: .canned {
            CannedAnswer(body: .spaces(count: 4 << 20))
        }, retryable: true) {
            $0 == .bodyTooLarge(limitBytes: 1 << 20)
        },
    ]

    /// HTTP 503 with a `Retry-After` 90 s ahead, written by `format`.
    private static func retryAfterInNinetySeconds(as form: String, _ format: @escaping @Sendable (Date) -> String) -> ProviderFault {
        ProviderFault(name: "HTTP 503 with Retry-After as \(form)", endpoint: .canned {
            CannedAnswer(status: 503, headers: [("Content-Type", "application/json"),
                                                ("Retry-After", format(Date().addingTimeInterval(90)))],
                         body: .text(#"{"error":"busy"}"#))
        }, retryable: true, retryAfter: 85...91) {
            $0.code == .httpStatus && $0.statusCode == 503 && $0.retryAfter.map { (85...91).contains($0) } == true
        }
    }
}

/// An engine on a fresh store file whose fetcher talks HTTP to a development issuer, and can be
/// repointed at faulty endpoints (``use(_:)``). The fetcher counts calls and remembers every
/// token value a provider returned, for the secret scan; it adds no behaviour of its own.
final class FaultRig: Sendable {
    let issuer: DevTokenIssuer
    let time: TestTime
    let log = LogRecorder()
    let secrets = SecretScanner()
    let directory = Scratch()
    let store: SQLiteTokenRepository
    let fetcher: ScriptedFetcher
    /// Every HTTP fetcher the rig used, shut down at the end.
    private let clients: Mutex<[HTTPTokenFetcher]>
    let engine: TokenSyncEngine
    let events: StreamRecorder<TokenSyncEvent>
    let policy: RefreshPolicy
    private let cleanups = Mutex<[@Sendable () async -> Void]>([])

    static var defaultPolicy: RefreshPolicy {
        var policy = RefreshPolicy()
        // The issuer mints on the simulated clock, but its `Date` header (set by Hummingbird) is
        // the real time, which the test leaves most of an hour behind. Clock-skew correction
        // would read that as a provider an hour behind; it has its own tests
        // (EngineTests.clockOffset), so here it is kept out of the way.
        policy.clockSkewThreshold = 10 * 365 * 86_400
        return policy
    }

    init(issuer: DevTokenIssuer, time: TestTime, seed: UInt64, policy: RefreshPolicy = FaultRig.defaultPolicy) throws {
        self.issuer = issuer
        self.time = time
        self.policy = policy
        store = try SQLiteTokenRepository(path: directory.file("tokens.sqlite"), logger: log.logger)
        let initial = try Self.http(issuer.urlTemplate, timeout: 10, logger: log.logger)
        clients = Mutex([initial])
        fetcher = ScriptedFetcher(secrets: secrets) { key, _ throws(TokenProviderError) in try await initial.fetchToken(for: key) }
        let random = SeededRandom(seed: seed)
        engine = TokenSyncEngine(repository: store, fetcher: fetcher, policy: policy, logger: log.logger,
                                 clock: time.clock, now: time.wall, random: { random.next() })
        events = StreamRecorder(engine.events())
    }

    static func http(_ template: String, timeout: TimeInterval, connectTimeout: TimeInterval = 5, logger: Logger) throws -> HTTPTokenFetcher {
        var configuration = HTTPTokenFetcherConfiguration(urlTemplate: template)
        configuration.totalTimeout = timeout
        configuration.connectTimeout = connectTimeout
        return try HTTPTokenFetcher(configuration: configuration, logger: logger)
    }

    /// Points the engine's fetcher at `client` for every later fetch.
    func use(_ client: HTTPTokenFetcher) {
        clients.withLock { $0.append(client) }
        fetcher.setAnswer { key, _ throws(TokenProviderError) in try await client.fetchToken(for: key) }
    }

    /// Starts what `endpoint` needs and returns a fetcher for it.
    func fetcher(for fault: ProviderFault) async throws -> HTTPTokenFetcher {
        let template: String
        switch fault.endpoint {
        case .issuer(let query):
            template = issuer.urlTemplate + "?" + query
        case .refused, .acceptThenHang:
            let socket = try SilentSocket(listening: { if case .acceptThenHang = fault.endpoint { true } else { false } }())
            cleanups.withLock { $0.append { socket.close() } }
            template = "http://127.0.0.1:\(socket.port)/token/{kind}/{id}"
        case .canned(let make):
            let answer = make()
            secrets.remember(contentsOf: answer.secrets)
            let server = CannedServer(answer)
            try await server.start()
            cleanups.withLock { $0.append { await server.stop() } }
            template = "http://127.0.0.1:\(server.port)/token/{kind}/{id}"
        }
        return try Self.http(template, timeout: fault.timeout, connectTimeout: fault.connectTimeout, logger: log.logger)
    }

    /// The refresh failures the engine reported, in order.
    var failures: [(error: TokenProviderError, consecutive: Int, next: Date)] {
        events.elements.compactMap {
            if case .refreshFailed(_, let error, let consecutive, let next) = $0 { (error, consecutive, next) } else { nil }
        }
    }

    /// Texts that must never carry a token: logs, every reported error, the stored failure state.
    func checkNoSecretLeaks(errors: [any Error], _ comment: Comment) async throws {
        #expect(secrets.count >= 1)
        #expect(log.count > 0)
        var texts = [log.allText]
        for error in errors + failures.map(\.error) {
            texts += [String(describing: error), String(reflecting: error), "\(error)"]
        }
        texts += events.elements.map { String(describing: $0) } + events.elements.map { String(reflecting: $0) }
        for entry in try await store.list(.all) {
            texts.append(entry.failure?.lastErrorMessage ?? "")
            texts += entry.token.map { [String(describing: $0), String(reflecting: $0)] } ?? []
        }
        for text in texts {
            let leaks = secrets.leaks(in: text)
            #expect(leaks.isEmpty, "\(comment): a token value, payload or signature leaked: \(leaks)")
        }
    }

    func shutdown() async {
        await engine.shutdown()
        for client in clients.withLock({ $0 }) { await client.shutdown() }
        store.close()
        for cleanup in cleanups.withLock({ $0 }) { await cleanup() }
    }

    /// Runs `body` with a rig on a fresh issuer minting on the rig's simulated clock, cleaning
    /// up whatever happens.
    static func with(seed: UInt64, policy: RefreshPolicy = FaultRig.defaultPolicy, _ body: (FaultRig) async throws -> Void) async throws {
        // The wall clock starts at the real time: the issuer's Date header is the real time.
        let time = TestTime(start: Date())
        var configuration = DevTokenIssuer.Configuration()
        configuration.now = time.wall
        let issuer = try await DevTokenIssuer.start(configuration, logger: quietLogger)
        do {
            let rig = try FaultRig(issuer: issuer, time: time, seed: seed, policy: policy)
            do {
                try await body(rig)
            } catch {
                await rig.shutdown()
                throw error
            }
            await rig.shutdown()
        } catch {
            await issuer.stop()
            throw error
        }
        await issuer.stop()
    }
}

@Suite("Provider faults through the engine, a loopback HTTP provider and a real store", .paced, .exclusive)
struct ProviderFaultTests {
    let key = try! TokenKey.vehicle(ProviderFault.subject)

    @Test("a failing provider: typed error, backoff per the rules, the good token kept, served and stored, no growth",
          .serialized, arguments: ProviderFault.all)
    func providerFault(_ fault: ProviderFault) async throws {
        let seed = fault.name.utf8.reduce(UInt64(14_695_981_039_346_656_037)) { ($0 ^ UInt64($1)) &* 1_099_511_628_211 }
        try await FaultRig.with(seed: seed) { rig in
            let key = self.key
            let policy = rig.policy
            var errors: [any Error] = []

            // A good token first, committed to the store.
            let good = try await rig.engine.token(for: key)
            #expect(rig.fetcher.total == 1)
            #expect(await eventually { (try? await rig.store.entry(for: key))?.token?.value == good.value })
            let usableUntil = good.expiresAt.addingTimeInterval(-policy.floor(of: good))

            // Then the provider breaks, and time passes the soft point (at most 80% of the hour).
            rig.use(try await rig.fetcher(for: fault))
            await rig.time.advance(by: 2900)

            var failures = 0
            while failures < fault.repeats {
                let callsBefore = rig.fetcher.total
                // Past the soft point (or a backoff): the good token, and one background refresh.
                #expect(try await rig.engine.token(for: key) == good)
                failures += 1
                let reported = await eventually { rig.failures.count == failures }
                try #require(reported, "\(fault.name): refresh \(failures) reported no failure")
                let failure = rig.failures[failures - 1]
                #expect(rig.fetcher.total == callsBefore + 1, "\(fault.name): one fetch per attempt")

                // The right typed error.
                #expect(fault.matches(failure.error), "\(fault.name): got \(failure.error)")
                #expect(failure.error.isRetryable == fault.retryable, "\(fault.name)")
                #expect(failure.consecutive == failures)
                #expect(rig.engine.memory.entry(key)?.lastError == failure.error)

                // Backoff: equal jitter within [nominal/2, nominal] of base × 2^(n-1) (capped),
                // from the 1 s or the 30 s base; a Retry-After (at most an hour) as a floor.
                let delay = failure.next.timeIntervalSince(rig.time.now)
                let nominal = policy.nominalBackoff(afterFailures: failures, retryable: fault.retryable)
                var bounds = (nominal / 2)...nominal
                if let retryAfter = fault.retryAfter {
                    bounds = max(bounds.lowerBound, min(retryAfter.lowerBound, 3600))...max(bounds.upperBound, min(retryAfter.upperBound, 3600))
                }
                #expect(bounds.contains(delay) || abs(delay - bounds.lowerBound) < 0.001 || abs(delay - bounds.upperBound) < 0.001,
                        "\(fault.name): failure \(failures) backs off \(delay) s, expected \(bounds)")

                // Nothing bad stored: the good token stays; the failure is recorded.
                let entry = try await rig.store.entry(for: key)
                #expect(entry?.token?.fingerprint == good.fingerprint)
                #expect(entry?.token?.expiresAt == good.expiresAt)
                #expect(entry?.failure?.consecutiveFailures == failures)
                #expect(entry?.failure?.lastErrorKind == failure.error.kind)
                #expect(abs((entry?.failure?.nextAttemptAt ?? .distantPast).timeIntervalSince(failure.next)) < 0.01)

                // Inside the backoff: the good token, no fetch, up to just before the next attempt.
                for _ in 0..<20 { #expect(try await rig.engine.token(for: key) == good) }
                await rig.time.advance(by: max(0, min(delay - 0.5, usableUntil.timeIntervalSince(rig.time.now) - 1)))
                #expect(try await rig.engine.token(for: key) == good)
                // Whatever that call set off has run its course (no flight left), then count.
                #expect(await eventually(within: 60) { await rig.engine.isSettled })
                #expect(rig.fetcher.total == callsBefore + 1, "\(fault.name): fetched inside the backoff")

                // No growth: one key in memory, one row in the store, however often it fails.
                #expect(rig.engine.memory.keys == [key])
                #expect(try await rig.store.list(.all).count == 1)

                guard failure.next.addingTimeInterval(1) < usableUntil else { break }
                await rig.time.advance(by: 0.51) // the next attempt is due
            }
            #expect(failures == fault.repeats, "\(fault.name): the test's repeats must fit before the floor")

            // Below the floor the good token is never handed out: a typed error instead.
            if rig.time.now < usableUntil.addingTimeInterval(5) {
                await rig.time.advance(by: usableUntil.addingTimeInterval(5).timeIntervalSince(rig.time.now))
            }
            let unavailable = await #expect(throws: TokenUnavailable.self) { try await rig.engine.token(for: key) }
            if let error = unavailable?.reason.providerError {
                #expect(fault.matches(error), "\(fault.name): unavailable because of \(error)")
            } else {
                Issue.record("\(fault.name): unexpected reason \(String(describing: unavailable?.reason))")
            }
            #expect((unavailable?.nextAttemptAt ?? .distantPast) > rig.time.now)
            #expect(try await rig.store.entry(for: key)?.token?.fingerprint == good.fingerprint)
            if let unavailable { errors.append(unavailable) }

            // The trace-level capture did see the engine at work (so the scan below means something).
            #expect(rig.log.allText.contains("token refresh failed; backing off"))
            #expect(rig.log.allText.contains("serving the current token while the provider fails"))
            try await rig.checkNoSecretLeaks(errors: errors, "\(fault.name)")
        }
    }

    @Test("a running engine retries a tracked key when Retry-After ends, then recovers and clears the failure")
    func scheduledRetryAndRecovery() async throws {
        var policy = FaultRig.defaultPolicy
        policy.softPointJitterFraction = 0 // soft point exactly at 80%: 2880 s
        try await FaultRig.with(seed: 7, policy: policy) { rig in
            let key = self.key
            let running = Task { try await rig.engine.run() }
            defer { running.cancel() }
            await rig.engine.track([key])
            #expect(await eventually { (try? await rig.store.entry(for: key))?.token != nil })
            let good = try #require(rig.engine.heldToken(for: key)?.token)
            #expect(rig.fetcher.total == 1)

            await rig.time.advance(by: 2870)
            #expect(await eventually(within: 60) { await rig.engine.isSettled }, "the scheduler is asleep again")
            #expect(rig.fetcher.total == 1, "refreshed before the soft point")

            rig.use(try await rig.fetcher(for: ProviderFault(
                name: "503", endpoint: .issuer(query: "fault=status&status=503&retry_after=7"), retryable: true) { _ in true }))
            await rig.time.advance(by: 11) // past the soft point: the scheduler refreshes, no caller needed
            #expect(await eventually { rig.failures.count == 1 })
            let failure = try #require(rig.failures.first)
            #expect(failure.error == .httpStatus(code: 503, retryAfter: 7))
            let stored = try #require(try await rig.store.entry(for: key)?.failure)
            #expect(abs(stored.nextAttemptAt.timeIntervalSince(stored.lastFailureAt) - 7) < 0.01)
            #expect(rig.engine.heldToken(for: key)?.token == good)

            // The provider recovers; the scheduler waits out Retry-After, then refetches once.
            rig.use(try FaultRig.http(rig.issuer.urlTemplate, timeout: 10, logger: rig.log.logger))
            await rig.time.advance(by: failure.next.timeIntervalSince(rig.time.now) - 1)
            #expect(await eventually(within: 60) { await rig.engine.isSettled }, "the scheduler is asleep again")
            #expect(rig.fetcher.total == 2, "retried before Retry-After ended")
            await rig.time.advance(by: 1.5)
            #expect(await eventually { (try? await rig.store.entry(for: key))?.failure == nil })
            let entry = try await rig.store.entry(for: key)
            #expect(rig.fetcher.total == 3)
            #expect(entry?.token?.fingerprint != good.fingerprint)
            #expect(entry?.token?.fingerprint == rig.engine.heldToken(for: key)?.token.fingerprint)
            #expect(try await rig.engine.token(for: key) != good)

            running.cancel()
            _ = try? await running.value
            try await rig.checkNoSecretLeaks(errors: [], "scheduled retry")
        }
    }
}
