// Provider layer: how a token provider's JSON answer is read, for any fetcher.

public import FleetTokenStore
public import Foundation

/// How a token provider's JSON answer is read: the token field for the key's kind and the
/// expiration field in a given format. Pure (no I/O), so it can be fuzzed, and usable by any
/// `TokenFetcher`; FleetTokenHTTP's fetcher reads every answer with it.
public struct ProviderResponseFormat: Sendable, Equatable {
    /// How `TOKEN_EXPIRATION` is written. The Fleet Engine samples disagree: the Swift sample
    /// reads absolute Unix seconds, the Objective-C sample seconds from now.
    public enum ExpirationFormat: String, Sendable, CaseIterable {
        /// Tell the formats apart by magnitude (see ``interpret(_:now:)``)
        /// and cross-check with the JWT `exp`.
        case auto
        /// Absolute Unix time in seconds.
        case epochSeconds = "epoch-seconds"
        /// Absolute Unix time in milliseconds.
        case epochMillis = "epoch-millis"
        /// Seconds from now.
        case relativeSeconds = "relative-seconds"

        /// The absolute expiry `value` means at `now` in this format.
        ///
        /// `auto`: above 10^11 it is milliseconds (10^11 s is the year 5138), above 10^9 it is
        /// seconds since 1970 (10^9 s is 2001), below it is seconds from now (10^9 s is 31 years).
        public func interpret(_ value: Double, now: Date) -> Date {
            switch self {
            case .epochSeconds: Date(timeIntervalSince1970: value)
            case .epochMillis: Date(timeIntervalSince1970: value / 1000)
            case .relativeSeconds: now.addingTimeInterval(value)
            case .auto:
                value >= 1e11 ? Date(timeIntervalSince1970: value / 1000)
                    : value >= 1e9 ? Date(timeIntervalSince1970: value) : now.addingTimeInterval(value)
            }
        }
    }

    /// One token field for every kind, overriding the per-kind defaults: a member name of the
    /// answer's top-level object, or a JSON pointer (RFC 6901, starting with `/`) such as
    /// `/data/token` for an answer that wraps the token.
    public var tokenKey: String?
    /// The expiration field, a member name or a JSON pointer. Default `TOKEN_EXPIRATION`; nil
    /// uses the JWT `exp` only.
    public var expirationKey: String?
    /// How to read the expiration field.
    public var expirationFormat: ExpirationFormat

    /// A format; the defaults are the Fleet Engine samples' field names, read with `auto`.
    public init(tokenKey: String? = nil, expirationKey: String? = "TOKEN_EXPIRATION", expirationFormat: ExpirationFormat = .auto) {
        self.tokenKey = tokenKey
        self.expirationKey = expirationKey
        self.expirationFormat = expirationFormat
    }

    /// The token field for `kind`: ``tokenKey`` if set, else the samples' name
    /// (`VEHICLE_TOKEN_KEY`, `TRIP_TOKEN_KEY`; `DELIVERY_VEHICLE_TOKEN_KEY`, `TASK_TOKEN_KEY`).
    public func tokenField(for kind: TokenKind) -> String {
        if let tokenKey { return tokenKey }
        switch kind {
        case .vehicle: return "VEHICLE_TOKEN_KEY"
        case .trip: return "TRIP_TOKEN_KEY"
        case .deliveryVehicle: return "DELIVERY_VEHICLE_TOKEN_KEY"
        case .task: return "TASK_TOKEN_KEY"
        }
    }

    /// Reads the provider's answer `data` for `key` at `now`.
    /// - Throws: `TokenProviderError.notJSON(detail:)` when the body is not a JSON object, or
    ///   `TokenProviderError.missingData(field:)` naming the token or expiration field that is
    ///   missing or unreadable. Never quotes the body.
    public func parse(_ data: Data, for key: TokenKey, now: Date, providerDate: Date? = nil) throws(TokenProviderError) -> FetchedToken {
        guard let document = JSONValue.parse(data) else {
            throw .notJSON(detail: Self.describe(data))
        }
        guard let object = document.objectValue else { throw .notJSON(detail: "a JSON value that is not an object") }
        let tokenField = tokenField(for: key.kind)
        guard let token = Self.value(at: tokenField, in: object)?.stringValue, !token.isEmpty else { throw .missingData(field: tokenField) }

        var statedExpiry: Date?
        if let expirationKey, let raw = Self.value(at: expirationKey, in: object), raw != .null {
            guard let value = Self.number(raw) else { throw .missingData(field: expirationKey) }
            statedExpiry = expirationFormat.interpret(value, now: now)
        }
        return FetchedToken(value: token, statedExpiry: statedExpiry, providerDate: providerDate)
    }

    /// The value a field names: a JSON pointer (RFC 6901: `/`-separated reference tokens, `~1`
    /// for `/` and `~0` for `~`, array elements by index) when it starts with `/`, else the
    /// top-level member of that name.
    static func value(at field: String, in object: [String: JSONValue]) -> JSONValue? {
        guard field.hasPrefix("/") else { return object[field] }
        var current = JSONValue.object(object)
        for token in field.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            let name = token.replacingOccurrences(of: "~1", with: "/").replacingOccurrences(of: "~0", with: "~")
            switch current {
            case .object(let members):
                guard let next = members[name] else { return nil }
                current = next
            case .array(let elements):
                // Digits only, no leading zero (RFC 6901 section 4).
                guard let index = Int(name), String(index) == name, elements.indices.contains(index) else { return nil }
                current = elements[index]
            default:
                return nil
            }
        }
        return current
    }

    /// A number, or a string holding one (some providers quote it).
    static func number(_ value: JSONValue) -> Double? {
        switch value {
        case .number(let number): number.isFinite ? number : nil
        case .string(let text): Double(text.trimmingCharacters(in: .whitespaces)).flatMap { $0.isFinite ? $0 : nil }
        default: nil
        }
    }

    /// What the body looks like, without quoting it (it might hold a token).
    static func describe(_ data: Data) -> String {
        let start = String(decoding: data.prefix(16), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        if start.hasPrefix("<") { return "looks like HTML, \(data.count) bytes" }
        if data.isEmpty { return "empty body" }
        return "\(data.count) bytes that do not parse as JSON"
    }
}
