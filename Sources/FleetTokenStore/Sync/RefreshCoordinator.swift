// Sync layer: the engine's slow path, where order matters: one flight per key, the tracked
// keys, the proactive-refresh loop, other processes' changes, invalidation and shutdown.
// Fresh hits never come here (TokenMemory serves them).
import Foundation
import Logging
import Synchronization

/// Starts and joins flights (one per key; a ``RefreshFlight`` each), keeps the tracked keys
/// scheduled, follows other processes' changes, and runs the engine's long-running work as
/// child tasks of ``runUntilCancelled()``: the scheduler loop, the change follower, the group
/// commit and the retention sweep.
actor RefreshCoordinator {
    typealias Outcome = RefreshFlight.Outcome

    nonisolated let parts: EngineParts
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
    /// Flights the scheduler started and that have not ended: they count against the fetch bound.
    private var backgroundFlights = 0
    /// Background refreshes asked for by hits, on their way to the actor.
    private nonisolated let startsInTransit = Atomic<Int>(0)
    private var schedulerRunning = false
    private var followingChanges = false

    init(repository: any TokenRepository, leases: any RefreshLeaseStore, fetcher: any TokenFetcher,
         policy: RefreshPolicy, logger: Logger, clock: any Clock<Duration>, now: @escaping @Sendable () -> Date,
         random: @escaping @Sendable () -> Double, metrics: SyncMetrics, memory: TokenMemory) {
        let events = EventBroadcaster<TokenSyncEvent>()
        let health = StoreHealth(events: events, metrics: metrics, logger: logger)
        let lease = CrossProcessLease(store: leases, changes: { repository.changes() },
                                      driveChanges: { await repository.followChanges() }, duration: policy.leaseDuration,
                                      clock: clock, now: now, logger: logger)
        let committer = GroupCommitter(repository: repository, health: health, events: events, logger: logger, clock: clock,
                                       committed: { await lease.releaseHandedOver($0) })
        let shutdown = ShutdownFlag()
        parts = EngineParts(
            policy: policy, memory: memory, repository: repository, fetcher: fetcher, validator: TokenValidator(policy: policy),
            lease: lease, slots: FetchSlots(limit: policy.maxConcurrentFetches), scheduler: RefreshScheduler(clock: clock),
            committer: committer, skew: ClockSkewTracker(policy: policy, memory: memory, logger: logger, clock: clock, now: now),
            health: health, events: events, metrics: metrics, logger: logger, now: now, random: random, shutdown: shutdown)
        sweeper = RetentionSweeper(repository: repository, retention: policy.retention, clock: clock, now: now,
                                   logger: logger, shutdown: shutdown)
    }

    nonisolated var events: EventBroadcaster<TokenSyncEvent> { parts.events }

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
        startsInTransit.load(ordering: .relaxed) == 0 && inFlight.isEmpty && parts.committer.isIdle
            && (!schedulerRunning || parts.scheduler.isParked)
    }

    /// Whether ``runUntilCancelled()`` is under way: the scheduler loop runs and the store's
    /// change feed is followed.
    var isRunning: Bool { schedulerRunning && followingChanges }

    /// Where the flight of `key` is, while one runs.
    nonisolated func phase(of key: TokenKey) -> RefreshDecision.State? {
        parts.phases.phase(of: key)
    }

    func track(_ keys: [TokenKey]) async {
        tracked.formUnion(keys)
        await parts.load(keys.filter { parts.memory.entry($0) == nil })
        for key in keys { parts.scheduleNextRefresh(key) }
    }

    /// The keys kept fresh proactively.
    var trackedKeys: Set<TokenKey> { tracked }

    func untrack(_ keys: [TokenKey]) {
        tracked.subtract(keys)
    }

    func invalidate(_ key: TokenKey) {
        // The removal goes through the group commit, queued before memory lets the token go
        // (from then on no read of the store brings it back): it replaces a token of the key
        // still waiting for its commit (whose lease its own commit then releases), follows a
        // write of the key already under way, and waits for the store without holding up the
        // caller, who is answered from memory.
        parts.committer.enqueueRemoval(key)
        switch parts.machine.invalidate(held: parts.memory.entry(key), tracked: tracked.contains(key)) {
        case .dropToken(let failure): parts.memory.installEmpty(key, failure: failure)
        case .nothingHeld: break
        }
        parts.scheduler.cancel(key)
        parts.logger.info("token invalidated; the next request fetches a new one", metadata: ["key": .string(key.description)])
        if wantsProactiveRefresh(key) { parts.scheduleNextRefresh(key) }
    }

    /// Gives every key in backoff its next attempt now (see ``TokenSyncEngine/retryFailedNow()``).
    func retryFailedNow() -> Int {
        let keys = parts.memory.endBackoffs(at: parts.now(), configurationDigest: parts.fetcher.configurationDigest)
        let due = parts.moment.corrected
        for key in keys { parts.scheduler.schedule(key, at: due) }
        parts.scheduler.wake()
        return keys.count
    }

    // MARK: - Flights

    private func flight(_ key: TokenKey, _ request: RefreshDecision.Request, background: Bool = false) -> Task<Outcome, Never> {
        if let task = inFlight[key] { return task }
        let parts = self.parts
        let task = Task {
            var flight = RefreshFlight(key: key, request: request, parts: parts)
            let outcome = await flight.run()
            self.flightEnded(key, background: background, thenRefresh: flight.wantsBackgroundRefresh)
            return outcome
        }
        inFlight[key] = task
        return task
    }

    private func flightEnded(_ key: TokenKey, background: Bool, thenRefresh: Bool) {
        inFlight[key] = nil
        parts.phases.remove(key)
        parts.memory.finishRefreshRequest(key)
        if thenRefresh { _ = flight(key, .background) }
        // The scheduler skips a key whose flight runs; a deadline set meanwhile (say, by
        // retryFailedNow) may have been dropped that way, so a key kept fresh gets one again.
        if parts.scheduler.deadline(of: key) == nil && wantsProactiveRefresh(key) { parts.scheduleNextRefresh(key) }
        guard background else { return }
        backgroundFlights -= 1
        parts.scheduler.wake()
    }

    private func wantsProactiveRefresh(_ key: TokenKey) -> Bool {
        parts.machine.wantsProactiveRefresh(tracked: tracked.contains(key), held: parts.memory.entry(key),
                                            at: parts.moment.corrected)
    }

    // MARK: - Long-running work

    /// Runs the scheduler loop, and beside it as child tasks the repository's own work (its
    /// change polling), the change follower, the group commit and the retention sweep, until
    /// cancelled; all of them end together.
    func runUntilCancelled() async {
        await withTaskGroup(of: Void.self) { group in
            let lease = parts.lease
            lease.feedIsDriven.store(true, ordering: .relaxed)
            defer { lease.feedIsDriven.store(false, ordering: .relaxed) }
            group.addTask { await self.parts.repository.runBackgroundWork() }
            group.addTask { await self.followStoreChanges() }
            group.addTask { await self.parts.committer.run() }
            group.addTask { await self.sweeper.run(unused: { await self.unused($0) }) }
            await scheduleUntilCancelled()
            group.cancelAll()
        }
    }

    /// One loop over the deadline queue, sleeping until the earliest deadline (at most
    /// ``RefreshScheduler/maximumSleep``, so wall-clock steps are noticed) or until woken by an
    /// earlier deadline or a finished flight.
    private func scheduleUntilCancelled() async {
        let scheduler = parts.scheduler
        let limit = parts.policy.maxConcurrentFetches
        schedulerRunning = true
        defer { schedulerRunning = false }
        while !Task.isCancelled && !parts.shutdown.isSet {
            let untilHeartbeat = scheduler.beatIfDue()
            // The wall clock moved more or less than time passed: it was stepped (NTP, an
            // operator). Deadlines are kept in corrected time, retries in local time: recompute.
            if parts.skew.observeSteps() {
                for key in parts.memory.keys where scheduler.deadline(of: key) != nil { parts.scheduleNextRefresh(key) }
            }
            let now = parts.moment
            let slots = max(0, limit - backgroundFlights)
            for key in scheduler.popDue(at: now.corrected, limit: slots) { startDue(key) }
            if scheduler.takeWakeRequest() { continue }
            // While a provider offset applies, a wall-clock step must be noticed within a second:
            // until then tokens are judged on the old offset.
            var delay = parts.skew.correcting ? 1 : RefreshScheduler.maximumSleep
            if slots > 0 || backgroundFlights < limit, let earliest = scheduler.earliest {
                delay = min(delay, max(0, earliest.timeIntervalSince(now.corrected)))
            }
            if let untilHeartbeat {
                delay = min(delay, Double(untilHeartbeat.components.seconds) + Double(untilHeartbeat.components.attoseconds) * 1e-18)
            }
            if delay <= 0 { continue }
            await scheduler.sleep(seconds: delay)
        }
    }

    private func startDue(_ key: TokenKey) {
        guard inFlight[key] == nil else { return }
        guard wantsProactiveRefresh(key) else {
            // Idle and untracked (a finished trip): stop refreshing it and free its memory; a
            // later request reads the store again.
            if !parts.committer.isPending(key) { parts.memory.remove(key) }
            return
        }
        backgroundFlights += 1
        _ = flight(key, .background, background: true)
    }

    /// The retention sweep's candidates that nobody here tracks, holds, fetches or commits.
    private func unused(_ keys: [TokenKey]) -> [TokenKey] {
        keys.filter {
            !tracked.contains($0) && parts.memory.entry($0) == nil && inFlight[$0] == nil && !parts.committer.isPending($0)
        }
    }

    /// Follows other processes' changes: subscribes first, then re-reads what memory holds
    /// (what `track()` loaded may have changed before the subscription), then each batch of
    /// changes gathered meanwhile in one read (see ``PendingReread``).
    private func followStoreChanges() async {
        let reader = StoreChangeReader(parts.repository.changes())
        followingChanges = true
        defer { followingChanges = false }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await reader.collect() }
            while let reread = await reader.next() {
                switch reread {
                case .keys(let keys): await reconcile(keys)
                case .everything: await reconcile(parts.memory.keys)
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
        let held = keys.filter { parts.memory.entry($0) != nil }
        var start = 0
        while start < held.count {
            let end = min(start + Self.reconcileChunk, held.count)
            await reconcileHeld(Array(held[start..<end]))
            start = end
        }
    }

    /// Most keys one re-read of the store asks for.
    static let reconcileChunk = 100

    private func reconcileHeld(_ held: [TokenKey]) async {
        let stored: [TokenKey: TokenEntry]
        do {
            stored = try await parts.repository.entries(for: held)
        } catch {
            parts.logger.warning("could not read another process's changes", metadata: ["error": .string(error.description)])
            return
        }
        for key in held {
            guard let entry = parts.memory.entry(key) else { continue }
            switch parts.machine.storeChanged(held: entry, stored: parts.admitted(stored[key]),
                                              commitPending: parts.committer.isPending(key), at: parts.moment.corrected) {
            case .adopt(let token, let failure):
                parts.adoptIfNewer(token, failure: failure)
            case .removed(let failure):
                // Only the token judged: a flight may have installed a new one meanwhile.
                guard parts.memory.installEmpty(key, failure: failure, ifHolding: entry.token) else { continue }
                parts.logger.notice("another process removed a token; it will be fetched again when needed", metadata: [
                    "key": .string(key.description),
                ])
                parts.events.emit(.removedExternally(key: key))
                if wantsProactiveRefresh(key) { parts.scheduleNextRefresh(key) }
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
        parts.shutdown.set()
        parts.scheduler.wake()
        // Flights queued for a fetch slot end without one (they see the shutdown and return).
        parts.slots.close()
        for task in inFlight.values { task.cancel() }
        let flights = Array(inFlight.values)
        let parts = self.parts
        let finished = await ShieldedShutdown.run {
            for task in flights { _ = await task.value }
            await parts.committer.stop()
            await parts.lease.releaseAll()
        }
        ShieldedShutdown.report(finished: finished, unwritten: parts.committer.unwrittenKeys, unreleased: parts.lease.heldKeys,
                                leaseDuration: parts.policy.leaseDuration, logger: parts.logger)
        parts.events.finish()
    }
}
