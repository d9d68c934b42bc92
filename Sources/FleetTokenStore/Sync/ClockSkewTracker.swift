// Sync layer: keeps the offset to the provider's clock that memory judges expiry by, learning
// it from answers and correcting it when our wall clock is stepped (rules in ProviderClockOffset).
import Foundation
import Logging
import Synchronization

/// Owns the provider clock offset and the wall-clock step detector, applies the offset to
/// ``TokenMemory`` and logs when a correction starts or stops applying.
final class ClockSkewTracker: Sendable {
    private struct State: Sendable {
        var offset: ProviderClockOffset
        /// Wall-clock and elapsed time when steps were last measured from.
        var steps: WallClockSteps
    }

    private let state: Mutex<State>
    private let memory: TokenMemory
    private let logger: Logger
    private let now: @Sendable () -> Date
    /// Elapsed time on the engine's clock, to tell a stepped wall clock from time passing.
    private let elapsed: @Sendable () -> Duration

    init(policy: RefreshPolicy, memory: TokenMemory, logger: Logger, clock: any Clock<Duration>,
         now: @escaping @Sendable () -> Date) {
        let elapsed = Self.elapsedReader(clock)
        self.elapsed = elapsed
        self.now = now
        self.memory = memory
        self.logger = logger
        state = Mutex(State(offset: ProviderClockOffset(threshold: policy.clockSkewThreshold),
                            steps: WallClockSteps(wall: now(), elapsed: elapsed(),
                                                  tolerance: RefreshFailureState.clockStepTolerance)))
    }

    /// Whether an offset applies now (the scheduler then looks for clock steps every second).
    var correcting: Bool { state.withLock { $0.offset.applied != 0 } }

    /// Re-estimates the offset from a successful answer's `Date` header or `iat`.
    func learn(providerDate: Date?, issuedAt: Date?) {
        let local = now()
        let at = elapsed()
        let (previous, applied) = state.withLock { state in
            let previous = state.offset.applied
            state.offset.learn(providerDate: providerDate, issuedAt: issuedAt, localNow: local)
            // The answer already reflects any step so far: later steps are measured from here.
            state.steps.rebase(wall: local, elapsed: at)
            return (previous, state.offset.applied)
        }
        apply(applied, previous: previous)
    }

    /// Compares the wall clock with elapsed time; true when it was stepped (deadlines and
    /// retries must then be recomputed).
    func observeSteps() -> Bool {
        let local = now()
        let at = elapsed()
        let change: (step: TimeInterval, previous: TimeInterval, applied: TimeInterval)? = state.withLock { state in
            guard let step = state.steps.observe(wall: local, elapsed: at) else { return nil }
            let previous = state.offset.applied
            state.offset.wallClockStepped(by: step)
            return (step, previous, state.offset.applied)
        }
        guard let change else { return false }
        logger.notice("the wall clock was stepped; expiry is judged against the corrected time", metadata: [
            "step_seconds": .stringConvertible(Int(change.step.rounded())),
            "offset_seconds": .stringConvertible(Int(change.applied.rounded())),
        ])
        apply(change.applied, previous: change.previous)
        return true
    }

    private func apply(_ applied: TimeInterval, previous: TimeInterval) {
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
}
