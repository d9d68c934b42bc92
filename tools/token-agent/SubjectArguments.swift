// Subject flags taken out of the command line before ArgumentParser sees it: its handling of a
// repeated option removes each parsed argument from an array (SplitArguments.remove(at:)), so N
// `--vehicle` flags cost O(N²): 22 s for 4,000 in a debug build. Taking them out first is linear.

import ArgumentParser

/// The subject flags (`--vehicle`, `--trip`, `--delivery-vehicle`, `--task`, each as `--flag ID`
/// or `--flag=ID`) of a command line, and the rest of it.
struct SubjectArguments: Equatable {
    /// Ids per flag name (without dashes), in command-line order.
    var ids: [String: [String]] = [:]
    /// Every other argument, in order.
    var rest: [String] = []

    static let flags: Set<String> = ["vehicle", "trip", "delivery-vehicle", "task"]

    /// Splits `arguments` (without the program name). Stops at `--`; a subject flag without a
    /// value is left in place for ArgumentParser to report.
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
                // A value that looks like an option is left to ArgumentParser, which refuses it
                // as it always did ("Missing value").
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

extension TokenAgent {
    /// Parses the command line with the subject flags taken out first (see ``SubjectArguments``),
    /// then runs, exiting as ArgumentParser's own `main` would.
    static func main() async {
        let split = SubjectArguments(Array(CommandLine.arguments.dropFirst()))
        do {
            var command = try parseAsRoot(split.rest)
            if var agent = command as? TokenAgent {
                agent.vehicles += split.ids["vehicle"] ?? []
                agent.trips += split.ids["trip"] ?? []
                agent.deliveryVehicles += split.ids["delivery-vehicle"] ?? []
                agent.tasks += split.ids["task"] ?? []
                try agent.validate()
                command = agent
            }
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            exit(withError: error)
        }
    }
}
