// Issue 31, item 4: docs/openapi.yaml against a real token-agent on loopback TCP, checked by
// Schemathesis (PyPI) with its stock checks: no server error, every status, content type and
// response body as the document says.
//
// Schemathesis is found at FLEET_SCHEMATHESIS, else in the virtual environment .ci/run makes
// (~/.cache/fleet-token-store/schemathesis-venv), else on PATH. Without it the suite is skipped,
// unless FLEET_REQUIRE_THIRD_PARTY=1 (.ci/run installs it and sets that), when it fails.

import Foundation
import TestSupportKit
import Testing

@Suite("Schemathesis: the live token API against docs/openapi.yaml", .paced, .exclusive,
       .enabled(if: Schemathesis.shouldRun,
                "needs Schemathesis (.ci/run installs it in ~/.cache/fleet-token-store/schemathesis-venv; or set FLEET_SCHEMATHESIS=PATH); FLEET_REQUIRE_THIRD_PARTY=1 makes its absence a failure"))
struct OpenAPIConformanceTests {
    static let document = Checkout.root.appendingPathComponent("docs/openapi.yaml").path
    static let checks = ["not_a_server_error", "status_code_conformance", "content_type_conformance", "response_schema_conformance"]

    @Test("every operation, generated and negative requests: Schemathesis's stock checks find nothing")
    func stockChecksFindNothing() async throws {
        let schemathesis = try Schemathesis.require()
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        // Configured subjects, and every kind allowed on demand: generated ids get real tokens
        // (or a provider's refusal), not only 403s.
        let agent = try await APIAgent.start(scratch, provider: issuer.template, [
            "--vehicle", "v-1", "--trip", "t-1",
            "--allow", "vehicle:*", "--allow", "trip:*", "--allow", "deliveryVehicle:*", "--allow", "task:*",
        ], tcp: true, logLevel: "notice")
        let port = try #require(agent.tcpPort)
        try await withAPIClient { (client) async throws in
            let api = APIClient.tcp(port, client)
            #expect(try await eventually(within: 60) { try await api.send("/readyz").status == 200 })
        }
        let arguments = Schemathesis.arguments(document: Self.document, port: port, checks: Self.checks, scratch: scratch)
        // Run in the scratch directory: Schemathesis keeps its example database in the working one.
        let run = try await runToEnd("/bin/sh", ["-c", "cd \"$0\" && exec \"$@\"", scratch.path, schemathesis] + arguments,
                                     in: scratch, timeout: 900)
        #expect(run.status == 0, "schemathesis \(arguments.joined(separator: " ")) exited \(run.status):\n\(run.stdout)\n\(run.stderr)")
        // A run that tested nothing would pass too: every operation of the document was tested,
        // in the coverage and fuzzing phases.
        #expect(run.stdout.contains("No issues found"), "\(run.stdout)\n\(run.stderr)")
        #expect(run.stdout.contains("Operations:       6 selected / 6 total") && run.stdout.contains("Tested: 6"), "\(run.stdout)")
        #expect(run.stdout.contains("✅ Coverage") && run.stdout.contains("✅ Fuzzing"), "\(run.stdout)")
        #expect(agent.process.isRunning, "\(agent.process.stderr)")
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }
}

/// Where Schemathesis is, and how it is run.
enum Schemathesis {
    static let tool = ThirdPartyTool.inVirtualEnvironment("Schemathesis", executable: "schemathesis",
                                                           venv: "schemathesis-venv", variable: "FLEET_SCHEMATHESIS")
    /// Run when installed, or when required (then its absence fails the test).
    static var shouldRun: Bool { tool.shouldRun }
    static func require() throws -> String { try tool.require() }

    /// `schemathesis run` on `document` against loopback `port`, with the token API's request
    /// header and a loopback Host on every request, only `checks`, a fixed seed, and no example
    /// database kept between runs.
    static func arguments(document: String, port: Int, checks: [String], scratch: Scratch) -> [String] {
        ["--no-color", "run", document,
         "--url", "http://127.0.0.1:\(port)",
         "--checks", checks.joined(separator: ","),
         "--header", "Fleet-Token-Request: true",
         "--header", "Host: 127.0.0.1:\(port)",
         "--max-examples", "150",
         "--seed", "31",
         "--generation-database", "none"]
    }
}
