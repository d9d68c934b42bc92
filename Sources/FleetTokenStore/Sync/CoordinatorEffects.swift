// Sync layer: what the coordinator may do besides keeping its flights and tracked keys, as small
// protocols (one per job), so that each step names the effect it needs instead of reaching into
// a bag of collaborators. The engine's implementation is EngineParts'
// (EngineParts+CoordinatorEffects.swift); a flight's own effects are RefreshEffects.
import Foundation

/// Everything ``RefreshCoordinator`` does through its effects: its flights' effects, the key
/// state, the schedule, the commit queue, the store's change feed, reporting and shutdown.
typealias CoordinatorEffects = RefreshEffects & KeyStates & RefreshSchedule & CommitQueue & StoreChangeFeed
    & EngineReporting & EngineLifecycle

/// The keys' state in memory as the coordinator changes it; each rule is ``RefreshMachine``'s.
protocol KeyStates: Sendable {
    /// The keys memory holds.
    var heldKeys: [TokenKey] { get }
    /// Where the flight of `key` is, while one runs.
    func flightPhase(of key: TokenKey) -> RefreshDecision.State?
    /// The flight of `key` ended: its phase and refresh request go.
    func flightEnded(_ key: TokenKey)
    /// Lets go of `key`'s token for an invalidation (its backoff stays).
    func dropForInvalidation(_ key: TokenKey, tracked: Bool)
    /// Whether `key` is to be kept fresh ahead of its callers.
    func wantsProactiveRefresh(_ key: TokenKey, tracked: Bool) -> Bool
    /// Ends every backoff that may end now; returns the keys to try again.
    func endBackoffs() -> [TokenKey]
    /// Forgets `key` (idle and untracked); a later request reads the store again.
    func evict(_ key: TokenKey)
    /// What another process's write (read back as `stored`, judged as the engine may use it)
    /// means for memory's `held`.
    func storeChanged(_ held: MemoryEntry, stored: TokenEntry?, commitPending: Bool) -> RefreshMachine.StoreChange
    /// Drops `key`'s token another process removed, only if memory still holds `token`;
    /// returns whether it did.
    func dropRemoved(_ key: TokenKey, failure: RefreshFailureState?, ifHolding token: StoredToken?) -> Bool
}

/// The proactive-refresh schedule and the loop's view of the clocks (``RefreshScheduler``,
/// ``ClockSkewTracker``).
protocol RefreshSchedule: Sendable {
    /// Schedules each of `keys` now and wakes the loop.
    func scheduleNow(_ keys: [TokenKey])
    /// Drops `key`'s deadline.
    func unschedule(_ key: TokenKey)
    /// Makes `key` due again once a commit of it lands: an idle key waits for its write before
    /// it leaves memory.
    func dueAgainOnCommit(_ key: TokenKey)
    /// Forgets ``dueAgainOnCommit(_:)`` for `key`; false when a landed commit took it first
    /// (and may have scheduled the key).
    func forgetDueAgainOnCommit(_ key: TokenKey) -> Bool
    /// Whether `key` has a deadline.
    func isScheduled(_ key: TokenKey) -> Bool
    /// The earliest deadline.
    var earliestDeadline: Date? { get }
    /// Up to `limit` keys due at `now`, taken off the schedule.
    func popDue(at now: Date, limit: Int) -> [TokenKey]
    /// Wakes the loop from its sleep.
    func wakeScheduler()
    /// Whether a wake was asked for since the last call (and clears it).
    func takeWakeRequest() -> Bool
    /// Whether the loop sleeps with nothing due.
    var isSchedulerParked: Bool { get }
    /// The injected clock's time, as the loop reads it before the wall clock at each turn.
    var schedulerNow: Duration { get }
    /// Sleeps the loop until at most `seconds` after `start` (a ``schedulerNow`` reading), or
    /// until woken: timed from the loop's reading, so time spent between that reading and the
    /// sleep never lengthens the wait.
    func sleepScheduler(seconds: TimeInterval, from start: Duration) async
    /// Calls `beat` from the loop at least every `interval`.
    func setHeartbeat(every interval: Duration, _ beat: @escaping @Sendable () -> Void)
    /// Beats when due; returns the time until the next beat (nil without a heartbeat).
    func beatIfDue() -> Duration?
    /// Reschedules every scheduled key when the wall clock was stepped since the last call.
    func rescheduleAfterClockStep()
    /// Whether a provider clock offset applies (wall-clock steps must then be seen quickly).
    var isCorrectingClock: Bool { get }
}

/// The group commit as the coordinator uses it (``GroupCommitter``).
protocol CommitQueue: Sendable {
    /// Queues the removal of `key`'s stored token.
    func queueRemoval(_ key: TokenKey)
    /// Whether a write of `key` waits or runs.
    func isCommitPending(_ key: TokenKey) -> Bool
    /// Whether nothing waits to be committed.
    var commitsIdle: Bool { get }
    /// Runs the commit loop until cancelled.
    func runCommits() async
}

/// The store's change feed and the reads that follow it.
protocol StoreChangeFeed: Sendable {
    /// Runs the repository's own background work (its change polling) until cancelled.
    func runStoreWork() async
    /// Marks whether the change feed is driven by a running engine (the lease waits on it).
    func setFeedDriven(_ driven: Bool)
    /// Other processes' changes, from now on.
    func storeChanges() -> AsyncStream<TokenStoreChange>
    /// The stored entries of `keys` as read (``KeyStates/storeChanged(_:stored:commitPending:)``
    /// judges each).
    func readStored(_ keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry]
}

/// What the coordinator reports: events, and the logs an operator reads.
protocol EngineReporting: Sendable {
    /// The engine's event stream.
    var events: EventBroadcaster<TokenSyncEvent> { get }
    /// `key` was invalidated.
    func reportInvalidated(_ key: TokenKey)
    /// Another process's changes could not be read.
    func reportChangesUnreadable(_ error: TokenStoreError)
    /// Another process removed `key`'s token.
    func reportRemovedExternally(_ key: TokenKey)
}

/// The engine's shutdown, step by step.
protocol EngineLifecycle: Sendable {
    /// Sets the shutdown flag, wakes the loop and closes the fetch slots.
    func beginShutdown()
    /// Finishes pending store writes and releases every lease.
    func drainForShutdown() async
    /// Logs what shutdown left undone (`finished` false: it gave up waiting) and ends events.
    func endShutdown(finished: Bool)
}
