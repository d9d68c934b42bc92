// The one agent fixture of the suites that start token-agent processes: how the agent is
// started (its arguments, environment and an optional wrapper such as `setpriv` or a shell
// that lowers a limit), how a test waits until it serves, and how it is stopped. Every test in
// this target starts token-agent through it.

import Foundation
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

/// Starts token-agent processes for the tests, run to the end or kept running.
enum AgentFixture {
    /// The token-agent executable SwiftPM built beside the test bundle.
    static var path: String { productsDirectory.appendingPathComponent("token-agent").path }

    /// An environment with every proxy variable empty: the agent must not reach a provider on
    /// 127.0.0.1 through a proxy from the machine's environment.
    static let noProxy = ["HTTPS_PROXY": "", "https_proxy": "", "HTTP_PROXY": "", "http_proxy": "",
                          "NO_PROXY": "", "no_proxy": ""]

    /// Starts token-agent with `arguments` and returns at once (no waiting: the test waits for
    /// what it looks at). `wrapper` is a command the agent runs under (an absolute executable
    /// and its arguments, the agent's path and `arguments` appended), as `setpriv …` or
    /// `/bin/sh -c 'ulimit -n 64; exec "$0" "$@"'`.
    /// - Throws: ``ProcessFailure`` when the process cannot be started.
    static func launch(_ arguments: [String], environment: [String: String] = [:], wrapper: [String] = [],
                       in scratch: Scratch) throws -> RunningProcess {
        guard let executable = wrapper.first else {
            return try RunningProcess("token-agent", arguments, environment: environment, in: scratch)
        }
        return try RunningProcess(executable, Array(wrapper.dropFirst()) + [path] + arguments, environment: environment, in: scratch)
    }

    /// Runs token-agent to its exit (`--once`, `--print-config`, a refusal at start) within
    /// `timeout` seconds; its status and output.
    /// - Throws: ``ProcessFailure`` when it cannot start or does not exit in time (it is killed).
    static func run(_ arguments: [String], environment: [String: String] = [:], wrapper: [String] = [],
                    in scratch: Scratch, timeout: Double = 60) async throws -> (status: Int32, stdout: String, stderr: String) {
        let process = try launch(arguments, environment: environment, wrapper: wrapper, in: scratch)
        guard let status = await process.wait(upTo: timeout) else {
            process.signal(SIGKILL)
            throw ProcessFailure(message: "token-agent \(arguments) did not finish in \(timeout) s; stderr: \(process.stderr)")
        }
        return (status, process.stdout, process.stderr)
    }

    /// ``run(_:environment:wrapper:in:timeout:)`` with no proxy from the machine's environment
    /// (``noProxy`` under `environment`): the transport tests choose their proxy explicitly.
    static func runDirect(_ arguments: [String], _ scratch: Scratch,
                          environment: [String: String] = [:]) async throws -> (status: Int32, stdout: String, stderr: String) {
        try await run(arguments, environment: noProxy.merging(environment) { $1 }, in: scratch, timeout: 60)
    }

    /// ``launch(_:environment:wrapper:in:)`` with no proxy from the machine's environment, as
    /// ``runDirect(_:_:environment:)``.
    static func launchDirect(_ arguments: [String], _ scratch: Scratch, environment: [String: String] = [:]) throws -> RunningProcess {
        try launch(arguments, environment: noProxy.merging(environment) { $1 }, in: scratch)
    }

    /// Starts a long-lived token-agent and returns once its token API listens on `listeners`
    /// addresses (its "token API listening" notices; the agent must log at notice or finer).
    /// - Throws: ``ProcessFailure`` when it exits or does not listen within `seconds` (it is
    ///   then stopped).
    static func serving(_ arguments: [String], environment: [String: String] = [:], wrapper: [String] = [],
                        listeners: Int = 1, in scratch: Scratch, within seconds: Double = 30) async throws -> ServingAgent {
        let process = try launch(arguments, environment: environment, wrapper: wrapper, in: scratch)
        let listening = { process.stderr.components(separatedBy: "token API listening").count - 1 >= listeners }
        _ = await eventually(within: seconds) { !process.isRunning || listening() }
        guard listening() else {
            process.signal(SIGKILL)
            throw ProcessFailure(message: "token-agent did not start listening: \(process.stderr)")
        }
        return ServingAgent(process: process)
    }
}

/// A token-agent whose token API listens (``AgentFixture/serving(_:environment:wrapper:listeners:in:within:)``).
struct ServingAgent: Sendable {
    /// The running process.
    let process: RunningProcess

    /// The port of its first loopback TCP listener, as it logged it; nil without one.
    var tcpPort: Int? {
        guard let range = process.stderr.range(of: #"address=127\.0\.0\.1:\d+"#, options: .regularExpression) else { return nil }
        return Int(process.stderr[range].split(separator: ":").last!)
    }

    /// Sends SIGTERM and waits (bounded); the exit status, nil if it did not stop in `seconds`.
    func stop(within seconds: Double = 60) async -> Int32? {
        process.signal(SIGTERM)
        return await process.wait(upTo: seconds)
    }
}
