// Issue 31 item 3: the man pages and shell completions are generated from the command
// definitions (tools/package/generate-manuals: swift-argument-parser's generate-manual over each
// tool's `--experimental-dump-help`, and `--generate-completion-script`), so they cannot drift
// from `--help`. These tests run the real script on the built binaries and read its output:
// every long option `--help` lists is in the page, and token-agent's option table reaches the
// page and the completions (an option added to the table is checked without touching them).

import Foundation
import TestSupportKit
import Testing
@testable import token_agent

/// swift-argument-parser's generate-manual, where tools/package/generate-manuals builds it. Not
/// built by the tests: a minute of compiling in the middle of the suite starved the tests that
/// wait on engines and processes beside it (two fresh-clone CI runs failed 4 and 6 of them).
enum GenerateManualTool {
    static let tool = ThirdPartyTool("generate-manual", candidates: [
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent(".build/generate-manual/debug/generate-manual").path,
        productsDirectory.appendingPathComponent("generate-manual").path,
    ], installHint: "tools/package/generate-manuals OUTDIR builds it once (about a minute)")
}

@Suite("man pages and shell completions, generated from the command definitions", .paced, .serialized,
       .enabled(if: GenerateManualTool.tool.shouldRun,
                "needs swift-argument-parser's generate-manual, built once by tools/package/generate-manuals (.ci/run does before the tests); FLEET_REQUIRE_THIRD_PARTY=1 makes its absence a failure"))
struct ManualPageTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// Holds the generated files for the whole run (one generation serves every test).
    static let scratch = Scratch()

    /// The script's output directory, made once for the suite.
    static let generated: Result<String, ProcessFailure> = {
        let out = scratch.file("manuals")
        do {
            _ = try GenerateManualTool.tool.require()
            let result = try runCapturing(["/bin/bash", root.appendingPathComponent("tools/package/generate-manuals").path, out, productsDirectory.path],
                                          timeout: 300)
            guard result.status == 0 else { return .failure(ProcessFailure(message: "generate-manuals exited \(result.status): \(result.stderr)")) }
            return .success(out)
        } catch {
            return .failure(ProcessFailure(message: "\(error)"))
        }
    }()

    static func file(_ relative: String) throws -> String {
        let out = try generated.get()
        return try String(contentsOfFile: "\(out)/\(relative)", encoding: .utf8)
    }

    /// The long options a `--help` text lists (`  --db <db>`, `  -h, --help`; wrapped help
    /// lines are indented further).
    static func longOptions(inHelp help: String) -> [String] {
        help.split(separator: "\n").compactMap { line in
            guard line.hasPrefix("  ") && !line.hasPrefix("   ") else { return nil }
            var rest = line.dropFirst(2)
            if rest.hasPrefix("-h, ") { rest = rest.dropFirst(4) }
            guard rest.hasPrefix("--") else { return nil }
            return String(rest.dropFirst(2).prefix { $0.isLetter || $0.isNumber || $0 == "-" })
        }
    }

    /// The subcommands a `--help` text lists under SUBCOMMANDS.
    static func subcommands(inHelp help: String) -> [String] {
        guard let section = help.range(of: "SUBCOMMANDS:\n") else { return [] }
        return help[section.upperBound...].split(separator: "\n", omittingEmptySubsequences: false)
            .prefix { !$0.isEmpty }
            .filter { $0.hasPrefix("  ") && !$0.hasPrefix("   ") }
            .compactMap { $0.split(separator: " ").first.map(String.init) }
    }

    static func help(_ tool: String, _ arguments: [String] = []) async throws -> String {
        let result = try await runToEnd(tool, arguments + ["--help"], in: Scratch())
        #expect(result.status == 0, "\(tool) \(arguments) --help: \(result.stderr)")
        return result.stdout
    }

    @Test("token-agent's man page names every long option of --help, and every option of the table --help shows", .timeLimit(.minutes(10)))
    func tokenAgentPage() async throws {
        let page = try Self.file("man/man1/token-agent.1")
        #expect(page.contains(".Dt TOKEN-AGENT 1"), "\(page.prefix(300))")
        #expect(page.contains(".Nd \"Keep Fleet Engine tokens"))
        let options = Self.longOptions(inHelp: try await Self.help("token-agent"))
        #expect(options.count > 40 && options.contains("check-config") && options.contains("help"), "\(options)")
        for option in options {
            #expect(page.contains(".It Fl -\(option)") || page.contains("Fl h , -\(option)"), "--\(option) of --help is not in token-agent.1")
        }
        // From the table itself: what --help shows reaches the page, what it hides does not.
        for option in AgentOption.all {
            #expect(page.contains(".It Fl -\(option.key)") != option.hidden, "--\(option.key) (hidden: \(option.hidden))")
        }
        // A choice's values, as --help gives them.
        #expect(page.contains("(values: trace, debug, info, notice, warning, error, critical)"))
    }

    @Test("tokenctl's man page names every long option of --help, its subcommands' included")
    func tokenctlPage() async throws {
        let page = try Self.file("man/man1/tokenctl.1")
        let help = try await Self.help("tokenctl")
        let subcommands = Self.subcommands(inHelp: help)
        #expect(subcommands.count >= 7 && subcommands.contains("rekey"), "\(subcommands)")
        var checked = 0
        for option in Self.longOptions(inHelp: help) {
            #expect(page.contains("Fl -\(option)"), "tokenctl --\(option) is not in tokenctl.1")
            checked += 1
        }
        for subcommand in subcommands {
            #expect(page.contains(".It Em \(subcommand)"), "subcommand \(subcommand) is not in tokenctl.1")
            for option in Self.longOptions(inHelp: try await Self.help("tokenctl", [subcommand])) {
                #expect(page.contains("Fl -\(option)"), "tokenctl \(subcommand) --\(option) is not in tokenctl.1")
                checked += 1
            }
        }
        #expect(checked > 30)
        #expect(page.contains("Fl -config Ar config"), "tokenctl --config")
        // dev-token-server's page too (its binary is built with the others).
        #expect(try Self.file("man/man1/dev-token-server.1").contains(".Dt DEV-TOKEN-SERVER 1"))
    }

    @Test("token-agent's completion scripts name every option of the table --help shows; bash completes names and choice values")
    func tokenAgentCompletions() async throws {
        let bash = try Self.file("completions/bash/token-agent")
        let zsh = try Self.file("completions/zsh/_token-agent")
        let fish = try Self.file("completions/fish/token-agent.fish")
        for option in AgentOption.all where !option.hidden {
            #expect(bash.contains(" --\(option.key) ") || bash.contains(" --\(option.key)\""), "bash: --\(option.key)")
            #expect(zsh.contains("--\(option.key)["), "zsh: --\(option.key)")
            #expect(fish.contains("-l \(option.key) "), "fish: --\(option.key)")
        }
        for (key, _, _) in AgentCommandLine.commandLineOnly {
            #expect(bash.contains("--\(key)") && zsh.contains("--\(key)[") && fish.contains("-l \(key) "), "--\(key)")
        }
        #expect(zsh.hasPrefix("#compdef token-agent\n"))

        // The bash script, sourced by bash, completes a flag's name and a choice's values.
        let scratch = Scratch()
        let script = scratch.file("complete.sh")
        try """
        source "$1"
        COMP_WORDS=(token-agent --log-l); COMP_CWORD=1; _token_agent; echo "${COMPREPLY[*]}"
        COMP_WORDS=(token-agent --log-level d); COMP_CWORD=2; _token_agent; echo "${COMPREPLY[*]}"
        COMP_WORDS=(token-agent --provider-url ''); COMP_CWORD=2; _token_agent; echo "${#COMPREPLY[@]}"
        """.write(toFile: script, atomically: true, encoding: .utf8)
        let out = try Self.generated.get()
        let run = try await runCapturing(["/bin/bash", script, "\(out)/completions/bash/token-agent"])
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.stdout == "--log-level\ndebug\n0\n", "\(run.stdout)")
        #expect(try await runCapturing(["/bin/bash", "-n", "\(out)/completions/bash/tokenctl"]).status == 0)
        // zsh and fish, where installed (not required: CI has neither), parse the scripts, and
        // fish completes a choice's values from its own.
        if let zshShell = executable(["/usr/bin/zsh", "/bin/zsh"]) {
            #expect(try await runCapturing([zshShell, "-n", "\(out)/completions/zsh/_token-agent"]).status == 0)
        }
        if let fishShell = executable(["/usr/bin/fish", "/bin/fish"]) {
            let fishFile = "\(out)/completions/fish/token-agent.fish"
            #expect(try await runCapturing([fishShell, "-n", fishFile]).status == 0)
            let values = try await runCapturing([fishShell, "-c", "source \(fishFile); complete -C 'token-agent --log-format '"])
            #expect(values.stdout.split(separator: "\n").map { $0.prefix { $0 != "\t" } } == ["json", "text"], "\(values.stdout)")
        }
        let (zshTokenctl, fishTokenctl) = (try Self.file("completions/zsh/_tokenctl"), try Self.file("completions/fish/tokenctl.fish"))
        #expect(zshTokenctl.contains("--db") && fishTokenctl.contains("'db='"), "tokenctl's completions")
    }

    @Test("--experimental-dump-help is ArgumentParser's ToolInfo (version 0); a bad --generate-completion-script shell is a usage error")
    func dumpHelpAndBadShell() async throws {
        let scratch = Scratch()
        let dump = try await AgentFixture.run(["--experimental-dump-help"], in: scratch)
        #expect(dump.status == 0)
        let json = try #require(try JSONSerialization.jsonObject(with: Data(dump.stdout.utf8)) as? [String: Any])
        #expect(json["serializationVersion"] as? Int == 0)
        let command = try #require(json["command"] as? [String: Any])
        #expect(command["commandName"] as? String == "token-agent")
        let names = (command["arguments"] as? [[String: Any]] ?? []).compactMap { ($0["preferredName"] as? [String: Any])?["name"] as? String }
        #expect(names == AgentHelp.entries.map(\.key) + ["help"])

        let bad = try await AgentFixture.run(["--generate-completion-script", "tcsh"], in: scratch)
        #expect(bad.status == 64)
        #expect(bad.stderr.contains("The value 'tcsh' is invalid for '--generate-completion-script <shell>'"), "\(bad.stderr)")
    }
}
