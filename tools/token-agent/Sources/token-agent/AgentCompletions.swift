// `token-agent --generate-completion-script bash|zsh|fish`, ArgumentParser's flag for its
// commands: the scripts are made from the options `--help` lists (AgentHelp.entries), so an
// option added to the table is completed without a change here. Values are completed as file
// names for the options that name files, as words for a choice, and not at all otherwise.

import Foundation

/// A shell token-agent writes a completion script for.
enum CompletionShell: String, CaseIterable, Sendable {
    case bash
    case zsh
    case fish
}

/// The completion scripts.
enum AgentCompletions {
    static let command = "token-agent"

    /// What a value of an option is completed with.
    enum ValueKind: Equatable {
        case none
        case file
        case directory
        case words([String])
    }

    /// Options naming a file are completed with file names: the `…-file` ones and these.
    static let fileKeys: Set<String> = ["config", "db", "client-cert", "client-key"]

    static func valueKind(_ entry: AgentHelp.Entry) -> ValueKind {
        if let values = entry.values { return .words(values) }
        if entry.key == "sink" { return .directory }
        if entry.key.hasSuffix("-file") || fileKeys.contains(entry.key) { return .file }
        return .none
    }

    static func script(_ shell: CompletionShell) -> String {
        switch shell {
        case .bash: bash
        case .zsh: zsh
        case .fish: fish
        }
    }

    static var bash: String {
        let entries = AgentHelp.entries
        var lines = [
            "# bash completion for \(command) (token-agent --generate-completion-script bash)",
            "_token_agent() {",
            "    COMPREPLY=()",
            "    local cur=\"${COMP_WORDS[COMP_CWORD]}\"",
            "    local prev=\"${COMP_WORDS[COMP_CWORD-1]}\"",
            "    case \"$prev\" in",
        ]
        for entry in entries where entry.takesValue {
            switch valueKind(entry) {
            case .words(let values):
                lines.append("        --\(entry.key)) COMPREPLY=($(compgen -W \"\(values.joined(separator: " "))\" -- \"$cur\")); return ;;")
            case .file:
                lines.append("        --\(entry.key)) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;")
            case .directory:
                lines.append("        --\(entry.key)) COMPREPLY=($(compgen -d -- \"$cur\")); return ;;")
            case .none:
                lines.append("        --\(entry.key)) return ;;")
            }
        }
        let flags = entries.map { "--\($0.key)" } + ["-h", "--help"]
        lines += [
            "    esac",
            "    COMPREPLY=($(compgen -W \"\(flags.joined(separator: " "))\" -- \"$cur\"))",
            "}",
            "complete -F _token_agent \(command)",
        ]
        return lines.joined(separator: "\n") + "\n"
    }

    static var zsh: String {
        var lines = [
            "#compdef \(command)",
            "# zsh completion for \(command) (token-agent --generate-completion-script zsh)",
            "_token_agent() {",
            "    _arguments -s \\",
        ]
        for entry in AgentHelp.entries {
            let repeating = entry.repeating ? "*" : ""
            let description = zshQuoted(entry.help)
            guard entry.takesValue else {
                lines.append("        '\(repeating)--\(entry.key)[\(description)]' \\")
                continue
            }
            let action = switch valueKind(entry) {
            case .words(let values): "(\(values.joined(separator: " ")))"
            case .file: "_files"
            case .directory: "_files -/"
            case .none: ""
            }
            lines.append("        '\(repeating)--\(entry.key)[\(description)]:\(entry.key):\(action)' \\")
        }
        lines += [
            "        '(-h --help)'{-h,--help}'[\(zshQuoted(AgentHelp.helpHelp))]'",
            "}",
            // Autoloaded from its file (`_token-agent` on $fpath), the file's body is the
            // completion function; sourced, it registers the function instead.
            "if [[ \"${funcstack[1]}\" = _\(command) ]]; then",
            "    _token_agent \"$@\"",
            "else",
            "    compdef _token_agent \(command)",
            "fi",
        ]
        return lines.joined(separator: "\n") + "\n"
    }

    static var fish: String {
        var lines = [
            "# fish completion for \(command) (token-agent --generate-completion-script fish)",
            "complete -c \(command) -f",
        ]
        for entry in AgentHelp.entries {
            var line = "complete -c \(command) -l \(entry.key)"
            if entry.takesValue {
                switch valueKind(entry) {
                case .words(let values): line += " -x -a '\(values.joined(separator: " "))'"
                case .file: line += " -r -F"
                case .directory: line += " -x -a '(__fish_complete_directories)'"
                case .none: line += " -x"
                }
            }
            lines.append(line + " -d '\(fishQuoted(entry.help))'")
        }
        lines.append("complete -c \(command) -s h -l help -d '\(fishQuoted(AgentHelp.helpHelp))'")
        return lines.joined(separator: "\n") + "\n"
    }

    /// Text inside a single-quoted `_arguments` spec's `[…]` description.
    static func zshQuoted(_ text: String) -> String {
        text.replacingOccurrences(of: "\\", with: "\\\\")
            .replacingOccurrences(of: "[", with: "\\[").replacingOccurrences(of: "]", with: "\\]")
            .replacingOccurrences(of: "'", with: "'\\''")
    }

    /// Text inside single quotes in fish.
    static func fishQuoted(_ text: String) -> String {
        text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'")
    }
}
