// Issue 27 item 7 in the engine: a failure is stored with the digest of the provider
// configuration that failed (TokenFetcher.configurationDigest); a stored failure of another
// configuration holds no backoff, one of the same configuration (or of an unknown one) does.
// On a real SQLite store, with test time: no waiting.

import FleetTokenStoreTesting
import Foundation
import Logging
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// A scripted fetcher whose configuration digest the test sets (an agent's changes on reload).
final class DigestFetcher: TokenFetcher, Sendable {
    let base: ScriptedFetcher
    private let digest: Mutex<String?>

    init(_ base: ScriptedFetcher, digest: String?) {
        self.base = base
        self.digest = Mutex(digest)
    }

    var configurationDigest: String? { digest.withLock { $0 } }

    func setDigest(_ value: String?) { digest.withLock { $0 = value } }

    func fetchToken(for key: TokenKey) async throws(TokenProviderError) -> FetchedToken {
        try await base.fetchToken(for: key)
    }
}

@Suite("A failure is bound to the provider configuration that made it", .paced)
struct FailureBindingTests {
    let time = TestTime()

    func engine(_ store: SQLiteTokenRepository, _ fetcher: DigestFetcher) -> TokenSyncEngine {
        TokenSyncEngine(repository: store, fetcher: fetcher, logger: Logger(label: "test"), clock: time.clock,
                        now: time.wall, random: { 0.5 })
    }

    func storedFailure(digest: String?) -> RefreshFailureState {
        RefreshFailureState(consecutiveFailures: 1, nextAttemptAt: time.now + 300, lastErrorKind: "tlsCertificate",
                            lastErrorMessage: "TLS certificate problem", lastFailureAt: time.now - 1, configurationDigest: digest)
    }

    @Test("a failing fetch stores the digest of the configuration it used")
    func failureStoresDigest() async throws {
        let dir = Scratch()
        let store = try openStore(dir.file("tokens.sqlite"))
        defer { store.close() }
        let key = try TokenKey.vehicle("v-tls")
        let fetcher = DigestFetcher(ScriptedFetcher { _, _ throws(TokenProviderError) in
            throw .tlsCertificate(detail: "unknown CA")
        }, digest: "config-a")
        let engine = engine(store, fetcher)
        await #expect(throws: TokenUnavailable.self) { try await engine.token(for: key) }
        await engine.shutdown()
        #expect(try await store.entry(for: key)?.failure?.configurationDigest == "config-a")
    }

    @Test("a stored failure of another configuration is tried at once; of the same one, or of an unknown one, the backoff holds")
    func storedFailureJudgedByDigest() async throws {
        let dir = Scratch()
        let store = try openStore(dir.file("tokens.sqlite"))
        defer { store.close() }
        let (same, other, unknown) = (try TokenKey.vehicle("same"), try TokenKey.vehicle("other"), try TokenKey.vehicle("unknown"))
        try await store.recordFailure(storedFailure(digest: "config-a"), for: same)
        try await store.recordFailure(storedFailure(digest: "config-a"), for: other)
        try await store.recordFailure(storedFailure(digest: nil), for: unknown)

        // A run with configuration A: A's failure holds, an older build's (no digest) holds.
        let minting = ScriptedFetcher.minting(time)
        let first = engine(store, DigestFetcher(minting, digest: "config-a"))
        for key in [same, unknown] {
            await #expect(throws: TokenUnavailable.self) { try await first.token(for: key) }
        }
        #expect(minting.total == 0, "a backoff of the same configuration was not honoured")
        await first.shutdown()

        // A run with configuration B (a flag or a file fixed): A's failure is tried at once.
        let second = engine(store, DigestFetcher(minting, digest: "config-b"))
        _ = try await second.token(for: other)
        #expect(minting.count(other) == 1)
        await #expect(throws: TokenUnavailable.self) { try await second.token(for: unknown) }
        #expect(minting.count(unknown) == 0)
        await second.shutdown()
        #expect(try await store.entry(for: other)?.failure == nil)
    }

    @Test("tracked keys loaded with another configuration's failure are fetched by the scheduler at once")
    func trackedKeysTriedAtOnce() async throws {
        let dir = Scratch()
        let store = try openStore(dir.file("tokens.sqlite"))
        defer { store.close() }
        let key = try TokenKey.vehicle("v-tls")
        try await store.recordFailure(storedFailure(digest: "config-a"), for: key)
        let minting = ScriptedFetcher.minting(time)
        let engine = engine(store, DigestFetcher(minting, digest: "config-b"))
        let running = Task { try await engine.run() }
        defer { running.cancel() }
        await engine.track([key])
        #expect(await eventually(within: 30) { engine.status(of: key).isUsable }, "not fetched before the old backoff's end")
        #expect(minting.count(key) == 1)
    }

    @Test("retryFailedNow (an agent's reload) ends a Retry-After backoff only when the configuration changed")
    func reloadEndsRetryAfterOfAnotherConfiguration() async throws {
        let dir = Scratch()
        let store = try openStore(dir.file("tokens.sqlite"))
        defer { store.close() }
        let key = try TokenKey.vehicle("v")
        let scripted = ScriptedFetcher { _, _ throws(TokenProviderError) in throw .httpStatus(code: 503, retryAfter: 600) }
        let fetcher = DigestFetcher(scripted, digest: "config-a")
        let engine = engine(store, fetcher)
        await #expect(throws: TokenUnavailable.self) { try await engine.token(for: key) }
        #expect(await engine.retryFailedNow() == 0, "the provider's Retry-After is kept for the same configuration")
        fetcher.setDigest("config-b")
        #expect(await engine.retryFailedNow() == 1)
        await engine.shutdown()
    }
}
