// FleetTokenHTTPTests' support: a quiet logger, a development issuer for the length of a test,
// an HTTP fetcher from a URL template, HTTP dates.

import DevTokenIssuer
import FleetTokenHTTP
import FleetTokenStore
import Foundation
import Logging

let quietLogger: Logger = {
    var logger = Logger(label: "test")
    logger.logLevel = .warning
    return logger
}()

/// Starts a development issuer on a free loopback port for the duration of `body`.
func withIssuer<T>(lifetime: TimeInterval = 3600, _ body: (DevTokenIssuer) async throws -> T) async throws -> T {
    var configuration = DevTokenIssuer.Configuration()
    configuration.lifetime = lifetime
    let issuer = try await DevTokenIssuer.start(configuration, logger: quietLogger)
    do {
        let result = try await body(issuer)
        await issuer.stop()
        return result
    } catch {
        await issuer.stop()
        throw error
    }
}

func fetcher(_ template: String, _ configure: (inout HTTPTokenFetcherConfiguration) -> Void = { _ in }) throws -> HTTPTokenFetcher {
    var configuration = HTTPTokenFetcherConfiguration(urlTemplate: template)
    configure(&configuration)
    return try HTTPTokenFetcher(configuration: configuration, logger: quietLogger)
}

/// `date` as an HTTP date (`Retry-After`, `Date`): "Sun, 06 Nov 1994 08:49:37 GMT".
func httpDate(_ date: Date) -> String {
    gmtText(date, "EEE, dd MMM yyyy HH:mm:ss 'GMT'")
}

/// `date` in HTTP-date's obsolete asctime form: "Sun Nov  6 08:49:37 1994" (a one-digit day
/// padded with a space).
func asctimeDate(_ date: Date) -> String {
    let parts = gmtText(date, "EEE MMM d HH:mm:ss yyyy").split(separator: " ")
    return "\(parts[0]) \(parts[1]) \(parts[2].count == 1 ? " " : "")\(parts[2]) \(parts[3]) \(parts[4])"
}

/// `date` in HTTP-date's obsolete RFC 850 form: "Sunday, 06-Nov-94 08:49:37 GMT".
func rfc850Date(_ date: Date) -> String {
    gmtText(date, "EEEE, dd-MMM-yy HH:mm:ss 'GMT'")
}

/// `date` written by a formatter (an oracle independent of the parser under test) in GMT.
private func gmtText(_ date: Date, _ pattern: String) -> String {
    let formatter = DateFormatter()
    formatter.locale = Locale(identifier: "en_US_POSIX")
    formatter.timeZone = TimeZone(identifier: "GMT")
    formatter.dateFormat = pattern
    return formatter.string(from: date)
}
