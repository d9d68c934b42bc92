// token-agent's command line and `--help`, both made from the option table: every option is a
// long flag (`--key VALUE`, `--key=VALUE`, a toggle without a value). Messages and exit codes
// are ArgumentParser's, as when it read these flags itself (UsageError: exit 64).
//
// swift-configuration's CommandLineArgumentsProvider is not used: it splits every value at its
// commas (a header value, a JSON body template) and ignores unknown flags and stray arguments,
// which must be usage errors here.

import ArgumentParser
import Configuration
import Foundation

/// The flags of one command line, as text for the configuration's first provider.
struct AgentCommandLine {
    /// The options given, by key: lists as lists, anything else as text (a toggle as `true`).
    var flags: [String: ConfigContent] = [:]
    /// `--config`.
    var config: String?
    /// `--print-config`.
    var printConfig = false
    /// `--help` or `-h`: nothing else is read.
    var help = false
    /// `--version`: nothing else is read (unless `--help` is also given, which wins).
    var version = false
    /// `--check-config`: run the start-up checks that touch neither the store nor the provider, and exit.
    var checkConfig = false
    /// `--experimental-dump-help`: ArgumentParser's tool description (JSON) for `generate-manual`.
    var dumpHelp = false
    /// `--generate-completion-script SHELL`: the completion script for bash, zsh or fish.
    var completionShell: CompletionShell?

    /// Flags of the command line alone, not options a config file or variable can set.
    static let commandLineOnly: [(key: String, takesValue: Bool, help: String)] = [
        ("config", true, "A config file (YAML or JSON) whose keys are these flags' long names; flags and TOKEN_AGENT_* variables override it (default: $TOKEN_AGENT_CONFIG)."),
        ("print-config", false, "Print the effective configuration (secrets redacted), with where each value came from, and exit."),
        ("check-config", false, "Run every start-up check that touches neither the store nor the provider, print 'configuration OK' and exit 0, or the start's message and exit 64."),
        ("version", false, "Print the version, the git revision it was built from and the Swift version, and exit."),
    ]

    /// Reads `arguments` (without the program name).
    /// - Throws: `ValidationError` (exit 64) for an unknown flag, a missing or bad value, or an
    ///   argument that is not a flag.
    init(parsing arguments: [String]) throws(ValidationError) {
        // The subject flags first, linearly (SubjectArguments.swift); a subject flag without a
        // value stays in `rest` and is refused below.
        let split = SubjectArguments(arguments)
        let flagsBeforeDashes = split.rest.prefix(while: { $0 != "--" })
        if flagsBeforeDashes.contains(where: { $0 == "--help" || $0 == "-h" }) {
            help = true
            return
        }
        // As ArgumentParser's --version: answered before any other argument is judged.
        if flagsBeforeDashes.contains("--version") {
            version = true
            return
        }
        // ArgumentParser's two hidden flags for tools (generate-manual, shell completions), also
        // answered before anything else is judged.
        if flagsBeforeDashes.contains("--experimental-dump-help") {
            dumpHelp = true
            return
        }
        if let index = flagsBeforeDashes.firstIndex(where: { $0 == "--generate-completion-script" || $0.hasPrefix("--generate-completion-script=") }) {
            let argument = flagsBeforeDashes[index]
            let value = argument.contains("=") ? String(argument.drop { $0 != "=" }.dropFirst())
                : index + 1 < flagsBeforeDashes.endIndex ? flagsBeforeDashes[index + 1] : ""
            guard let shell = CompletionShell(rawValue: value) else {
                throw ValidationError("The value '\(value)' is invalid for '--generate-completion-script <shell>'\nHelp:  --generate-completion-script <shell>  One of: bash, zsh, fish.")
            }
            completionShell = shell
            return
        }
        var lists = split.ids
        var texts: [String: String] = [:]
        var unexpected: [String] = []
        let rest = split.rest
        var index = rest.startIndex
        while index < rest.endIndex {
            let argument = rest[index]
            index += 1
            if argument == "--" {
                unexpected += rest[index...]
                break
            }
            guard argument.hasPrefix("-") && argument.count > 1 else {
                unexpected.append(argument)
                continue
            }
            guard argument.hasPrefix("--") else { throw ValidationError("Unknown option '\(argument)'") }
            let body = argument.dropFirst(2)
            let equals = body.firstIndex(of: "=")
            let key = String(body[..<(equals ?? body.endIndex)])
            let inline = equals.map { String(body[body.index(after: $0)...]) }
            let option = AgentOption.byKey[key]
            guard let takesValue = option.map({ $0.shape != .toggle }) ?? Self.commandLineOnly.first(where: { $0.key == key })?.takesValue else {
                throw ValidationError(Self.unknownOption(key))
            }
            guard takesValue else {
                if let inline {
                    throw ValidationError("The option '--\(key)' does not take any value, but '\(inline)' was specified.")
                }
                switch key {
                case "print-config": printConfig = true
                case "check-config": checkConfig = true
                default: texts[key] = "true"
                }
                continue
            }
            let value: String
            if let inline {
                value = inline
            } else if index < rest.endIndex && !rest[index].hasPrefix("-") {
                value = rest[index]
                index += 1
            } else {
                throw ValidationError("Missing value for '--\(key) <\(key)>'" + Self.helpLine(key))
            }
            guard let option else {
                config = value
                continue
            }
            guard option.accepts(value) else {
                throw ValidationError("The value '\(value)' is invalid for '--\(key) <\(key)>'" + Self.helpLine(key))
            }
            if option.shape == .list { lists[key, default: []].append(value) } else { texts[key] = value }
        }
        switch unexpected.count {
        case 0: break
        case 1: throw ValidationError("Unexpected argument '\(unexpected[0])'")
        default: throw ValidationError("\(unexpected.count) unexpected arguments: '\(unexpected.joined(separator: "', '"))'")
        }
        for (key, list) in lists where !list.isEmpty { flags[key] = .stringArray(list) }
        for (key, text) in texts { flags[key] = .string(text) }
    }

    /// "Unknown option '--vehicles'. Did you mean '--vehicle'?" (a flag a few edits away).
    static func unknownOption(_ key: String) -> String {
        let names = AgentOption.all.map(\.key) + commandLineOnly.map(\.key) + ["help"]
        let near = names.map { ($0, editDistance($0, key)) }.filter { $0.1 < 4 }.min { $0.1 < $1.1 }
        return "Unknown option '--\(key)'" + (near.map { ". Did you mean '--\($0.0)'?" } ?? "")
    }

    /// The second line of a message about a flag's value: the flag's help.
    private static func helpLine(_ key: String) -> String {
        let help = AgentOption.byKey[key]?.help ?? commandLineOnly.first { $0.key == key }?.help ?? ""
        return "\nHelp:  --\(key) <\(key)>  \(help)"
    }

    /// Levenshtein distance.
    static func editDistance(_ a: String, _ b: String) -> Int {
        let (a, b) = (Array(a), Array(b))
        var previous = Array(0...b.count)
        for (i, x) in a.enumerated() {
            var current = [i + 1]
            for (j, y) in b.enumerated() {
                current.append(min(previous[j + 1] + 1, current[j] + 1, previous[j] + (x == y ? 0 : 1)))
            }
            previous = current
        }
        return previous[b.count]
    }
}

/// `token-agent --help`: the command's overview and discussion, then every option the table
/// does not hide, laid out as ArgumentParser lays out a command's help.
enum AgentHelp {
    /// The usage line of the help and of usage errors.
    static let usage = "token-agent <options>"
    static let width = 80
    /// Where an option's help starts.
    static let helpColumn = 26

    static func text(_ configuration: CommandConfiguration) -> String {
        var lines = wrap("OVERVIEW: " + configuration.abstract, width: width)
        for paragraph in configuration.discussion.components(separatedBy: "\n\n") {
            lines += [""] + wrap(paragraph, width: width)
        }
        lines += ["", "USAGE: \(usage)", "", "OPTIONS:"]
        for option in entries {
            lines += entry(option.takesValue ? "--\(option.key) <\(option.key)>" : "--\(option.key)", option.help)
        }
        lines += entry("-h, --help", helpHelp)
        return lines.joined(separator: "\n") + "\n\n"
    }

    /// The help of `-h, --help`.
    static let helpHelp = "Show help information."

    /// One option as `--help` shows it.
    struct Entry: Equatable {
        let key: String
        let takesValue: Bool
        /// A repeatable flag (a list).
        let repeating: Bool
        /// The words a value may be, for a choice.
        let values: [String]?
        /// Its help, with a choice's values.
        let help: String
    }

    /// The options `--help` lists but `-h, --help`, in its order: the command line's own, then
    /// the table's not hidden. The man page (ToolInfo) and the completion scripts are made from
    /// this list too, so none of them can drift from `--help`.
    static var entries: [Entry] {
        var entries = AgentCommandLine.commandLineOnly.map {
            Entry(key: $0.key, takesValue: $0.takesValue, repeating: false, values: nil, help: $0.help)
        }
        for option in AgentOption.all where !option.hidden {
            var help = option.help
            var values: [String]?
            if case .choice(let words) = option.shape {
                help += " (values: \(words.joined(separator: ", ")))"
                values = words
            }
            entries.append(Entry(key: option.key, takesValue: option.shape != .toggle, repeating: option.shape == .list,
                                 values: values, help: help))
        }
        return entries
    }

    /// A label and its help: on one line when the label leaves room, else the help below it.
    private static func entry(_ label: String, _ help: String) -> [String] {
        let indent = String(repeating: " ", count: helpColumn)
        var lines = wrap(help, width: width - helpColumn).map { indent + $0 }
        if 2 + label.count < helpColumn, !lines.isEmpty {
            lines[0] = "  " + label.padding(toLength: helpColumn - 2, withPad: " ", startingAt: 0) + lines[0].dropFirst(helpColumn)
        } else {
            lines.insert("  " + label, at: 0)
        }
        return lines
    }

    /// `text` in lines of at most `width` characters, broken at spaces. As ArgumentParser
    /// breaks them: a line is the next `width` characters when they end the text, else those
    /// before the last space among them (a longer word stands alone).
    static func wrap(_ text: String, width: Int) -> [String] {
        var lines: [String] = []
        var rest = Substring(text)
        while !rest.isEmpty {
            let window = rest.prefix(width)
            if window.endIndex == rest.endIndex {
                lines.append(String(rest))
                break
            }
            guard let space = window.lastIndex(of: " ") ?? rest.firstIndex(of: " ") else {
                lines.append(String(rest))
                break
            }
            lines.append(String(rest[..<space]))
            rest = rest[rest.index(after: space)...]
        }
        return lines
    }
}
