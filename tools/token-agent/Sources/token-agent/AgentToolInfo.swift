// `token-agent --experimental-dump-help`: the command described as ArgumentParser describes a
// command for its tools (the ToolInfo JSON, serialization version 0), made from the options
// `--help` lists (AgentHelp.entries). swift-argument-parser's `generate-manual` reads it and
// writes the man page, as it does for tokenctl and dev-token-server.
//
// The JSON is written with types of our own: ArgumentParserToolInfo, whose types describe it,
// is a target of swift-argument-parser but not one of its products, so it cannot be a declared
// dependency. Only the fields generate-manual reads are written; the format is ArgumentParser's
// documented, versioned one (a change of it changes `serializationVersion`).

import ArgumentParser
import Foundation

/// The ToolInfo document of token-agent.
struct AgentToolInfo: Encodable {
    /// The format's version; generate-manual refuses any other.
    let serializationVersion = 0
    let command: Command

    struct Command: Encodable {
        let commandName: String
        let abstract: String
        let discussion: String
        let shouldDisplay = true
        let arguments: [Argument]
    }

    struct Argument: Encodable {
        struct Name: Encodable {
            /// `long` or `short`.
            let kind: String
            let name: String
        }

        /// `option` (takes a value) or `flag`.
        let kind: String
        let shouldDisplay = true
        let isOptional = true
        let isRepeating: Bool
        let parsingStrategy = "default"
        let names: [Name]
        let preferredName: Name
        let valueName: String
        let allValues: [String]?
        let abstract: String
    }

    init(_ configuration: CommandConfiguration) {
        var arguments = AgentHelp.entries.map { entry in
            let name = Argument.Name(kind: "long", name: entry.key)
            return Argument(kind: entry.takesValue ? "option" : "flag", isRepeating: entry.repeating, names: [name],
                            preferredName: name, valueName: entry.key, allValues: entry.values, abstract: entry.help)
        }
        let help = Argument.Name(kind: "long", name: "help")
        arguments.append(Argument(kind: "flag", isRepeating: false, names: [Argument.Name(kind: "short", name: "h"), help],
                                  preferredName: help, valueName: "help", allValues: nil, abstract: AgentHelp.helpHelp))
        command = Command(commandName: configuration.commandName ?? "token-agent", abstract: configuration.abstract,
                          discussion: configuration.discussion, arguments: arguments)
    }

    /// The document as JSON, keys sorted (as ArgumentParser prints it).
    var json: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        // Encoding these plain strings and arrays cannot fail.
        let data = (try? encoder.encode(self)) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }
}
