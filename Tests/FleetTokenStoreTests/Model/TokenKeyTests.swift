import Foundation
import Testing
import FleetTokenStore

@Suite("Token keys: which subject ids are accepted")
struct TokenKeyTests {
    // Issue 12 item 10: the HTTP fetcher leaves "." unencoded (RFC 3986 unreserved), so an id of
    // "." or ".." became a path segment that proxies and servers resolve to another endpoint.
    @Test("\".\" and \"..\" are refused for every kind, with a message naming the problem",
          arguments: TokenKind.allCases, [".", ".."])
    func dotSegments(kind: TokenKind, id: String) {
        let error = #expect(throws: InvalidTokenKey.self) { try TokenKey(kind: kind, subjectID: id) }
        let text = error?.description ?? ""
        #expect(text.contains("\"\(id)\"") && text.contains("path segment") && text.contains("\(kind)"), "\(text)")
    }

    @Test("ids that merely contain dots are accepted", arguments: ["...", ".hidden", "a.b", "v.", "..v", "1.2.3"])
    func dotsInsideIDs(id: String) throws {
        #expect(try TokenKey.vehicle(id).subjectID == id)
    }

    @Test("empty, over-long and control-character ids are refused")
    func otherInvalidIDs() {
        #expect(throws: InvalidTokenKey.emptySubjectID(kind: .trip)) { try TokenKey.trip("") }
        let long = String(repeating: "x", count: TokenKey.maximumSubjectIDLength + 1)
        #expect(throws: InvalidTokenKey.subjectIDTooLong(kind: .vehicle, length: long.utf8.count)) { try TokenKey.vehicle(long) }
        #expect(throws: InvalidTokenKey.controlCharacters(kind: .vehicle)) { try TokenKey.vehicle("a\nb") }
    }
}
