// The agent's effective settings: command-line flags over `TOKEN_AGENT_…` variables over the
// config file over defaults, read through swift-configuration's ConfigReader (one provider per
// source, in that order), each option as AgentOptionTable declares it. Values are plain here;
// checking them is AgentSettings+Checks.swift.

import AgentVariables
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
        /// The variable that gave it: the option's own, or another it answers to (`TOKEN_STORE_DB`).
        case environment(String)
        case file(String)
        case defaultValue
    }

    var byKey: [String: Origin] = [:]

    func origin(of key: String) -> Origin { byKey[key] ?? .defaultValue }

    /// How a message names the option: as the operator wrote it.
    func name(_ key: String) -> String {
        switch origin(of: key) {
        case .flag: "--\(key)"
        case .environment(let variable): variable
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
        // Which source sets each option: the order tokenctl follows too (AgentVariables).
        let variables = AgentVariables(sources.environment)
        var origins = Origins()
        var settingVariables: [String: String] = [:]
        for option in AgentOption.all {
            switch variables.source(flag: sources.flags[option.key] != nil, variables: option.variables,
                                    file: sources.file?.lines[option.key] != nil) {
            case .flag: origins.byKey[option.key] = .flag
            case .variable(let name):
                origins.byKey[option.key] = .environment(name)
                settingVariables[option.key] = name
            case .file: origins.byKey[option.key] = sources.file.map { .file($0.place(of: option.key)) }
            case nil: break
            }
        }
        self.origins = origins

        let secretKeys = Set(AgentOption.all.filter(\.secret).map(\.key))
        var providers: [any ConfigProvider] = [
            InMemoryProvider(name: "command line", values: flagValues),
            variables.provider(settingVariables, secretKeys: secretKeys),
        ]
        if let file = sources.file { providers.append(file.provider) }
        reader = ConfigReader(providers: providers)
    }

    /// The items `option` is set to by the highest source that sets it (one for a single
    /// value), nil when none does.
    func items(_ option: AgentOption) -> [String]? {
        guard let origin = origins.byKey[option.key] else { return nil }
        let key = ConfigKey([option.key])
        guard option.shape == .list else {
            return reader.string(forKey: key, isSecret: option.secret).map { [$0] }
        }
        if case .environment = origin, option.linesInEnvironment {
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
