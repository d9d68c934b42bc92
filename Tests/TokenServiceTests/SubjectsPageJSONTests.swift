// The body of a /v1/subjects page, written by hand (TokenAPI.subjectsPage): the same bytes as
// the dictionaries it replaced, serialized by Foundation with sorted keys. Plain values.

@testable import FleetTokenService
import FleetTokenStore
import Foundation
import NIOCore
import Testing

@Suite("The /v1/subjects page body", .paced)
struct SubjectsPageJSONTests {
    /// The page as the API built it before: one dictionary per subject, Foundation's serializer.
    func serialized(_ page: [SubjectStatus]) throws -> String {
        let list = page.map { status -> [String: Any] in
            var object: [String: Any] = [
                "kind": status.key.kind.rawValue, "id": status.key.subjectID, "tracked": status.tracked,
                "status": status.state.rawValue,
            ]
            object["expires_at"] = status.expiresAt.map(TokenAPI.timestamp) ?? NSNull()
            object["fingerprint"] = status.fingerprint?.description ?? NSNull()
            object["source"] = status.source?.rawValue ?? NSNull()
            object["consecutive_failures"] = status.failure?.consecutiveFailures ?? 0
            object["next_attempt_at"] = status.failure.map { TokenAPI.timestamp($0.nextAttemptAt) } ?? NSNull()
            object["last_error_kind"] = status.failure?.lastErrorKind ?? NSNull()
            return object
        }
        let data = try JSONSerialization.data(withJSONObject: list, options: [.sortedKeys, .withoutEscapingSlashes])
        return String(decoding: data, as: UTF8.self)
    }

    @Test("every kind of status, ids with characters to escape or beyond ASCII, and an empty page: the same bytes as before")
    func sameBytes() throws {
        let expiry = Date(timeIntervalSince1970: 1_800_000_123.456)
        let failure = RefreshFailureState(consecutiveFailures: 3, nextAttemptAt: expiry + 60, lastErrorKind: "httpStatus",
                                          lastErrorMessage: "HTTP 503", lastFailureAt: expiry - 5)
        let ids = ["truck-7", "a/b", "quote\"d", "back\\slash", "Zürich-ü", "t:1.2_3~4"]
        var page: [SubjectStatus] = []
        for (index, id) in ids.enumerated() {
            let key = try index.isMultiple(of: 2) ? TokenKey.vehicle(id) : TokenKey.trip(id)
            page.append(SubjectStatus(key: key, tracked: true, state: .valid, expiresAt: expiry,
                                      fingerprint: TokenFingerprint(of: "a.b.\(id)"), source: .provider, failure: nil))
            page.append(SubjectStatus(key: key, tracked: false, state: .backoff, expiresAt: expiry,
                                      fingerprint: TokenFingerprint(of: "c.d.\(id)"), source: .store, failure: failure))
            page.append(SubjectStatus(key: key, tracked: index.isMultiple(of: 3), state: .unavailable, expiresAt: nil,
                                      fingerprint: nil, source: nil, failure: index.isMultiple(of: 2) ? failure : nil))
            page.append(SubjectStatus(key: key, tracked: true, state: .refreshDue, expiresAt: expiry,
                                      fingerprint: TokenFingerprint(of: "e.f"), source: .store, failure: nil))
        }
        // A last error kind read back from a store row may hold any character: control characters
        // are escaped as the serializer escaped them (\b and \f by name, the others as \u00XX).
        let odd = RefreshFailureState(consecutiveFailures: 1, nextAttemptAt: expiry, lastErrorKind: "a\u{08}b\u{0C}c\u{01}d\ne\tf\"g\\h/i",
                                      lastErrorMessage: nil, lastFailureAt: expiry)
        page.append(SubjectStatus(key: try TokenKey.vehicle("odd"), tracked: false, state: .backoff, expiresAt: nil,
                                  fingerprint: nil, source: nil, failure: odd))
        #expect(String(buffer: TokenAPI.subjectsPage(page)) == (try serialized(page)))
        #expect(String(buffer: TokenAPI.subjectsPage([])) == "[]")
        // And it parses back as the objects the OpenAPI document describes.
        let parsed = try #require(try JSONSerialization.jsonObject(with: Data(buffer: TokenAPI.subjectsPage(page))) as? [[String: Any]])
        #expect(parsed.count == page.count && parsed[1]["consecutive_failures"] as? Int == 3)
    }
}
