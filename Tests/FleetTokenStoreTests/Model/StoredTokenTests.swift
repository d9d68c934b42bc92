import Foundation
import Testing
import TestSupportKit
import FleetTokenStore

// StoredToken keeps its fields in one shared immutable box (one retain per copy on the hit
// path). These pin the value semantics callers rely on: a change touches only the changed copy,
// and equality compares every field, not the box.
@Suite("Stored tokens behave as values", .paced)
struct StoredTokenTests {
    func token(_ key: TokenKey) -> StoredToken {
        StoredToken(key: key, value: "header.payload.signature",
                    expiresAt: Date(timeIntervalSince1970: 2_000), issuedAt: Date(timeIntervalSince1970: 1_000),
                    fetchedAt: Date(timeIntervalSince1970: 1_001))
    }

    @Test("changing one field of a copy leaves the original and the other fields as they were")
    func copiesAreIndependent() throws {
        let original = token(try .vehicle("truck-7"))
        var copy = original
        copy.value = "other.token.value"
        copy.lastUsedAt = Date(timeIntervalSince1970: 1_500)
        #expect(original.value == "header.payload.signature" && original.lastUsedAt == nil)
        #expect(copy.value == "other.token.value" && copy.lastUsedAt == Date(timeIntervalSince1970: 1_500))
        #expect(copy.key == original.key && copy.expiresAt == original.expiresAt)
        #expect(copy.issuedAt == original.issuedAt && copy.fetchedAt == original.fetchedAt)
        #expect(copy != original)
    }

    @Test("an optional date can be cleared, and tokens built apart with the same fields are equal")
    func clearingAndEquality() throws {
        let original = token(try .vehicle("truck-7"))
        var copy = original
        copy.issuedAt = nil
        #expect(copy.issuedAt == nil && original.issuedAt != nil)
        #expect(copy.lifetime == 999 && original.lifetime == 1_000)
        let twin = token(try .vehicle("truck-7"))
        #expect(twin == original)
        copy.issuedAt = original.issuedAt
        #expect(copy == original)
        var moved = original
        let trip = try TokenKey.trip("truck-7")
        moved.key = trip
        #expect(moved != original && moved.key == trip)
    }

    @Test("the fingerprint is the value's, read again from the token, and follows a changed value")
    func fingerprintFollowsTheValue() throws {
        var token = token(try .vehicle("truck-7"))
        let first = token.fingerprint
        #expect(first == TokenFingerprint(of: "header.payload.signature"))
        #expect(token.fingerprint == first)
        let copy = token
        token.lastUsedAt = Date(timeIntervalSince1970: 1_600)
        #expect(token.fingerprint == first)
        token.value = "abc"
        #expect(token.fingerprint.description == "ba7816bf8f01")
        #expect(copy.fingerprint == first)
    }
}
