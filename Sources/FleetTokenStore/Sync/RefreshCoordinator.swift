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
        /// This process holds the lease (or the store could not be asked): fetch.
        case proceed
        /// Another process's fresher token is here.
        case adopted(StoredToken)
        /// Another process's fetch failed and its backoff runs.
        case failedElsewhere(TokenProviderError, Date)
        /// Another live process is fetching, with a lease until this (local) time.
        case heldElsewhere(until: Date)
    }

    /// Longest `Retry-After` honoured, so a hostile or broken header cannot stop refreshes for days.
    static let maximumRetryAfter: TimeInterval = 3600
    /// Longest uninterrupted scheduler sleep; bounds the effect of wall-clock jumps.
    static let maximumSleep: TimeInterval = 30
    /// Delay between attempts to write results after the store failed.
    static let storeRetryDelay: TimeInterval = 2
    /// Longest wait on another process's lease between checks that its holder is alive and
    /// the lease not given up without a result (which leave no trace in the change feed).
    static let leaseCheckInterval: TimeInterval = 1
    /// Rows deleted per transaction by the retention sweep, so readers and writers never wait long.
    static let retentionBatch = 500
    /// Time between retention sweeps (or the retention itself, when shorter).
    static let retentionSweepInterval: TimeInterval = 3600
    /// The first sweep runs this soon after start, off start-up's own work: agents restart.
    static let firstRetentionSweepDelay: TimeInterval = 5
    /// Sweeps scan the table: never more often than this, however short the retention.
    static let minimumRetentionSweepInterval: TimeInterval = 60

    nonisolated let events = EventBroadcaster()
    private let repository: any TokenRepository
    private let leases: any RefreshLeaseStore
    private let fetcher: any TokenFetcher
    private let policy: RefreshPolicy
    private let validator: TokenValidator
    private let logger: Logger
    private let clock: any Clock<Duration>
    /// Elapsed time on `clock`, to tell a stepped wall clock from time passing.
    private let elapsed: @Sendable () -> Duration
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
    /// Flights queued for a fetch slot, oldest first.
    private var fetchWaiters: [(key: TokenKey, continuation: CheckedContinuation<Bool, Never>)] = []
    private var backgroundFlights = 0
    private var wakeRequested = false
    private nonisolated let sleeper = Mutex<Task<Void, Never>?>(nil)
    private var pendingWrites: [TokenKey: StoredToken] = [:]
    private var flushTask: Task<Void, Never>?
    private var leasedKeys: Set<TokenKey> = []
    private var storeDegraded = false
    private var shuttingDown = false
    private var clockOffset: ProviderClockOffset
    /// Wall-clock and elapsed time when steps were last measured from (see ``WallClockSteps``).
    private var clockSteps: WallClockSteps
    /// The supervisor's liveness signal, when one is set.
    private var heartbeat: SchedulerHeartbeat?

    init(repository: any TokenRepository, leases: any RefreshLeaseStore, fetcher: any TokenFetcher,
         policy: RefreshPolicy, logger: Logger,
         clock: any Clock<Duration>, now: @escaping @Sendable () -> Date, random: @escaping @Sendable () -> Double,
         metrics: SyncMetrics, memory: TokenMemory) {
        self.repository = repository
        self.leases = leases
        self.fetcher = fetcher
        self.policy = policy
        self.validator = TokenValidator(policy: policy)
        self.logger = logger
        self.clock = clock
        self.elapsed = Self.elapsedReader(clock)
        self.now = now
        self.clockOffset = ProviderClockOffset(threshold: policy.clockSkewThreshold)
        self.clockSteps = WallClockSteps(wall: now(), elapsed: self.elapsed(), tolerance: RefreshFailureState.clockStepTolerance)
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

    /// The keys kept fresh proactively.
    var trackedKeys: Set<TokenKey> { tracked }

    func untrack(_ keys: [TokenKey]) {
        tracked.subtract(keys)
    }

    func invalidate(_ key: TokenKey) async {
        // Keep the backoff: invalidating must not become a way around it.
        memory.installEmpty(key, failure: memory.entry(key)?.failure)
        queue.cancel(key)
        // A rejected token still waiting for its group commit must not reach the store after
        // the removal below; the commit would have released the key's lease, so release it here.
        if pendingWrites.removeValue(forKey: key) != nil && inFlight[key] == nil { await releaseLease(key) }
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
        // Any token fresher than this one ends the flight: whoever fetched it, this process's
        // change follower or the lease wait below may install it first.
        let startedFrom = entry?.token
        while true {
            if shuttingDown || Task.isCancelled { return .failed(.shuttingDown, nextAttemptAt: nil) }
            if let token = fresherHeld(key, than: startedFrom) { return .token(token) }
            // The fetch slot before the lease: a lease must not age while its key queues.
            guard await acquireFetchSlot(for: key) else { continue } // a fresher token came meanwhile, or shutdown
            if shuttingDown || Task.isCancelled {
                releaseFetchSlot()
                return .failed(.shuttingDown, nextAttemptAt: nil)
            }
            switch await takeLease(key, startedFrom: startedFrom) {
            case .adopted(let token):
                releaseFetchSlot()
                return .token(token)
            case .failedElsewhere(let error, let next):
                releaseFetchSlot()
                return .failed(.provider(error), nextAttemptAt: next)
            case .heldElsewhere(let until):
                releaseFetchSlot()
                if let decision = await waitForHolder(key, until: until, startedFrom: startedFrom) {
                    if case .adopted(let token) = decision { return .token(token) }
                    if case .failedElsewhere(let error, let next) = decision { return .failed(.provider(error), nextAttemptAt: next) }
                }
            case .proceed:
                // What we hold now, not before the lease wait: another process may have stored a newer token.
                return await fetch(key, previous: memory.entry(key)?.token, demand: demand)
            }
        }
    }

    /// Fetches `key` holding a fetch slot (released here) and, normally, its lease.
    private func fetch(_ key: TokenKey, previous: StoredToken?, demand: Bool) async -> Outcome {
        if shuttingDown || Task.isCancelled {
            releaseFetchSlot()
            await releaseLease(key)
            return .failed(.shuttingDown, nextAttemptAt: nil)
        }
        let started = ContinuousClock.now
        let result = await fetchRenewingLease(key)
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
            learnClockOffset(from: fetched)
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

    /// One attempt at `key`'s lease, adopting what another process stored meanwhile.
    private func takeLease(_ key: TokenKey, startedFrom: StoredToken?) async -> LeaseDecision {
        let outcome: RefreshLease
        do {
            outcome = try await acquireLease(key)
        } catch {
            logger.warning("could not take the refresh lease; fetching without it", metadata: [
                "key": .string(key.description), "error": .string(error.description),
            ])
            return .proceed
        }
        switch outcome {
        case .acquired(let current):
            leasedKeys.insert(key)
            if let decision = adoptFromStore(key, current, startedFrom: startedFrom) {
                await releaseLease(key)
                return decision
            }
            return .proceed
        case .heldElsewhere(let other, let until, let current):
            if let decision = adoptFromStore(key, current, startedFrom: startedFrom) { return decision }
            logger.debug("another process is refreshing this key; waiting for its result", metadata: [
                "key": .string(key.description), "holder": .string(other),
            ])
            return .heldElsewhere(until: until)
        }
    }

    /// Waits for another process's fetch of `key`: returns its result as soon as the change feed
    /// shows it; nil when the lease should be tried again (a check interval passed, or the lease
    /// ran out), which also finds a holder that died or gave up without a result.
    private func waitForHolder(_ key: TokenKey, until: Date, startedFrom: StoredToken?) async -> LeaseDecision? {
        let clock = self.clock
        while !shuttingDown && !Task.isCancelled {
            let limit = min(Self.leaseCheckInterval, until.timeIntervalSince(now()))
            guard limit > 0 else { return nil }
            // A stream per round: cancelling its reader below ends it.
            let changes = repository.changes()
            // true: the feed mentioned the key; false: the check interval passed; nil: the feed
            // ended (a closing or feedless repository), which is no signal: the timer decides.
            let changed = await withTaskGroup(of: Bool?.self) { group in
                group.addTask {
                    for await change in changes {
                        switch change {
                        case .upserted(let changedKey), .removed(let changedKey): if changedKey == key { return true }
                        case .unknown: return true
                        }
                    }
                    return nil
                }
                group.addTask {
                    try? await clock.sleep(for: .milliseconds(Int64((limit * 1000).rounded(.up))))
                    return false
                }
                var first = await group.next() ?? false
                if first == nil { first = await group.next() ?? false }
                group.cancelAll()
                return first ?? false
            }
            if let token = fresherHeld(key, than: startedFrom) { return .adopted(token) }
            guard changed else { return nil }
            if let stored = try? await repository.entry(for: key),
               let decision = adoptFromStore(key, stored, startedFrom: startedFrom) {
                return decision
            }
        }
        return nil
    }

    /// The token held for `key` when it is fresher than `startedFrom` and before its soft point.
    private func fresherHeld(_ key: TokenKey, than startedFrom: StoredToken?) -> StoredToken? {
        guard let entry = memory.entry(key), let token = entry.token, entry.softPoint > correctedNow,
              token.expiresAt > (startedFrom?.expiresAt ?? .distantPast) else { return nil }
        return token
    }

    /// Takes what another process stored for `key` when it is fresher than the token the flight
    /// started from: a token (adopted unless memory already holds it or a newer one), or a
    /// failure whose backoff is still running.
    private func adoptFromStore(_ key: TokenKey, _ stored: TokenEntry?, startedFrom: StoredToken?) -> LeaseDecision? {
        let held = memory.entry(key)
        if let token = stored?.token, token.expiresAt > (startedFrom?.expiresAt ?? .distantPast),
           correctedNow < token.expiresAt.addingTimeInterval(-policy.floor(of: token)) {
            adoptIfNewer(token, failure: stored?.failure)
            if let fresher = fresherHeld(key, than: startedFrom) { return .adopted(fresher) }
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

    /// Fetches `key`, renewing its lease while the request runs (a slow provider must not let
    /// the lease lapse and another process fetch the same key).
    private func fetchRenewingLease(_ key: TokenKey) async -> Result<FetchedToken, TokenProviderError> {
        let fetcher = self.fetcher
        let fetch: @Sendable () async -> Result<FetchedToken, TokenProviderError> = {
            do throws(TokenProviderError) { return .success(try await fetcher.fetchToken(for: key)) } catch { return .failure(error) }
        }
        guard leasedKeys.contains(key) else { return await fetch() }
        return await withTaskGroup(of: Result<FetchedToken, TokenProviderError>?.self) { group in
            group.addTask { await fetch() }
            group.addTask { await self.renewLease(key); return nil }
            var result: Result<FetchedToken, TokenProviderError> = .failure(.other(detail: "cancelled"))
            while let next = await group.next() {
                if let next {
                    result = next
                    break
                }
            }
            group.cancelAll()
            return result
        }
    }

    /// Extends `key`'s lease every third of its duration until cancelled or lost.
    private func renewLease(_ key: TokenKey) async {
        let interval = Duration.milliseconds(Int64(max(policy.leaseDuration / 3, 0.01) * 1000))
        while !Task.isCancelled {
            do { try await clock.sleep(for: interval) } catch { return }
            do {
                if case .heldElsewhere(let other, _, _) = try await acquireLease(key) {
                    logger.warning("another process took over the refresh lease while this fetch ran", metadata: [
                        "key": .string(key.description), "holder": .string(other),
                    ])
                    return
                }
            } catch {
                logger.debug("could not renew the refresh lease; will retry", metadata: [
                    "key": .string(key.description), "error": .string(error.description),
                ])
            }
        }
    }

    /// Installs a token another process stored when it is newer than ours (a slow writer's
    /// older token must not replace it), and reports and reschedules the key. Returns whether
    /// it was adopted.
    @discardableResult
    private func adoptIfNewer(_ token: StoredToken, failure: RefreshFailureState?) -> Bool {
        let mine = memory.entry(token.key)?.token
        guard token.value != mine?.value, token.expiresAt > (mine?.expiresAt ?? .distantPast) else { return false }
        memory.install(token, source: .otherProcess, failure: failure)
        endSlotWait(for: token.key)
        logger.info("adopted a token another process stored", metadata: [
            "key": .string(token.key.description), "fingerprint": .string(token.fingerprint.description),
        ])
        events.emit(.refreshed(key: token.key, fingerprint: token.fingerprint, expiresAt: token.expiresAt, source: .otherProcess))
        scheduleNextRefresh(token.key)
        return true
    }

    /// Takes or renews `key`'s lease. A lease held by a process of this machine that has
    /// exited is taken over at once (see ``RefreshLeaseHolder``), from exactly that holder: a
    /// crashed agent must not hold up its restarted successor.
    private func acquireLease(_ key: TokenKey) async throws(TokenStoreError) -> RefreshLease {
        let outcome = try await leases.acquireRefreshLease(for: key, holder: holder, now: now(),
                                                           duration: policy.leaseDuration)
        guard case .heldElsewhere(let other, _, _) = outcome, RefreshLeaseHolder.isDeadProcess(other) else { return outcome }
        logger.debug("the refresh lease's holder has exited; taking the lease over", metadata: [
            "key": .string(key.description), "holder": .string(other),
        ])
        return try await leases.takeOverRefreshLease(for: key, from: other, holder: holder, now: now(),
                                                     duration: policy.leaseDuration)
    }

    private func releaseLease(_ key: TokenKey) async {
        guard leasedKeys.remove(key) != nil else { return }
        try? await leases.releaseRefreshLeases(for: [key], holder: holder)
    }

    // MARK: - Fetch concurrency bound

    /// Waits for one of ``RefreshPolicy/maxConcurrentFetches`` slots: true with a slot; false,
    /// without one, when a fresher token for `key` arrived while it queued.
    private func acquireFetchSlot(for key: TokenKey) async -> Bool {
        if activeFetches < max(1, policy.maxConcurrentFetches) {
            activeFetches += 1
            return true
        }
        return await withCheckedContinuation { fetchWaiters.append((key, $0)) }
    }

    private func releaseFetchSlot() {
        if fetchWaiters.isEmpty {
            activeFetches -= 1
        } else {
            fetchWaiters.removeFirst().continuation.resume(returning: true) // the slot passes straight on
        }
    }

    /// Ends the slot wait of `key`'s flight, whose caller can have the token just installed:
    /// a caller must not queue behind other keys' fetches for a token already here.
    private func endSlotWait(for key: TokenKey) {
        guard let index = fetchWaiters.firstIndex(where: { $0.key == key }) else { return }
        fetchWaiters.remove(at: index).continuation.resume(returning: false)
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
                try? await leases.releaseRefreshLeases(for: keys, holder: holder)
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
        // Child tasks: following other processes' changes and the retention sweep end with the
        // scheduler, and are awaited before shutdown goes on.
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.followStoreChanges() }
            group.addTask { await self.sweepRetiredRowsPeriodically() }
            await scheduleUntilCancelled()
            group.cancelAll()
        }
    }

    /// Gives every key in backoff its next attempt now (see ``TokenSyncEngine/retryFailedNow()``).
    func retryFailedNow() -> Int {
        let keys = memory.endBackoffs(at: now())
        let due = correctedNow
        for key in keys { schedule(key, at: due) }
        wake()
        return keys.count
    }

    /// Calls `beat` from the scheduler loop at least every `interval`.
    func setHeartbeat(every interval: Duration, _ beat: @escaping @Sendable () -> Void) {
        heartbeat = SchedulerHeartbeat(interval: interval, beat: beat)
        wake()
    }

    private func scheduleUntilCancelled() async {
        while !Task.isCancelled && !shuttingDown {
            let untilHeartbeat = heartbeat?.beatIfDue(at: elapsed())
            // The wall clock moved more or less than time passed: it was stepped (NTP, an operator).
            if let step = clockSteps.observe(wall: now(), elapsed: elapsed()) { wallClockStepped(by: step) }
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
            // While a provider offset applies, a wall-clock step must be noticed within a second:
            // until then tokens are judged on the old offset.
            var delay = clockOffset.applied == 0 ? Self.maximumSleep : 1
            if slots > 0 || backgroundFlights < policy.maxConcurrentFetches, let earliest = queue.earliest {
                delay = min(delay, max(0, earliest.timeIntervalSince(nowC)))
            }
            if let untilHeartbeat { delay = min(delay, Double(untilHeartbeat.components.seconds) + Double(untilHeartbeat.components.attoseconds) * 1e-18) }
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
                // A purge removes tokens, not the backoff: a row left with failure state keeps
                // it here too (the newer of the stored and the held one). A deleted row was
                // purged with its failure state, on purpose.
                let failure = stored[key].map { Self.newer($0.failure, memory.entry(key)?.failure) } ?? nil
                memory.installEmpty(key, failure: failure)
                logger.notice("another process removed a token; it will be fetched again when needed", metadata: [
                    "key": .string(key.description),
                ])
                events.emit(.removedExternally(key: key))
                if wantsProactiveRefresh(key) { scheduleNextRefresh(key) }
            }
        }
    }

    static func newer(_ a: RefreshFailureState?, _ b: RefreshFailureState?) -> RefreshFailureState? {
        guard let a, let b else { return a ?? b }
        return a.lastFailureAt >= b.lastFailureAt ? a : b
    }

    // MARK: - Clock skew

    /// Re-estimates the provider's clock offset from a successful answer (see
    /// ``ProviderClockOffset``), logging when a correction starts or stops applying.
    private func learnClockOffset(from fetched: FetchedToken) {
        let issuedAt = fetched.providerDate == nil ? (try? JWTClaims.decode(fetched.value))?.issuedAt : nil
        let previous = clockOffset.applied
        let local = now()
        clockOffset.learn(providerDate: fetched.providerDate, issuedAt: issuedAt, localNow: local)
        // The answer already reflects any step so far: later steps are measured from here.
        clockSteps.rebase(wall: local, elapsed: elapsed())
        applyClockOffset(previous: previous)
    }

    /// Our wall clock was stepped by `step` seconds (positive: forward) relative to elapsed time.
    private func wallClockStepped(by step: TimeInterval) {
        let previous = clockOffset.applied
        clockOffset.wallClockStepped(by: step)
        logger.notice("the wall clock was stepped; expiry is judged against the corrected time", metadata: [
            "step_seconds": .stringConvertible(Int(step.rounded())),
            "offset_seconds": .stringConvertible(Int(clockOffset.applied.rounded())),
        ])
        applyClockOffset(previous: previous)
        // Deadlines are kept in corrected time; retries in local time, which the step moved.
        for key in memory.keys where queue.deadline(of: key) != nil {
            scheduleNextRefresh(key)
        }
    }

    private func applyClockOffset(previous: TimeInterval) {
        let applied = clockOffset.applied
        memory.state.withLock { $0.clockOffset = applied }
        if applied != 0 && previous == 0 {
            logger.warning("the token provider's clock differs from ours; judging expiry by the provider's time", metadata: [
                "offset_seconds": .stringConvertible(Int(applied)),
            ])
        } else if applied == 0 && previous != 0 {
            logger.notice("the token provider's clock agrees with ours again")
        }
    }

    private static func elapsedReader<C: Clock>(_ clock: C) -> @Sendable () -> Duration where C.Duration == Duration {
        let origin = clock.now
        return { origin.duration(to: clock.now) }
    }

    // MARK: - Retention

    /// Deletes, shortly after start and then every ``retentionSweepInterval`` (or
    /// ``RefreshPolicy/retention`` when shorter), the rows of keys nobody here tracks or holds
    /// that have been dead for the retention period, in batches of ``retentionBatch``.
    private func sweepRetiredRowsPeriodically() async {
        guard policy.retention > 0 else { return }
        var delay = min(Self.firstRetentionSweepDelay, policy.retention)
        while !Task.isCancelled && !shuttingDown {
            do { try await clock.sleep(for: .milliseconds(Int64(delay * 1000))) } catch { return }
            await sweepRetiredRows()
            delay = max(Self.minimumRetentionSweepInterval, min(Self.retentionSweepInterval, policy.retention))
        }
    }

    func sweepRetiredRows() async {
        let cutoff = now().addingTimeInterval(-policy.retention)
        var after: TokenKey?
        var deleted = 0
        do {
            while !Task.isCancelled && !shuttingDown {
                let candidates = try await repository.retiredKeys(before: cutoff, after: after, limit: Self.retentionBatch)
                after = candidates.last
                let unused = candidates.filter {
                    !tracked.contains($0) && memory.entry($0) == nil && inFlight[$0] == nil && pendingWrites[$0] == nil
                }
                if !unused.isEmpty { deleted += try await repository.deleteRetired(unused, before: cutoff) }
                if candidates.count < Self.retentionBatch { break }
                await Task.yield()
            }
        } catch {
            logger.warning("could not delete the rows of finished subjects; will retry", metadata: ["error": .string(error.description)])
        }
        if deleted > 0 {
            logger.info("deleted the rows of subjects unused past the retention period", metadata: [
                "rows": .stringConvertible(deleted), "retention_seconds": .stringConvertible(Int(policy.retention)),
            ])
        }
    }

    // MARK: - Shutdown

    /// Cancels fetches in flight, finishes pending store writes, releases leases, ends events.
    func shutDown() async {
        shuttingDown = true
        wake()
        // Flights queued for a fetch slot end without one (they see the shutdown and return).
        for waiter in fetchWaiters { waiter.continuation.resume(returning: false) }
        fetchWaiters.removeAll()
        for task in inFlight.values { task.cancel() }
        for task in Array(inFlight.values) { _ = await task.value }
        if !pendingWrites.isEmpty && flushTask == nil {
            flushTask = Task { await self.flushWrites() }
        }
        await flushTask?.value
        if !leasedKeys.isEmpty {
            try? await leases.releaseRefreshLeases(for: Array(leasedKeys), holder: holder)
            leasedKeys.removeAll()
        }
        events.finish()
    }
}

private extension Date {
    /// nil for `distantPast` (the "never" marker in memory entries).
    var nonDistant: Date? { self == .distantPast ? nil : self }
}
