import FleetTokenStore
import Foundation
import Logging
import Synchronization

/// Reads the provider's JSON object: the token field for the key's kind and the expiration
/// field in the configured format. Pure: no I/O, so it can be fuzzed.
struct ProviderResponseParser {
    let configuration: HTTPTokenFetcherConfiguration
    let logger: Logger
    let skewWarned: OnceFlag

    func parse(_ data: Data, for key: TokenKey, now: Date, providerDate: Date?) throws(TokenProviderError) -> FetchedToken {
        guard let document = JSONValue.parse(data) else {
            throw .notJSON(detail: Self.describe(data))
        }
        guard let object = document.objectValue else { throw .notJSON(detail: "a JSON value that is not an object") }
        let tokenField = configuration.tokenField(for: key.kind)
        guard let token = object[tokenField]?.stringValue, !token.isEmpty else { throw .missingData(field: tokenField) }

        var statedExpiry: Date?
        if let expirationKey = configuration.expirationKey, let raw = object[expirationKey], raw != .null {
            guard let value = Self.number(raw) else { throw .missingData(field: expirationKey) }
            statedExpiry = configuration.expirationFormat.interpret(value, now: now)
            if configuration.expirationFormat == .auto { crossCheck(statedExpiry!, token: token, raw: value) }
        }
        return FetchedToken(value: token, statedExpiry: statedExpiry, providerDate: providerDate)
    }

    /// Warns (once) when the auto-detected expiry and the JWT's own `exp` disagree by more than
    /// five minutes: the format is probably not what `auto` guessed. The engine uses the
    /// earlier of the two either way.
    private func crossCheck(_ stated: Date, token: String, raw: Double) {
        guard let exp = try? JWTClaims.decode(token).expiresAt, abs(exp.timeIntervalSince(stated)) > 300 else { return }
        guard skewWarned.claim() else { return }
        logger.warning("TOKEN_EXPIRATION read with --expiration-format auto disagrees with the token's exp; set --expiration-format explicitly", metadata: [
            "expiration_value": .stringConvertible(raw), "interpreted": .string(stated.formatted(.iso8601)),
            "jwt_exp": .string(exp.formatted(.iso8601)),
        ])
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

/// True the first time only: for warnings worth saying once per process.
final class OnceFlag: Sendable {
    private let used = Mutex(false)

    func claim() -> Bool {
        used.withLock { used in
            defer { used = true }
            return !used
        }
    }
}
