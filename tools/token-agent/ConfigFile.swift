// The agent's config file (`--config PATH`): checked here against the option table, with line
// numbers, before swift-configuration reads values from it. swift-configuration's file
// snapshots keep no line numbers and accept any key, and an operator needs both.

import Configuration
import FleetTokenStore
import Foundation
import SystemPackage
import Yams

/// A config file that passed the checks: every key is one of the agent's options, each value
/// has its option's shape, and the file is a flat mapping.
struct AgentConfigFile: Sendable {
    let path: String
    /// The line of each key, for messages about its value.
    let lines: [String: Int]
    /// The file as swift-configuration reads it.
    let provider: FileProvider<YAMLSnapshot>

    /// Reads and checks `path`. JSON is read as YAML (a JSON document is a YAML one), so
    /// `token-agent.json` gets the same checks and line numbers.
    static func load(_ path: String) async throws(ConfigFileError) -> AgentConfigFile {
        // access(2) first: its errno says why a file cannot be read in an operator's words.
        guard access(path, R_OK) == 0 else {
            throw ConfigFileError(path: path, line: nil, message: "cannot be read: \(String(cString: strerror(errno)))")
        }
        // A file another user could have written is refused before it is read, at start and
        // on every reload (as sshd refuses such an authorized_keys).
        do { try SteeringFileCheck.check(path: path, role: "config file") } catch {
            throw ConfigFileError(path: path, line: nil, message: error.reason)
        }
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw ConfigFileError(path: path, line: nil, message: "cannot be read as UTF-8 text")
        }
        let lines = try check(text, path: path)
        let secrets = Set(AgentOption.all.filter(\.secret).map(\.key))
        do {
            let provider = try await FileProvider<YAMLSnapshot>(
                parsingOptions: .init(secretsSpecifier: .specific(secrets)), filePath: FilePath(path))
            return AgentConfigFile(path: path, lines: lines, provider: provider)
        } catch {
            // The file changed between the two reads, or swift-configuration refuses what the
            // check accepted: say so rather than guess.
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

/// A config file that cannot be used, with the line at fault when there is one.
struct ConfigFileError: Error, CustomStringConvertible {
    let path: String
    let line: Int?
    let message: String

    var description: String {
        "config file \(path)\(line.map { ":\($0)" } ?? ""): \(message)"
    }
}
