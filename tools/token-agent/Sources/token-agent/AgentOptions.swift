// How an option of token-agent is declared, and what is derived from the declaration. The
// options themselves are in AgentOptionTable.swift, each written once; the command line, the
// environment (`TOKEN_AGENT_PROVIDER_URL`), the config file (`provider-url:`), `--print-config`,
// the reload diff and `--help` are all read from there.

import AgentVariables
import Foundation

/// One option of token-agent with its value type: what ``AgentOptionTable`` declares.
struct AgentOptionSpec<Value: Sendable & Equatable>: Sendable {
    /// The long flag without its dashes; also the config file's key and, in upper snake case
    /// after `TOKEN_AGENT_`, the variable's name.
    let key: String
    let shape: AgentOption.Shape
    /// The `--help` text.
    let help: String
    /// The value when no source sets the option.
    let defaultValue: Value
    /// What a value should look like, for a message about one that does not: "a number of seconds".
    let expected: String
    /// The value of the given items (one for a single value); nil when they are not one.
    let parse: @Sendable ([String]) -> Value?
    /// The value as text: one item per list element, none when unset.
    let format: @Sendable (Value) -> [String]
    /// Its values are credentials (or may hold some): never printed.
    var secret = false
    /// A reload applies a change of it; any other change needs a restart.
    var live = false
    /// A test or tuning knob `--help` does not show.
    var hidden = false
    /// In a variable the items go one a line (they may hold commas), not comma-separated.
    var linesInEnvironment = false
    /// Variables read after its own `TOKEN_AGENT_` one when that is not set (`TOKEN_STORE_DB`
    /// for `db`).
    var otherVariables: [String] = []

    func secretValues() -> Self { var copy = self; copy.secret = true; return copy }
    func reloadable() -> Self { var copy = self; copy.live = true; return copy }
    func hiddenFromHelp() -> Self { var copy = self; copy.hidden = true; return copy }
    func oneItemALineInEnvironment() -> Self { var copy = self; copy.linesInEnvironment = true; return copy }
    func alsoReadFrom(_ variable: String) -> Self { var copy = self; copy.otherVariables.append(variable); return copy }
}

// The value shapes an option can have, each with its parser and printed form. A single value is
// trimmed before it is parsed, as an operator's `connect-timeout: 5 ` means 5; text is kept whole.

extension AgentOptionSpec where Value == String? {
    /// Text, unset by default.
    static func text(_ key: String, help: String) -> Self {
        Self(key: key, shape: .text, help: help, defaultValue: nil, expected: "text",
             parse: { $0.first }, format: { $0.map { [$0] } ?? [] })
    }
}

extension AgentOptionSpec where Value == String {
    /// Text with a default.
    static func text(_ key: String, default defaultValue: String, help: String) -> Self {
        Self(key: key, shape: .text, help: help, defaultValue: defaultValue, expected: "text",
             parse: { $0.first }, format: { [$0] })
    }
}

extension AgentOptionSpec where Value == [String] {
    /// Several values: a repeated flag, a YAML list, a comma-separated variable.
    static func list(_ key: String, help: String) -> Self {
        Self(key: key, shape: .list, help: help, defaultValue: [], expected: "a list", parse: { $0 }, format: { $0 })
    }
}

extension AgentOptionSpec where Value == Bool {
    /// On or off: a flag without a value sets it on; `true`/`false` in a file or variable.
    static func toggle(_ key: String, help: String) -> Self {
        Self(key: key, shape: .toggle, help: help, defaultValue: false, expected: "true or false",
             parse: { $0.first.flatMap(AgentOption.bool) }, format: { [String($0)] })
    }
}

extension AgentOptionSpec where Value == Double {
    /// A number of seconds, maybe with a fraction.
    static func seconds(_ key: String, default defaultValue: Double, help: String) -> Self {
        Self(key: key, shape: .number, help: help, defaultValue: defaultValue, expected: "a number of seconds",
             parse: { $0.first.flatMap(AgentOption.double) }, format: { [AgentOption.number($0)] })
    }
}

extension AgentOptionSpec where Value == Double? {
    /// A number of seconds, unset by default.
    static func seconds(_ key: String, help: String) -> Self {
        Self(key: key, shape: .number, help: help, defaultValue: nil, expected: "a number of seconds",
             parse: { $0.first.flatMap(AgentOption.double).map(Optional.some) }, format: { $0.map { [AgentOption.number($0)] } ?? [] })
    }
}

extension AgentOptionSpec where Value == Int {
    /// A whole number.
    static func integer(_ key: String, default defaultValue: Int, expected: String = "a whole number", help: String) -> Self {
        Self(key: key, shape: .integer, help: help, defaultValue: defaultValue, expected: expected,
             parse: { $0.first.flatMap(AgentOption.integer) }, format: { [String($0)] })
    }
}

extension AgentOptionSpec where Value == Int? {
    /// A whole number, unset by default.
    static func integer(_ key: String, help: String) -> Self {
        Self(key: key, shape: .integer, help: help, defaultValue: nil, expected: "a whole number",
             parse: { $0.first.flatMap(AgentOption.integer).map(Optional.some) }, format: { $0.map { [String($0)] } ?? [] })
    }
}

extension AgentOptionSpec where Value == DurationArgument {
    /// A length of time: `90s`, `30m`, `24h`, `7d`.
    static func duration(_ key: String, default defaultValue: DurationArgument, expected: String, help: String) -> Self {
        Self(key: key, shape: .duration, help: help, defaultValue: defaultValue, expected: expected,
             parse: { $0.first.flatMap { DurationArgument(argument: AgentOption.trimmed($0)) } }, format: { [$0.description] })
    }
}

extension AgentOptionSpec where Value: RawRepresentable & CaseIterable, Value.RawValue == String {
    /// One of a few words, the type's cases; `parse` may accept other spellings (any case).
    static func choice(_ key: String, default defaultValue: Value, expected: String,
                       parse: @escaping @Sendable (String) -> Value? = { Value(rawValue: $0) }, help: String) -> Self {
        Self(key: key, shape: .choice(Value.allCases.map(\.rawValue)), help: help, defaultValue: defaultValue, expected: expected,
             parse: { $0.first.flatMap { parse(AgentOption.trimmed($0)) } }, format: { [$0.rawValue] })
    }
}

/// One option of token-agent, whatever its value type: what the sources, the checks,
/// `--print-config`, a reload and `--help` work with. Made from an ``AgentOptionSpec``.
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

    let key: String
    let shape: Shape
    let help: String
    let expected: String
    let secret: Bool
    let live: Bool
    let hidden: Bool
    let linesInEnvironment: Bool
    /// The variables that may set it, highest precedence first: its own, then the others it
    /// answers to (see ``AgentOptionSpec/otherVariables``).
    let variables: [String]
    /// Sets the option in `settings` from its items; false when they are not a value of it.
    let assign: @Sendable (inout AgentSettings, [String]) -> Bool
    /// The option's value in `settings` as text (see ``AgentOptionSpec/format``).
    let text: @Sendable (AgentSettings) -> [String]
    /// Whether two settings hold the same value of the option.
    let same: @Sendable (AgentSettings, AgentSettings) -> Bool
    /// Copies the option's value from the second settings into the first.
    let copy: @Sendable (inout AgentSettings, AgentSettings) -> Void

    init<Value>(_ spec: AgentOptionSpec<Value>) {
        (key, shape, help, expected) = (spec.key, spec.shape, spec.help, spec.expected)
        (secret, live, hidden, linesInEnvironment) = (spec.secret, spec.live, spec.hidden, spec.linesInEnvironment)
        variables = [AgentVariables.name(of: spec.key)] + spec.otherVariables
        assign = { settings, items in
            guard let value = spec.parse(items) else { return false }
            settings[spec] = value
            return true
        }
        text = { spec.format($0[spec]) }
        same = { $0[spec] == $1[spec] }
        copy = { $0[spec] = $1[spec] }
    }

    /// Whether `text` is a value of the option (a list takes any item).
    func accepts(_ text: String) -> Bool {
        var scratch = AgentSettings()
        return assign(&scratch, [text])
    }

    /// `TOKEN_AGENT_` and the key in upper snake case.
    var environmentName: String { Self.environmentName(key) }

    static func environmentName(_ key: String) -> String {
        AgentVariables.name(of: key)
    }

    /// The variable naming the config file when `--config` is not given.
    static let configFileVariable = "TOKEN_AGENT_CONFIG"

    /// Every option a flag, a config file or the environment may set, in the table's order
    /// (the README's). Read off the table's stored properties: declaring an option there is
    /// all it takes.
    static let all: [AgentOption] = Mirror(reflecting: AgentOptionTable.options).children.compactMap {
        ($0.value as? any AgentOptionDeclaration)?.option
    }

    static let byKey: [String: AgentOption] = Dictionary(uniqueKeysWithValues: all.map { ($0.key, $0) })

    // Parsers shared by the shapes.

    static func trimmed(_ text: String) -> String { text.trimmingCharacters(in: .whitespaces) }

    static func bool(_ text: String) -> Bool? {
        switch trimmed(text).lowercased() {
        case "true", "1", "yes", "on": true
        case "false", "0", "no", "off": false
        default: nil
        }
    }

    static func double(_ text: String) -> Double? { Double(trimmed(text)) }

    static func integer(_ text: String) -> Int? { Int(trimmed(text)) }

    /// A number as an operator writes it: `5`, not `5.0`.
    static func number(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int(value)) : String(value)
    }
}

/// An ``AgentOptionSpec`` of any value type, as ``AgentOption/all`` finds it in the table.
protocol AgentOptionDeclaration {
    var option: AgentOption { get }
}

extension AgentOptionSpec: AgentOptionDeclaration {
    var option: AgentOption { AgentOption(self) }
}
