// token-agent: the reference long-lived agent. Keeps every given subject's token fresh in the
// store until SIGTERM/SIGINT, or (--once) makes sure each has a usable token and exits.

import ArgumentParser
import BuildStamp
import Configuration
import DevTokenIssuer
import FleetTokenHTTP
import FleetTokenService
import FleetTokenStore
import Foundation
import Logging
import Metrics
import Prometheus
import ServiceLifecycle
#if canImport(Glibc)
import Glibc
#endif

@main
struct TokenAgent: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "token-agent",
        abstract: "Keep Fleet Engine tokens for vehicles, trips, delivery vehicles and tasks fresh in a local store.",
        usage: AgentHelp.usage,
        discussion: """
            Without --provider-url the agent runs in DEMO MODE on an embedded development issuer \
            (not for production) and tracks a few demo subjects.

            Every option can also come from a config file (--config; its keys are the long flag names) \
            or a TOKEN_AGENT_<FLAG> variable; flags win over variables, variables over the file. \
            SIGHUP (or a change of the config file) reloads subjects, allow patterns, --allow-client rules, \
            headers, TLS files and the log level.

            Exit codes: 0 ok (every subject has a usable token with --once; clean stop on SIGTERM/SIGINT), \
            1 operational error (a subject without a usable token, a store or provider problem), 64 usage error, \
            78 the provider refused every subject (--exit-on-permanent-error).
            """)

    /// The flag that names a subject of `kind`.
    static func flagName(_ kind: TokenKind) -> String {
        let options = AgentOptionTable.options
        return switch kind {
        case .vehicle: options.vehicles.key
        case .trip: options.trips.key
        case .deliveryVehicle: options.deliveryVehicles.key
        case .task: options.tasks.key
        }
    }

    /// The settings from the flags, the environment and the config file (`--config`, else
    /// `$TOKEN_AGENT_CONFIG`), checked.
    static func settings(_ commandLine: AgentCommandLine, environment: [String: String]) async throws(UsageError) -> (AgentSettings, SettingSources) {
        let path = commandLine.config ?? environment[AgentOption.configFileVariable].flatMap { $0.isEmpty ? nil : $0 }
        var file: AgentConfigFile?
        if let path {
            do { file = try await AgentConfigFile.load(path) } catch { throw UsageError(error.description) }
        }
        let sources = SettingSources(flags: commandLine.flags, environment: environment, file: file)
        let settings = try AgentSettings.resolve(sources)
        try settings.check(environment: environment)
        do { try settings.checkSteeringFiles() } catch { throw UsageError(error.description) }
        return (settings, sources)
    }

    /// Reads the command line with the option table (AgentCommandLine.swift), not with
    /// ArgumentParser's property wrappers; ArgumentParser still reports errors and exits.
    static func main() async {
        do {
            try await run(arguments: Array(CommandLine.arguments.dropFirst()))
        } catch {
            exit(withError: error)
        }
    }

    func run() async throws {
        try await Self.run(arguments: Array(CommandLine.arguments.dropFirst()))
    }

    static func run(arguments: [String]) async throws {
        let commandLine = try AgentCommandLine(parsing: arguments)
        if commandLine.help {
            Swift.print(AgentHelp.text(configuration), terminator: "")
            return
        }
        if commandLine.version {
            Swift.print(BuildStamp.versionLine(program: "token-agent"))
            return
        }
        if commandLine.dumpHelp {
            Swift.print(AgentToolInfo(configuration).json)
            return
        }
        if let shell = commandLine.completionShell {
            Swift.print(AgentCompletions.script(shell), terminator: "")
            return
        }
        let environment = ProcessInfo.processInfo.environment
        let settings: AgentSettings
        let sources: SettingSources
        do { (settings, sources) = try await self.settings(commandLine, environment: environment) } catch { throw ValidationError(error.description) }
        if commandLine.printConfig {
            let configuration = EffectiveConfiguration(settings: settings, configFile: sources.file?.path)
            Swift.print(configuration.text, terminator: "")
            return
        }
        if commandLine.checkConfig {
            try await AgentRun(settings: settings, sources: sources, environment: environment).checkOnly()
            Swift.print("token-agent: configuration OK")
            return
        }
        try await AgentRun(settings: settings, sources: sources, environment: environment).run()
    }
}

enum DemoBanner {
    static func print(url: String, lifetime: Int, socket: String?, example: TokenKey?) {
        var lines = [
            String(repeating: "=", count: 78),
            " token-agent: DEMO MODE - NOT FOR PRODUCTION",
            " Tokens come from an embedded development issuer at",
            " \(url)",
            " that signs a token for anyone who asks (\(lifetime) s lifetime, so refreshes show soon).",
            " Pass --provider-url with your token provider's URL for real use.",
        ]
        if let socket, let example {
            lines += [" Ask it for a token from another terminal:",
                      "   curl --unix-socket \(socket) -H 'Fleet-Token-Request: true' http://localhost/v1/token/\(example.kind.rawValue)/\(example.subjectID)"]
        }
        lines.append(String(repeating: "=", count: 78))
        FileHandle.standardError.write(Data((lines.joined(separator: "\n") + "\n").utf8))
    }
}

/// The open-files limit: 1,000 idle API clients must not stop the next one being served.
enum FileDescriptorLimit {
    /// Raises the soft limit to the hard limit.
    static func raise() {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }
}
