// Issue 31, item 5: a real token-agent's /metrics as Prometheus's own linter sees it
// (`promtool check metrics`), and the README's sample alert rules (docs/alerts.yaml) checked and
// run on made-up series by promtool (`check rules`, `test rules` with docs/alerts.test.yaml).
//
// Without promtool (Debian's `prometheus` package) the suite is skipped, unless
// FLEET_REQUIRE_THIRD_PARTY=1 (.ci/run installs it and sets that), when it fails saying so.

import BuildStamp
import FleetTokenStore
import Foundation
import TestSupportKit
import Testing

@Suite("Prometheus's promtool on a live agent's /metrics and on the sample alert rules", .paced, .exclusive,
       .enabled(if: Promtool.shouldRun,
                "needs promtool (apt-get install prometheus; or FLEET_PROMTOOL=PATH); FLEET_REQUIRE_THIRD_PARTY=1 makes its absence a failure"))
struct PrometheusConformanceTests {
    @Test("a serving agent's /metrics: promtool finds nothing; build info, the earliest tracked expiry, no subject labels")
    func servingAgentMetrics() async throws {
        let promtool = try Promtool.require()
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template,
                                             ["--vehicle", "v-1", "--trip", "t-1", "--allow", "task:*"], tcp: true)
        try await withAPIClient { (client) async throws in
            let api = APIClient.tcp(try #require(agent.tcpPort), client)
            #expect(try await eventually(within: 60) { try await api.send("/readyz").status == 200 })
            // An on-demand subject: held, not tracked, so it must not move the expiry gauge.
            #expect(try await api.send("/v1/token/task/on-demand-1").status == 200)
            _ = try await api.send("/v1/token/vehicle/v-1")

            let metrics = try await api.send("/metrics", marked: false)
            #expect(metrics.status == 200)
            try expectNoFindings(promtool, metrics.body, in: scratch)

            // Every metric of the catalog the agent has made has its HELP line.
            for metric in FleetTokenMetric.all where metrics.body.contains("# TYPE \(metric.name) ") {
                #expect(metrics.body.contains("# HELP \(metric.name) \(metric.help)\n"), "\(metric.name)")
            }
            let buildInfo = metrics.body.split(separator: "\n").filter { $0.hasPrefix("fleet_tokens_build_info{") }
            #expect(buildInfo.count == 1, "\(metrics.body)")
            // The version and the revision the agent was built from, as its --version says
            // (VersionOutputTests: the stamp's revision is HEAD's).
            #expect(buildInfo.first == "fleet_tokens_build_info{version=\"\(BuildStamp.version)\",revision=\"\(BuildStamp.revision)\"} 1.0")

            // The gauge is the earliest expiry of the tracked subjects, as /v1/subjects shows them
            // (whole seconds there).
            let subjects = try await api.send("/v1/subjects")
            let list = try #require(try JSONSerialization.jsonObject(with: Data(subjects.body.utf8)) as? [[String: Any]])
            let tracked = list.filter { $0["tracked"] as? Bool == true }
            #expect(tracked.count == 2 && list.count == 3, "\(subjects.body)")
            let expiries = tracked.compactMap { ($0["expires_at"] as? String).flatMap { try? Date($0, strategy: .iso8601) } }
            let earliest = try #require(expiries.min())
            let gauge = try #require(sample(FleetTokenMetric.earliestExpiry.name, in: metrics.body), "\(metrics.body)")
            #expect(abs(gauge - earliest.timeIntervalSince1970) < 2, "gauge \(gauge), earliest tracked expires_at \(earliest)")

            // Bounded cardinality: no series names a subject.
            for id in ["v-1", "t-1", "on-demand-1"] { #expect(!metrics.body.contains(id)) }
        }
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }

    @Test("an agent whose provider fails: failures counted by `error` (not `kind`), the expiry gauge 0, promtool finds nothing")
    func failingProviderMetrics() async throws {
        let promtool = try Promtool.require()
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template + "?fault=status&status=503", ["--vehicle", "v-1"])
        try await withAPIClient { (client) async throws in
            let api = APIClient.unix(agent.socket, client)
            var body = ""
            #expect(try await eventually(within: 60) {
                body = try await api.send("/metrics").body
                return body.contains("fleet_tokens_refresh_failures_total{")
            }, "\(body)")
            let failures = body.split(separator: "\n").filter { $0.hasPrefix("fleet_tokens_refresh_failures_total{") }
            #expect(!failures.isEmpty && failures.allSatisfy { $0.hasPrefix("fleet_tokens_refresh_failures_total{error=\"httpStatus\"}") },
                    "\(failures)")
            #expect(sample(FleetTokenMetric.earliestExpiry.name, in: body) == 0, "a tracked subject holds no token")
            try expectNoFindings(promtool, body, in: scratch)
        }
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }

    @Test("docs/alerts.yaml: promtool check rules passes, and test rules fires each alert when it should and not before")
    func alertRules() throws {
        let promtool = try Promtool.require()
        let docs = Checkout.root.appendingPathComponent("docs")
        let check = try runCapturing([promtool, "check", "rules", docs.appendingPathComponent("alerts.yaml").path])
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
        #expect(check.stdout.contains("SUCCESS: 2 rules found"), "\(check.stdout)\(check.stderr)")
        let test = try runCapturing([promtool, "test", "rules", docs.appendingPathComponent("alerts.test.yaml").path])
        #expect(test.status == 0, "\(test.stdout)\(test.stderr)")
        #expect(test.stdout.contains("SUCCESS"), "\(test.stdout)\(test.stderr)")
    }

    /// Runs `promtool check metrics` on `text` (its stdin) and expects it to pass with no output:
    /// promtool prints one line per finding ("no help text", "counter metrics should have
    /// _total suffix", ...).
    private func expectNoFindings(_ promtool: String, _ text: String, in scratch: Scratch) throws {
        let file = scratch.file("metrics-\(UUID().uuidString.prefix(8)).prom")
        try text.write(toFile: file, atomically: true, encoding: .utf8)
        let result = try runCapturing(["/bin/sh", "-c", "exec \"$0\" check metrics < \"$1\"", promtool, file])
        #expect(result.status == 0 && result.stdout.isEmpty && result.stderr.isEmpty,
                "promtool check metrics (exit \(result.status)):\n\(result.stdout)\(result.stderr)\non:\n\(text)")
    }
}

/// Where promtool is: `FLEET_PROMTOOL`, else Debian's `/usr/bin/promtool`.
enum Promtool {
    static let tool = ThirdPartyTool("promtool", variable: "FLEET_PROMTOOL", candidates: ["/usr/bin/promtool", "/usr/local/bin/promtool"],
                                     installHint: "apt-get install prometheus (.ci/run does this)")
    /// Run when installed, or when required (then its absence fails the test).
    static var shouldRun: Bool { tool.shouldRun }
    static func require() throws -> String { try tool.require() }
}
