// The agent's effective settings: command-line flags over `TOKEN_AGENT_…` variables over the
// config file over defaults, read through swift-configuration's ConfigReader (one provider per
// source, in that order), each option as AgentOptionTable declares it. Values are plain here;
// checking them is AgentSettings+Checks.swift.

import Configuration
import FleetTokenHTTP
import FleetTokenService
import FleetTokenStore
import Foundation
import Logging

/// Every option's value in force, whichever source gave it. The values are kept by option;
/// `settings.connectTimeout` reads ``AgentOptionTable/connectTimeout`` (its default when no
/// source set it), so the table is the only declaration of an option.
@dynamicMemberLookup
struct AgentSettings: Sendable, Equatable {
    /// The values set, by option key, each of its option's value type.
    private var stored: [String: any Sendable] = [:]

    /// Where each option's value came from, for messages and `--print-config`.
    var origins: Origins = Origins()

    /// The value of `option`: its default until a source sets it.
    subscript<Value>(option: AgentOptionSpec<Value>) -> Value {
        get { stored[option.key].flatMap { $0 as? Value } ?? option.defaultValue }
        set { stored[option.key] = newValue }
    }

    /// `settings.name` for the table's option `name`. (Swift finds dynamic members only after a
    /// dot: inside AgentSettings' extensions they are written `self.name`.)
    subscript<Value>(dynamicMember option: KeyPath<AgentOptionTable, AgentOptionSpec<Value>>) -> Value {
        get { self[AgentOptionTable.options[keyPath: option]] }
        set { self[AgentOptionTable.options[keyPath: option]] = newValue }
    }

    /// The same value of every option (where they came from aside).
    static func == (a: AgentSettings, b: AgentSettings) -> Bool {
        AgentOption.all.allSatisfy { $0.same(a, b) }
    }
}

/// Never printed whole: header values, the body template and a proxy password are secrets
/// (`--print-config` redacts them; see EffectiveConfiguration).
extension AgentSettings: CustomStringConvertible {
    var description: String {
        let subjects = self.vehicles.count + self.trips.count + self.deliveryVehicles.count + self.tasks.count
        return "AgentSettings(\(self.providerURL == nil ? "demo" : "provider"), \(subjects) subjects)"
    }
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
        for option in AgentOption.all {
            guard let items = values.items(option) else { continue }
            guard option.assign(&settings, items) else {
                let shown = option.secret ? "its value" : "'\(items.first ?? "")'"
                throw UsageError("\(values.origins.name(option.key)): \(shown) is not \(option.expected)")
            }
        }
        // TOKEN_STORE_DB is a variable, so it beats the config file's `db:` (flags > variables >
        // file); --db and TOKEN_AGENT_DB beat it. Left unset, the store is the variable's
        // (AgentRun.storePath, --print-config).
        if case .file = settings.origins.origin(of: "db"), sources.environment["TOKEN_STORE_DB"].map({ !$0.isEmpty }) == true {
            settings.db = nil
            settings.origins.byKey["db"] = nil
        }
        return settings
    }

    /// Every option's value as text (lists item by item; nothing for an unset option), for
    /// `--print-config` and messages.
    var values: [String: [String]] {
        Dictionary(uniqueKeysWithValues: AgentOption.all.map { ($0.key, $0.text(self)) })
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

    /// The items `option` is set to by the highest source that sets it (one for a single
    /// value), nil when none does.
    func items(_ option: AgentOption) -> [String]? {
        guard let origin = origins.byKey[option.key] else { return nil }
        let key = ConfigKey([option.key])
        guard option.shape == .list else {
            return reader.string(forKey: key, isSecret: option.secret).map { [$0] }
        }
        if origin == .environment && option.linesInEnvironment {
            let text = reader.string(forKey: key, isSecret: option.secret) ?? ""
            return text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
        return reader.stringArray(forKey: key, isSecret: option.secret) ?? []
    }
}

/// A usage error: exit code 64, with a message naming the flag, variable or file line at fault.
struct UsageError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
