// Service layer: how the local token API answers: the key a path names or the refusal, the
// unavailable answer, JSON bodies and timestamps. The routes are in TokenAPI.swift.

package import FleetTokenStore
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

extension TokenAPI {
    /// The key named by the path, or the refusal: `404` unknown kind, `400` bad id, `403` not allowed.
    func subject(_ context: TokenAPIRequestContext) -> Result<TokenKey, Refusal> {
        subject(kind: context.parameters.get("kind") ?? "", id: context.parameters.get("id") ?? "", peer: context.peer)
    }

    /// The key named by a path's `kind` and `id` segments (as sent, the id percent-decoded
    /// here) for `peer`, or the refusal.
    func subject(kind kindText: some StringProtocol, id raw: String, peer: PeerIdentity?) -> Result<TokenKey, Refusal> {
        guard let kind = TokenKind(rawValue: String(kindText)) else {
            return .failure(Refusal(Self.json(.notFound, ["error": "unknown kind: use vehicle, trip, deliveryVehicle or task"])))
        }
        guard let id = raw.utf8.contains(UInt8(ascii: "%")) ? raw.removingPercentEncoding : raw else {
            return .failure(Refusal(Self.json(.badRequest, ["error": "the id is not valid percent-encoding"])))
        }
        let key: TokenKey
        do {
            key = try TokenKey(kind: kind, subjectID: id)
        } catch {
            return .failure(Refusal(Self.json(.badRequest, ["error": error.description])))
        }
        if let refusal = accessRefusal(key, peer: peer) {
            return .failure(Refusal(Self.json(.forbidden, ["error": refusal])))
        }
        return .success(key)
    }

    /// Why `peer` (nil: not identified, as on TCP) may not have `key`'s token, or nil when it
    /// may: the allow list decides, or the client rules alone when there are any. Every edge
    /// that hands out or uses a token (the token API, the Fleet Engine proxy) asks this.
    package func accessRefusal(_ key: TokenKey, peer: PeerIdentity?) -> String? {
        // Tracked before the allow list is read, and again after: a reload puts a removed subject
        // still in use into the list before it untracks it, and tracks an added one before it
        // replaces the list, so a request decided across a reload finds it in one or the other.
        // (A tracked subject, the common case, is then matched against no pattern.)
        let tracked = { self.configuration.allowsTrackedSubjects && self.engine.isTracked(key) }
        let trackedBefore = tracked()
        let (allowList, clients) = subjectsInForce.state.withLock { ($0.allowList, $0.clients) }
        if clients.isEmpty {
            let configured = trackedBefore || allowList.allows(key) || tracked()
            return configured ? nil : "\(key) is not a configured subject and matches no allow pattern"
        }
        // Client rules decide alone: the answer names the caller and the subject it asked for,
        // never which subjects exist or whom they are granted to.
        guard let peer else {
            return "the caller could not be identified: with client rules (--allow-client), tokens are served on Unix sockets only"
        }
        return clients.allows(key, for: peer) ? nil : "no client rule (--allow-client) grants \(key) to uid \(peer.uid)"
    }

    func unavailable(_ error: TokenUnavailable) -> Response {
        var object: [String: Any] = ["error": "no usable token for \(error.key)", "last_error_kind": error.lastErrorKind]
        var headers: HTTPFields = [:]
        if let next = error.nextAttemptAt, let seconds = error.retryAfterSeconds {
            object["next_attempt_at"] = Self.timestamp(next)
            headers[.retryAfter] = "\(seconds)"
        }
        return Self.json(.serviceUnavailable, object, headers: headers)
    }

    static func prefersPlainText(_ accept: String) -> Bool {
        let types = accept.split(separator: ",").map { $0.split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces).lowercased() } ?? "" }
        guard let plain = types.firstIndex(of: "text/plain") else { return false }
        return types.firstIndex(of: "application/json").map { plain < $0 } ?? true
    }

    /// `2026-11-23T12:53:27Z` (UTC, whole seconds), as `Date.ISO8601FormatStyle` writes it,
    /// without a formatter per call.
    static func timestamp(_ date: Date) -> String {
        var buffer = ByteBuffer()
        writeTimestamp(date, to: &buffer)
        return String(buffer: buffer)
    }

    /// ``timestamp(_:)``'s text through the C library's calendar: for a year outside 1000 to 9999.
    static func calendarTimestamp(_ date: Date) -> String {
        guard let parts = UTCTime.parts(time_t(date.timeIntervalSince1970.rounded(.down))) else { return date.formatted(.iso8601) }
        let two = UTCTime.twoDigits
        return "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday))T\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec))Z"
    }

    /// Writes ``timestamp(_:)``'s text for `date` to `buffer`: for the years 1000 to 9999 from
    /// the seconds by arithmetic alone (no `gmtime_r`, no string on the way: every held token's
    /// answer writes one).
    static func writeTimestamp(_ date: Date, to buffer: inout ByteBuffer) {
        let interval = date.timeIntervalSince1970.rounded(.down)
        guard (-30_610_224_000...253_402_300_799).contains(interval) else {
            buffer.writeString(calendarTimestamp(date))
            return
        }
        let seconds = Int(interval)
        let days = seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400
        let ofDay = seconds - days * 86_400
        let (year, month, day) = UTCTime.civil(daysSince1970: days)
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: 20) { out in
            func put(_ value: Int, _ width: Int, at offset: Int) {
                var rest = value
                for position in stride(from: offset + width - 1, through: offset, by: -1) {
                    out[position] = UInt8(ascii: "0") + UInt8(rest % 10)
                    rest /= 10
                }
            }
            put(year, 4, at: 0)
            out[4] = UInt8(ascii: "-")
            put(month, 2, at: 5)
            out[7] = UInt8(ascii: "-")
            put(day, 2, at: 8)
            out[10] = UInt8(ascii: "T")
            put(ofDay / 3600, 2, at: 11)
            out[13] = UInt8(ascii: ":")
            put(ofDay / 60 % 60, 2, at: 14)
            out[16] = UInt8(ascii: ":")
            put(ofDay % 60, 2, at: 17)
            out[19] = UInt8(ascii: "Z")
            return 20
        }
    }

    static func json(_ status: HTTPResponse.Status, _ object: Any, headers: HTTPFields = [:]) -> Response {
        var headers = headers
        headers[.contentType] = "application/json"
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data("{}".utf8)
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    /// A response refusing a request, as an error value.
    struct Refusal: Error {
        let response: Response
        init(_ response: Response) { self.response = response }
    }
}

extension TokenUnavailable {
    /// What went wrong last, as the token API and the Fleet Engine proxy name it: the provider
    /// error's kind, `shutting_down`, or the reason's code. The kind only: a provider's message
    /// can quote what it was sent.
    package var lastErrorKind: String {
        reason.code == .shuttingDown ? "shutting_down" : reason.providerError?.kind ?? reason.code.description
    }

    /// Whole seconds until the next attempt (at least 1), for `Retry-After`; nil when none is set.
    package var retryAfterSeconds: Int? {
        nextAttemptAt.map { max(1, Int($0.timeIntervalSinceNow.rounded(.up))) }
    }
}

/// UTC calendar fields of a time, for the API's timestamps and the `Date` header, without a
/// formatter per call.
enum UTCTime {
    /// The fields of `seconds` since 1970, in UTC; nil when the C library cannot tell.
    static func parts(_ seconds: time_t) -> tm? {
        var seconds = seconds
        var parts = tm()
        return gmtime_r(&seconds, &parts) != nil ? parts : nil
    }

    /// `7` as `07`.
    static func twoDigits(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }

    /// The proleptic Gregorian date `days` after 1970-01-01. Counted in 400-year eras from
    /// 0000-03-01 (an era is always 146,097 days, and a year from March puts the leap day last).
    static func civil(daysSince1970 days: Int) -> (year: Int, month: Int, day: Int) {
        let fromMarch = days + 719_468
        let era = (fromMarch >= 0 ? fromMarch : fromMarch - 146_096) / 146_097
        let dayOfEra = fromMarch - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1_460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthFromMarch = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthFromMarch + 2) / 5 + 1
        let month = monthFromMarch < 10 ? monthFromMarch + 3 : monthFromMarch - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }
}
