// Issue 26, item 9: a database password is never printed. token-agent (--print-config and a real
// start) and tokenctl (list, stats, show, check) run as real processes with PostgreSQL URLs
// holding a password, given by flag, TOKEN_STORE_DB, TOKEN_AGENT_DB or the config file's `db`
// key, in the userinfo or as a `password=` parameter, well-formed (pointing at a closed loopback
// port) or malformed; stdout and stderr of each are searched for the password.

import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("database passwords are never printed", .paced)
struct SecretOutputTests {
    static let password = "S3cretDbPw"
    /// The password percent-encoded in the URL (`!` as `%21`): neither form may show.
    static let encodedPassword = "S3cret%21DbPw2"
    static let decodedPassword = "S3cret!DbPw2"

    /// A loopback port nothing listens on: bound, read and closed.
    static let closedPort: Int = {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) == 0 && getsockname(descriptor, $0, &length) == 0 }
        }
        return Int(UInt16(bigEndian: address.sin_port))
    }()

    /// URLs holding the password, each with what it tests.
    static var urls: [(String, String)] {
        let port = closedPort
        let pw = password
        return [
            ("userinfo", "postgres://agent:\(pw)@127.0.0.1:\(port)/db"),
            ("userinfo, postgresql scheme, sslmode", "postgresql://agent:\(pw)@127.0.0.1:\(port)/db?sslmode=disable"),
            ("percent-encoded userinfo", "postgres://agent:\(encodedPassword)@127.0.0.1:\(port)/db"),
            ("password parameter", "postgres://agent@127.0.0.1:\(port)/db?password=\(pw)"),
            ("password parameter after another", "postgres://agent@127.0.0.1:\(port)/db?sslmode=disable&password=\(pw)"),
            ("password parameter, no user", "postgres://127.0.0.1:\(port)/db?password=\(pw)"),
            ("misspelt parameter", "postgres://agent@127.0.0.1:\(port)/db?pasword=\(pw)"),
            ("a bad value of a known parameter", "postgres://agent@127.0.0.1:\(port)/db?sslmode=\(pw)"),
            ("bad port", "postgres://agent:\(pw)@127.0.0.1:99999/db"),
            ("not a URL at all", "postgres://agent:\(pw)@127.0.0.1:\(port):5/db"),
            ("no // after the scheme", "postgres:agent:\(pw)@127.0.0.1:\(port)/db"),
            ("both", "postgres://agent:\(pw)@127.0.0.1:\(port)/db?password=\(pw)&schema=fleet"),
            // libpq's keyword/value form is not a URL: never taken for a SQLite file name.
            ("libpq keyword string", "host=127.0.0.1 port=\(port) user=agent password=\(pw) dbname=db"),
            ("libpq keyword string, password first and quoted", "password='\(pw)' host=127.0.0.1 dbname=db"),
            ("libpq keyword string, spaces around =", "  dbname = db password = \(pw)"),
        ]
    }

    static func leaks(_ outputs: [(label: String, text: String)]) -> [String] {
        outputs.compactMap { output in
            [password, encodedPassword, decodedPassword].contains { output.text.contains($0) }
                ? "\(output.label) shows the password:\n\(output.text)" : nil
        }
    }

    @Test("token-agent --print-config redacts the password from --db, TOKEN_STORE_DB, TOKEN_AGENT_DB and the config file's db key",
          arguments: urls)
    func printConfig(_ what: String, _ url: String) async throws {
        let scratch = Scratch()
        let config = scratch.file("agent.yaml")
        try "db: \(JSONQuoted(url))\n".write(toFile: config, atomically: true, encoding: .utf8)
        let runs: [(String, [String], [String: String])] = [
            ("--db", ["--print-config", "--db", url], [:]),
            ("TOKEN_STORE_DB", ["--print-config"], ["TOKEN_STORE_DB": url]),
            ("TOKEN_AGENT_DB", ["--print-config"], ["TOKEN_AGENT_DB": url]),
            ("config file", ["--print-config", "--config", config], [:]),
        ]
        for (source, arguments, environment) in runs {
            let result = try await AgentFixture.run(arguments, environment: environment, in: scratch)
            #expect(result.status == 0, "\(what) by \(source): \(result.stderr)")
            let leaks = Self.leaks([("stdout", result.stdout), ("stderr", result.stderr)])
            #expect(leaks.isEmpty, "\(what) by \(source): \(leaks)")
            // The line is still there, its password shown as ***.
            let line = result.stdout.split(separator: "\n").first { $0.hasPrefix("db: ") }.map(String.init) ?? ""
            #expect(line.contains("127.0.0.1") || line.contains("<not shown: "), "\(what) by \(source): \(line)")
        }
    }

    @Test("a well-formed URL keeps its shape in --print-config: user, host, port, database and sslmode shown, the password as ***")
    func printConfigShape() async throws {
        let scratch = Scratch()
        let port = Self.closedPort
        let result = try await AgentFixture.run(["--print-config"], environment: [
            "TOKEN_STORE_DB": "postgres://agent:\(Self.password)@127.0.0.1:\(port)/db?sslmode=disable&password=\(Self.password)",
        ], in: scratch)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("db: \"postgres://agent:***@127.0.0.1:\(port)/db?sslmode=disable&password=***\"  # TOKEN_STORE_DB"),
                "\(result.stdout)")
    }

    @Test("a token-agent start with such a URL fails without printing the password", arguments: urls)
    func agentStart(_ what: String, _ url: String) async throws {
        let scratch = Scratch()
        let common = ["--once", "--vehicle", "a", "--provider-url", "http://127.0.0.1:\(Self.closedPort)/{id}", "--connect-timeout", "1"]
        for (source, arguments, environment) in [("--db", common + ["--db", url], [:]),
                                                 ("TOKEN_STORE_DB", common, ["TOKEN_STORE_DB": url])] {
            let result = try await AgentFixture.run(arguments, environment: environment, in: scratch)
            #expect(result.status != 0, "\(what) by \(source)")
            let leaks = Self.leaks([("stdout", result.stdout), ("stderr", result.stderr)])
            #expect(leaks.isEmpty, "\(what) by \(source): \(leaks)")
        }
    }

    @Test("tokenctl list, stats, show and check with such a URL fail without printing the password", arguments: urls)
    func tokenctl(_ what: String, _ url: String) async throws {
        let scratch = Scratch()
        for command in [["list"], ["stats"], ["show", "vehicle", "a"], ["check"]] {
            for (source, arguments, environment) in [("--db", ["--db", url] + command, [:]),
                                                     ("TOKEN_STORE_DB", command, ["TOKEN_STORE_DB": url])] {
                let result = try await runToEnd("tokenctl", arguments, environment: environment, in: scratch)
                #expect(result.status != 0, "\(command) \(what) by \(source)")
                let leaks = Self.leaks([("stdout", result.stdout), ("stderr", result.stderr)])
                #expect(leaks.isEmpty, "tokenctl \(command.joined(separator: " ")), \(what) by \(source): \(leaks)")
            }
        }
    }

    @Test("a libpq keyword string is a usage error that shows none of it and asks for a postgres:// URL, from token-agent and tokenctl")
    func keywordString() async throws {
        let scratch = Scratch()
        let port = Self.closedPort
        let dsn = "host=127.0.0.1 port=\(port) user=agent password=\(Self.password) dbname=db"
        let agent = ["--once", "--vehicle", "a", "--provider-url", "http://127.0.0.1:\(port)/{id}", "--connect-timeout", "1"]
        let runs: [(String, String, [String], [String: String], String)] = [
            ("token-agent", "--db", agent + ["--db", dsn], [:], "--db"),
            ("token-agent", "TOKEN_STORE_DB", agent, ["TOKEN_STORE_DB": dsn], "TOKEN_STORE_DB"),
            ("token-agent", "TOKEN_AGENT_DB", agent, ["TOKEN_AGENT_DB": dsn], "TOKEN_AGENT_DB"),
            ("tokenctl", "--db", ["--db", dsn, "list"], [:], "--db"),
            ("tokenctl", "TOKEN_STORE_DB", ["list"], ["TOKEN_STORE_DB": dsn], "TOKEN_STORE_DB"),
        ]
        for (tool, source, arguments, environment, named) in runs {
            let result = try await runToEnd(tool, arguments, environment: environment, in: scratch)
            #expect(result.status == 64, "\(tool) by \(source): \(result.stderr)")
            #expect(result.stderr.contains(named) && result.stderr.contains("postgres://"), "\(tool) by \(source): \(result.stderr)")
            #expect(!result.stderr.contains("host=") && !result.stderr.contains("dbname"), "shows none of it: \(result.stderr)")
            #expect(Self.leaks([("stderr", result.stderr), ("stdout", result.stdout)]).isEmpty)
        }
        // Nothing was made of it: no SQLite store named after it in the working directory.
        let here = FileManager.default.currentDirectoryPath
        #expect(try FileManager.default.contentsOfDirectory(atPath: here).allSatisfy { !$0.contains(Self.password) })
    }

    @Test("a refused parameter is named, never its value; a password parameter is told where a password goes")
    func parameterErrors() async throws {
        let scratch = Scratch()
        let port = Self.closedPort
        let misspelt = try await runToEnd("tokenctl", ["--db", "postgres://agent@127.0.0.1:\(port)/db?pasword=\(Self.password)", "list"], in: scratch)
        #expect(misspelt.status == 64)
        #expect(misspelt.stderr.contains("parameter pasword is not accepted"), "\(misspelt.stderr)")
        let mode = try await runToEnd("tokenctl", ["list"], environment: ["TOKEN_STORE_DB": "postgres://agent@127.0.0.1:\(port)/db?sslmode=\(Self.password)"],
                                      in: scratch)
        #expect(mode.status == 64)
        #expect(mode.stderr.contains("TOKEN_STORE_DB: the PostgreSQL URL's parameter sslmode"), "names the variable that gave it: \(mode.stderr)")
        let password = try await runToEnd("tokenctl", ["--db", "postgres://agent@127.0.0.1:\(port)/db?password=\(Self.password)", "list"], in: scratch)
        #expect(password.status == 64)
        #expect(password.stderr.contains("PGPASSWORD"), "\(password.stderr)")
        for result in [misspelt, mode, password] {
            #expect(Self.leaks([("stderr", result.stderr), ("stdout", result.stdout)]).isEmpty)
        }
    }
}

/// `text` as a JSON (and so YAML) double-quoted string.
private func JSONQuoted(_ text: String) -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = .withoutEscapingSlashes
    return String(decoding: try! encoder.encode(text), as: UTF8.self)
}
