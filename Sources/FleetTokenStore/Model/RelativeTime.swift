// Model layer: how tokenctl and token-agent show a time relative to now. `package`: the two
// executables share no target but this library, and embedders have no use for it.

package import Foundation

/// Short human descriptions of a time relative to now, for admin and agent output:
/// `in 41m`, `in 1m59s`, `3h2m ago`.
package enum RelativeTime {
    /// Differences beyond this (about 31,700 years) are described as this: converting them to
    /// `Int` would trap, and a stored or provider-stated expiry can be any date.
    static let largestDescribed: TimeInterval = 1e12

    /// Describes `date` relative to `now`, for any two dates.
    package static func describe(_ date: Date, now: Date) -> String {
        let interval = date.timeIntervalSince(now)
        let seconds = interval.isNaN ? 0 : Int(min(max(interval, -largestDescribed), largestDescribed).rounded())
        let magnitude = abs(seconds)
        let text: String
        switch magnitude {
        case 86400...: text = "\(magnitude / 86400)d\(magnitude % 86400 / 3600)h"
        case 3600...: text = "\(magnitude / 3600)h\(magnitude % 3600 / 60)m"
        case 600...: text = "\(magnitude / 60)m"
        case 60...: text = "\(magnitude / 60)m\(magnitude % 60)s"
        default: text = "\(magnitude)s"
        }
        return seconds >= 0 ? "in \(text)" : "\(text) ago"
    }
}
