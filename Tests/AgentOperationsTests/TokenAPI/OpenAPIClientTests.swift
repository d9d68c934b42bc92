// Issue 31, item 4 (the README's generated client): openapi-python-client (PyPI) generates a
// Python client from docs/openapi.yaml, and a short program using only that client (and the
// httpx it is built on) talks to a real token-agent over its Unix socket and loopback TCP. The
// program starts with the README's example, word for word but for the socket path.
//
// openapi-python-client is found at FLEET_OPENAPI_PYTHON_CLIENT, else in the virtual environment
// .ci/run makes (~/.cache/fleet-token-store/openapi-python-client-venv), else on PATH; the
// program runs with the Python of the same environment (it has httpx and attrs). Without it the
// suite is skipped, unless FLEET_REQUIRE_THIRD_PARTY=1 (.ci/run sets it), when it fails.

import Foundation
import TestSupportKit
import Testing

@Suite("openapi-python-client: a client generated from docs/openapi.yaml against the live agent", .paced, .exclusive,
       .enabled(if: OpenAPIPythonClient.shouldRun,
                "needs openapi-python-client (.ci/run installs it in ~/.cache/fleet-token-store/openapi-python-client-venv; or set FLEET_OPENAPI_PYTHON_CLIENT=PATH); FLEET_REQUIRE_THIRD_PARTY=1 makes its absence a failure"))
struct OpenAPIClientTests {
    /// The README's example, verbatim: a token and the subject list over the Unix socket.
    static let readmeExample = #"""
        import httpx
        from token_agent_client import Client
        from token_agent_client.api.tokens import get_token, list_subjects
        from token_agent_client.models import FleetTokenRequest, Kind, Token

        transport = httpx.HTTPTransport(uds="/run/token-agent/api.sock")
        client = Client(base_url="http://localhost", httpx_args={"transport": transport},
                        raise_on_unexpected_status=True)
        marked = FleetTokenRequest.TRUE  # every /v1/ request carries Fleet-Token-Request: true
        answer = get_token.sync(Kind.VEHICLE, "fleet-a/truck 7", client=client, fleet_token_request=marked)
        if not isinstance(answer, Token):  # Error (400, 403, 404) or Unavailable (503)
            raise SystemExit(f"no token: {answer.error}")
        authorization = f"Bearer {answer.token}"  # good until answer.expires_at
        for subject in list_subjects.sync(client=client, fleet_token_request=marked):
            print(subject.kind, subject.id, subject.status, subject.expires_at)

        """#

    /// The test's checks, run after the example (which set `client`, `marked` and `answer`);
    /// the loopback port is the first argument. Each check prints one line the test reads.
    static let checks = #"""
        import base64, hashlib, json, sys
        from token_agent_client.api.tokens import invalidate_token
        from token_agent_client.models import Error

        def claims(jwt):
            payload = jwt.split(".")[1]
            return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))

        def check_token(token, label):
            assert token.kind == Kind.VEHICLE and token.id == "fleet-a/truck 7", (token.kind, token.id)  # no token value in messages
            assert claims(token.token)["authorization"]["vehicleid"] == "fleet-a/truck 7", claims(token.token)
            assert token.fingerprint == hashlib.sha256(token.token.encode()).hexdigest()[:12], token.fingerprint
            assert int(token.expires_at.timestamp()) == claims(token.token)["exp"], token.expires_at
            print(label, "token", token.fingerprint, token.source)

        def check_refused(client, label):
            refused = get_token.sync_detailed(Kind.VEHICLE, "not configured", client=client, fleet_token_request=marked)
            assert refused.status_code == 403 and isinstance(refused.parsed, Error), refused
            print(label, "refused", refused.status_code, refused.parsed.error)

        check_token(answer, "unix")
        subjects = list_subjects.sync(client=client, fleet_token_request=marked)
        assert [(s.kind, s.id, s.tracked) for s in subjects] == [(Kind.TRIP, "t-1", True), (Kind.VEHICLE, "fleet-a/truck 7", True)], subjects
        check_refused(client, "unix")
        first = invalidate_token.sync_detailed(Kind.TRIP, "t-1", client=client, fleet_token_request=marked)
        again = invalidate_token.sync_detailed(Kind.TRIP, "t-1", client=client, fleet_token_request=marked)
        assert first.status_code == 204 and again.status_code == 429 and isinstance(again.parsed, Error), (first, again)
        print("unix invalidate", first.status_code, again.status_code, again.parsed.error)

        tcp = Client(base_url=f"http://127.0.0.1:{int(sys.argv[1])}", raise_on_unexpected_status=True)
        check_token(get_token.sync(Kind.VEHICLE, "fleet-a/truck 7", client=tcp, fleet_token_request=marked), "tcp")
        check_refused(tcp, "tcp")
        print("done")

        """#

    @Test("the generated client gets a token (a JWT for the subject), lists subjects, and parses refusals into its Error model, over the Unix socket and loopback TCP")
    func generatedClientTalksToLiveAgent() async throws {
        let generator = try OpenAPIPythonClient.require()
        let python = try OpenAPIPythonClient.python(for: generator)
        let scratch = Scratch()
        // The generator's own environment first on PATH: it formats the client with the ruff
        // beside it, and warns ("ruff is not in PATH") without. --fail-on-warning: a document
        // the generator cannot fully turn into a client fails here.
        let bin = URL(fileURLWithPath: generator).deletingLastPathComponent().path
        let generated = try await runToEnd(
            "/bin/sh", ["-c", "cd \"$0\" && exec \"$@\"", scratch.path, generator, "generate",
                        "--path", OpenAPIConformanceTests.document, "--output-path", "token_agent_client",
                        "--meta", "none", "--fail-on-warning"],
            environment: ["PATH": bin + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")],
            in: scratch, timeout: 300)
        #expect(generated.status == 0, "openapi-python-client generate exited \(generated.status):\n\(generated.stdout)\n\(generated.stderr)")
        #expect(!(generated.stdout + generated.stderr).contains("Warning"), "\(generated.stdout)\n\(generated.stderr)")
        for module in ["api/tokens/get_token.py", "api/tokens/list_subjects.py", "api/tokens/invalidate_token.py",
                       "models/error.py", "models/token.py", "models/fleet_token_request.py"] {
            #expect(FileManager.default.fileExists(atPath: scratch.file("token_agent_client/\(module)")), "no \(module)")
        }

        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template,
                                             ["--vehicle", "fleet-a/truck 7", "--trip", "t-1"], tcp: true, logLevel: "notice")
        let port = try #require(agent.tcpPort)
        // The token the agent serves, asked without the generated client: the program must get
        // the same one.
        let answer = try await withAPIClient { (client) async throws -> [String: Any]? in
            let api = APIClient.unix(agent.socket, client)
            #expect(try await eventually(within: 60) { try await api.send("/readyz").status == 200 })
            return try await api.send("/v1/token/vehicle/fleet-a%2Ftruck%207").json
        }
        let served = try #require(answer?["fingerprint"] as? String)
        let token = try #require(answer?["token"] as? String)

        let program = scratch.file("client_check.py")
        let example = Self.readmeExample.replacingOccurrences(of: "/run/token-agent/api.sock", with: agent.socket)
        #expect(example != Self.readmeExample)
        try (example + Self.checks).write(toFile: program, atomically: true, encoding: .utf8)
        // NO_PROXY: httpx would send the loopback TCP requests through a proxy named in the
        // environment (the Unix-socket transport never uses one).
        let run = try await runToEnd("/bin/sh", ["-c", "cd \"$0\" && exec \"$@\"", scratch.path, python, program, "\(port)"],
                                     environment: ["NO_PROXY": "*"], in: scratch, timeout: 120)
        let report = "\(python) \(program) exited \(run.status):\n\(run.stdout)\n\(run.stderr)"
        #expect(run.status == 0, "\(report)")
        let lines = run.stdout.split(separator: "\n").map(String.init)
        #expect(lines.contains { $0.hasPrefix("trip t-1 valid ") }, "\(report)")
        #expect(lines.contains { $0.hasPrefix("vehicle fleet-a/truck 7 valid ") }, "\(report)")
        #expect(lines.contains("unix token \(served) provider"), "\(report)")
        #expect(lines.contains("tcp token \(served) provider"), "\(report)")
        #expect(lines.contains { $0.hasPrefix("unix refused 403 vehicle/not configured is not a configured subject") }, "\(report)")
        #expect(lines.contains { $0.hasPrefix("tcp refused 403 vehicle/not configured is not a configured subject") }, "\(report)")
        #expect(lines.contains { $0.hasPrefix("unix invalidate 204 429 trip/t-1 was invalidated") }, "\(report)")
        #expect(lines.last == "done", "\(report)")
        #expect(!run.stderr.contains(token) && !agent.process.stderr.contains(token), "a token value in the output")
        #expect(agent.process.isRunning, "\(agent.process.stderr)")
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }
}

/// Where openapi-python-client is, and the Python that runs what it generates.
enum OpenAPIPythonClient {
    static let tool = ThirdPartyTool.inVirtualEnvironment("openapi-python-client", executable: "openapi-python-client",
                                                           venv: "openapi-python-client-venv", variable: "FLEET_OPENAPI_PYTHON_CLIENT")
    /// Run when installed, or when required (then its absence fails the test).
    static var shouldRun: Bool { tool.shouldRun }
    static func require() throws -> String { try tool.require() }

    /// The Python of the generator's environment: `python` beside it (a virtual environment's
    /// bin), else the interpreter its `#!` line names (pip's launcher script).
    /// - Throws: ``ProcessFailure`` when neither is there.
    static func python(for generator: String) throws -> String {
        let beside = URL(fileURLWithPath: generator).deletingLastPathComponent().appendingPathComponent("python").path
        if FileManager.default.isExecutableFile(atPath: beside) { return beside }
        let firstLine = (try? String(contentsOfFile: generator, encoding: .utf8))?.split(separator: "\n").first ?? ""
        if firstLine.hasPrefix("#!/"), let interpreter = firstLine.dropFirst(2).split(separator: " ").first,
           FileManager.default.isExecutableFile(atPath: String(interpreter)) {
            return String(interpreter)
        }
        throw ProcessFailure(message: "no Python beside \(generator) nor on its #! line: install openapi-python-client in a virtual environment (\(tool.installHint))")
    }
}

/// The README shows the example the generated-client test runs: kept identical, whether or not
/// openapi-python-client is installed here.
@Suite("README: the generated-client example is the one OpenAPIClientTests runs", .paced)
struct OpenAPIClientReadmeTests {
    @Test("README.md contains OpenAPIClientTests.readmeExample line for line")
    func readmeShowsTheTestedExample() throws {
        let root = Checkout.root
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        // The raw string is indented by its closing delimiter's column; README has it flush.
        #expect(readme.contains("```python\n" + OpenAPIClientTests.readmeExample + "```\n"))
    }
}
