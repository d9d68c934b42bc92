// The agent's config file (`--config PATH`): checked here against the option table, with line
// numbers, before swift-configuration reads values from it. swift-configuration's file
// snapshots keep no line numbers and accept any key, and an operator needs both.

import Configuration
import FleetTokenStore
import Foundation
import Yams

/// A config file that passed the checks: every key is one of the agent's options, each value
/// has its option's shape, and the file is a flat mapping.
struct AgentConfigFile: Sendable {
    let path: String
    /// The line of each key, for messages about its value.
    let lines: [String: Int]
    /// The file as swift-configuration reads it: the bytes that were checked.
    let provider: any ConfigProvider
    /// The bytes read and applied: what a reload compares the file with (``ReloadInputs``).
    let bytes: Data

    /// Reads and checks `path`. JSON is read as YAML (a JSON document is a YAML one), so
    /// `token-agent.json` gets the same checks and line numbers.
    static func load(_ path: String) async throws(ConfigFileError) -> AgentConfigFile {
        // Opened once: a file another user could have written (or replaced, through a
        // directory on the way) is refused, at start and on every reload (as sshd refuses such
        // an authorized_keys), and what is checked and applied below is the very bytes judged.
        let data: Data
        do { data = try SteeringFileCheck.read(path: path, role: "config file") } catch {
            switch error.code {
            case .missing, .unreadable:
                // The system's words say why a file cannot be read in an operator's words.
                throw ConfigFileError(path: path, line: nil, message: "cannot be read: \(error.systemMessage ?? "unknown error")")
            default:
                throw ConfigFileError(path: path, line: nil, message: error.reason)
            }
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw ConfigFileError(path: path, line: nil, message: "cannot be read as UTF-8 text")
        }
        let lines = try check(text, path: path)
        let name = "FileProvider<YAMLSnapshot>"
        // An empty file (or only comments) sets nothing; swift-configuration would refuse it.
        guard !lines.isEmpty else {
            return AgentConfigFile(path: path, lines: lines, provider: InMemoryProvider(name: name, values: [:]), bytes: data)
        }
        let secrets = Set(AgentOption.all.filter(\.secret).map(\.key))
        do {
            let snapshot = try YAMLSnapshot(data: data.bytes, providerName: name,
                                            parsingOptions: .init(secretsSpecifier: .specific(secrets)))
            return AgentConfigFile(path: path, lines: lines, provider: CheckedFileProvider(checked: snapshot), bytes: data)
        } catch {
            // swift-configuration refuses what the check accepted: say so rather than guess.
            throw ConfigFileError(path: path, line: nil, message: "cannot be read as configuration: \(error)")
        }
    }

    /// Where `key` is set, for messages: `/etc/token-agent.yaml:12 (connect-timeout)`.
    func place(of key: String) -> String {
        "\(path)\(lines[key].map { ":\($0)" } ?? "") (\(key))"
    }

    /// The keys and their lines, or the first problem.
    static func check(_ text: String, path: String) throws(ConfigFileError) -> [String: Int] {
        let root: Node?
        do {
            root = try Yams.compose(yaml: text)
        } catch YamlError.duplicatedKeysInMapping(let duplicates, let context) {
            // Yams finds repeated keys itself; its mark is the mapping's, not the repeat's.
            let key = duplicates.first ?? "a key"
            let forms = [key, "\"\(key)\"", "'\(key)'"].map { $0 + ":" }
            let repeated = text.split(separator: "\n", omittingEmptySubsequences: false).enumerated()
                .filter { line in forms.contains { line.element.drop { $0 == " " || $0 == "\t" || $0 == "{" || $0 == "," }.hasPrefix($0) } }
                .dropFirst().first.map { $0.offset + 1 }
            throw ConfigFileError(path: path, line: repeated ?? context.mark.line, message: "'\(key)' is set twice")
        } catch let error as YamlError {
            throw ConfigFileError(path: path, line: line(of: error, in: text), message: "is not valid YAML or JSON: \(problem(of: error))")
        } catch {
            // Not a YamlError: say no more than that (a parser's text may quote the line at fault).
            throw ConfigFileError(path: path, line: nil, message: "is not valid YAML or JSON")
        }
        guard let root else { return [:] }  // An empty file (or only comments) sets nothing.
        guard case .mapping(let mapping) = root else {
            throw ConfigFileError(path: path, line: root.mark?.line, message: "must be a mapping of option names to values, such as 'provider-url: https://…'")
        }
        var lines: [String: Int] = [:]
        for (keyNode, value) in mapping {
            let line = keyNode.mark?.line
            guard case .scalar(let keyScalar) = keyNode else {
                throw ConfigFileError(path: path, line: line, message: "has a key that is not a name")
            }
            let key = keyScalar.string
            guard let option = AgentOption.byKey[key] else {
                // Quoted only when it looks like a key: a pasted value in key position may be a secret.
                let shown = key.count <= 40 && key.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }
                throw ConfigFileError(path: path, line: line, message: shown ? "unknown key '\(key)'\(suggestion(for: key))" : "unknown key (not shown)")
            }
            if lines[key] != nil {
                throw ConfigFileError(path: path, line: line, message: "'\(key)' is set twice")
            }
            try checkShape(value, of: option, path: path, line: value.mark?.line ?? line)
            lines[key] = line
        }
        return lines
    }

    /// A list option takes a list of plain values; any other a single plain value (whose
    /// content is checked when it is read, with the same line).
    private static func checkShape(_ value: Node, of option: AgentOption, path: String, line: Int?) throws(ConfigFileError) {
        func wrong(_ expected: String) -> ConfigFileError {
            ConfigFileError(path: path, line: line, message: "'\(option.key)' must be \(expected)")
        }
        switch (option.shape, value) {
        case (.list, .sequence(let items)):
            for item in items {
                guard case .scalar(let scalar) = item, !isNull(scalar) else {
                    throw wrong("a list of plain values, such as \(option.key): [a, b]")
                }
            }
        case (.list, _):
            throw wrong("a list, such as \(option.key): [a, b] (or one item a line, each starting with '- ')")
        case (_, .scalar(let scalar)) where isNull(scalar):
            throw wrong("given a value (or the line removed)")
        case (.toggle, .scalar(let scalar)) where !["true", "false"].contains(scalar.string.lowercased()):
            throw wrong("true or false")
        case (_, .scalar):
            break
        default:
            throw wrong("a single value, not a list or mapping")
        }
    }

    private static func isNull(_ scalar: Node.Scalar) -> Bool {
        scalar.style == .plain && ["", "~", "null", "Null", "NULL"].contains(scalar.string)
    }

    /// " (did you mean 'vehicle'?)" for a near miss such as `vehicles`.
    static func suggestion(for key: String) -> String {
        closestKey(to: key).map { " (did you mean '\($0)'?)" }
            ?? "; the keys are the long flags without dashes, as in the README's flag table"
    }

    /// The option a misspelt key most likely meant: a prefix either way, or the same letters
    /// with underscores or without dashes.
    static func closestKey(to key: String) -> String? {
        let candidates = AgentOption.all.map(\.key).filter { candidate in
            candidate.hasPrefix(key) || key.hasPrefix(candidate) || candidate.replacingOccurrences(of: "-", with: "_") == key
                || candidate.replacingOccurrences(of: "-", with: "") == key.lowercased()
        }
        return candidates.min(by: { abs($0.count - key.count) < abs($1.count - key.count) })
    }

    private static func line(of error: YamlError, in text: String) -> Int? {
        switch error {
        case .scanner(_, _, let mark, _), .parser(_, _, let mark, _), .composer(_, _, let mark, _): mark.line
        case .reader(_, let offset?, _, _):
            // A byte offset: its line is one more than the newlines before it.
            text.utf8.prefix(offset).count(where: { $0 == UInt8(ascii: "\n") }) + 1
        default: nil
        }
    }

    /// The parser's problem in its own words, never its description: that quotes the line at
    /// fault, which may hold a credential.
    private static func problem(of error: YamlError) -> String {
        switch error {
        case .scanner(let context, let problem, _, _), .parser(let context, let problem, _, _), .composer(let context, let problem, _, _):
            context.map { "\($0.text) \(problem)" } ?? problem
        case .reader(let problem, _, _, _): problem
        default: "the parser gave up"
        }
    }
}

/// The values of the config file as it was read and checked, for swift-configuration: a
/// FileProvider would read the path once more, and could be given another file.
struct CheckedFileProvider: ConfigProvider, CustomStringConvertible {
    let checked: YAMLSnapshot

    var providerName: String { checked.providerName }
    var description: String { checked.description }

    func value(forKey key: AbsoluteConfigKey, type: ConfigType) throws -> LookupResult {
        try checked.value(forKey: key, type: type)
    }

    func fetchValue(forKey key: AbsoluteConfigKey, type: ConfigType) async throws -> LookupResult {
        try value(forKey: key, type: type)
    }

    func watchValue<Return: ~Copyable>(
        forKey key: AbsoluteConfigKey, type: ConfigType,
        updatesHandler: nonisolated(nonsending) (_ updates: ConfigUpdatesAsyncSequence<Result<LookupResult, any Error>, Never>) async throws -> Return
    ) async throws -> Return {
        try await watchValueFromValue(forKey: key, type: type, updatesHandler: updatesHandler)
    }

    func snapshot() -> any ConfigSnapshot { checked }

    func watchSnapshot<Return: ~Copyable>(
        updatesHandler: nonisolated(nonsending) (_ updates: ConfigUpdatesAsyncSequence<any ConfigSnapshot, Never>) async throws -> Return
    ) async throws -> Return {
        try await watchSnapshotFromSnapshot(updatesHandler: updatesHandler)
    }
}

/// A config file that cannot be used, with the line at fault when there is one.
struct ConfigFileError: Error, CustomStringConvertible {
    let path: String
    let line: Int?
    let message: String

    var description: String {
        "config file \(path)\(line.map { ":\($0)" } ?? ""): \(message)"
    }
}
