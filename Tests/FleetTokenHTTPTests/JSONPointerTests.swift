import Foundation
import Testing
@testable import FleetTokenHTTP
@testable import FleetTokenHTTPSyntax
@testable import FleetTokenStore

/// `tokenKey` and `expirationKey` as JSON pointers (RFC 6901) for answers that wrap the token.
@Suite("Provider answers read through JSON pointers", .paced)
struct JSONPointerTests {
    let key = try! TokenKey.vehicle("truck-7")
    let now = Date(timeIntervalSince1970: 1_800_000_000)

    @Test("/data/token and /data/expires read a nested answer; plain names keep working")
    func nested() throws {
        let body = #"{"data":{"token":"a.b.c","expires":1800003600},"TOKEN_EXPIRATION":1800001800,"VEHICLE_TOKEN_KEY":"x.y.z"}"#
        let nested = ProviderResponseFormat(tokenKey: "/data/token", expirationKey: "/data/expires")
        let fetched = try nested.parse(Data(body.utf8), for: key, now: now)
        #expect(fetched.value == "a.b.c")
        #expect(fetched.statedExpiry == Date(timeIntervalSince1970: 1_800_003_600))
        let flat = try ProviderResponseFormat().parse(Data(body.utf8), for: key, now: now)
        #expect(fetched.value != flat.value)
        #expect(flat.value == "x.y.z")
        #expect(flat.statedExpiry == Date(timeIntervalSince1970: 1_800_001_800))
    }

    @Test("array indices and the ~0/~1 escapes; a missing or malformed path is missingData naming it")
    func escapesAndMisses() throws {
        let body = #"{"tokens":[{"a/b":"first"},{"m~n":"second"}]}"#
        let data = Data(body.utf8)
        #expect(try ProviderResponseFormat(tokenKey: "/tokens/0/a~1b", expirationKey: nil).parse(data, for: key, now: now).value == "first")
        #expect(try ProviderResponseFormat(tokenKey: "/tokens/1/m~0n", expirationKey: nil).parse(data, for: key, now: now).value == "second")
        for pointer in ["/tokens/2/x", "/tokens/01/m~0n", "/tokens/-1", "/missing", "/tokens/0/a~1b/deeper"] {
            #expect(throws: TokenProviderError.missingData(field: pointer)) {
                try ProviderResponseFormat(tokenKey: pointer, expirationKey: nil).parse(data, for: key, now: now)
            }
        }
    }
}
