// Sync layer: when each key is next refreshed. A deadline-ordered queue, a sleep on the
// injected clock that an earlier deadline or a finished flight cuts short, and the heartbeat.
import Foundation
import Synchronization

/// The proactive-refresh schedule: one sleeping loop (the coordinator's) over a deadline queue,
/// however many keys are tracked. Deadlines are provider-corrected times.
final class RefreshScheduler: Sendable {
    private struct State: Sendable {
        var queue = DeadlineQueue()
        /// Keys to make due again when a commit of theirs lands (``dueAgainOnCommit(_:)``).
        var dueOnCommit: Set<TokenKey> = []
        var heartbeat: SchedulerHeartbeat?
        /// While the loop sleeps: true once its wake-up time has come on the clock.
        var sleepIsOver: (@Sendable () -> Bool)?
    }

    /// Longest uninterrupted sleep; bounds the effect of wall-clock jumps.
    static let maximumSleep: TimeInterval = 30

    private let state = Mutex(State())
    /// Something changed since the loop last looked: it must look again before sleeping.
    private let wakes = WakeSignal()
    /// Time on the injected clock since the scheduler was made.
    private let elapsed: @Sendable () -> Duration
    /// The wake-up time at that much time since the scheduler was made.
    private let wakeUpTime: @Sendable (Duration) -> WakeUpTime

    init(clock: any Clock<Duration>) {
        (elapsed, wakeUpTime) = Self.readers(clock)
    }

    /// Time on the injected clock since the scheduler was made: the loop reads it with the wall
    /// clock and times its sleep from it (``sleep(seconds:from:)``).
    var now: Duration { elapsed() }

    /// Sets `key`'s deadline, waking the loop when it is the new earliest.
    func schedule(_ key: TokenKey, at due: Date) {
        if state.withLock({ $0.queue.schedule(key, at: due) }) { wake() }
    }

    /// Makes `key` due at once when a commit of it lands (``commitsLanded(_:)``).
    func dueAgainOnCommit(_ key: TokenKey) {
        _ = state.withLock { $0.dueOnCommit.insert(key) }
    }

    /// Forgets ``dueAgainOnCommit(_:)`` for `key`; false when a landed commit took it first.
    func forgetDueAgainOnCommit(_ key: TokenKey) -> Bool {
        state.withLock { state in
            defer { Self.releaseIfEmpty(&state.dueOnCommit) }
            return state.dueOnCommit.remove(key) != nil
        }
    }

    /// The group commit wrote `keys`: those waiting for it are due now, unless a deadline was
    /// set for them meanwhile.
    func commitsLanded(_ keys: [TokenKey]) {
        let wake = state.withLock { state -> Bool in
            var earliest = false
            for key in keys {
                guard !state.dueOnCommit.isEmpty else { break }
                guard state.dueOnCommit.remove(key) != nil, state.queue.deadline(of: key) == nil else { continue }
                earliest = state.queue.schedule(key, at: .distantPast) || earliest
            }
            Self.releaseIfEmpty(&state.dueOnCommit)
            return earliest
        }
        if wake { self.wake() }
    }

    /// An emptied set keeps its storage: a burst of idle keys waiting for a store that could
    /// not be written would otherwise cost memory for good.
    private static func releaseIfEmpty(_ keys: inout Set<TokenKey>) {
        if keys.isEmpty, keys.capacity > 0 { keys = [] }
    }

    func cancel(_ key: TokenKey) {
        state.withLock { $0.queue.cancel(key) }
    }

    func deadline(of key: TokenKey) -> Date? {
        state.withLock { $0.queue.deadline(of: key) }
    }

    /// Removes and returns up to `limit` keys due at `now`, earliest first.
    func popDue(at now: Date, limit: Int) -> [TokenKey] {
        state.withLock { $0.queue.popDue(at: now, limit: limit) }
    }

    var earliest: Date? { state.withLock { $0.queue.earliest } }

    /// Makes the loop look again now (ends its sleep, or keeps it from starting one).
    func wake() {
        wakes.signal()
    }

    /// Whether a wake was requested since the last call; clears the request.
    func takeWakeRequest() -> Bool {
        wakes.take()
    }

    /// Calls `beat` from the loop at least every `interval`.
    func setHeartbeat(every interval: Duration, _ beat: @escaping @Sendable () -> Void) {
        state.withLock { $0.heartbeat = SchedulerHeartbeat(interval: interval, beat: beat) }
        wake()
    }

    /// Beats when due; returns how long the loop may sleep before the next beat (nil: no heartbeat).
    func beatIfDue() -> Duration? {
        let now = elapsed()
        // The beat is quick by contract (one datagram), so it may run under the lock.
        return state.withLock { state in
            guard var heartbeat = state.heartbeat else { return nil }
            defer { state.heartbeat = heartbeat }
            return heartbeat.beatIfDue(at: now)
        }
    }

    /// Whether the loop sleeps with nothing to do before its clock reaches the wake-up time:
    /// no wake request waits and the time has not come (tests wait for this; see
    /// `TokenSyncEngine.isSettled`).
    var isParked: Bool {
        guard let sleepIsOver = state.withLock({ $0.sleepIsOver }) else { return false }
        return !sleepIsOver() && !wakes.isSignalled
    }

    /// Sleeps until `seconds` after `start` (a reading of ``now``) on the injected clock, or
    /// until ``wake()`` or cancellation. Timed from the reading the loop decided by, not from
    /// whenever the sleep begins: time that passes in between (a busy machine preempting the
    /// loop, a test moving its clock) shortens the sleep instead of adding to the wait.
    func sleep(seconds: TimeInterval, from start: Duration) async {
        let duration = Duration.milliseconds(Int64((seconds * 1000).rounded(.up)))
        let deadline = wakeUpTime(start + duration)
        state.withLock { $0.sleepIsOver = deadline.isOver }
        defer { state.withLock { $0.sleepIsOver = nil } }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await deadline.sleep() }
            group.addTask { await self.wakes.wait() }
            await group.next()
            group.cancelAll()
        }
    }

    /// A wake-up time fixed in advance: the sleep waits until that instant, not for a duration
    /// from whenever its task starts, so a test clock moved past it in between still ends it.
    private struct WakeUpTime: Sendable {
        let isOver: @Sendable () -> Bool
        let sleep: @Sendable () async -> Void
    }

    /// The elapsed-time reader and the wake-up times, from one origin on `clock`.
    private static func readers<C: Clock>(_ clock: C) -> (@Sendable () -> Duration, @Sendable (Duration) -> WakeUpTime) where C.Duration == Duration {
        let origin = clock.now
        return (
            { origin.duration(to: clock.now) },
            { offset in
                let due = origin.advanced(by: offset)
                return WakeUpTime(isOver: { clock.now >= due }, sleep: { _ = try? await clock.sleep(until: due, tolerance: nil) })
            }
        )
    }
}
