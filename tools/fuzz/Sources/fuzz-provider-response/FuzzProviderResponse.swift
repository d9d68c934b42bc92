// libFuzzer harness for the provider-response parser, through its public entry point
// `ProviderResponseFormat.parse(_:for:now:providerDate:)` (what `HTTPTokenFetcher.fetchToken`
// runs on a received body), followed by what the engine does next: `TokenValidator.validate`,
// and the descriptions an agent prints. The parser is in FleetTokenHTTPSyntax; the fetcher in
// FleetTokenHTTP runs it.
//
// Input: byte 0 picks the configuration, byte 1 the clock; the rest is the response body.
//   byte 0, bits 0-1: expiration format (auto, epoch-seconds, epoch-millis, relative-seconds)
//           bits 2-3: key kind (vehicle, trip, deliveryVehicle, task)
//           bits 4-5: token key (samples' per-kind name, "token", "access_token", samples' name)
//           bits 6-7: expiration key ("TOKEN_EXPIRATION" twice, none, "expires_in")
//   byte 1, bits 0-2: `now` (see `clocks`); bit 3: allow opaque tokens; bit 4: pass `now` as
//           the provider's Date header.

// @testable: JSONValue (the library's own JSON reader), RelativeTime and TokenValidator are
// package-only (the fuzz build is a debug build, so testing is enabled).
import FleetTokenHTTPSyntax
@testable import FleetTokenStore
import Foundation
import FuzzSupport

/// Clocks a provider's `Date` header can put the parser at, not only the present.
let clocks: [Date] = [
    Date(timeIntervalSince1970: 1_800_000_000),          // the seeds' iat
    Date(timeIntervalSince1970: 1_800_003_600),          // the seeds' exp
    Date(timeIntervalSince1970: 1_800_000_000.5),
    Date(timeIntervalSince1970: 0),
    Date(timeIntervalSince1970: 999_999_999),            // just below auto's seconds threshold
    Date(timeIntervalSince1970: -62_135_596_800),        // Date: Mon, 01 Jan 0001 00:00:00 GMT
    Date(timeIntervalSince1970: 253_402_300_799),        // Date: Fri, 31 Dec 9999 23:59:59 GMT
    Date(timeIntervalSince1970: 99_999_999_999),         // just below auto's millis threshold
]

let formats: [ProviderResponseFormat.ExpirationFormat] = [.auto, .epochSeconds, .epochMillis, .relativeSeconds]
let kinds: [TokenKind] = [.vehicle, .trip, .deliveryVehicle, .task]
let tokenKeys: [String?] = [nil, "token", "access_token", nil]
let expirationKeys: [String?] = ["TOKEN_EXPIRATION", "TOKEN_EXPIRATION", nil, "expires_in"]

/// One format per configuration (the kind bits aside), made once.
let parsers: [Int: ProviderResponseFormat] = Dictionary(uniqueKeysWithValues: (0..<256).filter { $0 & 0b1100 == 0 }.map { selector in
    (selector, ProviderResponseFormat(tokenKey: tokenKeys[selector >> 4 & 3], expirationKey: expirationKeys[selector >> 6 & 3],
                                      expirationFormat: formats[selector & 3]))
})

let keys: [TokenKey] = kinds.map { try! TokenKey(kind: $0, subjectID: "subject-1") }

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzProviderResponse(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = FuzzInput(data, size)
    let configuration = Int(input.selector(0)), clock = Int(input.selector(1))
    let fetcher = parsers[configuration & 0b1111_0011]!
    let key = keys[configuration >> 2 & 3]
    let now = clocks[clock & 7]
    let allowOpaque = clock & 8 != 0
    let providerDate = clock & 16 != 0 ? now : nil
    let body = Data(input.payload(after: 2))
    check(body: body, fetcher: fetcher, key: key, now: now, providerDate: providerDate, allowOpaque: allowOpaque)
    return 0
}

func check(body: Data, fetcher settings: ProviderResponseFormat, key: TokenKey, now: Date, providerDate: Date?, allowOpaque: Bool) {
    let tokenField = settings.tokenField(for: key.kind)
    // The library's own JSON reader, to know which token a leak would show and which
    // expiration value the parser saw.
    let object = JSONValue.parse(body)?.objectValue
    let secret = object?[tokenField]?.stringValue ?? ""

    let fetched: FetchedToken
    do {
        fetched = try settings.parse(body, for: key, now: now, providerDate: providerDate)
    } catch {
        switch error.code {
        case .notJSON:
            require(object == nil, "a JSON object rejected as not an object: \(error)")
        case .missingData:
            require(error.field == tokenField || error.field == settings.expirationKey, "missingData names an unknown field: \(error)")
        default:
            require(false, "the parser threw an error of another kind: \(error.kind)")
        }
        requireNoLeak(of: secret, in: error.description, "the parser's error")
        return
    }

    require(!fetched.value.isEmpty, "an empty token was accepted")
    require(fetched.value == secret, "the token returned is not the body's \(tokenField)")
    require(fetched.providerDate == providerDate, "the provider date was not passed through")
    checkStatedExpiry(fetched.statedExpiry, raw: settings.expirationKey.flatMap { object?[$0] },
                      format: settings.expirationFormat, now: now)
    requireNoLeak(of: secret, in: fetched.description, "FetchedToken.description")
    requireNoLeak(of: secret, in: String(reflecting: fetched), "FetchedToken's debug description")

    // What the engine does next with it.
    var policy = RefreshPolicy()
    policy.allowOpaqueTokens = allowOpaque
    let stored: StoredToken
    do {
        stored = try TokenValidator(policy: policy).validate(fetched, for: key, now: now)
    } catch {
        requireNoLeak(of: secret, in: error.description, "the validator's error")
        requireNoLeak(of: secret, in: TokenProviderError.invalidToken(error).description, "the provider error")
        return
    }
    if let stated = fetched.statedExpiry {
        require(stored.expiresAt <= stated, "the stored expiry is later than the provider stated")
    }
    require(stored.expiresAt > now, "an expired token passed validation")
    requireNoLeak(of: secret, in: stored.description, "StoredToken.description")
    // The agent prints every stored token's expiry, absolute and relative.
    requireNoLeak(of: secret, in: RelativeTime.describe(stored.expiresAt, now: now), "RelativeTime")
}

/// The stated expiry follows the configured format exactly, as documented on
/// `ExpirationFormat.interpret(_:now:)`; and it is absent when there is no expiration field.
func checkStatedExpiry(_ stated: Date?, raw: JSONValue?, format: ProviderResponseFormat.ExpirationFormat, now: Date) {
    guard let raw, raw != .null else {
        require(stated == nil, "an expiry was stated without an expiration field")
        return
    }
    guard let stated else {
        require(false, "the expiration field \(raw) was ignored")
        return
    }
    let value: Double
    switch raw {
    case .number(let number): value = number
    case .string(let text): value = Double(text.trimmingCharacters(in: .whitespaces)) ?? .nan
    default: value = .nan
    }
    require(value.isFinite, "an expiration field that is not a finite number was accepted: \(raw)")
    require(stated.timeIntervalSince1970.isFinite, "the stated expiry is not finite")
    let expected: Date = switch format {
    case .epochSeconds: Date(timeIntervalSince1970: value)
    case .epochMillis: Date(timeIntervalSince1970: value / 1000)
    case .relativeSeconds: now + value
    case .auto:
        value >= 100_000_000_000 ? Date(timeIntervalSince1970: value / 1000)
            : value >= 1_000_000_000 ? Date(timeIntervalSince1970: value) : now + value
    }
    require(stated == expected, "\(raw) read as \(format.rawValue) at \(now.timeIntervalSince1970) gave \(stated.timeIntervalSince1970), not \(expected.timeIntervalSince1970)")
}
