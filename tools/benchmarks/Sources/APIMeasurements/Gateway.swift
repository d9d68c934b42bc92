// A vehicle gateway's agent (issue 32): the release token-agent built with the Swift runtime
// linked statically by tools/package/swift-build-static (as the Debian package and a gateway
// image ship it: one file, no Swift libraries on the box), five vehicles, the token API on a Unix
// socket and the file sink on.
//
// - Memory: VmRSS once every subject has been refreshed `refreshes` times (tokens of a short
//   lifetime from a development issuer of its own, so refreshes come every few seconds) and the
//   API has answered each subject; the split between anonymous memory and mapped files beside it,
//   and how much of the mapped files' pages the agent used after its first refresh of every subject
//   (the rest: pages used only while starting, and pages the kernel mapped around those used).
// - Size: the binary as built and stripped (`strip` on a copy).

import BenchmarkSupport
import DevTokenIssuer
import Foundation
#if canImport(Glibc)
import Glibc
#endif

struct GatewaySettings {
    var subjects = 5
    /// Refreshes of every subject before the reading.
    var refreshes = 10
    /// The issuer's token lifetime: a refresh comes at about 0.75 to 0.8 of it.
    var lifetime: TimeInterval = 10
}

func measureGateway(agentPath: String, scratch: String, settings: GatewaySettings) async throws -> [String: Any] {
    var results: [String: Any] = [:]
    let directory = scratch + "/gateway"
    try FileManager.default.createDirectory(atPath: directory + "/sink", withIntermediateDirectories: true)
    var configuration = DevTokenIssuer.Configuration()
    configuration.lifetime = settings.lifetime
    let issuer = try await DevTokenIssuer.start(configuration, logger: quietLogger)
    do {
        let socket = directory + "/agent.sock"
        let ids = (0..<settings.subjects).map { "gateway-\($0)" }
        let agent = try Child(agentPath, ["--db", directory + "/tokens.sqlite", "--listen", "unix:" + socket,
                                          "--sink", directory + "/sink", "--provider-url", issuer.urlTemplate, "--no-proxy",
                                          "--log-level", "warning"] + ids.flatMap { ["--vehicle", $0] },
                              log: directory + "/agent.log")
        defer { agent.stop() }
        let connection = try waitUntilServing(socket, tokenRequest("vehicle", ids[0]), child: agent)
        // A first token and `refreshes` more for every subject.
        let wanted = settings.subjects * (settings.refreshes + 1)
        let deadline = monotonicNanoseconds() + UInt64((Double(settings.refreshes + 2) * settings.lifetime * 2) * 1e9)
        // Pages used from here on: the agent started, and refreshed every subject once.
        var referencesCleared = false
        while issuer.issuedCount < wanted {
            if !referencesCleared && issuer.issuedCount >= settings.subjects * 2 {
                guard agent.clearReferencedPages() else { throw MeasurementError("cannot write /proc/\(agent.pid)/clear_refs") }
                referencesCleared = true
            }
            guard agent.isRunning else { throw MeasurementError("the gateway agent exited:\n\(agent.logTail)") }
            guard monotonicNanoseconds() < deadline else {
                throw MeasurementError("the gateway agent fetched \(issuer.issuedCount) tokens of \(wanted) in time")
            }
            for id in ids {
                let status = try connection.exchange(tokenRequest("vehicle", id))
                guard status == 200 else { throw MeasurementError("status \(status) from the gateway agent for \(id)") }
            }
            try await Task.sleep(for: .milliseconds(500))
        }
        for id in ids where !FileManager.default.fileExists(atPath: directory + "/sink/vehicle/\(id).jwt") {
            throw MeasurementError("the gateway agent's sink has no file for \(id)")
        }
        try await Task.sleep(for: .seconds(2))
        results.merge(residentFigures(of: agent, suffix: "5_subjects")) { $1 }
        results["agent_files_referenced_mib_5_subjects"] = rounded(Double(agent.referencedFileKiB()) / 1024, 1)
        results["agent_threads_5_subjects"] = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(agent.pid)/task").count) ?? 0
        results["gateway_tokens_fetched"] = issuer.issuedCount
    } catch {
        await issuer.stop()
        throw error
    }
    await issuer.stop()

    // The binary: as built, and stripped (a copy: the build's own file keeps its symbols).
    let builtBytes = (try FileManager.default.attributesOfItem(atPath: agentPath)[.size] as? Int) ?? 0
    let stripped = directory + "/token-agent.stripped"
    try? FileManager.default.removeItem(atPath: stripped)
    try FileManager.default.copyItem(atPath: agentPath, toPath: stripped)
    let strip = try Child("/usr/bin/strip", [stripped], log: directory + "/strip.log")
    guard strip.wait() == 0 else { throw MeasurementError("strip failed: \(strip.output)") }
    let strippedBytes = (try FileManager.default.attributesOfItem(atPath: stripped)[.size] as? Int) ?? 0
    results["agent_binary_mib"] = rounded(Double(strippedBytes) / 1_048_576, 1)
    results["agent_binary_mib_as_built"] = rounded(Double(builtBytes) / 1_048_576, 1)
    return results
}
