// `token-agent --print-config`: the settings in force as a config file would give them, each
// with where its value came from, secrets redacted. The output loads as a config file again
// (except for the redacted values).

import FleetTokenHTTP
import FleetTokenPostgres
import FleetTokenService
import FleetTokenStore
import Foundation

/// The printable form of ``AgentSettings``.
struct EffectiveConfiguration {
    let settings: AgentSettings
    let configFile: String?

    static let redacted = "<redacted>"

    var text: String {
        var lines = [
            "# token-agent: the effective configuration. Precedence: flags > TOKEN_AGENT_* variables > config file > defaults.",
            "# Config file: \(configFile ?? "none"). Secrets are shown as \(Self.redacted).",
        ]
        let values = settings.values
        for option in AgentOption.all {
            let shown = values[option.key, default: []].map { redact($0, of: option) }
            let origin = self.origin(of: option.key)
            switch option.shape {
            case .list:
                lines.append("\(option.key): [\(shown.map(JSONText.quoted).joined(separator: ", "))]  # \(origin)")
            default:
                if let value = shown.first {
                    // Text is quoted (it may hold YAML's special characters); words and numbers are not.
                    let literal = option.shape == .text ? JSONText.quoted(value) : value
                    lines.append("\(option.key): \(literal)  # \(origin)")
                } else if option.key == "db" {
                    lines.append("db: \(JSONText.quoted("./tokens.sqlite"))  # default")
                } else {
                    lines.append("# \(option.key): not set")
                }
            }
        }
        return lines.joined(separator: "\n") + "\n"
    }

    private func origin(of key: String) -> String {
        switch settings.origins.origin(of: key) {
        case .flag: "--\(key)"
        case .environment(let variable): variable
        case .file(let place): place
        case .defaultValue: "default"
        }
    }

    /// A header keeps its name; a proxy URL its host (password as `***`); the provider URL its
    /// shape (a password or query values may be credentials); other secrets go whole.
    private func redact(_ value: String, of option: AgentOption) -> String {
        if option.key == "provider-url" { return Self.redactedURL(value) }
        if option.key == "db" { return PostgresStoreLocation.redacted(value) }
        guard option.secret else { return value }
        switch option.key {
        case "header":
            guard let (name, _) = HeaderArgument.parseHeader(value) else { return Self.redacted }
            return "\(name): \(Self.redacted)"
        case "proxy":
            return (try? ProxySettings.Proxy(parsing: value, source: "proxy"))?.description ?? Self.redacted
        default:
            return Self.redacted
        }
    }

    /// `https://user:***@host/path/{id}?api_key=<redacted>`: userinfo password and query values
    /// hidden, placeholders kept. (The store's URL goes through PostgresStoreLocation.redacted,
    /// whatever its source: its password as `***`, plain parameters such as sslmode kept.)
    static func redactedURL(_ text: String) -> String {
        var result = text
        if let scheme = result.range(of: "://"), let at = result[scheme.upperBound...].firstIndex(of: "@"),
           !result[scheme.upperBound..<at].contains("/"), let colon = result[scheme.upperBound..<at].firstIndex(of: ":") {
            result.replaceSubrange(result.index(after: colon)..<at, with: "***")
        }
        if let query = result.firstIndex(of: "?") {
            let pairs = result[result.index(after: query)...].split(separator: "&", omittingEmptySubsequences: false).map { pair in
                guard let equals = pair.firstIndex(of: "=") else { return String(pair) }
                let value = pair[pair.index(after: equals)...]
                return value == "{id}" || value == "{kind}" ? String(pair) : "\(pair[..<equals])=\(redacted)"
            }
            result = String(result[...query]) + pairs.joined(separator: "&")
        }
        return result
    }
}
