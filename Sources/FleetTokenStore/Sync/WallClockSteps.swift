// Sync layer: tells a stepped wall clock from time passing, as a pure value.

import Foundation

/// Tells a stepped wall clock (NTP, an operator) from time passing: a pure value comparing how
/// far the wall clock moved with how much time elapsed on a monotonic clock since a baseline.
///
/// Two observers measure from one baseline: the scheduler (``observe(wall:elapsed:)``), which
/// recomputes deadlines after a step, and a provider's answer (``rebase(wall:elapsed:)``), which
/// re-estimates the provider offset on the clock as it is now. A step the answer measured first
/// is kept for the scheduler: the answer accounts for it in the offset, not in deadlines and
/// backoffs computed on the old clock.
struct WallClockSteps: Sendable, Equatable {
    /// Differences up to this many seconds are jitter, not steps.
    static let defaultTolerance: TimeInterval = 1

    private var wall: Date
    private var elapsed: Duration
    /// Differences up to this many seconds are jitter, not steps.
    let tolerance: TimeInterval
    /// Steps rebases measured that the scheduler has not been told of yet, in seconds.
    private(set) var unhandledStep: TimeInterval?

    init(wall: Date, elapsed: Duration, tolerance: TimeInterval) {
        self.wall = wall
        self.elapsed = elapsed
        self.tolerance = tolerance
    }

    /// The step since the baseline, in seconds (positive: the wall clock jumped forward), or nil
    /// when there was none; either way the baseline moves to this reading.
    mutating func observe(wall: Date, elapsed: Duration) -> TimeInterval? {
        let passed = elapsed - self.elapsed
        let step = wall.timeIntervalSince(self.wall) - (Double(passed.components.seconds) + Double(passed.components.attoseconds) / 1e18)
        self.wall = wall
        self.elapsed = elapsed
        return abs(step) > tolerance ? step : nil
    }

    /// Measures later steps from this reading (a provider's answer reflects the clock as it is
    /// now). A step since the baseline is returned and kept for ``takeUnhandledStep()``.
    @discardableResult
    mutating func rebase(wall: Date, elapsed: Duration) -> TimeInterval? {
        let step = observe(wall: wall, elapsed: elapsed)
        if let step { unhandledStep = (unhandledStep ?? 0) + step }
        return step
    }

    /// The steps rebases measured since the last call, or nil (the scheduler then recomputes
    /// its deadlines as after a step it measured itself); clears them.
    mutating func takeUnhandledStep() -> TimeInterval? {
        defer { unhandledStep = nil }
        return unhandledStep
    }
}
