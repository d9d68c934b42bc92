// Sync layer: the engine's slow path, where order matters: one flight per key, the tracked
// keys, the proactive-refresh loop, other processes' changes, invalidation and shutdown.
// Fresh hits never come here (TokenMemory serves them).
import Foundation
import Logging
import Synchronization

/// Starts and joins flights (one per key; a ``RefreshFlight`` each), keeps the tracked keys
/// scheduled, follows other processes' changes, and runs the engine's long-running work as
/// child tasks of ``runUntilCancelled()``: the scheduler loop, the change follower, the group
/// commit and the retention sweep. Everything else it does goes through its `Effects`
/// (``CoordinatorEffects``: small protocols, one per job); the engine's are ``EngineParts``.
actor RefreshCoordinator<Effects: CoordinatorEffects> {
    typealias Outcome = RefreshOutcome

    nonisolated let effects: Effects
    private let sweeper: RetentionSweeper
    private var inFlight: [TokenKey: Task<Outcome, Never>] = [:]
    private var tracked: Set<TokenKey> = [] {
        didSet {
            // Published for readers that must not wait for the actor (the engine's `tracked`).
            guard tracked.count != oldValue.count || tracked != oldValue else { return }
            let keys = tracked
            trackedSnapshot.withLock { $0 = TrackedKeys(keys: keys, generation: $0.generation + 1) }
        }
    }
    /// ``tracked`` and its generation, behind a lock: read by the engine without an actor hop.
    nonisolated let trackedSnapshot = Mutex(TrackedKeys())
    /// The tracked keys after each ``track(_:)`` (once its stored tokens are loaded) and
    /// ``untrack(_:)`` that changed them: for edges that mirror tracking and must not wait for
    /// a refresh event (a newly tracked key loaded from the store has none). A slow reader
    /// keeps the newest.
    nonisolated let trackingChanges = EventBroadcaster<TrackedKeys>(buffering: .bufferingNewest(1))
    /// Flights the scheduler started and that have not ended: they count against the fetch bound.
    private var backgroundFlights = 0
    /// Background refreshes asked for by hits, on their way to the actor.
    private nonisolated let startsInTransit = Atomic<Int>(0)
    private var schedulerRunning = false
    private var followingChanges = false

    init(effects: Effects, sweeper: RetentionSweeper) {
        self.effects = effects
        self.sweeper = sweeper
    }

    nonisolated var events: EventBroadcaster<TokenSyncEvent> { effects.events }

    // MARK: - Entry points

    /// Waits for a token for `key`, joining the key's flight if one is running.
    func obtain(_ key: TokenKey) async -> Outcome {
        await flight(key, .caller).value
    }

    /// Like ``obtain(_:)``, but a token past its soft point is refreshed before returning
    /// (one fetch attempt, unless backing off).
    func obtainFresh(_ key: TokenKey) async -> Outcome {
        while let running = inFlight[key] { _ = await running.value }
        return await flight(key, .callerWantsFresh).value
    }

    /// Starts a refresh of `key` unless one is running; returns at once. Called from the hot
    /// path, which cannot wait for the actor: the hop is a task of its own, and the flight it
    /// starts ends with the engine's shutdown like every other.
    nonisolated func refreshInBackground(_ key: TokenKey) {
        startsInTransit.add(1, ordering: .relaxed)
        Task { await self.startBackgroundRefresh(key) }
    }

    private func startBackgroundRefresh(_ key: TokenKey) {
        _ = flight(key, .background)
        startsInTransit.subtract(1, ordering: .relaxed)
    }

    /// Whether the engine has nothing to do until its clock moves or another process acts: no
    /// flight runs or is on its way, nothing waits to be committed, and the scheduler (when
    /// running) sleeps with nothing due. Tests wait for this instead of sleeping.
    var isSettled: Bool {
        startsInTransit.load(ordering: .relaxed) == 0 && inFlight.isEmpty && effects.commitsIdle
            && (!schedulerRunning || effects.isSchedulerParked)
    }

    /// Whether ``runUntilCancelled()`` is under way: the scheduler loop runs and the store's
    /// change feed is followed.
    var isRunning: Bool { schedulerRunning && followingChanges }

    /// Where the flight of `key` is, while one runs.
    nonisolated func phase(of key: TokenKey) -> RefreshDecision.State? {
        effects.flightPhase(of: key)
    }

    func track(_ keys: [TokenKey]) async {
        // At start-up, sized once for the whole list rather than grown step by step; a later
        // call (a reload) names mostly keys already tracked, so it reserves nothing.
        if tracked.isEmpty { tracked.reserveCapacity(keys.count) }
        let before = tracked.count
        tracked.formUnion(keys)
        let added = tracked.count != before
        await effects.load(keys.filter { effects.held($0) == nil })
        for key in keys { effects.scheduleNextRefresh(key) }
        // Only a change: a reload calls this (and untrack) on every reload, mostly with nothing new.
        if added { trackingChanges.emit(trackedSnapshot.withLock { $0 }) }
    }

    /// The keys kept fresh proactively.
    var trackedKeys: Set<TokenKey> { tracked }

    func untrack(_ keys: [TokenKey]) {
        let before = tracked.count
        tracked.subtract(keys)
        if tracked.count != before { trackingChanges.emit(trackedSnapshot.withLock { $0 }) }
    }

    func invalidate(_ key: TokenKey) {
        // The removal goes through the group commit, queued before memory lets the token go
        // (from then on no read of the store brings it back): it replaces a token of the key
        // still waiting for its commit (whose lease its own commit then releases), follows a
        // write of the key already under way, and waits for the store without holding up the
        // caller, who is answered from memory.
        effects.queueRemoval(key)
        effects.dropForInvalidation(key, tracked: tracked.contains(key))
        effects.unschedule(key)
        effects.reportInvalidated(key)
        // Memory may still hold an entry for the key (its failure state, or an empty one): it
        // needs a turn even when nobody uses the key, else the idle rule never evicts it.
        if wantsProactiveRefresh(key) || effects.held(key) != nil { effects.scheduleNextRefresh(key) }
    }

    /// Gives every key in backoff its next attempt now (see ``TokenSyncEngine/retryFailedNow()``).
    func retryFailedNow() -> Int {
        let keys = effects.endBackoffs()
        effects.scheduleNow(keys)
        return keys.count
    }

    // MARK: - Flights

    private func flight(_ key: TokenKey, _ request: RefreshDecision.Request, background: Bool = false) -> Task<Outcome, Never> {
        if let task = inFlight[key] { return task }
        let effects = self.effects
        let task = Task {
            var flight = RefreshFlight(key: key, request: request, effects: effects)
            let outcome = await flight.run()
            self.flightEnded(key, background: background, thenRefresh: flight.wantsBackgroundRefresh)
            return outcome
        }
        inFlight[key] = task
        return task
    }

    private func flightEnded(_ key: TokenKey, background: Bool, thenRefresh: Bool) {
        inFlight[key] = nil
        effects.flightEnded(key)
        if thenRefresh { _ = flight(key, .background) }
        // The scheduler skips a key whose flight runs; a deadline set meanwhile (say, by
        // retryFailedNow) may have been dropped that way, so a key kept fresh gets one again.
        if !effects.isScheduled(key) && wantsProactiveRefresh(key) { effects.scheduleNextRefresh(key) }
        guard background else { return }
        backgroundFlights -= 1
        effects.wakeScheduler()
    }

    private func wantsProactiveRefresh(_ key: TokenKey) -> Bool {
        effects.wantsProactiveRefresh(key, tracked: tracked.contains(key))
    }

    // MARK: - Long-running work

    /// Runs the scheduler loop, and beside it as child tasks the repository's own work (its
    /// change polling), the change follower, the group commit and the retention sweep, until
    /// cancelled; all of them end together.
    func runUntilCancelled() async {
        await withTaskGroup(of: Void.self) { group in
            let effects = self.effects
            effects.setFeedDriven(true)
            defer { effects.setFeedDriven(false) }
            group.addTask { await effects.runStoreWork() }
            group.addTask { await self.followStoreChanges() }
            group.addTask { await effects.runCommits() }
            group.addTask { await self.sweeper.run(unused: { await self.unused($0) }) }
            await scheduleUntilCancelled()
            group.cancelAll()
        }
    }

    /// One loop over the deadline queue, sleeping until the earliest deadline (at most
    /// ``RefreshScheduler/maximumSleep``, so wall-clock steps are noticed) or until woken by an
    /// earlier deadline or a finished flight.
    private func scheduleUntilCancelled() async {
        let limit = effects.policy.maxConcurrentFetches
        schedulerRunning = true
        defer { schedulerRunning = false }
        while !Task.isCancelled && !effects.isShuttingDown {
            // Read before the wall clock: the sleep below is timed from here (see sleepScheduler).
            let turn = effects.schedulerNow
            let untilHeartbeat = effects.beatIfDue()
            effects.rescheduleAfterClockStep()
            let now = effects.moment
            let slots = max(0, limit - backgroundFlights)
            for key in effects.popDue(at: now.corrected, limit: slots) { startDue(key) }
            if effects.takeWakeRequest() { continue }
            // While a provider offset applies, a wall-clock step must be noticed within a second:
            // until then tokens are judged on the old offset.
            var delay = effects.isCorrectingClock ? 1 : RefreshScheduler.maximumSleep
            if slots > 0 || backgroundFlights < limit, let earliest = effects.earliestDeadline {
                delay = min(delay, max(0, earliest.timeIntervalSince(now.corrected)))
            }
            if let untilHeartbeat {
                delay = min(delay, Double(untilHeartbeat.components.seconds) + Double(untilHeartbeat.components.attoseconds) * 1e-18)
            }
            if delay <= 0 { continue }
            await effects.sleepScheduler(seconds: delay, from: turn)
        }
    }

    private func startDue(_ key: TokenKey) {
        guard inFlight[key] == nil else { return }
        guard wantsProactiveRefresh(key) else {
            // Idle and untracked (a finished trip): stop refreshing it and free its memory; a
            // later request reads the store again. Not while its write waits for the store (that
            // request would miss it and fetch again): due again once the write lands. Asked for
            // before the check, so that a write landing in between is not missed.
            effects.dueAgainOnCommit(key)
            guard !effects.isCommitPending(key) else { return }
            // A write that landed meanwhile made the key due again: no turn for it is needed.
            if !effects.forgetDueAgainOnCommit(key) { effects.unschedule(key) }
            effects.evict(key)
            return
        }
        backgroundFlights += 1
        _ = flight(key, .background, background: true)
    }

    /// The retention sweep's candidates that nobody here tracks, holds, fetches or commits.
    private func unused(_ keys: [TokenKey]) -> [TokenKey] {
        keys.filter {
            !tracked.contains($0) && effects.held($0) == nil && inFlight[$0] == nil && !effects.isCommitPending($0)
        }
    }

    /// Follows other processes' changes: subscribes first, then re-reads what memory holds
    /// (what `track()` loaded may have changed before the subscription), then each batch of
    /// changes gathered meanwhile in one read (see ``PendingReread``).
    private func followStoreChanges() async {
        let reader = StoreChangeReader(effects.storeChanges())
        followingChanges = true
        defer { followingChanges = false }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await reader.collect() }
            while let reread = await reader.next() {
                switch reread {
                case .keys(let keys): await reconcile(keys)
                case .everything: await reconcile(effects.heldKeys)
                }
            }
            group.cancelAll()
        }
    }

    /// Brings memory in line with the store for `keys` we hold: adopts tokens another process
    /// wrote, and drops tokens another process removed (refetching tracked ones at once).
    private func reconcile(_ keys: [TokenKey]) async {
        // In reads of at most `reconcileChunk` keys: re-reading all 10,000 held entries in one
        // read allocated every stored token at once, and glibc kept those pages (the agent's
        // resident size at 10,000 tracked subjects went from 64 to 74 MiB).
        let held = keys.filter { effects.held($0) != nil }
        var start = 0
        // A stopped run reads no further: every read would fail with the cancellation.
        while start < held.count, !Task.isCancelled {
            let end = min(start + Self.reconcileChunk, held.count)
            await reconcileHeld(Array(held[start..<end]))
            start = end
        }
    }

    /// Most keys one re-read of the store asks for.
    static var reconcileChunk: Int { 100 }

    private func reconcileHeld(_ held: [TokenKey]) async {
        let stored: [TokenKey: TokenEntry]
        do {
            stored = try await effects.readStored(held)
        } catch {
            // Stopped while reading (a shutdown): not a store failure.
            if !Task.isCancelled { effects.reportChangesUnreadable(error) }
            return
        }
        for key in held {
            guard let entry = effects.held(key) else { continue }
            switch effects.storeChanged(entry, stored: stored[key], commitPending: effects.isCommitPending(key)) {
            case .adopt(let token, let failure):
                effects.adoptIfNewer(token, failure: failure)
            case .removed(let failure):
                // Only the token judged: a flight may have installed a new one meanwhile.
                guard effects.dropRemoved(key, failure: failure, ifHolding: entry.token) else { continue }
                effects.reportRemovedExternally(key)
                if wantsProactiveRefresh(key) { effects.scheduleNextRefresh(key) }
            case .none:
                break
            }
        }
    }

    // MARK: - Shutdown

    /// Cancels fetches in flight, finishes pending store writes, releases leases, ends events.
    /// The waiting is shielded from the caller's cancellation and bounded (see
    /// ``ShieldedShutdown``); what is left undone is logged.
    func shutDown() async {
        effects.beginShutdown()
        for task in inFlight.values { task.cancel() }
        let flights = Array(inFlight.values)
        let effects = self.effects
        let finished = await ShieldedShutdown.run {
            for task in flights { _ = await task.value }
            await effects.drainForShutdown()
        }
        effects.endShutdown(finished: finished)
        trackingChanges.finish()
    }
}

extension RefreshCoordinator where Effects == EngineParts {
    /// The engine's coordinator: its collaborators built and held as ``EngineParts``.
    init(repository: any TokenRepository, leases: any RefreshLeaseStore, fetcher: any TokenFetcher,
         policy: RefreshPolicy, logger: Logger, clock: any Clock<Duration>, now: @escaping @Sendable () -> Date,
         random: @escaping @Sendable () -> Double, metrics: SyncMetrics, memory: TokenMemory) {
        let events = EventBroadcaster<TokenSyncEvent>()
        let health = StoreHealth(events: events, metrics: metrics, logger: logger)
        let lease = CrossProcessLease(store: leases, changes: { repository.changes() },
                                      driveChanges: { await repository.followChanges() }, duration: policy.leaseDuration,
                                      clock: clock, now: now, logger: logger)
        let scheduler = RefreshScheduler(clock: clock)
        let committer = GroupCommitter(repository: repository, health: health, events: events, logger: logger, clock: clock,
                                       committed: { keys in
                                           scheduler.commitsLanded(keys)
                                           await lease.releaseHandedOver(keys)
                                       },
                                       invalidationPending: { memory.setInvalidationPending($0, $1) })
        let shutdown = ShutdownFlag()
        let parts = EngineParts(
            policy: policy, memory: memory, repository: repository, fetcher: fetcher, validator: TokenValidator(policy: policy),
            lease: lease, slots: FetchSlots(limit: policy.maxConcurrentFetches), scheduler: scheduler,
            committer: committer, skew: ClockSkewTracker(policy: policy, memory: memory, logger: logger, clock: clock, now: now),
            health: health, events: events, metrics: metrics, logger: logger, now: now, random: random, shutdown: shutdown)
        let sweeper = RetentionSweeper(repository: repository, leases: leases, retention: policy.retention, clock: clock,
                                       now: now, logger: logger, shutdown: shutdown)
        self.init(effects: parts, sweeper: sweeper)
    }

    /// Calls `beat` from the scheduler's loop at least every `interval` (the watchdog's heartbeat).
    nonisolated func setHeartbeat(every interval: Duration, _ beat: @escaping @Sendable () -> Void) {
        effects.setHeartbeat(every: interval, beat)
    }
}
