// Sync layer: tells a stepped wall clock from time passing, as a pure value.

import Foundation

/// Tells a stepped wall clock (NTP, an operator) from time passing: a pure value comparing how
/// far the wall clock moved with how much time elapsed on a monotonic clock since a baseline.
struct WallClockSteps: Sendable, Equatable {
    private var wall: Date
    private var elapsed: Duration
    /// Differences up to this many seconds are jitter, not steps.
    let tolerance: TimeInterval

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
        rebase(wall: wall, elapsed: elapsed)
        return abs(step) > tolerance ? step : nil
    }

    /// Measures later steps from this reading (what happened before it is accounted for).
    mutating func rebase(wall: Date, elapsed: Duration) {
        self.wall = wall
        self.elapsed = elapsed
    }
}
