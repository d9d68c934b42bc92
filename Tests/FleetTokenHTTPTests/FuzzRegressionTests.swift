import FleetTokenHTTP
import FleetTokenStore
import Foundation
import Testing

/// Inputs found by the libFuzzer harnesses in tools/fuzz, kept so what they exposed stays fixed.
@Suite("Provider responses found by fuzzing", .paced)
struct ProviderResponseFuzzRegressionTests {
    // tools/fuzz reproducer (provider-response, found after 224,390 runs; kept as
    // Corpus/provider-response/regression-opaque-expiry-beyond-int): configuration byte "@"
    // (auto format, vehicle, the samples' field names), clock byte 0x08 (now 1_800_000_000,
    // opaque tokens allowed), then the body below. Auto reads the expiration as epoch
    // milliseconds, 1.18e21 s; with no JWT exp to cap it, validation keeps that expiry, and
    // describing it as the agent does ("expires ... (in ...)") trapped converting it to Int.
    @Test("an opaque token with an absurd stated expiry goes through parse, validation and description")
    func absurdStatedExpiry() async throws {
        let body = Data(#"{"VEHICLE_TOKEN_KEY": "opaque1b2c3d4e5", "TOKEN_EXPIRATION": 1180000360080180030036000}"#.utf8)
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let key = try TokenKey.vehicle("subject-1")
        let http = try fetcher("https://provider.invalid/{kind}/{id}")
        let fetched = try http.parse(body, for: key, now: now)
        await http.shutdown()
        #expect(fetched.statedExpiry == Date(timeIntervalSince1970: 1_180_000_360_080_180_030_036_000.0 / 1000))

        var policy = RefreshPolicy()
        policy.allowOpaqueTokens = true
        let stored = try TokenValidator(policy: policy).validate(fetched, for: key, now: now)
        #expect(RelativeTime.describe(stored.expiresAt, now: now) == "in 11574074d1h")
    }
}
