// Test kit layer: a clock that moves only when the test moves it. A sleep whose deadline has
// come by the time it begins returns at once, decided under the same lock that `advance` takes,
// so a sleep that starts late (a loaded machine) never waits for a time that already passed.

import Foundation
import Synchronization

/// A `Clock` whose time moves only through ``advance(by:)``.
///
/// ``sleep(until:tolerance:)`` returns once the clock's time reaches the deadline, or at once
/// when it already has (including a deadline equal to now), or throws `CancellationError` when
/// its task is cancelled. Checking the deadline and registering the sleeper happen in one step
/// under a lock, so a test that advances the clock while the sleeping task is still starting
/// cannot strand it.
public final class ManualClock: Clock, Sendable {
    /// A point on a ``ManualClock``: the time since the clock was made.
    public struct Instant: InstantProtocol, Sendable {
        /// Time since the clock's origin.
        public let offset: Duration

        /// Creates the instant `offset` after the clock's origin.
        public init(offset: Duration) { self.offset = offset }

        /// The instant `duration` later.
        public func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }

        /// The time from this instant to `other`.
        public func duration(to other: Instant) -> Duration { other.offset - offset }

        /// Whether `lhs` comes before `rhs`.
        public static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
    }

    private struct Sleeper {
        let id: UInt64
        let deadline: Instant
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now = Instant(offset: .zero)
        var sleepers: [Sleeper] = []
        var nextID: UInt64 = 0
    }

    private let state = Mutex(State())

    /// Creates a clock at its origin, with no sleepers.
    public init() {}

    /// The clock's current time.
    public var now: Instant { state.withLock { $0.now } }

    /// The smallest step the clock distinguishes.
    public var minimumResolution: Duration { .nanoseconds(1) }

    /// How many sleeps wait for the clock to move.
    public var sleeperCount: Int { state.withLock { $0.sleepers.count } }

    /// Waits until the clock reaches `deadline` (at once when it has), or throws
    /// `CancellationError` when the task is cancelled.
    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        let id = state.withLock { state in
            defer { state.nextID += 1 }
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let outcome: Result<Void, any Error>? = state.withLock { state in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if deadline <= state.now { return .success(()) }
                    state.sleepers.append(Sleeper(id: id, deadline: deadline, continuation: continuation))
                    return nil
                }
                if let outcome { continuation.resume(with: outcome) }
            }
        } onCancel: {
            let sleeper = state.withLock { state -> Sleeper? in
                guard let index = state.sleepers.firstIndex(where: { $0.id == id }) else { return nil }
                return state.sleepers.remove(at: index)
            }
            sleeper?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Moves the clock forward by `duration`, one deadline at a time: each sleep that ends on
    /// the way is resumed with the clock at its deadline, and gets a chance to run before the
    /// clock moves on.
    public func advance(by duration: Duration) async {
        precondition(duration >= .zero, "a ManualClock only moves forward")
        let target = state.withLock { $0.now.advanced(by: duration) }
        while true {
            // Tasks that were about to sleep get a turn first, so they sleep from the old time.
            await Self.letOthersRun()
            if !resumeNextDue(notAfter: target) { break }
        }
        await Self.letOthersRun()
    }

    /// One step of a move: the clock goes to the earliest deadline not after `target` and that
    /// deadline's sleeps are resumed (true), or, when none is left before it, to `target`
    /// (false). For a test that decides itself how long to let the woken tasks run before the
    /// next step (``advance(by:)`` gives them a fixed number of turns).
    public func resumeNextDue(notAfter target: Instant) -> Bool {
        let due = state.withLock { state -> [Sleeper] in
            guard let earliest = state.sleepers.map(\.deadline).min(), earliest <= target else {
                state.now = max(state.now, target)
                return []
            }
            state.now = max(state.now, earliest)
            let due = state.sleepers.filter { $0.deadline <= earliest }
            state.sleepers.removeAll { $0.deadline <= earliest }
            return due
        }
        for sleeper in due { sleeper.continuation.resume() }
        return !due.isEmpty
    }

    /// Gives other tasks turns before the caller goes on: each yield waits for a background
    /// task, so the cooperative pool runs what is ready. A convenience, not a guarantee (tests
    /// still wait for what they check).
    private static func letOthersRun() async {
        for _ in 0..<20 {
            await Task.detached(priority: .background) { await Task.yield() }.value
        }
    }
}
