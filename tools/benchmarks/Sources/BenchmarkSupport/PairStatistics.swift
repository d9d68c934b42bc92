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
