import CoreMetrics
import Foundation
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The engine's slow path, where order matters: single flight per key, the cross-process lease,
/// fetching under a concurrency bound, backoff, group-committed persistence, the proactive
/// refresh schedule and reactions to other processes' changes. Fresh hits never come here.
actor RefreshCoordinator {
    enum Outcome: Sendable {
        case token(StoredToken)
        case failed(TokenUnavailable.Reason, nextAttemptAt: Date?)
    }

    private enum LeaseDecision {
        case proceed
        case adopted(StoredToken)
        case failedElsewhere(TokenProviderError, Date)
    }

    /// Longest `Retry-After` honoured, so a hostile or broken header cannot stop refreshes for days.
    static let maximumRetryAfter: TimeInterval = 3600
    /// Longest uninterrupted scheduler sleep; bounds the effect of wall-clock jumps.
    static let maximumSleep: TimeInterval = 30
    /// Delay between attempts to write results after the store failed.
    static let storeRetryDelay: TimeInterval = 2

    nonisolated let events = EventBroadcaster()
    private let repository: any TokenRepository
    private let fetcher: any TokenFetcher
    private let policy: RefreshPolicy
    private let validator: TokenValidator
    private let logger: Logger
    private let clock: any Clock<Duration>
    private let now: @Sendable () -> Date
    private let random: @Sendable () -> Double
    private let metrics: SyncMetrics
    private let memory: TokenMemory
    /// Names this process in refresh leases (so others can tell when it died).
    private let holder = RefreshLeaseHolder.make()

    private var inFlight: [TokenKey: Task<Outcome, Never>] = [:]
    private var tracked: Set<TokenKey> = []
    private var queue = DeadlineQueue()
    private var activeFetches = 0
    private var fetchWaiters: [CheckedContinuation<Void, Never>] = []
    private var backgroundFlights = 0
    private var wakeRequested = false
    private nonisolated let sleeper = Mutex<Task<Void, Never>?>(nil)
    private var pendingWrites: [TokenKey: StoredToken] = [:]
    private var flushTask: Task<Void, Never>?
    private var leasedKeys: Set<TokenKey> = []
    private var storeDegraded = false
    private var shuttingDown = false

    init(repository: any TokenRepository, fetcher: any TokenFetcher, policy: RefreshPolicy, logger: Logger,
         clock: any Clock<Duration>, now: @escaping @Sendable () -> Date, random: @escaping @Sendable () -> Double,
         metrics: SyncMetrics, memory: TokenMemory) {
        self.repository = repository
        self.fetcher = fetcher
        self.policy = policy
        self.validator = TokenValidator(policy: policy)
        self.logger = logger
        self.clock = clock
        self.now = now
        self.random = random
        self.metrics = metrics
        self.memory = memory
    }

    private var correctedNow: Date { memory.correctedNow(now()) }

    // MARK: - Entry points

    /// Waits for a token for `key`, joining the key's flight if one is running.
    func obtain(_ key: TokenKey) async -> Outcome {
        await flight(key, demand: true, background: false).value
    }

    /// Like ``obtain(_:)``, but a token past its soft point is refreshed before returning
    /// (one fetch attempt, unless backing off).
    func obtainFresh(_ key: TokenKey) async -> Outcome {
        while let running = inFlight[key] { _ = await running.value }
        return await flight(key, demand: true, background: false, wantFresh: true).value
    }

    /// Starts a refresh of `key` unless one is running; returns at once.
    nonisolated func refreshInBackground(_ key: TokenKey) {
        Task { await self.startBackgroundRefresh(key) }
    }

    private func startBackgroundRefresh(_ key: TokenKey) {
        _ = flight(key, demand: false, background: false)
    }

    func track(_ keys: [TokenKey]) async {
        tracked.formUnion(keys)
        await load(keys.filter { memory.entry($0) == nil })
        for key in keys { scheduleNextRefresh(key) }
    }

    func untrack(_ keys: [TokenKey]) {
        tracked.subtract(keys)
    }

    func invalidate(_ key: TokenKey) async {
        // Keep the backoff: invalidating must not become a way around it.
        memory.installEmpty(key, failure: memory.entry(key)?.failure)
        queue.cancel(key)
        // A rejected token still waiting for its group commit must not reach the store after
        // the removal below.
        pendingWrites[key] = nil
        await flushTask?.value
        do {
            try await repository.removeToken(for: key)
        } catch {
            logger.warning("could not remove an invalidated token from the store", metadata: [
                "key": .string(key.description), "error": .string(error.description),
            ])
        }
        logger.info("token invalidated; the next request fetches a new one", metadata: ["key": .string(key.description)])
        if wantsProactiveRefresh(key) { scheduleNextRefresh(key) }
    }

    // MARK: - One refresh

    private func flight(_ key: TokenKey, demand: Bool, background: Bool, wantFresh: Bool = false) -> Task<Outcome, Never> {
        if let task = inFlight[key] { return task }
        let task = Task { await self.refresh(key, demand: demand, background: background, wantFresh: wantFresh) }
        inFlight[key] = task
        return task
    }

    private func refresh(_ key: TokenKey, demand: Bool, background: Bool, wantFresh: Bool) async -> Outcome {
        defer {
            inFlight[key] = nil
            memory.finishRefreshRequest(key)
            if background {
                backgroundFlights -= 1
                wake()
            }
        }
        if shuttingDown { return .failed(.shuttingDown, nextAttemptAt: nil) }
        if memory.entry(key) == nil { await load([key]) }
        let entry = memory.entry(key)
        let nowC = correctedNow
        if let token = entry?.token, let entry {
            if nowC < entry.softPoint {
                // Fresh (loaded from the store, or refreshed by someone else meanwhile).
                if demand { memory.markUsed(key, at: nowC) }
                scheduleNextRefresh(key)
                return .token(token)
            }
            if demand && !wantFresh && nowC < entry.usableUntil {
                // Due but usable: the caller gets it now; the refresh runs in the background
                // (started here, not left to the scheduler, which runs only inside run()).
                memory.markUsed(key, at: nowC)
                refreshInBackground(key)
                return .token(token)
            }
        }
        // Backoff and lease times are local wall-clock times: they coordinate this machine's
        // processes, whose provider-clock estimates may differ.
        if let failure = entry?.failure, failure.isBackingOff(at: now()) {
            scheduleNextRefresh(key)
            return .failed(.provider(entry?.lastError ?? Self.persistedError(failure)), nextAttemptAt: failure.nextAttemptAt)
        }
        switch await takeLease(key) {
        case .adopted(let token):
            return .token(token)
        case .failedElsewhere(let error, let next):
            return .failed(.provider(error), nextAttemptAt: next)
        case .proceed:
            break
        }
        if shuttingDown || Task.isCancelled {
            await releaseLease(key)
            return .failed(.shuttingDown, nextAttemptAt: nil)
        }
        // What we hold now, not before the lease wait: another process may have stored a newer token.
        return await fetch(key, previous: memory.entry(key)?.token, demand: demand)
    }

    private func fetch(_ key: TokenKey, previous: StoredToken?, demand: Bool) async -> Outcome {
        await acquireFetchSlot()
        if shuttingDown || Task.isCancelled {
            releaseFetchSlot()
            await releaseLease(key)
            return .failed(.shuttingDown, nextAttemptAt: nil)
        }
        let started = ContinuousClock.now
        let result: Result<FetchedToken, TokenProviderError>
        do {
            result = .success(try await fetcher.fetchToken(for: key))
        } catch {
            result = .failure(error)
        }
        releaseFetchSlot()
        metrics.fetchLatency.recordNanoseconds(Int64((ContinuousClock.now - started) / .nanoseconds(1)))
        if Task.isCancelled || shuttingDown {
            await releaseLease(key)
            return .failed(.shuttingDown, nextAttemptAt: nil)
        }
        switch result {
        case .failure(let error):
            return await recordFailure(key, error)
        case .success(let fetched):
            updateClockOffset(fetched)
            let nowC = correctedNow
            do throws(TokenValidationError) {
                var token = try validator.validate(fetched, for: key, now: nowC)
                if let previous, token.expiresAt <= previous.expiresAt {
                    throw .noProgress(expiresAt: previous.expiresAt)
                }
                token.lastUsedAt = demand ? nowC : memory.entry(key)?.lastUsed.nonDistant
                memory.install(token, source: .provider, lastUsed: demand ? nowC : nil)
                metrics.refreshes.increment()
                // Debug, not info: thousands of keys refresh every hour; events() reports them.
                logger.debug("token refreshed", metadata: [
                    "key": .string(key.description), "fingerprint": .string(token.fingerprint.description),
                    "expires_at": .string(token.expiresAt.formatted(.iso8601)),
                ])
                enqueueWrite(token)
                scheduleNextRefresh(key)
                return .token(token)
            } catch {
                return await recordFailure(key, .invalidToken(error))
            }
        }
    }

    private func recordFailure(_ key: TokenKey, _ error: TokenProviderError) async -> Outcome {
        let nowC = correctedNow
        let local = now()
        let failures = (memory.entry(key)?.failure?.consecutiveFailures ?? 0) + 1
        var delay = policy.jitteredBackoff(afterFailures: failures, retryable: error.isRetryable, random: random())
        if let retryAfter = error.retryAfter {
            delay = max(delay, min(retryAfter, Self.maximumRetryAfter))
        }
        let next = local.addingTimeInterval(delay)
        let failure = RefreshFailureState(consecutiveFailures: failures, nextAttemptAt: next, lastErrorKind: error.kind,
                                          lastErrorMessage: error.description, lastFailureAt: local)
        memory.recordFailure(key, failure: failure, error: error)
        metrics.failure(kind: error.kind)
        logger.warning("token refresh failed; backing off", metadata: [
            "key": .string(key.description), "error": .string(error.description),
            "failures": .stringConvertible(failures), "next_attempt_at": .string(next.formatted(.iso8601)),
        ])
        if let held = memory.entry(key), let token = held.token, nowC < held.usableUntil {
            logger.notice("serving the current token while the provider fails (offline mode)", metadata: [
                "key": .string(key.description), "fingerprint": .string(token.fingerprint.description),
                "usable_until": .string(held.usableUntil.formatted(.iso8601)),
            ])
        }
        do {
            try await repository.recordFailure(failure, for: key)
            noteStoreWriteSucceeded()
        } catch {
            noteStoreWriteFailed(error)
        }
        await releaseLease(key)
        events.emit(.refreshFailed(key: key, error: error, consecutiveFailures: failures, nextAttemptAt: next))
        scheduleNextRefresh(key)
        return .failed(.provider(error), nextAttemptAt: next)
    }

    static func persistedError(_ failure: RefreshFailureState) -> TokenProviderError {
        .other(detail: failure.lastErrorMessage ?? failure.lastErrorKind)
    }

    // MARK: - Cross-process single flight

    private func takeLease(_ key: TokenKey) async -> LeaseDecision {
        for _ in 0..<3 {
            let outcome: RefreshLease
            do {
                outcome = try await repository.acquireRefreshLease(for: key, holder: holder, now: now(),
                                                                  duration: policy.leaseDuration)
            } catch {
                logger.warning("could not take the refresh lease; fetching without it", metadata: [
                    "key": .string(key.description), "error": .string(error.description),
                ])
                return .proceed
            }
            switch outcome {
            case .acquired(let current):
                leasedKeys.insert(key)
                if let decision = adoptFromStore(key, current) {
                    await releaseLease(key)
                    return decision
                }
                return .proceed
            case .heldElsewhere(let other, let until, _):
                logger.debug("another process is refreshing this key; waiting for its result", metadata: [
                    "key": .string(key.description), "holder": .string(other),
                ])
                let deadline = min(until, now().addingTimeInterval(policy.leaseDuration))
                while now() < deadline, !Task.isCancelled {
                    try? await Task.sleep(for: .milliseconds(50))
                    guard let current = try? await repository.entry(for: key) else { continue }
                    if let decision = adoptFromStore(key, current) { return decision }
                }
            }
        }
        return .proceed
    }

    /// Takes what another process stored for `key` when it is newer than what we hold: a fresh
    /// token, or a failure whose backoff is still running.
    private func adoptFromStore(_ key: TokenKey, _ stored: TokenEntry?) -> LeaseDecision? {
        let held = memory.entry(key)
        let nowC = correctedNow
        if let token = stored?.token, nowC < token.expiresAt.addingTimeInterval(-policy.floor(of: token)),
           adoptIfNewer(token, failure: stored?.failure),
           let entry = memory.entry(key), nowC < entry.softPoint {
            return .adopted(token)
        }
        if let failure = stored?.failure, failure.isBackingOff(at: now()),
           failure.lastFailureAt > (held?.failure?.lastFailureAt ?? .distantPast) {
            let error = Self.persistedError(failure)
            memory.recordFailure(key, failure: failure, error: error)
            scheduleNextRefresh(key)
            return .failedElsewhere(error, failure.nextAttemptAt)
        }
        return nil
    }

    /// Installs a token another process stored when it is newer than ours (a slow writer's
    /// older token must not replace it), and reports and reschedules the key. Returns whether
    /// it was adopted.
    @discardableResult
    private func adoptIfNewer(_ token: StoredToken, failure: RefreshFailureState?) -> Bool {
        let mine = memory.entry(token.key)?.token
        guard token.value != mine?.value, token.expiresAt > (mine?.expiresAt ?? .distantPast) else { return false }
        memory.install(token, source: .otherProcess, failure: failure)
        logger.info("adopted a token another process stored", metadata: [
            "key": .string(token.key.description), "fingerprint": .string(token.fingerprint.description),
        ])
        events.emit(.refreshed(key: token.key, fingerprint: token.fingerprint, expiresAt: token.expiresAt, source: .otherProcess))
        scheduleNextRefresh(token.key)
        return true
    }

    private func releaseLease(_ key: TokenKey) async {
        guard leasedKeys.remove(key) != nil else { return }
        try? await repository.releaseRefreshLeases(for: [key], holder: holder)
    }

    // MARK: - Fetch concurrency bound

    private func acquireFetchSlot() async {
        if activeFetches < max(1, policy.maxConcurrentFetches) {
            activeFetches += 1
            return
        }
        await withCheckedContinuation { fetchWaiters.append($0) }
    }

    private func releaseFetchSlot() {
        if fetchWaiters.isEmpty {
            activeFetches -= 1
        } else {
            fetchWaiters.removeFirst().resume() // the slot passes straight to the next waiter
        }
    }

    // MARK: - Persistence (group commit)

    private func enqueueWrite(_ token: StoredToken) {
        pendingWrites[token.key] = token
        if flushTask == nil {
            flushTask = Task { await self.flushWrites() }
        }
    }

    /// Writes pending results in batches: whatever accumulates while one transaction commits
    /// goes into the next, so a refresh burst costs a few commits, not one per key.
    private func flushWrites() async {
        while !pendingWrites.isEmpty {
            let batch = Array(pendingWrites.values)
            pendingWrites.removeAll(keepingCapacity: true)
            do {
                try await repository.upsert(batch, clearFailure: true)
                noteStoreWriteSucceeded()
                // A key with a new flight running holds a new lease (same holder): leave it.
                let keys = batch.map(\.key).filter { leasedKeys.contains($0) && inFlight[$0] == nil }
                leasedKeys.subtract(keys)
                try? await repository.releaseRefreshLeases(for: keys, holder: holder)
                for token in batch {
                    logger.debug("token committed to the store", metadata: [
                        "key": .string(token.key.description), "fingerprint": .string(token.fingerprint.description),
                    ])
                    events.emit(.refreshed(key: token.key, fingerprint: token.fingerprint, expiresAt: token.expiresAt, source: .provider))
                }
            } catch {
                noteStoreWriteFailed(error)
                // Keep the newest token per key for the next attempt; memory keeps serving.
                for token in batch where pendingWrites[token.key] == nil { pendingWrites[token.key] = token }
                if shuttingDown { break }
                try? await clock.sleep(for: .seconds(Self.storeRetryDelay))
                if shuttingDown { break }
            }
        }
        flushTask = nil
    }

    private func noteStoreWriteFailed(_ error: TokenStoreError) {
        metrics.storeWriteFailures.increment()
        guard !storeDegraded else { return }
        storeDegraded = true
        logger.error("token store write failed; serving from memory until it works again", metadata: [
            "error": .string(error.description),
        ])
        events.emit(.storeDegraded(error))
    }

    private func noteStoreWriteSucceeded() {
        guard storeDegraded else { return }
        storeDegraded = false
        logger.notice("token store writes work again")
        events.emit(.storeRecovered)
    }

    // MARK: - Loading from the store

    /// Reads the stored entries of `keys` into memory; keys the store lacks are remembered as
    /// empty so a miss does not read the store again.
    private func load(_ keys: [TokenKey]) async {
        guard !keys.isEmpty else { return }
        let found: [TokenKey: TokenEntry]
        do {
            found = try await repository.entries(for: keys)
        } catch {
            logger.warning("could not read stored tokens; they will be fetched", metadata: ["error": .string(error.description)])
            return
        }
        let nowC = correctedNow
        for key in keys where memory.entry(key) == nil {
            let entry = found[key]
            if let token = entry?.token, nowC < token.expiresAt.addingTimeInterval(-policy.floor(of: token)) {
                memory.install(token, source: .store, failure: entry?.failure)
                metrics.storeReuses.increment()
            } else {
                memory.installEmpty(key, failure: entry?.failure)
            }
        }
    }

    // MARK: - Proactive refresh

    private func wantsProactiveRefresh(_ key: TokenKey) -> Bool {
        if tracked.contains(key) { return true }
        guard let lastUsed = memory.entry(key)?.lastUsed else { return false }
        return correctedNow.timeIntervalSince(lastUsed) < policy.idleWindow
    }

    /// Schedules `key` at its soft point, or at its next attempt while backing off, or now
    /// when it holds no usable token. When it comes due, an idle untracked key is evicted
    /// instead of refreshed.
    private func scheduleNextRefresh(_ key: TokenKey) {
        let entry = memory.entry(key)
        let nowC = correctedNow
        var due = entry?.token == nil ? nowC : (entry?.softPoint ?? nowC)
        if let failure = entry?.failure, failure.isBackingOff(at: now()) {
            // The queue runs on corrected time; backoff is kept in local time.
            let retry = failure.nextAttemptAt.addingTimeInterval(nowC.timeIntervalSince(now()))
            if retry > due { due = retry }
        }
        schedule(key, at: due)
    }

    private func schedule(_ key: TokenKey, at due: Date) {
        if queue.schedule(key, at: due) { wake() }
    }

    private func wake() {
        wakeRequested = true
        sleeper.withLock { $0?.cancel() }
    }

    /// The scheduler: one loop over a deadline-ordered queue, sleeping until the earliest
    /// deadline (at most ``maximumSleep``, so wall-clock jumps are noticed) or until woken by
    /// an earlier deadline or a finished refresh. Also follows other processes' store changes.
    func runUntilCancelled() async {
        let watcher = Task { await self.followStoreChanges() }
        defer { watcher.cancel() }
        var lastWall = now()
        while !Task.isCancelled && !shuttingDown {
            let wall = now()
            if wall < lastWall.addingTimeInterval(-RefreshFailureState.clockStepTolerance) {
                // The wall clock was stepped back: queued retries were computed on the old
                // clock and would wait the size of the step on top of their backoff.
                for key in memory.keys where memory.entry(key)?.failure != nil && queue.deadline(of: key) != nil {
                    scheduleNextRefresh(key)
                }
            }
            lastWall = wall
            let nowC = correctedNow
            let slots = max(0, policy.maxConcurrentFetches - backgroundFlights)
            for key in queue.popDue(at: nowC, limit: slots) {
                guard inFlight[key] == nil else { continue }
                guard wantsProactiveRefresh(key) else {
                    // Idle and untracked (a finished trip): stop refreshing it and free its
                    // memory; a later request reads the store again.
                    if pendingWrites[key] == nil { memory.remove(key) }
                    continue
                }
                backgroundFlights += 1
                _ = flight(key, demand: false, background: true)
            }
            if wakeRequested {
                wakeRequested = false
                continue
            }
            var delay = Self.maximumSleep
            if slots > 0 || backgroundFlights < policy.maxConcurrentFetches, let earliest = queue.earliest {
                delay = min(delay, max(0, earliest.timeIntervalSince(nowC)))
            }
            if delay <= 0 { continue }
            await sleep(seconds: delay)
        }
    }

    private func sleep(seconds: TimeInterval) async {
        let clock = self.clock
        let task = Task { _ = try? await clock.sleep(for: .milliseconds(Int64((seconds * 1000).rounded(.up)))) }
        sleeper.withLock { $0 = task }
        if wakeRequested { task.cancel() }
        await withTaskCancellationHandler {
            await task.value
        } onCancel: {
            task.cancel()
        }
        sleeper.withLock { $0 = nil }
    }

    // MARK: - Other processes' changes

    private func followStoreChanges() async {
        for await change in repository.changes() {
            if Task.isCancelled { break }
            switch change {
            case .upserted(let key), .removed(let key):
                await reconcile([key])
            case .unknown:
                await reconcile(memory.keys)
            }
        }
    }

    /// Brings memory in line with the store for `keys` we hold: adopts tokens another process
    /// wrote, and drops tokens another process removed (refetching tracked ones at once).
    private func reconcile(_ keys: [TokenKey]) async {
        let held = keys.filter { memory.entry($0) != nil }
        guard !held.isEmpty else { return }
        let stored: [TokenKey: TokenEntry]
        do {
            stored = try await repository.entries(for: held)
        } catch {
            logger.warning("could not read another process's changes", metadata: ["error": .string(error.description)])
            return
        }
        for key in held {
            let mine = memory.entry(key)?.token
            if let token = stored[key]?.token {
                adoptIfNewer(token, failure: stored[key]?.failure)
            } else if mine != nil, pendingWrites[key] == nil {
                memory.installEmpty(key, failure: nil)
                logger.notice("another process removed a token; it will be fetched again when needed", metadata: [
                    "key": .string(key.description),
                ])
                events.emit(.removedExternally(key: key))
                if wantsProactiveRefresh(key) { schedule(key, at: correctedNow) }
            }
        }
    }

    // MARK: - Clock skew

    /// Estimates the provider's clock offset from its `Date` header, or from an `iat` in our
    /// future (an old `iat` proves nothing: providers cache tokens). Applied only beyond the
    /// threshold, and logged when it starts or stops applying.
    private func updateClockOffset(_ fetched: FetchedToken) {
        let local = now()
        var estimate: TimeInterval?
        if let providerDate = fetched.providerDate {
            estimate = providerDate.timeIntervalSince(local)
        } else if let issued = (try? JWTClaims.decode(fetched.value))?.issuedAt,
                  issued.timeIntervalSince(local) > policy.clockSkewThreshold {
            estimate = issued.timeIntervalSince(local)
        }
        guard let estimate else { return }
        let applied = abs(estimate) > policy.clockSkewThreshold ? estimate : 0
        let previous = memory.state.withLock { state in
            defer { state.clockOffset = applied }
            return state.clockOffset
        }
        if applied != 0 && previous == 0 {
            logger.warning("the token provider's clock differs from ours; judging expiry by the provider's time", metadata: [
                "offset_seconds": .stringConvertible(Int(applied)),
            ])
        } else if applied == 0 && previous != 0 {
            logger.notice("the token provider's clock agrees with ours again")
        }
    }

    // MARK: - Shutdown

    /// Cancels fetches in flight, finishes pending store writes, releases leases, ends events.
    func shutDown() async {
        shuttingDown = true
        wake()
        for task in inFlight.values { task.cancel() }
        for task in Array(inFlight.values) { _ = await task.value }
        if !pendingWrites.isEmpty && flushTask == nil {
            flushTask = Task { await self.flushWrites() }
        }
        await flushTask?.value
        if !leasedKeys.isEmpty {
            try? await repository.releaseRefreshLeases(for: Array(leasedKeys), holder: holder)
            leasedKeys.removeAll()
        }
        events.finish()
    }
}

private extension Date {
    /// nil for `distantPast` (the "never" marker in memory entries).
    var nonDistant: Date? { self == .distantPast ? nil : self }
}
