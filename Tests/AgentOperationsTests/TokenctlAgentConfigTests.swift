// Issue 31 item 6: tokenctl beside an installed agent takes the store and the encryption key
// files from the agent's config file (`--config`, or TOKEN_AGENT_CONFIG), with the agent's
// precedence: flags, then variables, then the file. Real processes: an agent run fills an
// encrypted store named only in its config file; tokenctl reads it with nothing but that file.

import Foundation
import TestSupportKit
import Testing

@Suite("tokenctl --config: the agent's store and keys from the agent's config file", .paced)
struct TokenctlAgentConfigTests {
    /// An agent config naming the store and a key file, and the store filled by a demo `--once`.
    static func installedAgent(_ scratch: Scratch) async throws -> (config: String, db: String) {
        let db = scratch.file("agent-store.sqlite")
        let key = scratch.file("token-store.key")
        try #require(FileManager.default.createFile(atPath: key, contents: Data((0..<32).map { _ in UInt8.random(in: 0...255) }),
                                                    attributes: [.posixPermissions: 0o600]))
        let config = scratch.file("token-agent.yaml")
        try """
        # the agent's own config file
        db: \(db)
        encryption-key-file: [\(key)]
        vehicle: [truck-7]
        log-level: warning
        """.write(toFile: config, atomically: true, encoding: .utf8)
        let once = try await AgentFixture.run(["--config", config, "--once"], in: scratch)
        #expect(once.status == 0, "\(once.stderr)")
        return (config, db)
    }

    static func listed(_ stdout: String) -> [String] {
        let rows = (try? JSONSerialization.jsonObject(with: Data(stdout.utf8))) as? [[String: Any]] ?? []
        return rows.compactMap { $0["id"] as? String }
    }

    @Test("--config and TOKEN_AGENT_CONFIG find the agent's store and open its sealed values; without them tokenctl does not")
    func findsTheAgentsStore() async throws {
        let scratch = Scratch()
        let (config, _) = try await Self.installedAgent(scratch)

        let withoutConfig = try await runToEnd("tokenctl", ["list"], in: scratch)
        #expect(withoutConfig.status == 1, "\(withoutConfig.stdout)")

        let fromFlag = try await runToEnd("tokenctl", ["--config", config, "list", "--json"], in: scratch)
        #expect(fromFlag.status == 0, "\(fromFlag.stderr)")
        #expect(Self.listed(fromFlag.stdout) == ["truck-7"], "\(fromFlag.stdout)")
        let afterSubcommand = try await runToEnd("tokenctl", ["list", "--config", config, "--json"], in: scratch)
        #expect(Self.listed(afterSubcommand.stdout) == ["truck-7"], "\(afterSubcommand.stderr)")

        let fromVariable = try await runToEnd("tokenctl", ["list", "--json"], environment: ["TOKEN_AGENT_CONFIG": config], in: scratch)
        #expect(fromVariable.status == 0, "\(fromVariable.stderr)")
        #expect(Self.listed(fromVariable.stdout) == ["truck-7"])

        // The key file comes from the config too: the sealed value opens.
        let revealed = try await runToEnd("tokenctl", ["--config", config, "show", "vehicle", "truck-7", "--reveal", "--json"], in: scratch)
        #expect(revealed.status == 0, "\(revealed.stderr)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(revealed.stdout.utf8)) as? [String: Any])
        #expect((object["token"] as? String)?.split(separator: ".").count == 3, "the token was opened with the config's key")
    }

    @Test("--db beats the file's db:, and so does TOKEN_STORE_DB (variables beat the file); a bad --config is a usage error")
    func precedence() async throws {
        let scratch = Scratch()
        let (config, _) = try await Self.installedAgent(scratch)
        let other = scratch.file("other.sqlite")
        let migrated = try await runToEnd("tokenctl", ["--db", other, "migrate"], in: scratch)
        #expect(migrated.status == 0, "\(migrated.stderr)")

        let flag = try await runToEnd("tokenctl", ["--config", config, "--db", other, "list", "--json"], in: scratch)
        #expect(flag.status == 0 && Self.listed(flag.stdout).isEmpty, "\(flag.stdout)\(flag.stderr)")
        let variable = try await runToEnd("tokenctl", ["--config", config, "list", "--json"], environment: ["TOKEN_STORE_DB": other], in: scratch)
        #expect(variable.status == 0 && Self.listed(variable.stdout).isEmpty, "\(variable.stdout)\(variable.stderr)")

        let missing = try await runToEnd("tokenctl", ["--config", scratch.file("nope.yaml"), "list"], in: scratch)
        #expect(missing.status == 64)
        #expect(missing.stderr.contains("agent config file \(scratch.file("nope.yaml")): does not exist"), "\(missing.stderr)")
        let badShape = scratch.file("bad.yaml")
        try "db: [a, b]\n".write(toFile: badShape, atomically: true, encoding: .utf8)
        let shape = try await runToEnd("tokenctl", ["list"], environment: ["TOKEN_AGENT_CONFIG": badShape], in: scratch)
        #expect(shape.status == 64)
        #expect(shape.stderr.contains("agent config file \(badShape):1: 'db' must be a single value"), "\(shape.stderr)")
    }

    @Test("the agent and tokenctl read the variables alike: an empty TOKEN_STORE_DB is unset, and TOKEN_AGENT_ENCRYPTION_KEY_FILE splits and trims as the agent's does")
    func variablesReadAlike() async throws {
        let scratch = Scratch()
        let (_, db) = try await Self.installedAgent(scratch)

        // Empty counts as unset, as for every TOKEN_AGENT_ variable and in tokenctl (the agent
        // took "" for the store's path and refused the working directory).
        let printed = try await AgentFixture.run(["--print-config"], environment: ["TOKEN_STORE_DB": ""], in: scratch)
        #expect(printed.status == 0, "\(printed.stderr)")
        #expect(printed.stdout.contains("db: \"./tokens.sqlite\"  # default"), "\(printed.stdout)")

        // A list in a variable is split at commas and each item trimmed of every white space,
        // a line break included: the same value opens the sealed store in both.
        let keys = ["TOKEN_AGENT_ENCRYPTION_KEY_FILE": scratch.file("token-store.key") + "\n"]
        let agent = try await AgentFixture.run(["--db", db, "--vehicle", "truck-7", "--once"], environment: keys, in: scratch)
        #expect(agent.status == 0, "the agent opens the store with the variable's key: \(agent.stderr)")
        let revealed = try await runToEnd("tokenctl", ["--db", db, "show", "vehicle", "truck-7", "--reveal", "--json"], environment: keys, in: scratch)
        #expect(revealed.status == 0, "tokenctl opens it with the same variable: \(revealed.stderr)")
        let object = (try? JSONSerialization.jsonObject(with: Data(revealed.stdout.utf8))) as? [String: Any]
        #expect((object?["token"] as? String)?.split(separator: ".").count == 3, "\(revealed.stdout)")
    }
}
