public import Foundation

/// Short human descriptions of a time relative to now, for admin and agent output:
/// `in 41m`, `in 1m59s`, `3h2m ago`.
public enum RelativeTime {
    /// Describes `date` relative to `now`.
    public static func describe(_ date: Date, now: Date) -> String {
        let seconds = Int(date.timeIntervalSince(now).rounded())
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
