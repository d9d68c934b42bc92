// Issue 18: token-agent's config file, TOKEN_AGENT_* variables and flags, through the real
// executable: every key once, precedence, the shipped sample, and bad input (exit 64 naming the
// key and the line). `--print-config` shows what the agent would run with, so these tests need
// no provider.

import Foundation
import TestSupportKit
import Testing

@Suite("token-agent configuration: file, environment, flags", .paced)
struct ConfigFileTests {
    /// Every option once, each on its own line (the line numbers are asserted).
    static func everyKey(_ scratch: Scratch) -> String {
        """
        # every option once
        db: \(scratch.file("tokens.sqlite"))
        encryption-key-file: [\(scratch.file("token-store.key"))]
        provider-url: https://auth.example.com/fleet/{kind}/{id}
        vehicle: [truck-7, truck-8]
        trip: [trip-1]
        delivery-vehicle: [dv-1]
        task: [task-1]
        subjects-file: \(scratch.file("subjects.txt"))
        header: ["Authorization: Bearer file-secret-value"]
        header-file: ["X-Api-Key:\(scratch.file("key.txt"))"]
        method: POST
        body-template: '{"vehicleId":"{id}","secret":"body-secret-value"}'
        content-type: application/json
        ca-file: [\(scratch.file("ca.pem"))]
        extra-ca-file: [\(scratch.file("extra.pem"))]
        client-cert: \(scratch.file("client.pem"))
        client-key: \(scratch.file("client.key"))
        proxy: http://user:proxy-secret-value@127.0.0.1:3128
        no-proxy: false
        token-key: /data/token
        expiration-key: /data/expires
        expiration-format: epoch-seconds
        allow-insecure-http: true
        allow-opaque-tokens: true
        connect-timeout: 7
        request-timeout: 20
        retention: 7d
        once: false
        json: true
        max-event-lines: 200
        log-level: debug
        log-format: json
        listen: ["unix:\(scratch.file("api.sock"))"]
        allow-non-loopback-listen: false
        socket-mode: "0600"
        allow: ["trip:*"]
        allow-client: ["uid:4242 vehicle:v-*"]
        invalidate-interval: 30s
        sink: \(scratch.file("sink"))
        sink-mode: "0600"
        exit-on-permanent-error: true
        permanent-error-attempts: 5
        max-dynamic-subjects: 500
        max-api-connections: 300
        max-api-connections-per-peer: 20
        fleet-engine-listen: ["unix:\(scratch.file("fleet.sock"))"]
        fleet-engine-url: https://fleet.example.test
        fleet-engine-ca-file: \(scratch.file("fleet-ca.pem"))
        fleet-engine-default-subject: vehicle:fleet-admin
        demo-lifetime: 60
        lease-duration: 10
        idle-window: 30
        failure-backoff: 2
        event-line-window: 5
        """
    }

    static let secrets = ["file-secret-value", "body-secret-value", "proxy-secret-value", "env-secret-value", "flag-secret-value"]

    /// `--print-config`'s lines by key: (value text, origin).
    static func printed(_ stdout: String) -> [String: (value: String, origin: String)] {
        var result: [String: (String, String)] = [:]
        for line in stdout.split(separator: "\n") where !line.hasPrefix("#") {
            guard let colon = line.firstIndex(of: ":"), let hash = line.range(of: "  # ", options: .backwards) else { continue }
            let key = String(line[..<colon])
            let value = line[line.index(after: colon)..<hash.lowerBound].trimmingCharacters(in: .whitespaces)
            result[key] = (value, String(line[hash.upperBound...]))
        }
        return result
    }

    @Test("a file setting every option once loads; each value is printed with its file and line, secrets redacted")
    func everyOptionOnce() async throws {
        let scratch = Scratch()
        let path = scratch.file("token-agent.yaml")
        let text = Self.everyKey(scratch)
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        let result = try await AgentFixture.run(["--config", path, "--print-config"], in: scratch)
        #expect(result.status == 0, "\(result.stderr)")
        let printed = Self.printed(result.stdout)
        let fileLines = text.split(separator: "\n", omittingEmptySubsequences: false)
        var keysInFile: Set<String> = []
        for (index, line) in fileLines.enumerated() where !line.hasPrefix("#") {
            let key = String(line[..<line.firstIndex(of: ":")!])
            keysInFile.insert(key)
            #expect(printed[key]?.origin == "\(path):\(index + 1) (\(key))", "\(key): \(String(describing: printed[key]))")
        }
        // Every option the agent knows is in the file: an option added later must join it.
        #expect(Set(printed.keys) == keysInFile, "printed but not in the file: \(Set(printed.keys).subtracting(keysInFile))")
        #expect(printed["vehicle"]?.value == #"["truck-7", "truck-8"]"#)
        #expect(printed["connect-timeout"]?.value == "7")
        #expect(printed["log-format"]?.value == "json")
        #expect(printed["header"]?.value == #"["Authorization: <redacted>"]"#)
        #expect(printed["body-template"]?.value == #""<redacted>""#)
        #expect(printed["proxy"]?.value.contains("user:***@127.0.0.1:3128") == true, "\(String(describing: printed["proxy"]))")
        for secret in Self.secrets { #expect(!result.stdout.contains(secret) && !result.stderr.contains(secret)) }

        // The same file as JSON reads the same.
        let json = scratch.file("token-agent.json")
        try #"{"provider-url": "https://auth.example.com/{kind}/{id}", "vehicle": ["a", "b"], "connect-timeout": 3}"#
            .write(toFile: json, atomically: true, encoding: .utf8)
        let fromJSON = try await AgentFixture.run(["--config", json, "--print-config"], in: scratch)
        #expect(fromJSON.status == 0, "\(fromJSON.stderr)")
        #expect(Self.printed(fromJSON.stdout)["vehicle"]?.value == #"["a", "b"]"#)
        #expect(Self.printed(fromJSON.stdout)["connect-timeout"]?.origin == "\(json):1 (connect-timeout)")
    }

    @Test("flags win over TOKEN_AGENT_* variables, variables over the file, the file over defaults; TOKEN_AGENT_CONFIG names the file")
    func precedence() async throws {
        let scratch = Scratch()
        let path = scratch.file("agent.yaml")
        try """
        provider-url: https://file.example.com/{kind}/{id}
        vehicle: [from-file]
        log-level: debug
        connect-timeout: 7
        request-timeout: 20
        header: ["Authorization: Bearer file-secret-value"]
        """.write(toFile: path, atomically: true, encoding: .utf8)
        let environment = [
            "TOKEN_AGENT_CONFIG": path, "TOKEN_AGENT_LOG_LEVEL": "warning", "TOKEN_AGENT_CONNECT_TIMEOUT": "8",
            "TOKEN_AGENT_VEHICLE": "env-a,env-b", "TOKEN_AGENT_HEADER": "Authorization: Bearer env-secret-value",
        ]
        let result = try await AgentFixture.run(["--print-config", "--connect-timeout", "9", "--header", "X-Flag: flag-secret-value"],
                                        environment: environment, in: scratch)
        #expect(result.status == 0, "\(result.stderr)")
        let printed = Self.printed(result.stdout)
        #expect(printed["connect-timeout"]?.value == "9" && printed["connect-timeout"]?.origin == "--connect-timeout")
        #expect(printed["log-level"]?.value == "warning" && printed["log-level"]?.origin == "TOKEN_AGENT_LOG_LEVEL")
        #expect(printed["vehicle"]?.value == #"["env-a", "env-b"]"# && printed["vehicle"]?.origin == "TOKEN_AGENT_VEHICLE")
        #expect(printed["request-timeout"]?.value == "20" && printed["request-timeout"]?.origin == "\(path):5 (request-timeout)")
        #expect(printed["provider-url"]?.origin == "\(path):1 (provider-url)")
        #expect(printed["retention"]?.value == "1d" && printed["retention"]?.origin == "default")
        // A list given by a higher source replaces the lower one's whole.
        #expect(printed["header"]?.value == #"["X-Flag: <redacted>"]"# && printed["header"]?.origin == "--header")
        #expect(result.stdout.contains("Config file: \(path)."))

        // Header values may hold commas: in a variable, headers go one a line.
        let headers = try await AgentFixture.run(["--config", path, "--print-config"],
                                         environment: ["TOKEN_AGENT_HEADER": "Accept: a, b\nX-Other: c"], in: scratch)
        #expect(headers.status == 0, "\(headers.stderr)")
        #expect(Self.printed(headers.stdout)["header"]?.value == #"["Accept: <redacted>", "X-Other: <redacted>"]"#)
        for secret in Self.secrets { #expect(!result.stdout.contains(secret) && !result.stderr.contains(secret)) }
    }

    @Test("the shipped sample token-agent.yaml loads", arguments: ["tools/token-agent/token-agent.yaml"])
    func sampleLoads(_ relative: String) async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let sample = root.appendingPathComponent(relative).path
        let text = try String(contentsOfFile: sample, encoding: .utf8)
        #expect(text.split(separator: "\n").filter { $0.hasPrefix("#") }.count >= 20, "the sample explains itself in comments")
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--config", sample, "--print-config"], in: scratch)
        #expect(result.status == 0, "\(result.stderr)")
        let printed = Self.printed(result.stdout)
        #expect(printed["provider-url"]?.origin.hasPrefix(sample) == true)
        #expect(printed["vehicle"]?.origin.hasPrefix(sample) == true)
    }

    @Test("a bad file or variable is a usage error (exit 64) naming the key and the line", arguments: [
        ("provider-url: https://a/{id}\nvehicles: [a]\n", "agent.yaml:2: unknown key 'vehicles' (did you mean 'vehicle'?)"),
        ("provider-url: https://a/{id}\nvehicle: [a]\nconnect-timeout: soon\n", "agent.yaml:3 (connect-timeout): 'soon' is not a number of seconds"),
        ("vehicle: truck-7\n", "agent.yaml:1: 'vehicle' must be a list"),
        ("provider-url: [a, b]\n", "agent.yaml:1: 'provider-url' must be a single value"),
        ("vehicle: [a]\nonce: maybe\n", "agent.yaml:2: 'once' must be true or false"),
        ("vehicle: [a]\nlog-level: loud\n", "agent.yaml:2 (log-level): 'loud' is not trace, debug"),
        ("vehicle: [a\nlog-level: info\n", "agent.yaml:2: is not valid YAML or JSON"),
        ("vehicle: [a]\nvehicle: [b]\n", "agent.yaml:2: 'vehicle' is set twice"),
        ("- vehicle\n- trip\n", "agent.yaml:1: must be a mapping of option names to values"),
        ("provider-url: https://a/{id}\nvehicle: [a]\nheader: [\"Authorization Bearer file-secret-value\"]\n", "agent.yaml:3 (header) is not 'Name: value'"),
        ("vehicle: [a]\nlisten: [\"unix:\"]\n", "agent.yaml:2 (listen): "),
        ("\"Authorization: Bearer file-secret-value\": 1\n", "agent.yaml:1: unknown key (not shown)"),
        // The parser quotes the line at fault in its own message: not in ours (it holds a credential).
        ("provider-url: https://a/{id}\nheader: [\"Authorization: Bearer file-secret-value\u{01}\"]\n",
         "agent.yaml:2: is not valid YAML or JSON: control characters are not allowed"),
    ])
    func badFile(_ text: String, _ expected: String) async throws {
        let scratch = Scratch()
        try text.write(toFile: scratch.file("agent.yaml"), atomically: true, encoding: .utf8)
        let result = try await AgentFixture.run(["--config", scratch.file("agent.yaml")], in: scratch)
        #expect(result.status == 64)
        #expect(result.stderr.contains(expected), "\(result.stderr)")
        for secret in Self.secrets { #expect(!result.stderr.contains(secret)) }
    }

    @Test("a missing config file, an unknown TOKEN_AGENT_ variable and a bad variable value are usage errors")
    func badSources() async throws {
        let scratch = Scratch()
        let missing = try await AgentFixture.run(["--config", scratch.file("nope.yaml")], in: scratch)
        #expect(missing.status == 64)
        #expect(missing.stderr.contains("config file \(scratch.file("nope.yaml")): cannot be read: No such file or directory"), "\(missing.stderr)")

        let unknown = try await AgentFixture.run(["--vehicle", "a"], environment: ["TOKEN_AGENT_PROVIDR_URL": "https://x/{id}"], in: scratch)
        #expect(unknown.status == 64)
        #expect(unknown.stderr.contains("unknown environment variable TOKEN_AGENT_PROVIDR_URL"), "\(unknown.stderr)")

        let badValue = try await AgentFixture.run(["--vehicle", "a"], environment: ["TOKEN_AGENT_REQUEST_TIMEOUT": "forever"], in: scratch)
        #expect(badValue.status == 64)
        #expect(badValue.stderr.contains("TOKEN_AGENT_REQUEST_TIMEOUT: 'forever' is not a number of seconds"), "\(badValue.stderr)")

        let badToggle = try await AgentFixture.run(["--vehicle", "a"], environment: ["TOKEN_AGENT_ONCE": "perhaps"], in: scratch)
        #expect(badToggle.status == 64)
        #expect(badToggle.stderr.contains("TOKEN_AGENT_ONCE: 'perhaps' is not true or false"), "\(badToggle.stderr)")
    }
}
