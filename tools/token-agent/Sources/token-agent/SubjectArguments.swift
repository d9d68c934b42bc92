// Subject flags taken out of the command line first, in one linear pass: a command line may name
// thousands (ArgumentParser, which once read them, removed each parsed argument from an array:
// 22 s for 4,000 `--vehicle` flags in a debug build). AgentCommandLine reads the rest.

import FleetTokenStore

/// The subject flags (`--vehicle`, `--trip`, `--delivery-vehicle`, `--task`, each as `--flag ID`
/// or `--flag=ID`) of a command line, and the rest of it.
struct SubjectArguments: Equatable {
    /// Ids per flag name (without dashes), in command-line order.
    var ids: [String: [String]] = [:]
    /// Every other argument, in order.
    var rest: [String] = []

    static let flags = Set(TokenKind.allCases.map(TokenAgent.flagName))

    /// Splits `arguments` (without the program name). Stops at `--`; a subject flag without a
    /// value is left in place for AgentCommandLine to report.
    init(_ arguments: [String]) {
        var index = arguments.startIndex
        while index < arguments.endIndex {
            let argument = arguments[index]
            if argument == "--" {
                rest += arguments[index...]
                break
            }
            if argument.hasPrefix("--") {
                let body = argument.dropFirst(2)
                if let equals = body.firstIndex(of: "="), Self.flags.contains(String(body[..<equals])) {
                    ids[String(body[..<equals]), default: []].append(String(body[body.index(after: equals)...]))
                    index += 1
                    continue
                }
                // A value that looks like an option is left to AgentCommandLine, which refuses it
                // as ArgumentParser always did ("Missing value").
                if Self.flags.contains(String(body)), index + 1 < arguments.endIndex, !arguments[index + 1].hasPrefix("-") {
                    ids[String(body), default: []].append(arguments[index + 1])
                    index += 2
                    continue
                }
            }
            rest.append(argument)
            index += 1
        }
    }
}
