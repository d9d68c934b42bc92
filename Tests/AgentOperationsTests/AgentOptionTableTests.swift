// Issue 28: token-agent's options are declared once (AgentOptionTable.swift) and every source is
// made from that table. These tests iterate the table, so an option added later is covered
// without touching them: each option reads the same through a flag, a TOKEN_AGENT_ variable and
// a config file, and the command line and `--help` know it.

import Foundation
import TestSupportKit
import Testing
@testable import token_agent

@Suite("token-agent's option table: one declaration, every source", .paced)
struct AgentOptionTableTests {
    /// A value of `option` that is not its default, as items (one for a single value).
    static func sample(_ option: AgentOption) -> [String] {
        let defaultText = option.text(AgentSettings())
        switch option.shape {
        case .list: return ["item-1", "item-2"]
        case .toggle: return ["true"]
        case .integer: return ["7"]
        case .number: return ["7.5"]
        case .duration: return ["90s"]
        case .choice(let values): return [values.first { [$0] != defaultText } ?? values[0]]
        case .text: return ["sample-\(option.key)"]
        }
    }

    /// The settings from `sources`, and `--print-config`'s value of each option without its
    /// origin comment.
    static func read(_ sources: SettingSources) throws -> (settings: AgentSettings, printed: [String: String]) {
        let settings = try AgentSettings.resolve(sources)
        var printed: [String: String] = [:]
        for line in EffectiveConfiguration(settings: settings, configFile: nil).text.split(separator: "\n") where !line.hasPrefix("#") {
            let key = String(line[..<line.firstIndex(of: ":")!])
            printed[key] = String(line[..<(line.range(of: "  # ", options: .backwards)?.lowerBound ?? line.endIndex)])
        }
        return (settings, printed)
    }

    @Test("every option reads the same through its flag, its variable and the config file", arguments: AgentOption.all.map(\.key))
    func roundTrip(_ key: String) async throws {
        let option = try #require(AgentOption.byKey[key])
        let items = Self.sample(option)

        var arguments: [String] = []
        for item in items { arguments += option.shape == .toggle ? ["--\(key)"] : ["--\(key)", item] }
        let commandLine = try AgentCommandLine(parsing: arguments)
        let fromFlag = try Self.read(SettingSources(flags: commandLine.flags, environment: [:]))

        let variable = items.joined(separator: option.linesInEnvironment ? "\n" : ",")
        let fromVariable = try Self.read(SettingSources(flags: [:], environment: [option.environmentName: variable]))

        let scratch = Scratch()
        let path = scratch.file("agent.yaml")
        let quoted = items.map { "\"\($0)\"" }
        let value = option.shape == .list ? "[\(quoted.joined(separator: ", "))]" : option.shape == .toggle ? items[0] : quoted[0]
        try "\(key): \(value)\n".write(toFile: path, atomically: true, encoding: .utf8)
        let file = try await AgentConfigFile.load(path)
        let fromFile = try Self.read(SettingSources(flags: [:], environment: [:], file: file))

        #expect(option.text(fromFlag.settings) == items, "the flag's value is the one given")
        #expect(option.text(fromFlag.settings) != option.text(AgentSettings()), "the sample must differ from the default")
        #expect(fromFlag.settings == fromVariable.settings && fromFlag.settings == fromFile.settings)
        #expect(fromFlag.settings.values == fromVariable.settings.values && fromFlag.settings.values == fromFile.settings.values)
        #expect(fromFlag.printed == fromVariable.printed && fromFlag.printed == fromFile.printed)
        #expect(fromFlag.settings.origins.origin(of: key) == .flag && fromVariable.settings.origins.origin(of: key) == .environment(option.environmentName))
        #expect(fromFlag.settings.differingOptions(from: AgentSettings()).map(\.key) == [key], "one option set, one option differs")
        if option.shape != .list && option.shape != .text {
            // A value of the wrong shape is refused by every source, naming it as given.
            #expect(throws: (any Error).self) { try AgentCommandLine(parsing: ["--\(key)=not-a-value"]) }
            #expect(throws: UsageError.self) {
                try AgentSettings.resolve(SettingSources(flags: [:], environment: [option.environmentName: "not-a-value"]))
            }
        }
    }

    @Test("names follow one rule: the long flag is the config key, the variable its upper snake case")
    func names() {
        let keys = AgentOption.all.map(\.key)
        #expect(Set(keys).count == keys.count && keys.count == AgentOption.byKey.count)
        for option in AgentOption.all {
            #expect(option.key.allSatisfy { $0.isLowercase || $0.isNumber || $0 == "-" }, "\(option.key)")
            #expect(option.environmentName == "TOKEN_AGENT_" + option.key.uppercased().replacingOccurrences(of: "-", with: "_"))
            #expect(!option.help.isEmpty, "\(option.key) has help")
        }
        // The README's contract: these flags, keys and variables exist (more may be added).
        let documented = [
            "db", "encryption-key-file", "provider-url", "vehicle", "trip", "delivery-vehicle", "task", "subjects-file", "header",
            "header-file", "method", "body-template", "content-type", "ca-file", "extra-ca-file", "client-cert", "client-key", "proxy",
            "no-proxy", "token-key", "expiration-key", "expiration-format", "allow-insecure-http", "allow-opaque-tokens",
            "connect-timeout", "request-timeout", "retention", "once", "json", "log-level", "log-format", "listen",
            "allow-non-loopback-listen", "socket-mode", "allow", "allow-client", "invalidate-interval", "max-dynamic-subjects",
            "max-api-connections", "max-api-connections-per-peer", "sink", "sink-mode", "exit-on-permanent-error",
            "permanent-error-attempts", "demo-lifetime", "lease-duration", "idle-window", "failure-backoff",
            "fleet-engine-listen", "fleet-engine-url", "fleet-engine-ca-file", "fleet-engine-default-subject", "max-event-lines",
        ]
        #expect(Set(documented).subtracting(keys).isEmpty, "missing: \(Set(documented).subtracting(keys))")
        #expect(AgentOption.all.filter(\.secret).map(\.key) == ["db", "header", "body-template", "proxy"])
        // --lease-duration is shown (issue 31: it worked, but neither --help nor the reference had
        // it, while the README's clock rule is stated in terms of it).
        #expect(AgentOption.all.filter(\.hidden).map(\.key) == ["event-line-window", "demo-lifetime", "idle-window", "failure-backoff"])
    }

    @Test("--help lists every option the table does not hide, with its help, and the README's CLI reference names each")
    func help() throws {
        let help = AgentHelp.text(TokenAgent.configuration)
        let flags = Set(help.split(separator: "\n").compactMap { line -> String? in
            guard line.hasPrefix("  --") else { return nil }
            return String(line.dropFirst(2).prefix { $0 != " " })
        })
        let shown = AgentOption.all.filter { !$0.hidden }.map { "--\($0.key)" }
        #expect(flags == Set(shown + ["--config", "--print-config", "--check-config", "--version"]))
        for option in AgentOption.all where option.hidden { #expect(!help.contains("--\(option.key)"), "\(option.key) is hidden") }
        #expect(help.split(separator: "\n").allSatisfy { $0.count <= AgentHelp.width }, "lines fit 80 columns")
        #expect(help.contains("OVERVIEW: Keep Fleet Engine tokens") && help.contains("USAGE: token-agent <options>"))
        #expect(help.contains("(values: GET, POST)"))

        // The README's reference: every flag --help shows appears in it.
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        let start = try #require(readme.range(of: "### `token-agent`"))
        let end = try #require(readme.range(of: "### `tokenctl`"))
        let reference = readme[start.upperBound..<end.lowerBound]
        for flag in flags { #expect(reference.contains("`\(flag)") || reference.contains("[\(flag)"), "README's CLI reference lacks \(flag)") }
    }

    @Test("command-line mistakes are ArgumentParser's usage errors, naming the flag", arguments: [
        (["--vehicle"], "Missing value for '--vehicle <vehicle>'"),
        (["--connect-timeout"], "Missing value for '--connect-timeout <connect-timeout>'"),
        (["--connect-timeout", "--once"], "Missing value for '--connect-timeout <connect-timeout>'"),
        (["--connect-timeout", "soon"], "The value 'soon' is invalid for '--connect-timeout <connect-timeout>'"),
        (["--provider-urll", "x"], "Unknown option '--provider-urll'. Did you mean '--provider-url'?"),
        (["-x"], "Unknown option '-x'"),
        (["--once=yes"], "The option '--once' does not take any value, but 'yes' was specified."),
        (["--version=1"], "The option '--version' does not take any value, but '1' was specified."),
        (["extra"], "Unexpected argument 'extra'"),
        (["--once", "--", "a", "b"], "2 unexpected arguments: 'a', 'b'"),
    ])
    func commandLineErrors(_ arguments: [String], _ message: String) {
        // ArgumentParser's ValidationError describes itself by its message.
        let error = #expect(throws: (any Error).self) { try AgentCommandLine(parsing: arguments) }
        let described = error.map { "\($0)" } ?? ""
        #expect(described.hasPrefix(message), "\(described)")
    }

    @Test("the command line: values with commas stay whole, the last single value wins, lists keep their order")
    func commandLine() throws {
        let line = try AgentCommandLine(parsing: [
            "--header", "Accept: a, b", "--db", "one", "--vehicle=v-1", "--db=two", "--header=X: 1", "--once", "--config", "/c.yaml",
            "--print-config", "--vehicle", "v-2",
        ])
        #expect(line.flags["header"] == .stringArray(["Accept: a, b", "X: 1"]))
        #expect(line.flags["db"] == .string("two"))
        #expect(line.flags["vehicle"] == .stringArray(["v-1", "v-2"]))
        #expect(line.flags["once"] == .string("true"))
        #expect(line.config == "/c.yaml" && line.printConfig && !line.help)
        #expect(try AgentCommandLine(parsing: ["--vehicle", "v", "-h"]).help)
        #expect(try AgentCommandLine(parsing: ["--bogus", "--help"]).help, "help wins, as with ArgumentParser")
        #expect(try AgentCommandLine(parsing: ["--bogus", "--version"]).version, "--version is answered before other flags are judged")
        #expect(try !AgentCommandLine(parsing: ["--version", "--help"]).version, "help wins over --version")
        #expect(!line.version)
    }
}
