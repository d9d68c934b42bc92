// Provider layer: the HTTP-date of a provider's `Date` and `Retry-After` headers, parsed by
// arithmetic; and the token API's own `Date` header, formatted. A `DateFormatter` per response (what this replaced) built an ICU calendar and
// locale for every fetch, and kept ICU's code and data resident in an agent that needs nothing
// else of it.

package import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// RFC 9110's HTTP-date (section 5.6.7) in all three of its forms, which a recipient must
/// accept: the IMF-fixdate every current server sends (`Sun, 06 Nov 1994 08:49:37 GMT`), and
/// the obsolete RFC 850 (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime
/// (`Sun Nov  6 08:49:37 1994`) forms.
///
/// Strict about everything else: the exact spacing, two-digit fields, `GMT`, a day that exists
/// in its month. The day name must be one, but is not checked against the date (RFC 9110 does
/// not ask for that, and a sender that gets it wrong still means the date).
package enum HTTPDate {
    /// The moment `text` names, or nil when it is not an HTTP-date. `now` places an RFC 850
    /// date's two-digit year: in the century that puts it at most 50 years after `now`.
    package static func parse(_ text: some StringProtocol, now: Date = Date()) -> Date? {
        let bytes = Array(text.utf8)
        guard let fields = imfFixdate(bytes) ?? rfc850(bytes, now: now) ?? asctime(bytes) else { return nil }
        return fields.date
    }

    /// `seconds` since 1970 as an IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`: what a server
    /// sends as its `Date`. Empty when the C library cannot place the time.
    package static func format(_ seconds: Int) -> String {
        var time = time_t(seconds), parts = tm()
        guard gmtime_r(&time, &parts) != nil else { return "" }
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        // tm_wday counts from Sunday, the names from Monday.
        let day = String(decoding: shortDayNames[(Int(parts.tm_wday) + 6) % 7], as: UTF8.self)
        let month = String(decoding: monthNames[Int(parts.tm_mon)], as: UTF8.self)
        return "\(day), \(two(parts.tm_mday)) \(month) \(parts.tm_year + 1900) \(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }

    /// The calendar fields of a parsed date, checked to name a moment that exists.
    private struct Fields {
        var year: Int, month: Int, day: Int, hour: Int, minute: Int, second: Int

        var date: Date? {
            guard (1...12).contains(month), (1...Self.days(inMonth: month, of: year)).contains(day),
                  (0...23).contains(hour), (0...59).contains(minute), (0...60).contains(second) else { return nil }
            let seconds = Self.daysSince1970(year: year, month: month, day: day) * 86_400 + hour * 3_600 + minute * 60 + second
            return Date(timeIntervalSince1970: TimeInterval(seconds))
        }

        /// The year that holds the day `days` after 1970-01-01.
        static func year(daysSince1970 days: Int) -> Int {
            var year = 1970 + Int((Double(days) / 365.2425).rounded(.down))
            while daysSince1970(year: year, month: 1, day: 1) > days { year -= 1 }
            while daysSince1970(year: year + 1, month: 1, day: 1) <= days { year += 1 }
            return year
        }

        static func days(inMonth month: Int, of year: Int) -> Int {
            switch month {
            case 2: return year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) ? 29 : 28
            case 4, 6, 9, 11: return 30
            default: return 31
            }
        }

        /// Days from 1970-01-01 to a proleptic Gregorian date: counted in 400-year eras from
        /// 0000-03-01, a year from March putting the leap day last.
        static func daysSince1970(year: Int, month: Int, day: Int) -> Int {
            let fromMarchYear = month <= 2 ? year - 1 : year
            let era = (fromMarchYear >= 0 ? fromMarchYear : fromMarchYear - 399) / 400
            let yearOfEra = fromMarchYear - era * 400
            let dayOfYear = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1
            let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
            return era * 146_097 + dayOfEra - 719_468
        }
    }

    private static let shortDayNames = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"].map { Array($0.utf8) }
    private static let longDayNames = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"].map { Array($0.utf8) }
    private static let monthNames = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"].map { Array($0.utf8) }

    /// `Sun, 06 Nov 1994 08:49:37 GMT`: 29 bytes.
    private static func imfFixdate(_ b: [UInt8]) -> Fields? {
        guard b.count == 29, shortDayNames.contains(Array(b[0..<3])), literal(b, 3, ", "), b[7] == space,
              b[11] == space, b[16] == space, literal(b, 25, " GMT"),
              let day = digits(b, 5, 2), let month = month(b, 8), let year = digits(b, 12, 4),
              let (hour, minute, second) = time(b, 17) else { return nil }
        return Fields(year: year, month: month, day: day, hour: hour, minute: minute, second: second)
    }

    /// `Sunday, 06-Nov-94 08:49:37 GMT`: a full day name, then 24 bytes.
    private static func rfc850(_ b: [UInt8], now: Date) -> Fields? {
        guard let comma = b.firstIndex(of: UInt8(ascii: ",")), longDayNames.contains(Array(b[..<comma])),
              b.count == comma + 24 else { return nil }
        let s = comma + 1
        guard b[s] == space, b[s + 3] == dash, b[s + 7] == dash, b[s + 10] == space, literal(b, s + 19, " GMT"),
              let day = digits(b, s + 1, 2), let month = month(b, s + 4), let twoDigitYear = digits(b, s + 8, 2),
              let (hour, minute, second) = time(b, s + 11) else { return nil }
        // RFC 9110: a two-digit year more than 50 years in the future is the most recent past
        // year with the same last two digits.
        let thisYear = Fields.year(daysSince1970: Int((now.timeIntervalSince1970 / 86_400).rounded(.down)))
        var year = thisYear - thisYear % 100 + twoDigitYear
        if year > thisYear + 50 { year -= 100 } else if year + 100 <= thisYear + 50 { year += 100 }
        return Fields(year: year, month: month, day: day, hour: hour, minute: minute, second: second)
    }

    /// `Sun Nov  6 08:49:37 1994`: 24 bytes, the day of the month padded with a space.
    private static func asctime(_ b: [UInt8]) -> Fields? {
        guard b.count == 24, shortDayNames.contains(Array(b[0..<3])), b[3] == space, b[7] == space,
              b[10] == space, b[19] == space, let month = month(b, 4),
              let day = b[8] == space ? digits(b, 9, 1) : digits(b, 8, 2),
              let (hour, minute, second) = time(b, 11), let year = digits(b, 20, 4) else { return nil }
        return Fields(year: year, month: month, day: day, hour: hour, minute: minute, second: second)
    }

    private static let space = UInt8(ascii: " ")
    private static let dash = UInt8(ascii: "-")

    private static func literal(_ b: [UInt8], _ at: Int, _ text: String) -> Bool {
        b[at..<at + text.utf8.count].elementsEqual(text.utf8)
    }

    /// `count` ASCII digits at `at` as a number.
    private static func digits(_ b: [UInt8], _ at: Int, _ count: Int) -> Int? {
        var value = 0
        for byte in b[at..<at + count] {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            value = value * 10 + Int(byte - UInt8(ascii: "0"))
        }
        return value
    }

    /// A month's three letters at `at`, as 1 to 12 (case as written in RFC 9110).
    private static func month(_ b: [UInt8], _ at: Int) -> Int? {
        monthNames.firstIndex(of: Array(b[at..<at + 3])).map { $0 + 1 }
    }

    /// `HH:MM:SS` at `at`.
    private static func time(_ b: [UInt8], _ at: Int) -> (Int, Int, Int)? {
        guard b[at + 2] == UInt8(ascii: ":"), b[at + 5] == UInt8(ascii: ":"),
              let hour = digits(b, at, 2), let minute = digits(b, at + 3, 2), let second = digits(b, at + 6, 2) else { return nil }
        return (hour, minute, second)
    }
}
