/// A length of time in an option: a whole number with an optional unit, `s` (the
/// default), `m`, `h` or `d`: `90s`, `30m`, `24h`, `7d`, `0`.
struct DurationArgument: Sendable, Equatable, CustomStringConvertible {
    /// The length in seconds.
    let seconds: Double

    init(seconds: Double) {
        self.seconds = seconds
    }

    init?(argument: String) {
        let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600, "d": 86_400]
        var digits = Substring(argument)
        var unit = 1.0
        if let last = digits.last, let factor = units[last] {
            unit = factor
            digits = digits.dropLast()
        }
        // Whole numbers only, and at most 10 years: a typo must not overflow or mean forever.
        guard !digits.isEmpty, digits.allSatisfy(\.isASCII), digits.allSatisfy(\.isNumber),
              let value = Double(digits), value * unit <= 10 * 365 * 86_400 else { return nil }
        seconds = value * unit
    }

    var description: String {
        for (suffix, unit) in [("d", 86_400.0), ("h", 3600), ("m", 60)] where seconds >= unit && seconds.truncatingRemainder(dividingBy: unit) == 0 {
            return "\(Int(seconds / unit))\(suffix)"
        }
        return "\(Int(seconds))s"
    }
}
