// The agent's options, one table for the three places a value can come from: the command line
// (`--provider-url`), the environment (`TOKEN_AGENT_PROVIDER_URL`) and the config file
// (`provider-url:`). The README's flag table is therefore also the file's reference.

import Foundation

/// One option of token-agent: its key (the long flag without dashes), what it holds, and how
/// it behaves on a reload.
struct AgentOption: Sendable {
    /// What a value of the option looks like.
    enum Shape: Sendable, Equatable {
        /// One piece of text.
        case text
        /// Several values: a YAML list, a repeated flag, or a comma-separated variable.
        case list
        /// On or off: `true`/`false` in a file or variable; a flag sets it on.
        case toggle
        /// A whole number.
        case integer
        /// A number, maybe with a fraction.
        case number
        /// A length of time: `90s`, `30m`, `24h`, `7d`.
        case duration
        /// One of a few words.
        case choice([String])
    }

    /// The key in a config file, and the long flag without its dashes.
    let key: String
    let shape: Shape
    /// Its values are credentials (or may hold some): never printed.
    var secret = false
    /// A reload applies a change of it; any other change needs a restart.
    var live: Bool { AgentSettings.liveCopies[key] != nil }

    /// `TOKEN_AGENT_` and the key in upper snake case.
    var environmentName: String { Self.environmentName(key) }

    static func environmentName(_ key: String) -> String {
        "TOKEN_AGENT_" + key.uppercased().replacingOccurrences(of: "-", with: "_")
    }

    /// The variable naming the config file when `--config` is not given.
    static let configFileVariable = "TOKEN_AGENT_CONFIG"

    /// Every option a config file or the environment may set, in the README's order.
    static let all: [AgentOption] = [
        // A PostgreSQL URL may hold the database password (--print-config shows it as ***).
        AgentOption(key: "db", shape: .text, secret: true),
        AgentOption(key: "encryption-key-file", shape: .list),
        AgentOption(key: "provider-url", shape: .text),
        AgentOption(key: "vehicle", shape: .list),
        AgentOption(key: "trip", shape: .list),
        AgentOption(key: "delivery-vehicle", shape: .list),
        AgentOption(key: "task", shape: .list),
        AgentOption(key: "subjects-file", shape: .text),
        AgentOption(key: "header", shape: .list, secret: true),
        AgentOption(key: "header-file", shape: .list),
        AgentOption(key: "method", shape: .choice(["GET", "POST"])),
        AgentOption(key: "body-template", shape: .text, secret: true),
        AgentOption(key: "content-type", shape: .text),
        AgentOption(key: "ca-file", shape: .list),
        AgentOption(key: "extra-ca-file", shape: .list),
        AgentOption(key: "client-cert", shape: .text),
        AgentOption(key: "client-key", shape: .text),
        AgentOption(key: "proxy", shape: .text, secret: true),
        AgentOption(key: "no-proxy", shape: .toggle),
        AgentOption(key: "token-key", shape: .text),
        AgentOption(key: "expiration-key", shape: .text),
        AgentOption(key: "expiration-format", shape: .choice(["auto", "epoch-seconds", "epoch-millis", "relative-seconds"])),
        AgentOption(key: "allow-insecure-http", shape: .toggle),
        AgentOption(key: "allow-opaque-tokens", shape: .toggle),
        AgentOption(key: "connect-timeout", shape: .number),
        AgentOption(key: "request-timeout", shape: .number),
        AgentOption(key: "retention", shape: .duration),
        AgentOption(key: "once", shape: .toggle),
        AgentOption(key: "json", shape: .toggle),
        AgentOption(key: "log-level", shape: .choice(["trace", "debug", "info", "notice", "warning", "error", "critical"])),
        AgentOption(key: "log-format", shape: .choice(["text", "json"])),
        AgentOption(key: "listen", shape: .list),
        AgentOption(key: "allow-non-loopback-listen", shape: .toggle),
        AgentOption(key: "socket-mode", shape: .text),
        AgentOption(key: "allow", shape: .list),
        AgentOption(key: "allow-client", shape: .list),
        AgentOption(key: "invalidate-interval", shape: .duration),
        AgentOption(key: "max-dynamic-subjects", shape: .integer),
        AgentOption(key: "max-api-connections", shape: .integer),
        AgentOption(key: "max-api-connections-per-peer", shape: .integer),
        AgentOption(key: "sink", shape: .text),
        AgentOption(key: "sink-mode", shape: .text),
        AgentOption(key: "exit-on-permanent-error", shape: .toggle),
        AgentOption(key: "permanent-error-attempts", shape: .integer),
        // Test and tuning knobs the help hides.
        AgentOption(key: "demo-lifetime", shape: .integer),
        AgentOption(key: "lease-duration", shape: .number),
        AgentOption(key: "idle-window", shape: .number),
        AgentOption(key: "failure-backoff", shape: .number),
    ]

    static let byKey: [String: AgentOption] = Dictionary(uniqueKeysWithValues: all.map { ($0.key, $0) })
}
