// Sync layer: the engine's I/O for its coordinator: memory, the schedule and clocks, the group
// commit, the store's change feed, events and logs, and shutdown. One-line forwards to the
// collaborator that does each job.
import Foundation
import Logging
import Synchronization

extension EngineParts: KeyStates {
    var heldKeys: [TokenKey] { memory.keys }

    func flightPhase(of key: TokenKey) -> RefreshDecision.State? { memory.flightPhase(of: key) }

    func flightEnded(_ key: TokenKey) { memory.flightEnded(key) }

    func dropForInvalidation(_ key: TokenKey, tracked: Bool) {
        switch machine.invalidate(held: memory.entry(key), tracked: tracked) {
        case .dropToken(let failure): memory.installEmpty(key, failure: failure)
        case .nothingHeld: break
        }
    }

    func wantsProactiveRefresh(_ key: TokenKey, tracked: Bool) -> Bool {
        machine.wantsProactiveRefresh(tracked: tracked, held: memory.entry(key), at: moment.corrected)
    }

    func endBackoffs() -> [TokenKey] {
        memory.endBackoffs(at: now(), configurationDigest: fetcher.configurationDigest)
    }

    func evict(_ key: TokenKey) { memory.remove(key) }

    func storeChanged(_ held: MemoryEntry, stored: TokenEntry?, commitPending: Bool) -> RefreshMachine.StoreChange {
        machine.storeChanged(held: held, stored: admitted(stored), commitPending: commitPending, at: moment.corrected)
    }

    func dropRemoved(_ key: TokenKey, failure: RefreshFailureState?, ifHolding token: StoredToken?) -> Bool {
        memory.installEmpty(key, failure: failure, ifHolding: token)
    }
}

extension EngineParts: RefreshSchedule {
    func scheduleNow(_ keys: [TokenKey]) {
        let due = moment.corrected
        for key in keys { scheduler.schedule(key, at: due) }
        scheduler.wake()
    }

    func unschedule(_ key: TokenKey) { scheduler.cancel(key) }

    func dueAgainOnCommit(_ key: TokenKey) { scheduler.dueAgainOnCommit(key) }

    func forgetDueAgainOnCommit(_ key: TokenKey) -> Bool { scheduler.forgetDueAgainOnCommit(key) }

    func isScheduled(_ key: TokenKey) -> Bool { scheduler.deadline(of: key) != nil }

    var earliestDeadline: Date? { scheduler.earliest }

    func popDue(at now: Date, limit: Int) -> [TokenKey] { scheduler.popDue(at: now, limit: limit) }

    func wakeScheduler() { scheduler.wake() }

    func takeWakeRequest() -> Bool { scheduler.takeWakeRequest() }

    var isSchedulerParked: Bool { scheduler.isParked }

    var schedulerNow: Duration { scheduler.now }

    func sleepScheduler(seconds: TimeInterval, from start: Duration) async { await scheduler.sleep(seconds: seconds, from: start) }

    func setHeartbeat(every interval: Duration, _ beat: @escaping @Sendable () -> Void) {
        scheduler.setHeartbeat(every: interval, beat)
    }

    func beatIfDue() -> Duration? { scheduler.beatIfDue() }

    func rescheduleAfterClockStep() {
        // The wall clock moved more or less than time passed: it was stepped (NTP, an
        // operator). Deadlines are kept in corrected time, retries in local time: recompute.
        guard skew.observeSteps() else { return }
        for key in memory.keys where scheduler.deadline(of: key) != nil { scheduleNextRefresh(key) }
    }

    var isCorrectingClock: Bool { skew.correcting }
}

extension EngineParts: CommitQueue {
    func queueRemoval(_ key: TokenKey) { committer.enqueueRemoval(key) }

    func isCommitPending(_ key: TokenKey) -> Bool { committer.isPending(key) }

    var commitsIdle: Bool { committer.isIdle }

    func runCommits() async { await committer.run() }
}

extension EngineParts: StoreChangeFeed {
    func runStoreWork() async { await repository.runBackgroundWork() }

    func setFeedDriven(_ driven: Bool) { lease.feedIsDriven.store(driven, ordering: .relaxed) }

    func storeChanges() -> AsyncStream<TokenStoreChange> { repository.changes() }

    func readStored(_ keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] {
        try await repository.entries(for: keys)
    }
}

extension EngineParts: EngineReporting {
    func reportInvalidated(_ key: TokenKey) {
        logger.info("token invalidated; the next request fetches a new one", metadata: ["key": .string(key.description)])
    }

    func reportChangesUnreadable(_ error: TokenStoreError) {
        logger.warning("could not read another process's changes", metadata: ["error": .string(error.description)])
    }

    func reportRemovedExternally(_ key: TokenKey) {
        logger.notice("another process removed a token; it will be fetched again when needed", metadata: [
            "key": .string(key.description),
        ])
        events.emit(.removedExternally(key: key))
    }
}

extension EngineParts: EngineLifecycle {
    func beginShutdown() {
        shutdown.set()
        scheduler.wake()
        // Flights queued for a fetch slot end without one (they see the shutdown and return).
        slots.close()
    }

    func drainForShutdown() async {
        await committer.stop()
        await lease.releaseAll()
    }

    func endShutdown(finished: Bool) {
        ShieldedShutdown.report(finished: finished, unwritten: committer.unwrittenKeys, unreleased: lease.heldKeys,
                                leaseDuration: policy.leaseDuration, logger: logger)
        events.finish()
    }
}
