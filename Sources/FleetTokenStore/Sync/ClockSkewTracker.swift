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
                                                  tolerance: WallClockSteps.defaultTolerance)))
    }

    /// Whether an offset applies now (the scheduler then looks for clock steps every second).
    var correcting: Bool { state.withLock { $0.offset.applied != 0 } }

    /// Re-estimates the offset from a successful answer's `Date` header or `iat`. Returns true
    /// when the wall clock was stepped since the scheduler last looked: its deadlines are still
    /// on the old clock, so the caller wakes it (``observeSteps()`` then reports the step).
    @discardableResult
    func learn(providerDate: Date?, issuedAt: Date?) -> Bool {
        let local = now()
        let at = elapsed()
        let (previous, applied, step) = state.withLock { state in
            let previous = state.offset.applied
            state.offset.learn(providerDate: providerDate, issuedAt: issuedAt, localNow: local)
            // The answer already reflects any step so far: the offset needs no correction for
            // it and later steps are measured from here, but the step is kept for the scheduler.
            let step = state.steps.rebase(wall: local, elapsed: at)
            return (previous, state.offset.applied, step)
        }
        // Debug: the scheduler logs the step when it takes it (observeSteps). Without run()
        // nothing does: hours of NTP slewing between answers can add up past the tolerance.
        if let step {
            logger.debug("the wall clock moved apart from elapsed time since steps were last measured; deadlines are recomputed", metadata: [
                "step_seconds": .stringConvertible(Int(step.rounded())),
            ])
        }
        apply(applied, previous: previous)
        return step != nil
    }

    /// Raises the offset to what `tokens`, read from the store, prove about the provider's clock
    /// (``ProviderClockOffset/learnFromStored(issuedAt:fetchedAt:)``), until the provider has
    /// answered in this process. Call before judging them.
    func learnFromStored(_ tokens: some Sequence<StoredToken>) {
        let (previous, applied) = state.withLock { state in
            let previous = state.offset.applied
            guard !state.offset.answered else { return (previous, previous) }
            for token in tokens {
                guard let issuedAt = token.issuedAt else { continue }
                state.offset.learnFromStored(issuedAt: issuedAt, fetchedAt: token.fetchedAt)
            }
            return (previous, state.offset.applied)
        }
        guard applied != previous else { return }
        apply(applied, previous: previous)
    }

    /// Compares the wall clock with elapsed time; true when it was stepped since the last call,
    /// whether measured here or first by an answer (deadlines and retries must then be
    /// recomputed).
    func observeSteps() -> Bool {
        let local = now()
        let at = elapsed()
        let (change, seenByAnswer): ((step: TimeInterval, previous: TimeInterval, applied: TimeInterval)?, TimeInterval?) = state.withLock { state in
            let step = state.steps.observe(wall: local, elapsed: at)
            // A step an answer measured first: the offset was re-learnt after it, deadlines not.
            let seenByAnswer = state.steps.takeUnhandledStep()
            guard let step else { return (nil, seenByAnswer) }
            let previous = state.offset.applied
            state.offset.wallClockStepped(by: step)
            return ((step, previous, state.offset.applied), seenByAnswer)
        }
        if let seenByAnswer {
            logger.notice("the wall clock was stepped (a provider's answer noticed it first); deadlines and backoffs are recomputed", metadata: [
                "step_seconds": .stringConvertible(Int(seenByAnswer.rounded())),
            ])
        }
        guard let change else { return seenByAnswer != nil }
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
