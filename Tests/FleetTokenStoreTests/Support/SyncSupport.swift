// FleetTokenStoreTests' engine support: a repository that counts calls, and an engine on a
// fresh store driven by the test kit's TestTime and ScriptedFetcher.

import FleetTokenStoreTesting
import Foundation
import TestSupportKit
import CoreMetrics
import Logging
import Synchronization
@testable import FleetTokenStore

/// A repository that counts the engine's store and lease calls before forwarding them, to
/// prove the hot path does no I/O. It forwards only what the engine uses.
final class CountingRepository: TokenRepository, RefreshLeaseStore, Sendable {
    let base: SQLiteTokenRepository
    private let counter = Mutex(0)

    init(_ base: SQLiteTokenRepository) { self.base = base }

    var calls: Int { counter.withLock { $0 } }
    private func tick() { counter.withLock { $0 += 1 } }

    func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry? { tick(); return try await base.entry(for: key) }
    func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] { tick(); return try await base.entries(for: keys) }
    func upsert(_ token: StoredToken, clearFailure: Bool) async throws(TokenStoreError) { tick(); try await base.upsert(token, clearFailure: clearFailure) }
    func upsert(_ tokens: [StoredToken], clearFailure: Bool) async throws(TokenStoreError) { tick(); try await base.upsert(tokens, clearFailure: clearFailure) }
    func removeToken(for key: TokenKey) async throws(TokenStoreError) { tick(); try await base.removeToken(for: key) }
    func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) { tick(); try await base.recordFailure(failure, for: key) }
    func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        tick(); return try await base.retiredKeys(before: cutoff, after: after, limit: limit)
    }
    func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int { tick(); return try await base.deleteRetired(keys, before: cutoff) }
    func changes() -> AsyncStream<TokenStoreChange> { base.changes() }
    func runBackgroundWork() async { await base.runBackgroundWork() }
    func followChanges() async { await base.followChanges() }

    func acquireRefreshLease(for key: TokenKey, holder: String, now: Date, duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        tick(); return try await base.acquireRefreshLease(for: key, holder: holder, now: now, duration: duration)
    }
    func takeOverRefreshLease(for key: TokenKey, from deadHolder: String, holder: String, now: Date,
                              duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        tick(); return try await base.takeOverRefreshLease(for: key, from: deadHolder, holder: holder, now: now, duration: duration)
    }
    func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) { tick(); try await base.releaseRefreshLeases(for: keys, holder: holder) }
    func deleteExpiredRefreshLeases(before cutoff: Date, limit: Int) async throws(TokenStoreError) -> Int {
        tick(); return try await base.deleteExpiredRefreshLeases(before: cutoff, limit: limit)
    }
}

/// An engine on a fresh store in a temporary directory, with a test clock.
struct EngineHarness {
    let dir: Scratch
    let time: TestTime
    let store: SQLiteTokenRepository
    let fetcher: ScriptedFetcher
    let engine: TokenSyncEngine
    let log: LogRecorder

    init(dir: Scratch = Scratch(), time: TestTime = TestTime(), fetcher: ScriptedFetcher? = nil,
         policy: RefreshPolicy = RefreshPolicy(), random: Double = 0.5, metrics: (any MetricsFactory)? = nil,
         feedClock: ManualClock? = nil) throws {
        self.dir = dir
        self.time = time
        self.store = try openStore(dir.file("tokens.sqlite"), pollClock: feedClock)
        self.fetcher = fetcher ?? .minting(time)
        self.log = LogRecorder()
        self.engine = TokenSyncEngine(repository: store, fetcher: self.fetcher, policy: policy, logger: log.logger,
                                      clock: time.clock, now: time.wall, random: { random }, metricsFactory: metrics)
    }

    /// A second engine on the same store file (its own repository), as another agent would be.
    func sibling(fetcher: ScriptedFetcher? = nil, policy: RefreshPolicy = RefreshPolicy()) throws -> (TokenSyncEngine, SQLiteTokenRepository) {
        let store = try openStore(dir.file("tokens.sqlite"))
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher ?? self.fetcher, policy: policy,
                                     logger: Logger(label: "sibling"), clock: time.clock, now: time.wall, random: { 0.5 })
        return (engine, store)
    }

    /// Starts `run()` in the background; cancel the returned task to stop it.
    func start() -> Task<Void, any Error> {
        let engine = self.engine
        return Task { try await engine.run() }
    }
}

extension TokenSyncEngine {
    /// Waits until the engine has nothing to do until its clock moves (no flight running or on
    /// its way, nothing to commit, the scheduler asleep with nothing due): what tests check
    /// after a step instead of sleeping for an arbitrary while. False if it did not settle.
    func settle(within seconds: Double = 60) async -> Bool {
        await eventually(within: seconds) { await self.isSettled }
    }
}

extension RefreshDecision.State {
    /// The flight waits for another process's fetch of its key.
    var isWaitingForHolder: Bool {
        if case .waitingForHolder = self { return true }
        return false
    }
}
