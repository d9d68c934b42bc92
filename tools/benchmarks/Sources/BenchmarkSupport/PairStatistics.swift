// What the paired measurements (token-store-hit-pair, token-store-persist-pair) compute from
// their rounds.

/// `duration` in nanoseconds.
public func nanoseconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) * 1e9 + Double(duration.components.attoseconds) / 1e9
}

/// The median of `values` (not empty).
public func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
}

/// The `q` quantile of `values` (not empty), nearest rank.
public func quantile(_ values: [Double], _ q: Double) -> Double {
    let sorted = values.sorted()
    return sorted[min(sorted.count - 1, Int((Double(sorted.count - 1) * q).rounded()))]
}

/// `value` rounded to three decimals, as the reports give ratios.
public func round3(_ value: Double) -> Double { (value * 1000).rounded() / 1000 }

/// The rounds of a paired measurement: per round, the measured side's time and the baseline's
/// for the same amount of work, kept after the warm-up rounds.
public struct PairedRounds: Sendable {
    /// Each round's measured time over its baseline's.
    public private(set) var ratios: [Double] = []
    /// Each round's measured time per unit of work, in microseconds.
    public private(set) var measuredMicroseconds: [Double] = []
    /// Each round's baseline time per unit of work, in microseconds.
    public private(set) var baselineMicroseconds: [Double] = []

    public init() {}

    /// Records one round in which `measured` and `baseline` each did `units` of the same work.
    public mutating func record(_ measured: Duration, against baseline: Duration, units: Int) {
        ratios.append(nanoseconds(measured) / nanoseconds(baseline))
        measuredMicroseconds.append(nanoseconds(measured) / Double(units) / 1000)
        baselineMicroseconds.append(nanoseconds(baseline) / Double(units) / 1000)
    }

    /// The figure: the median of the rounds' ratios.
    public var ratio: Double { round3(median(ratios)) }
    /// The rounds' ratios at the 25th and 75th percentile.
    public var ratioQuartiles: [Double] { [round3(quantile(ratios, 0.25)), round3(quantile(ratios, 0.75))] }
    /// The median of the measured side's time per unit, in microseconds.
    public var measuredMedian: Double { round3(median(measuredMicroseconds)) }
    /// The median of the baseline's time per unit, in microseconds.
    public var baselineMedian: Double { round3(median(baselineMicroseconds)) }
}
