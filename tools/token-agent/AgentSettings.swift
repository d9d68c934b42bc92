// The agent's effective settings: command-line flags over `TOKEN_AGENT_…` variables over the
// config file over defaults, read through swift-configuration's ConfigReader (one provider per
// source, in that order). Values are plain here; checking them is AgentSettings+Checks.swift.

import Configuration
import FleetTokenHTTP
import FleetTokenService
import FleetTokenStore
import Foundation
import Logging

/// Every option's value in force, whichever source gave it.
struct AgentSettings: Sendable, Equatable {
    var db: String?
    var encryptionKeyFiles: [String] = []
    var providerURL: String?
    var vehicles: [String] = []
    var trips: [String] = []
    var deliveryVehicles: [String] = []
    var tasks: [String] = []
    var subjectsFile: String?
    var headers: [String] = []
    var headerFiles: [String] = []
    var method: ProviderRequestMethod = .get
    var bodyTemplate: String?
    var contentType: String?
    var caFiles: [String] = []
    var extraCAFiles: [String] = []
    var clientCertificate: String?
    var clientKey: String?
    var proxy: String?
    var noProxy = false
    var tokenKey: String?
    var expirationKey = "TOKEN_EXPIRATION"
    var expirationFormat: HTTPTokenFetcherConfiguration.ExpirationFormat = .auto
    var allowInsecureHTTP = false
    var allowOpaqueTokens = false
    var connectTimeout = 5.0
    var requestTimeout = 15.0
    var retention = DurationArgument(seconds: 86_400)
    var once = false
    var json = false
    var logLevel: Logger.Level = .info
    var logFormat: LogFormat = .text
    var listen: [String] = []
    var allowNonLoopbackListen = false
    var socketMode = "0660"
    var allow: [String] = []
    var allowClient: [String] = []
    var invalidateInterval = DurationArgument(seconds: 10)
    var sink: String?
    var sinkMode = "0640"
    var exitOnPermanentError = false
    var permanentErrorAttempts = 3
    var maxDynamicSubjects = 10_000
    var maxAPIConnections = APIConnectionLimits.defaultMaxConnections
    /// nil: half the overall cap in force.
    var maxAPIConnectionsPerPeer: Int?
    var demoLifetime = 120
    var leaseDuration = 30.0
    /// Seconds an untracked subject is kept fresh after its last use (RefreshPolicy.idleWindow).
    var idleWindow = 600.0
    /// First backoff after a refusal the provider will repeat (401, 403, a bad answer); nil: the policy's.
    var failureBackoff: Double?

    /// Where each option's value came from, for messages and `--print-config`.
    var origins: Origins = Origins()

    static func == (a: AgentSettings, b: AgentSettings) -> Bool {
        a.values == b.values
    }
}

/// Never printed whole: header values, the body template and a proxy password are secrets
/// (`--print-config` redacts them; see EffectiveConfiguration).
extension AgentSettings: CustomStringConvertible {
    var description: String { "AgentSettings(\(providerURL == nil ? "demo" : "provider"), \(vehicles.count + trips.count + deliveryVehicles.count + tasks.count) subjects)" }
}

/// The places the settings are read from, highest precedence first.
struct SettingSources: Sendable {
    /// Options given on the command line, as text (lists as lists).
    var flags: [String: ConfigContent]
    /// The process environment.
    var environment: [String: String]
    /// The config file, when there is one.
    var file: AgentConfigFile?

    /// The option variables set in `environment` (an empty value counts as unset).
    /// (The environment may hold secrets of other programs: see the description below.)
    var optionVariables: [String: String] {
        environment.filter { $0.key.hasPrefix("TOKEN_AGENT_") && !$0.value.isEmpty && $0.key != AgentOption.configFileVariable }
    }
}

extension SettingSources: CustomStringConvertible {
    var description: String { "SettingSources(\(flags.count) flags, config file: \(file?.path ?? "none"))" }
}

/// Names the source of each option's value: `--connect-timeout`, `TOKEN_AGENT_CONNECT_TIMEOUT`,
/// `/etc/token-agent.yaml:12 (connect-timeout)`, or `connect-timeout` for a default.
struct Origins: Sendable {
    enum Origin: Sendable, Equatable {
        case flag
        case environment
        case file(String)
        case defaultValue
    }

    var byKey: [String: Origin] = [:]

    func origin(of key: String) -> Origin { byKey[key] ?? .defaultValue }

    /// How a message names the option: as the operator wrote it.
    func name(_ key: String) -> String {
        switch origin(of: key) {
        case .flag: "--\(key)"
        case .environment: AgentOption.environmentName(key)
        case .file(let place): place
        case .defaultValue: "--\(key)"
        }
    }
}

extension AgentSettings {
    /// Reads every option from `sources` through one ConfigReader.
    static func resolve(_ sources: SettingSources) throws(UsageError) -> AgentSettings {
        let known = Set(AgentOption.all.map(\.environmentName))
        if let unknown = sources.optionVariables.keys.sorted().first(where: { !known.contains($0) }) {
            let key = unknown.dropFirst("TOKEN_AGENT_".count).lowercased().replacingOccurrences(of: "_", with: "-")
            let hint = AgentConfigFile.closestKey(to: key).map { " (did you mean \(AgentOption.environmentName($0))?)" } ?? ""
            throw UsageError("unknown environment variable \(unknown)\(hint); the variables are TOKEN_AGENT_ and a long flag in upper snake case")
        }
        let values = ResolvedValues(sources)
        var settings = AgentSettings()
        settings.origins = values.origins
        settings.db = try values.text("db")
        settings.encryptionKeyFiles = values.list("encryption-key-file")
        settings.providerURL = try values.text("provider-url")
        settings.vehicles = values.list("vehicle")
        settings.trips = values.list("trip")
        settings.deliveryVehicles = values.list("delivery-vehicle")
        settings.tasks = values.list("task")
        settings.subjectsFile = try values.text("subjects-file")
        settings.headers = values.list("header")
        settings.headerFiles = values.list("header-file")
        settings.method = try values.parsed("method", "GET or POST", ProviderRequestMethod.init(argument:)) ?? .get
        settings.bodyTemplate = try values.text("body-template")
        settings.contentType = try values.text("content-type")
        settings.caFiles = values.list("ca-file")
        settings.extraCAFiles = values.list("extra-ca-file")
        settings.clientCertificate = try values.text("client-cert")
        settings.clientKey = try values.text("client-key")
        settings.proxy = try values.text("proxy")
        settings.noProxy = try values.toggle("no-proxy")
        settings.tokenKey = try values.text("token-key")
        settings.expirationKey = try values.text("expiration-key") ?? settings.expirationKey
        settings.expirationFormat = try values.parsed("expiration-format", "auto, epoch-seconds, epoch-millis or relative-seconds",
                                                      HTTPTokenFetcherConfiguration.ExpirationFormat.init(rawValue:)) ?? .auto
        settings.allowInsecureHTTP = try values.toggle("allow-insecure-http")
        settings.allowOpaqueTokens = try values.toggle("allow-opaque-tokens")
        settings.connectTimeout = try values.parsed("connect-timeout", "a number of seconds", Double.init) ?? settings.connectTimeout
        settings.requestTimeout = try values.parsed("request-timeout", "a number of seconds", Double.init) ?? settings.requestTimeout
        settings.retention = try values.parsed("retention", "a duration such as 90s, 30m, 24h or 7d", DurationArgument.init(argument:)) ?? settings.retention
        settings.once = try values.toggle("once")
        settings.json = try values.toggle("json")
        settings.logLevel = try values.parsed("log-level", "trace, debug, info, notice, warning, error or critical", Logger.Level.init(rawValue:)) ?? .info
        settings.logFormat = try values.parsed("log-format", "text or json", LogFormat.init(rawValue:)) ?? .text
        settings.listen = values.list("listen")
        settings.allowNonLoopbackListen = try values.toggle("allow-non-loopback-listen")
        settings.socketMode = try values.text("socket-mode") ?? settings.socketMode
        settings.allow = values.list("allow")
        settings.allowClient = values.list("allow-client")
        settings.invalidateInterval = try values.parsed("invalidate-interval", "a duration such as 10s or 1m", DurationArgument.init(argument:)) ?? settings.invalidateInterval
        settings.sink = try values.text("sink")
        settings.sinkMode = try values.text("sink-mode") ?? settings.sinkMode
        settings.exitOnPermanentError = try values.toggle("exit-on-permanent-error")
        settings.permanentErrorAttempts = try values.parsed("permanent-error-attempts", "a whole number", Int.init) ?? settings.permanentErrorAttempts
        settings.maxDynamicSubjects = try values.parsed("max-dynamic-subjects", "a whole number", Int.init) ?? settings.maxDynamicSubjects
        settings.maxAPIConnections = try values.parsed("max-api-connections", "a whole number", Int.init) ?? settings.maxAPIConnections
        settings.maxAPIConnectionsPerPeer = try values.parsed("max-api-connections-per-peer", "a whole number", Int.init)
        settings.demoLifetime = try values.parsed("demo-lifetime", "a whole number of seconds", Int.init) ?? settings.demoLifetime
        settings.leaseDuration = try values.parsed("lease-duration", "a number of seconds", Double.init) ?? settings.leaseDuration
        settings.idleWindow = try values.parsed("idle-window", "a number of seconds", Double.init) ?? settings.idleWindow
        settings.failureBackoff = try values.parsed("failure-backoff", "a number of seconds", Double.init)
        return settings
    }

    /// Every option's value as text, in table order (lists joined by newlines), for comparing
    /// two settings and for `--print-config`.
    var values: [String: [String]] {
        var values: [String: [String]] = [
            "vehicle": vehicles, "trip": trips, "delivery-vehicle": deliveryVehicles, "task": tasks,
            "header": headers, "header-file": headerFiles, "ca-file": caFiles, "extra-ca-file": extraCAFiles,
            "listen": listen, "allow": allow, "allow-client": allowClient, "encryption-key-file": encryptionKeyFiles,
            "method": [method.rawValue], "expiration-key": [expirationKey], "expiration-format": [expirationFormat.rawValue],
            "no-proxy": [String(noProxy)], "allow-insecure-http": [String(allowInsecureHTTP)],
            "allow-opaque-tokens": [String(allowOpaqueTokens)], "connect-timeout": [Self.number(connectTimeout)],
            "request-timeout": [Self.number(requestTimeout)], "retention": [retention.description], "once": [String(once)],
            "json": [String(json)], "log-level": [logLevel.rawValue], "log-format": [logFormat.rawValue],
            "allow-non-loopback-listen": [String(allowNonLoopbackListen)], "socket-mode": [socketMode],
            "invalidate-interval": [invalidateInterval.description], "sink-mode": [sinkMode],
            "exit-on-permanent-error": [String(exitOnPermanentError)], "permanent-error-attempts": [String(permanentErrorAttempts)],
            "max-dynamic-subjects": [String(maxDynamicSubjects)], "max-api-connections": [String(maxAPIConnections)],
            "demo-lifetime": [String(demoLifetime)], "lease-duration": [Self.number(leaseDuration)],
            "idle-window": [Self.number(idleWindow)],
        ]
        let optional: [String: String?] = [
            "db": db, "provider-url": providerURL, "subjects-file": subjectsFile, "body-template": bodyTemplate,
            "content-type": contentType, "client-cert": clientCertificate, "client-key": clientKey, "proxy": proxy,
            "token-key": tokenKey, "sink": sink, "failure-backoff": failureBackoff.map(Self.number),
            "max-api-connections-per-peer": maxAPIConnectionsPerPeer.map(String.init),
        ]
        for (key, value) in optional { values[key] = value.map { [$0] } ?? [] }
        return values
    }

    static func number(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int(value)) : String(value)
    }
}

/// Values read through the ConfigReader, each parsed with a message naming its source.
private struct ResolvedValues {
    let reader: ConfigReader
    let origins: Origins

    init(_ sources: SettingSources) {
        var flagValues: [AbsoluteConfigKey: ConfigValue] = [:]
        for (key, content) in sources.flags {
            flagValues[AbsoluteConfigKey([key])] = ConfigValue(content, isSecret: AgentOption.byKey[key]?.secret ?? false)
        }
        let secretVariables = Set(AgentOption.all.filter(\.secret).map(\.environmentName))
        let environment = EnvironmentVariablesProvider(environmentVariables: sources.optionVariables,
                                                       secretsSpecifier: .specific(secretVariables))
        var providers: [any ConfigProvider] = [
            InMemoryProvider(name: "command line", values: flagValues),
            environment.prefixKeys(with: ConfigKey(["token-agent"])),
        ]
        if let file = sources.file { providers.append(file.provider) }
        reader = ConfigReader(providers: providers)

        var origins = Origins()
        for option in AgentOption.all {
            if sources.flags[option.key] != nil {
                origins.byKey[option.key] = .flag
            } else if sources.optionVariables[option.environmentName] != nil {
                origins.byKey[option.key] = .environment
            } else if let file = sources.file, file.lines[option.key] != nil {
                origins.byKey[option.key] = .file(file.place(of: option.key))
            }
        }
        self.origins = origins
    }

    private func isSecret(_ key: String) -> Bool { AgentOption.byKey[key]?.secret ?? false }

    func text(_ key: String) throws(UsageError) -> String? {
        guard origins.byKey[key] != nil else { return nil }
        return reader.string(forKey: ConfigKey([key]), isSecret: isSecret(key))
    }

    /// Options whose items may hold commas (header values): one item a line in a variable.
    static let lineSeparated: Set<String> = ["header", "header-file"]

    func list(_ key: String) -> [String] {
        guard let origin = origins.byKey[key] else { return [] }
        if origin == .environment && Self.lineSeparated.contains(key) {
            let text = reader.string(forKey: ConfigKey([key]), isSecret: isSecret(key)) ?? ""
            return text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
        return reader.stringArray(forKey: ConfigKey([key]), isSecret: isSecret(key)) ?? []
    }

    func toggle(_ key: String) throws(UsageError) -> Bool {
        try parsed(key, "true or false", Self.bool) ?? false
    }

    /// The value of `key` parsed by `parse`, nil when no source sets it.
    func parsed<Value>(_ key: String, _ expected: String, _ parse: (String) -> Value?) throws(UsageError) -> Value? {
        guard let text = try text(key) else { return nil }
        guard let value = parse(text.trimmingCharacters(in: .whitespaces)) else {
            let shown = isSecret(key) ? "its value" : "'\(text)'"
            throw UsageError("\(origins.name(key)): \(shown) is not \(expected)")
        }
        return value
    }

    static func bool(_ text: String) -> Bool? {
        switch text.lowercased() {
        case "true", "1", "yes", "on": true
        case "false", "0", "no", "off": false
        default: nil
        }
    }
}

/// A usage error: exit code 64, with a message naming the flag, variable or file line at fault.
struct UsageError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
