import Foundation
import Testing
import FleetTokenStore

@Suite("Token keys: which subject ids are accepted", .paced)
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
        // At the edges of printable ASCII, which is judged in one pass over the bytes.
        #expect(throws: InvalidTokenKey.controlCharacters(kind: .vehicle)) { try TokenKey.vehicle("a\u{7F}b") }
        #expect(throws: InvalidTokenKey.controlCharacters(kind: .vehicle)) { try TokenKey.vehicle("\tv") }
        #expect(throws: InvalidTokenKey.controlCharacters(kind: .vehicle)) { try TokenKey.vehicle("v\u{1F}") }
    }

    @Test("every printable ASCII character is accepted in an id")
    func printableASCII() throws {
        let printable = String(decoding: (0x20...0x7E).map { UInt8($0) }, as: UTF8.self)
        #expect(try TokenKey.trip(printable).subjectID == printable)
    }

    // Issue 26 item 10: one id, one key, byte for byte.
    @Test("canonically equivalent ids are distinct keys: they compare, hash and order by their UTF-8 bytes",
          arguments: [("T-\u{212A}-9", "T-K-9"), ("zo\u{00EB}", "zoe\u{0308}"), ("\u{00C5}", "\u{212B}"), ("caf\u{00E9}", "cafe\u{0301}")])
    func byteIdentity(first: String, second: String) throws {
        #expect(first == second, "Swift's String equality takes these as one: the reason keys must not use it")
        let a = try TokenKey.trip(first)
        let b = try TokenKey.trip(second)
        #expect(a != b)
        #expect(Set([a, b]).count == 2)
        #expect(Dictionary([(a, 1), (b, 2)], uniquingKeysWith: +).count == 2)
        #expect((a < b) != (b < a), "a strict order between them")
        #expect(a == (try TokenKey.trip(String(decoding: Array(first.utf8), as: UTF8.self))))
        #expect((a < b) == Array(first.utf8).lexicographicallyPrecedes(Array(second.utf8)), "byte order, as the store lists")
    }

    @Test("invisible format characters (category Cf) are refused like control characters",
          arguments: ["\u{202E}evil", "truck\u{200B}7", "a\u{2066}b", "\u{FEFF}v", "x\u{061C}"])
    func formatCharacters(id: String) {
        #expect(throws: InvalidTokenKey.formatCharacters(kind: .trip)) { try TokenKey.trip(id) }
        #expect(InvalidTokenKey.formatCharacters(kind: .trip).description.contains("invisible"))
    }

    @Test(". and .. are refused as segments of a /-separated id; other slashes are fine",
          arguments: ["fleet-a/x/../../truck-7", "fleet-a/..", "./v", "a/./b", "../v"])
    func dotSegmentsInside(id: String) {
        let error = #expect(throws: InvalidTokenKey.self) { try TokenKey.vehicle(id) }
        #expect(error?.code == .pathSegment)
    }

    @Test("ids with slashes and dots that are not whole segments are accepted", arguments: ["fleet-a/truck-7", "a/.b/c", "a/b..", "a//b"])
    func slashesAccepted(id: String) throws {
        #expect(try TokenKey.vehicle(id).subjectID == id)
    }
}
