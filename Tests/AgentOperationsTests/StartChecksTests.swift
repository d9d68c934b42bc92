// Issue 31 item 6, through the real executable: `--check-config` runs the start's checks and
// gives the start's messages without touching the store or the provider; TOKEN_STORE_DB beats
// the config file's `db:` (flags > variables > file); a saved config file followed by SIGHUP
// reloads once.

import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent's start-up checks, store variable and reload de-duplication", .paced)
struct StartChecksTests {
    /// Nothing listens there: a check that sent a request would fail on it.
    static let provider = "https://127.0.0.1:1/fleet/{kind}/{id}"

    /// One configuration per class of start-up check, with what the start says about it.
    static let badConfigurations: [(name: String, arguments: [String], message: String)] = [
        ("no {id} and no body template", ["--provider-url", "https://127.0.0.1:1/fleet/{kind}", "--vehicle", "a"], "has no {id} placeholder"),
        ("no subjects", ["--provider-url", provider], "give at least one --vehicle"),
        ("plain http:// to another host", ["--provider-url", "http://auth.example.com/{kind}/{id}", "--vehicle", "a"], "plain http:// to auth.example.com"),
        ("a missing CA file", ["--provider-url", provider, "--vehicle", "a", "--ca-file", "/nonexistent/ca.pem"], "cannot read the CA file /nonexistent/ca.pem"),
        ("a missing client key", ["--provider-url", provider, "--vehicle", "a", "--client-cert", "/nonexistent/c.pem", "--client-key", "/nonexistent/c.key"], "/nonexistent/c"),
        ("a missing subjects file", ["--provider-url", provider, "--subjects-file", "/nonexistent/subjects.txt"], "--subjects-file: subjects file /nonexistent/subjects.txt"),
        ("a non-loopback listen address", ["--provider-url", provider, "--vehicle", "a", "--listen", "192.0.2.1:8080"], "--listen"),
        ("a bad header", ["--provider-url", provider, "--vehicle", "a", "--header", "Authorization Bearer x"], "--header is not 'Name: value'"),
        ("a missing encryption key file", ["--provider-url", provider, "--vehicle", "a", "--encryption-key-file", "/nonexistent/key"], "/nonexistent/key"),
    ]

    /// The first line of `text` (the message; ArgumentParser's usage lines follow it).
    static func firstLine(_ text: String) -> String { String(text.split(separator: "\n").first ?? "") }

    @Test("--check-config: each class of bad configuration exits 64 with the message a real start prints", arguments: 0..<badConfigurations.count)
    func badConfiguration(_ index: Int) async throws {
        let (name, arguments, message) = Self.badConfigurations[index]
        let scratch = Scratch()
        let db = scratch.file("tokens.sqlite")
        let checked = try await AgentFixture.run(["--db", db, "--check-config"] + arguments, in: scratch)
        #expect(checked.status == 64, "\(name): \(checked.stderr)")
        #expect(checked.stderr.contains(message), "\(name): \(checked.stderr)")
        #expect(!checked.stdout.contains("configuration OK"))
        #expect(!FileManager.default.fileExists(atPath: db), "\(name): --check-config created the store")

        // A real start refuses it with the same message (before it opens the store).
        let started = try await AgentFixture.run(["--db", db] + arguments, in: scratch, timeout: 30)
        #expect(started.status != 0, "\(name): \(started.stderr)")
        #expect(Self.firstLine(started.stderr) == Self.firstLine(checked.stderr), "\(name)")
    }

    @Test("--check-config: a good configuration (a provider nobody listens on, a config file, demo mode) prints 'configuration OK' and exits 0, touching neither store nor provider")
    func goodConfiguration() async throws {
        let scratch = Scratch()
        let db = scratch.file("tokens.sqlite")
        let config = scratch.file("agent.yaml")
        try """
        db: \(db)
        provider-url: \(Self.provider)
        vehicle: [truck-7]
        listen: ["unix:\(scratch.file("api.sock"))"]
        """.write(toFile: config, atomically: true, encoding: .utf8)
        let checked = try await AgentFixture.run(["--config", config, "--check-config"], in: scratch)
        #expect(checked.status == 0, "\(checked.stderr)")
        #expect(checked.stdout == "token-agent: configuration OK\n")
        #expect(!FileManager.default.fileExists(atPath: db))
        #expect(!FileManager.default.fileExists(atPath: scratch.file("api.sock")))

        let demo = try await AgentFixture.run(["--db", db, "--check-config"], in: scratch)
        #expect(demo.status == 0, "\(demo.stderr)")
        #expect(demo.stdout == "token-agent: configuration OK\n")
        #expect(!demo.stderr.contains("DEMO MODE"), "no demo issuer was started")
        #expect(!FileManager.default.fileExists(atPath: db))
    }

    @Test("--check-config judges the sockets' and the sink's directories as a start does (its message, exit 64, nothing created) and after the key file, as a start does; a socket the running agent answers on passes, and a socket directory not made yet passes with a note")
    func edgeDirectories() async throws {
        let scratch = Scratch()
        let open = scratch.file("open")
        try FileManager.default.createDirectory(atPath: open, withIntermediateDirectories: false)
        #expect(chmod(open, 0o775) == 0)
        let refused: [(name: String, arguments: [String], message: String)] = [
            ("a socket directory its group may write", ["--listen", "unix:\(open)/api.sock"], "the socket's directory \(open) is writable by its group"),
            ("the proxy's socket directory its group may write", ["--fleet-engine-listen", "unix:\(open)/fleet.sock"], "the socket's directory \(open) is writable by its group"),
            ("a sink under a directory its group may write", ["--sink", "\(open)/sink"], "the sink directory \(open)/sink is under \(open)"),
            ("a sink directory its group may write", ["--sink", open], "the sink directory \(open) is not safe for tokens"),
        ]
        for (name, arguments, message) in refused {
            let db = scratch.file("tokens.sqlite")
            let arguments = ["--db", db, "--provider-url", Self.provider, "--vehicle", "a"] + arguments
            let checked = try await AgentFixture.run(arguments + ["--check-config"], in: scratch)
            #expect(checked.status == 64, "\(name): \(checked.stderr)")
            #expect(checked.stderr.contains(message), "\(name): \(checked.stderr)")
            #expect(!checked.stdout.contains("configuration OK"), "\(name)")
            #expect(!FileManager.default.fileExists(atPath: "\(open)/sink"), "\(name): --check-config created the sink")
            #expect(!FileManager.default.fileExists(atPath: db), "\(name): --check-config created the store")

            let started = try await AgentFixture.run(arguments, in: scratch, timeout: 30)
            #expect(started.status == 1, "\(name): \(started.stderr)")
            #expect(started.stderr.split(separator: "\n").contains { $0 == Self.firstLine(checked.stderr) }, "\(name): \(started.stderr)")
            try? FileManager.default.removeItem(atPath: db)
        }

        // Two faults at once: the check names the one the start stops at (the key file, read
        // before the store opens; the sockets come after it).
        let both = ["--db", scratch.file("tokens.sqlite"), "--provider-url", Self.provider, "--vehicle", "a",
                    "--listen", "unix:\(open)/api.sock", "--encryption-key-file", scratch.file("missing.key")]
        let checkedBoth = try await AgentFixture.run(both + ["--check-config"], in: scratch)
        let startedBoth = try await AgentFixture.run(both, in: scratch, timeout: 30)
        #expect(checkedBoth.status == 64 && startedBoth.status == 1, "\(checkedBoth.stderr)\n\(startedBoth.stderr)")
        #expect(Self.firstLine(checkedBoth.stderr).contains("missing.key"), "\(checkedBoth.stderr)")
        #expect(startedBoth.stderr.split(separator: "\n").contains { $0 == Self.firstLine(checkedBoth.stderr) }, "\(startedBoth.stderr)")
        try? FileManager.default.removeItem(atPath: scratch.file("tokens.sqlite"))

        // A socket directory not made yet (systemd's RuntimeDirectory= makes it for the start):
        // a note, and a pass; a start without it refuses.
        let missing = ["--db", scratch.file("tokens.sqlite"), "--provider-url", Self.provider, "--vehicle", "a",
                       "--listen", "unix:\(scratch.file("run"))/api.sock"]
        let noted = try await AgentFixture.run(missing + ["--check-config"], in: scratch)
        #expect(noted.status == 0, "\(noted.stderr)")
        #expect(noted.stdout == "token-agent: configuration OK\n")
        #expect(noted.stderr.contains("the socket's directory \(scratch.file("run")) does not exist yet"), "\(noted.stderr)")
        let refusedStart = try await AgentFixture.run(missing, in: scratch, timeout: 30)
        #expect(refusedStart.status == 1 && refusedStart.stderr.contains("does not exist"), "\(refusedStart.stderr)")
        try? FileManager.default.removeItem(atPath: scratch.file("tokens.sqlite"))

        // Beside the agent it checks: its live socket and its sink pass.
        let db = scratch.file("tokens.sqlite")
        let arguments = ["--db", db, "--provider-url", Self.provider, "--vehicle", "a", "--log-level", "notice",
                         "--listen", "unix:\(scratch.file("api.sock"))", "--sink", scratch.file("sink")]
        let agent = try await AgentFixture.serving(arguments, environment: AgentFixture.noProxy, in: scratch)
        let checked = try await AgentFixture.run(arguments + ["--check-config"], in: scratch)
        #expect(checked.status == 0, "\(checked.stderr)")
        #expect(checked.stdout == "token-agent: configuration OK\n")
        #expect(await agent.stop() == 0)
    }

    @Test("TOKEN_STORE_DB beats the config file's db: (variables beat the file); --db and TOKEN_AGENT_DB beat TOKEN_STORE_DB")
    func storeVariableBeatsFile() async throws {
        let scratch = Scratch()
        let fromFile = scratch.file("from-file.sqlite")
        let fromVariable = scratch.file("from-variable.sqlite")
        let config = scratch.file("agent.yaml")
        try "db: \(fromFile)\n".write(toFile: config, atomically: true, encoding: .utf8)
        let environment = ["TOKEN_STORE_DB": fromVariable]

        let printed = try await AgentFixture.run(["--config", config, "--print-config"], environment: environment, in: scratch)
        #expect(printed.status == 0, "\(printed.stderr)")
        #expect(printed.stdout.contains("db: \"\(fromVariable)\"  # TOKEN_STORE_DB"), "\(printed.stdout)")

        // A real start (demo mode, --once) writes the variable's store, not the file's.
        let once = try await AgentFixture.run(["--config", config, "--once"], environment: environment, in: scratch)
        #expect(once.status == 0, "\(once.stderr)")
        #expect(FileManager.default.fileExists(atPath: fromVariable))
        #expect(!FileManager.default.fileExists(atPath: fromFile))

        let agentVariable = try await AgentFixture.run(["--config", config, "--print-config"],
                                               environment: environment.merging(["TOKEN_AGENT_DB": scratch.file("agent.sqlite")]) { $1 }, in: scratch)
        #expect(agentVariable.stdout.contains("db: \"\(scratch.file("agent.sqlite"))\"  # TOKEN_AGENT_DB"), "\(agentVariable.stdout)")
        let flag = try await AgentFixture.run(["--config", config, "--db", scratch.file("flag.sqlite"), "--print-config"],
                                      environment: environment, in: scratch)
        #expect(flag.stdout.contains("db: \"\(scratch.file("flag.sqlite"))\"  # --db"), "\(flag.stdout)")
    }

    @Test("a config file saved and then SIGHUP (systemctl reload): one reload, not two; the second is a no-op logged at debug level")
    func savedThenReloadedOnce() async throws {
        let scratch = Scratch()
        let config = scratch.file("agent.yaml")
        func write(_ vehicles: String) throws {
            try """
            db: \(scratch.file("tokens.sqlite"))
            listen: ["unix:\(scratch.file("api.sock"))"]
            log-level: debug
            vehicle: [\(vehicles)]
            """.write(toFile: config, atomically: true, encoding: .utf8)
        }
        try write("a")
        let agent = try AgentFixture.launch(["--config", config], in: scratch)
        defer { agent.signal(SIGKILL) }
        #expect(await agent.waitForOutput("token API listening", within: 30), "\(agent.stderr)")
        func reloads() -> Int { agent.stderr.components(separatedBy: "configuration reloaded").count - 1 }

        // The file watch (it polls every 5 s) notices the edit first, as when an operator saves
        // and then types `systemctl reload`; then the SIGHUP comes.
        try write("a, b")
        #expect(await eventually(within: 30) { reloads() == 1 }, "\(agent.stderr)")
        agent.signal(SIGHUP)
        #expect(await eventually(within: 30) {
            agent.stderr.contains("SIGHUP: configuration reloaded") || agent.stderr.contains("SIGHUP: the configuration is the one in force")
        }, "\(agent.stderr)")
        #expect(reloads() == 1, "\(agent.stderr)")
        #expect(agent.stderr.split(separator: "\n").contains { $0.contains(" debug ") && $0.contains("SIGHUP: the configuration is the one in force") },
                "\(agent.stderr)")

        // A SIGHUP that finds a change still reloads.
        try write("a, b, c")
        agent.signal(SIGHUP)
        #expect(await eventually(within: 30) { reloads() == 2 }, "\(agent.stderr)")
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 30) == 0, "\(agent.stderr)")
    }
}
