@testable import FleetTokenHTTP
import FleetTokenHTTPSyntax
import Foundation
import Testing
import TestSupportKit

/// The provider's `Date` and `Retry-After` headers: RFC 9110's HTTP-date in all three forms,
/// parsed without a formatter.
@Suite("HTTP-date parsing", .paced)
struct HTTPDateTests {
    /// RFC 9110's example moment, 1994-11-06 08:49:37 UTC.
    let example = Date(timeIntervalSince1970: 784_111_777)
    /// A fixed "now" for the RFC 850 form's two-digit years: 2026-12-02.
    let now = Date(timeIntervalSince1970: 1_796_169_600)

    @Test("the three forms of RFC 9110's example name the same moment")
    func threeForms() {
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 08:49:37 GMT", now: now) == example)
        #expect(HTTPDate.parse("Sunday, 06-Nov-94 08:49:37 GMT", now: now) == example)
        #expect(HTTPDate.parse("Sun Nov  6 08:49:37 1994", now: now) == example)
        #expect(HTTPDate.parse("Sun Nov 16 08:49:37 1994", now: now) == example.addingTimeInterval(10 * 86_400))
    }

    // The fetcher took only the IMF-fixdate (a DateFormatter with one pattern), though RFC 9110
    // says a recipient must accept all three: a provider (or a proxy in front of it) sending
    // the asctime form had its Retry-After ignored, and was asked again at once.
    @Test("a Retry-After in either obsolete form is honoured")
    func retryAfterObsoleteForms() {
        let start = Date()
        let inTwoMinutes = start.addingTimeInterval(120)
        for text in [asctimeDate(inTwoMinutes), rfc850Date(inTwoMinutes)] {
            let delay = HTTPTokenFetcher.retryAfter(text)
            // Less than 120 s by the second's fraction the text drops and by the time passed
            // since `start` (seconds on a loaded machine: a fixed 3 s margin failed in CI).
            let elapsed = Date().timeIntervalSince(start)
            #expect(delay.map { $0 <= 120 && $0 >= 120 - 1 - elapsed - 0.01 } == true, "\(text): \(String(describing: delay)) after \(elapsed) s")
        }
    }

    @Test("every IMF-fixdate from 1600 to 9999 parses to what a formatter wrote, and is written as the formatter writes it")
    func matchesAFormatter() {
        // The formatter switches to the Julian calendar before 1582; HTTP dates are Gregorian.
        let first = -11_676_096_000.0, last = 253_402_300_799.0
        var generator = SystemRandomNumberGenerator()
        var moments = [first, last, 0, 951_782_400, 951_868_799, 4_107_542_400] // 2000-02-29, 2100-03-01
        for _ in 0..<2_000 { moments.append(Double.random(in: first...last, using: &generator).rounded(.down)) }
        for seconds in moments {
            let date = Date(timeIntervalSince1970: seconds)
            let text = httpDate(date)
            #expect(HTTPDate.parse(text, now: now) == date, "\(text)")
            #expect(HTTPDate.format(Int(seconds)) == text)
        }
    }

    @Test("RFC 850's two-digit year: at most 50 years ahead of now, else the century before")
    func twoDigitYears() {
        func year(_ yy: String, now: Date) -> Int? {
            HTTPDate.parse("Monday, 01-Jan-\(yy) 00:00:00 GMT", now: now).map {
                Calendar(identifier: .gregorian).dateComponents(in: TimeZone(identifier: "GMT")!, from: $0).year!
            }
        }
        #expect(year("94", now: now) == 1994)
        #expect(year("26", now: now) == 2026)
        #expect(year("76", now: now) == 2076)
        #expect(year("77", now: now) == 1977)
        #expect(year("00", now: now) == 2000)
        // Late in a century, the next one's early years are at most 50 years ahead.
        let in2072 = Date(timeIntervalSince1970: 3_219_264_000)
        #expect(year("05", now: in2072) == 2105)
        #expect(year("22", now: in2072) == 2122)
        #expect(year("23", now: in2072) == 2023)
        #expect(year("72", now: in2072) == 2072)
    }

    @Test("anything else is refused", arguments: [
        "", "soon", "Sun, 06 Nov 1994 08:49:37 UTC", "Sun, 06 Nov 1994 08:49:37 +0000", "Sun, 06 Nov 1994 08:49:37",
        "Sun, 6 Nov 1994 08:49:37 GMT", "Sun,  06 Nov 1994 08:49:37 GMT", "Sun, 06 nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 GMT ", " Sun, 06 Nov 1994 08:49:37 GMT", "Xyz, 06 Nov 1994 08:49:37 GMT",
        "Sun, 29 Feb 2023 00:00:00 GMT", "Sun, 31 Apr 2024 00:00:00 GMT", "Sun, 00 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 24:00:00 GMT", "Sun, 06 Nov 1994 08:60:00 GMT", "Sun, 06 Nov 1994 08:49:61 GMT",
        "Sun, 06 Nov 1994 08-49-37 GMT", "Sun, 06 Nov 19a4 08:49:37 GMT", "Sun, 06 Nov ١٩٩٤ 08:49:37 GMT",
        "Sunday, 06-Nov-1994 08:49:37 GMT", "Sun, 06-Nov-94 08:49:37 GMT", "Funday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov 6 08:49:37 1994", "Sun Nov  6 08:49:37 1994 ", "Sun Nov 06 08:49:37 94", "Sun Nov  6 08:49:37 GMT 1994",
    ])
    func refused(_ text: String) {
        #expect(HTTPDate.parse(text, now: now) == nil)
    }

    @Test("the leap day and a leap second")
    func edges() {
        #expect(HTTPDate.parse("Thu, 29 Feb 2024 12:00:00 GMT", now: now) == Date(timeIntervalSince1970: 1_709_208_000))
        #expect(HTTPDate.parse("Tue, 29 Feb 2000 00:00:00 GMT", now: now) == Date(timeIntervalSince1970: 951_782_400))
        #expect(HTTPDate.parse("Mon, 01 Mar 2100 00:00:00 GMT", now: now) == Date(timeIntervalSince1970: 4_107_542_400))
        #expect(HTTPDate.parse("Sat, 31 Dec 2016 23:59:60 GMT", now: now) == Date(timeIntervalSince1970: 1_483_228_800))
    }
}
