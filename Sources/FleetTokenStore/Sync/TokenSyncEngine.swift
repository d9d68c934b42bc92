// Sync layer: the engine's public face: hands out tokens, tracks keys, runs as a Service.

public import CoreMetrics
public import Foundation
public import Logging
public import ServiceLifecycle
import Synchronization

/// Hands out tokens per vehicle and trip: fresh ones from memory with no I/O, stale ones while
/// a refresh runs in the background, and new ones fetched once per key however many callers
/// ask. Persists everything through a ``TokenRepository`` so a restart reuses what it stored.
///
/// The rules (soft point, floor, backoff, lifetimes) come from ``RefreshPolicy``; see the
/// README's "How refresh works". Run the engine as a swift-service-lifecycle `Service` (or call
/// ``run()``) for proactive refresh of tracked keys and to follow changes other processes make
/// to the store; ``token(for:)`` works without it.
///
/// ```swift
/// let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: logger)
/// await engine.track([try .vehicle("truck-7")])
/// let group = ServiceGroup(services: [engine], gracefulShutdownSignals: [.sigterm], logger: logger)
/// try await group.run()
/// ```
public final class TokenSyncEngine: Service, Sendable {
    /// The rules the engine follows.
    public let policy: RefreshPolicy

    let memory: TokenMemory
    let coordinator: RefreshCoordinator<EngineParts>
    let metrics: SyncMetrics
    let wallClock: @Sendable () -> Date
    let logger: Logger

    /// Creates an engine on a store that keeps tokens and refresh leases alike, such as
    /// ``SQLiteTokenRepository``.
    ///
    /// - Parameters:
    ///   - repository: Where tokens persist and refresh leases are kept (normally
    ///     ``SQLiteTokenRepository``).
    ///   - fetcher: Gets tokens from the provider.
    ///   - policy: Refresh rules; the defaults suit Fleet Engine.
    ///   - logger: Receives refresh, failure and clock-skew logs. Never a token value.
    ///   - clock: Schedules proactive refreshes and retries; inject a test clock in tests.
    ///   - now: The wall clock expiry is judged by; inject it together with `clock` in tests.
    ///     Defaults to ``coarseWallClock``.
    ///   - random: Uniform values in 0...1 for jitter; injectable for tests.
    ///   - metricsFactory: Makes the engine's swift-metrics instruments; nil uses the process's
    ///     `MetricsSystem.factory` (what `MetricsSystem.bootstrap` installed).
    public convenience init(repository: some TokenRepository & RefreshLeaseStore, fetcher: any TokenFetcher,
                            policy: RefreshPolicy = RefreshPolicy(), logger: Logger,
                            clock: any Clock<Duration> = ContinuousClock(),
                            now: @escaping @Sendable () -> Date = TokenSyncEngine.coarseWallClock,
                            random: @escaping @Sendable () -> Double = { Double.random(in: 0...1) },
                            metricsFactory: (any MetricsFactory)? = nil) {
        self.init(repository: repository, leases: repository, fetcher: fetcher, policy: policy, logger: logger,
                  clock: clock, now: now, random: random, metricsFactory: metricsFactory)
    }

    /// Creates an engine whose tokens and refresh leases may live in different stores.
    ///
    /// - Parameters:
    ///   - repository: Where tokens persist (normally ``SQLiteTokenRepository``).
    ///   - leases: Where the refresh leases that make one process fetch each key live; every
    ///     process sharing `repository` must share these too (normally the same
    ///     ``SQLiteTokenRepository``).
    ///   - fetcher: Gets tokens from the provider.
    ///   - policy: Refresh rules; the defaults suit Fleet Engine.
    ///   - logger: Receives refresh, failure and clock-skew logs. Never a token value.
    ///   - clock: Schedules proactive refreshes and retries; inject a test clock in tests.
    ///   - now: The wall clock expiry is judged by; inject it together with `clock` in tests.
    ///     Defaults to ``coarseWallClock``.
    ///   - random: Uniform values in 0...1 for jitter; injectable for tests.
    ///   - metricsFactory: Makes the engine's swift-metrics instruments; nil uses the process's
    ///     `MetricsSystem.factory` (what `MetricsSystem.bootstrap` installed).
    public init(repository: any TokenRepository, leases: any RefreshLeaseStore, fetcher: any TokenFetcher,
                policy: RefreshPolicy = RefreshPolicy(), logger: Logger,
                clock: any Clock<Duration> = ContinuousClock(),
                now: @escaping @Sendable () -> Date = TokenSyncEngine.coarseWallClock,
                random: @escaping @Sendable () -> Double = { Double.random(in: 0...1) },
                metricsFactory: (any MetricsFactory)? = nil) {
        self.policy = policy
        self.metrics = SyncMetrics(factory: metricsFactory ?? MetricsSystem.factory)
        self.wallClock = now
        self.logger = logger
        let memory = TokenMemory(policy: policy, random: random)
        self.memory = memory
        self.coordinator = RefreshCoordinator(
            repository: repository, leases: leases, fetcher: fetcher, policy: policy, logger: logger, clock: clock,
            now: now, random: random, metrics: metrics, memory: memory)
    }

    // MARK: - Handing out tokens

    /// A token for `key` that is not expired and has more than the floor of life left.
    ///
    /// Fresh tokens come from memory without I/O. Past the soft point the current token is
    /// returned and one background refresh starts. Missing or below the floor, the caller waits
    /// for a fetch shared with every other caller of the key; if it fails, the old token is
    /// returned while it is above the floor (offline mode).
    /// - Throws: ``TokenUnavailable`` with the provider's last error and the next attempt time.
    #if compiler(>=6.2)
    @inlinable
    nonisolated(nonsending) public func token(for key: TokenKey) async throws(TokenUnavailable) -> StoredToken {
        // Inlined into the caller and `nonisolated(nonsending)`: a hit then costs neither a
        // switch to the generic executor nor an async frame of its own, which together were
        // about a third of a hit's cost when profiled. Only a miss makes an async call.
        if let token = tokenFromMemory(key) { return token }
        return try await tokenAfterMiss(key)
    }
    #else
    @inlinable
    public func token(for key: TokenKey) async throws(TokenUnavailable) -> StoredToken {
        if let token = tokenFromMemory(key) { return token }
        return try await tokenAfterMiss(key)
    }
    #endif

    /// The hot path of ``token(for:)``: the held token if it is usable, starting a background
    /// refresh past its soft point; nil on a miss.
    @usableFromInline
    func tokenFromMemory(_ key: TokenKey) -> StoredToken? {
        let localNow = wallClock()
        if let token = memory.freshToken(key, localNow: localNow) {
            metrics.hits.increment()
            return token
        }
        return tokenPastSoftPoint(key, localNow: localNow)
    }

    /// The rest of ``tokenFromMemory(_:)``, decided afresh under the lock: a token past its soft
    /// point (counted, its refresh started by the first caller), or nil on a miss. Out of line,
    /// so that the fresh path's frame stays small (inlined, the task creation cost every hit).
    @inline(never)
    func tokenPastSoftPoint(_ key: TokenKey, localNow: Date) -> StoredToken? {
        switch memory.lookup(key, localNow: localNow) {
        case .fresh(let token):
            metrics.hits.increment()
            return token
        case .stale(let token, let startRefresh, let offline):
            metrics.hits.increment()
            if offline { metrics.servedOffline.increment() }
            if startRefresh { coordinator.refreshInBackground(key) }
            return token
        case .miss:
            return nil
        }
    }

    /// ``token(for:)``'s answer when memory has it (a hit, counted; past the soft point its
    /// refresh starts), without suspending; nil on a miss, for which the caller then awaits
    /// ``token(for:)``. For callers answering on an event loop, which need no task for a hit.
    package func tokenIfHeld(for key: TokenKey) -> StoredToken? {
        tokenFromMemory(key)
    }

    /// Where the token memory holds for `key` came from (`store` when it holds none): what
    /// ``tokenWithSource(for:)`` says of a hit, for callers of ``tokenIfHeld(for:)``.
    package func source(of key: TokenKey) -> TokenSource {
        memory.source(key) ?? .store
    }

    /// The slow path of ``token(for:)``: waits for the shared fetch.
    @usableFromInline
    func tokenAfterMiss(_ key: TokenKey) async throws(TokenUnavailable) -> StoredToken {
        metrics.misses.increment()
        return try await waitForToken(key)
    }

    /// Like ``token(for:)``, also saying where the token came from.
    /// - Throws: ``TokenUnavailable``.
    package func tokenWithSource(for key: TokenKey) async throws(TokenUnavailable) -> (token: StoredToken, source: TokenSource) {
        if let token = tokenFromMemory(key) { return (token, source(of: key)) }
        let token = try await tokenAfterMiss(key)
        return (token, memory.entry(key)?.source ?? .provider)
    }

    /// A token for `key` that is before its soft point when possible: a stored or held token
    /// past it is refreshed first (one fetch attempt, none while backing off). If that fails,
    /// the held token is returned while above the floor. For one-shot runs (`token-agent --once`).
    /// - Throws: ``TokenUnavailable``.
    package func freshToken(for key: TokenKey) async throws(TokenUnavailable) -> (token: StoredToken, source: TokenSource) {
        let token = try await waitForToken(key, fresh: true)
        return (token, memory.entry(key)?.source ?? .provider)
    }

    /// The usable token held in memory for `key`, with its source, without any I/O or fetch;
    /// nil when none is held (not loaded, missing, or below the floor).
    package func heldToken(for key: TokenKey) -> (token: StoredToken, source: TokenSource)? {
        guard let token = memory.usableToken(key, localNow: wallClock()) else { return nil }
        return (token, memory.entry(key)?.source ?? .store)
    }

    /// What memory holds for each subject the engine knows: the tracked ones and those in use,
    /// sorted by key. No I/O and no token values.
    package func subjects() async -> [SubjectStatus] {
        let tracked = await coordinator.trackedKeys
        let local = wallClock()
        return Set(memory.keys).union(tracked).sorted().map { key in
            memory.status(key, tracked: tracked.contains(key), localNow: local)
                ?? SubjectStatus(key: key, tracked: tracked.contains(key), state: .unavailable, expiresAt: nil,
                                 fingerprint: nil, source: nil, failure: nil)
        }
    }

    /// One page of ``subjects()``: at most `limit` subjects after `after` in key order, of those
    /// `included` lets through (a caller's grants, say: the page is full of what it may see).
    package func subjects(after: TokenKey?, limit: Int, where included: (TokenKey) -> Bool = { _ in true }) async -> [SubjectStatus] {
        let tracked = self.tracked.keys
        var page = SubjectPage(after: after, limit: limit)
        for key in memory.keys { page.offer(key, if: included) }
        for key in tracked { page.offer(key, if: included) }
        let local = wallClock()
        return page.keys.map { key in
            memory.status(key, tracked: tracked.contains(key), localNow: local)
                ?? SubjectStatus(key: key, tracked: tracked.contains(key), state: .unavailable, expiresAt: nil,
                                 fingerprint: nil, source: nil, failure: nil)
        }
    }

    /// True when memory holds an entry for `key` (a token, or a failure being backed off): no
    /// I/O, nothing created.
    package func holds(_ key: TokenKey) -> Bool { memory.holds(key) }

    /// How many subjects memory holds entries for: tracked ones and those used within the idle
    /// window. No I/O.
    package var heldCount: Int { memory.count }

    /// How many invalidated subjects memory holds no entry for but keeps while the removal of
    /// their stored token waits for the store: near 0 while the store takes writes, growing
    /// with each such invalidation while it does not. No I/O.
    package var removalsWaitingForUnheldSubjects: Int { memory.removalOnlyCount }

    /// The status of one subject from memory; `.unavailable` when nothing is held for it.
    package func status(of key: TokenKey) -> SubjectStatus {
        memory.status(key, tracked: false, localNow: wallClock())
            ?? SubjectStatus(key: key, tracked: false, state: .unavailable, expiresAt: nil, fingerprint: nil, source: nil, failure: nil)
    }

    /// Hands `body` the standing of each of `keys` now, in order: what ``status(of:)`` says of
    /// each (state, usable, failure), for readiness checks and counts over many subjects. From
    /// memory only, with one clock reading and one lock per 256 keys; `body` runs outside the
    /// lock.
    package func forEachStanding(among keys: [TokenKey], _ body: (TokenKey, SubjectStanding) -> Void) {
        memory.forEachStanding(among: keys, localNow: wallClock(), body)
    }

    private func waitForToken(_ key: TokenKey, fresh: Bool = false) async throws(TokenUnavailable) -> StoredToken {
        let outcome = fresh ? await coordinator.obtainFresh(key) : await coordinator.obtain(key)
        switch outcome {
        case .token(let token):
            return token
        case .failed(let reason, let nextAttempt):
            switch memory.afterFailedFlight(key, localNow: wallClock()) {
            case .serveOffline(let token):
                metrics.servedOffline.increment()
                return token
            case .unavailable:
                metrics.unavailable.increment()
                throw TokenUnavailable(key: key, reason: reason, nextAttemptAt: nextAttempt)
            }
        }
    }

    // MARK: - Tracking and invalidation

    /// Keeps `keys` fresh proactively: each is refreshed at its soft point without anyone
    /// asking. Loads their stored entries in one read (nothing else of the store is read), so a
    /// restarted agent serves them with zero fetches when they are still fresh.
    public func track(_ keys: [TokenKey]) async {
        await coordinator.track(keys)
    }

    /// The keys kept fresh proactively, with a generation that changes whenever they do. No
    /// I/O and no wait for the engine's work: one lock, and the set is shared, not copied. For
    /// edges that follow tracking: remember the generation, look at the keys again when it moved.
    public var tracked: TrackedKeys {
        coordinator.trackedSnapshot.withLock { $0 }
    }

    /// The tracked keys each time a ``track(_:)`` that added keys has taken effect (their stored
    /// tokens are loaded, so ``heldToken(for:)`` answers for them) and each time an
    /// ``untrack(_:)`` removed some. For edges that mirror tracking (the file sink): a key
    /// tracked with a token already stored brings no refresh event. Each call returns a new
    /// stream, which keeps only the newest value for a slow reader and ends when the engine
    /// stops.
    package func trackingChanges() -> AsyncStream<TrackedKeys> {
        coordinator.trackingChanges.subscribe()
    }

    /// Whether `key` is kept fresh proactively (see ``track(_:)``): one lock and a hash lookup.
    package func isTracked(_ key: TokenKey) -> Bool {
        coordinator.trackedSnapshot.withLock { $0.keys.contains(key) }
    }

    /// Stops proactive refresh of `keys` (they are still served, and refreshed on demand while
    /// used within ``RefreshPolicy/idleWindow``).
    public func untrack(_ keys: [TokenKey]) async {
        await coordinator.untrack(keys)
    }

    /// Forgets the token of `key` because Fleet Engine rejected it: it is removed from memory
    /// at once, and the next ``token(for:)`` fetches a new one. The removal from the store is
    /// queued with the engine's other writes and made as soon as the store can be written
    /// (a token of the key fetched earlier never lands after it); meanwhile the stored token is
    /// not read back. Returns without waiting for the store. A key the engine neither holds nor
    /// tracks is only removed from the store: invalidating creates nothing in memory.
    public func invalidate(_ key: TokenKey) async {
        await coordinator.invalidate(key)
    }

    /// What the engine did: refreshes, failures, external removals, store trouble. Each call
    /// returns a new stream; it ends when the engine stops.
    public func events() -> AsyncStream<TokenSyncEvent> {
        coordinator.events.subscribe()
    }

    /// Ends every running backoff now, so each failing key is tried again at once: for when the
    /// cause of the failures may be gone (an operator fixed the provider's credentials or TLS
    /// files and reloaded). Each key's failure count stays, so a key that fails again backs off
    /// from where it was. A backoff the provider asked for with `Retry-After` is kept, unless it
    /// was asked under another provider configuration (``TokenFetcher/configurationDigest``)
    /// than the fetcher's now. Returns how many keys are tried again.
    @discardableResult
    public func retryFailedNow() async -> Int {
        await coordinator.retryFailedNow()
    }

    /// Calls `beat` from the scheduler's own loop at least every `interval` while ``run()``
    /// runs (for systemd's watchdog: `WATCHDOG=1` at half of `WATCHDOG_USEC`). An engine whose
    /// loop is wedged stops calling it, so the supervisor can restart the process. `beat` runs
    /// on the engine's actor: it must be quick and must not wait.
    package func setHeartbeat(every interval: Duration, _ beat: @escaping @Sendable () -> Void) async {
        coordinator.setHeartbeat(every: interval, beat)
    }

    // MARK: - Test support

    /// Whether the engine has nothing to do until its clock moves or another process acts (see
    /// `RefreshCoordinator.isSettled`): tests poll this instead of sleeping.
    var isSettled: Bool {
        get async { await coordinator.isSettled }
    }

    /// Whether ``run()`` is under way: its scheduler loop runs and it follows the store's changes.
    var isRunning: Bool {
        get async { await coordinator.isRunning }
    }

    /// Where the running flight of `key` is (nil when none runs).
    func flightPhase(of key: TokenKey) -> RefreshDecision.State? {
        coordinator.phase(of: key)
    }

    // MARK: - Service

    /// Stops the engine without ``run()``: cancels fetches in flight, waits until every fetched
    /// token is committed to the store, and releases refresh leases, for at most 5 s (what is
    /// not done by then is logged as a warning). For one-shot programs; a running service does
    /// this itself when it stops.
    public func shutdown() async {
        await coordinator.shutDown()
    }

    /// Runs proactive refresh and follows changes other processes make to the store, until the
    /// task is cancelled or a graceful shutdown is triggered; then cancels fetches in flight,
    /// finishes pending store writes, releases refresh leases, and returns.
    ///
    /// Cancelling the task (leaving the scope that runs it, say) stops the engine as a graceful
    /// shutdown does: the writing and releasing are shielded from the cancellation, and wait
    /// for the store at most 5 s; what is not done by then is logged as a warning.
    public func run() async throws {
        await cancelWhenGracefulShutdown {
            await self.coordinator.runUntilCancelled()
        }
        await coordinator.shutDown()
    }
}
