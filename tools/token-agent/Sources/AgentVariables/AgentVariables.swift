// token-agent's environment as token-agent and tokenctl both read it: which source sets an
// option (the command line, then its variables in order, TOKEN_AGENT_DB before TOKEN_STORE_DB,
// then the config file), and the variables' values as swift-configuration provides them (a list
// split at commas). One copy, so tokenctl finds the agent's store and keys as the agent does.

package import Configuration
import Foundation

/// Where an option's value comes from, highest precedence first.
package enum AgentSource: Sendable, Equatable {
    /// The command line.
    case flag
    /// The named variable.
    case variable(String)
    /// The config file.
    case file
}

/// The process environment as token-agent reads its options from it.
package struct AgentVariables: Sendable {
    /// Every variable of the process.
    package let environment: [String: String]

    /// Reads options from `environment` (the process's, or a test's).
    package init(_ environment: [String: String]) {
        self.environment = environment
    }

    /// The store's variable shared with tokenctl and the library's tools: the `db` option's
    /// second name, read after `TOKEN_AGENT_DB`.
    package static let storeVariable = "TOKEN_STORE_DB"

    /// `TOKEN_AGENT_` and the option's key in upper snake case: `TOKEN_AGENT_CONNECT_TIMEOUT`.
    package static func name(of key: String) -> String {
        "TOKEN_AGENT_" + key.uppercased().replacingOccurrences(of: "-", with: "_")
    }

    /// The value of `variable`; an empty one counts as unset (`TOKEN_AGENT_DB=` in a unit file
    /// clears it, it does not name a store called "").
    package func value(_ variable: String) -> String? {
        environment[variable].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// Which source sets an option: the command line when `flag`, else the first of
    /// `variables` that is set, else the config file when `file`; nil when none does (the
    /// option's default applies).
    package func source(flag: Bool, variables: [String], file: Bool) -> AgentSource? {
        if flag { return .flag }
        if let variable = variables.first(where: { value($0) != nil }) { return .variable(variable) }
        return file ? .file : nil
    }

    /// The options `settingVariables` names (option key to the variable that sets it), as
    /// token-agent's ConfigReader reads them: at key `[key]`, a list split at commas with each
    /// item trimmed (swift-configuration's rule for an array in a variable). The values of
    /// `secretKeys` are marked secret, so the reader never prints them.
    package func provider(_ settingVariables: [String: String], secretKeys: Set<String>) -> any ConfigProvider {
        var values: [String: String] = [:]
        for (key, variable) in settingVariables {
            if let value = value(variable) { values[Self.name(of: key)] = value }
        }
        let secret = Set(secretKeys.map(Self.name(of:)))
        return EnvironmentVariablesProvider(environmentVariables: values, secretsSpecifier: .specific(secret))
            .prefixKeys(with: ConfigKey(["token-agent"]))
    }

    /// The items of the list option `key` given in `variable`, split as token-agent splits it
    /// (see ``provider(_:secretKeys:)``); nil when `variable` is not set.
    package func list(_ key: String, in variable: String) -> [String]? {
        guard value(variable) != nil else { return nil }
        return ConfigReader(provider: provider([key: variable], secretKeys: [])).stringArray(forKey: ConfigKey([key]))
    }
}
