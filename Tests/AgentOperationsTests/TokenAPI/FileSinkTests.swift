// Issue 13: token-agent --sink, against real token-agent, tokenctl and dev-token-server processes
// and real files: layout, modes, file names, atomic replacement under a reading loop, purges.

import FleetTokenService
import TokenAgentRuntime
import FleetTokenStore
import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent --sink: token files", .paced, .exclusive)
struct FileSinkTests {
    /// A long-lived token-agent writing its tokens under `scratch/sink`.
    static func startAgent(_ scratch: Scratch, provider: String, _ arguments: [String]) throws -> RunningProcess {
        try AgentFixture.launch(["--db", scratch.file("tokens.sqlite"), "--provider-url", provider,
                                           "--sink", scratch.file("sink"), "--json", "--log-level", "debug"] + arguments, in: scratch)
    }

    /// The stored token of `kind/id`, from `tokenctl show --reveal`.
    static func revealed(_ scratch: Scratch, _ kind: String, _ id: String) async throws -> String? {
        let shown = try await runToEnd("tokenctl", ["--db", scratch.file("tokens.sqlite"), "show", kind, id, "--reveal", "--json"], in: scratch)
        return (try? JSONSerialization.jsonObject(with: Data(shown.stdout.utf8)) as? [String: Any])?["token"] as? String
    }

    static func contents(_ path: String) -> String? {
        FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
    }

    /// The JWT payload's `authorization` claim, when `text` is a whole JWT.
    static func authorization(of text: String) -> [String: String]? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts.allSatisfy({ !$0.isEmpty }) else { return nil }
        var payload = parts[1].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        payload += String(repeating: "=", count: (4 - payload.count % 4) % 4)
        guard let data = Data(base64Encoded: payload),
              let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return nil }
        return object["authorization"] as? [String: String]
    }

    @Test("files appear at start with the exact stored token, mode 0640 in 0750 directories; ids with / and spaces get the documented names; stale *.jwt files go, other files stay; a restart with --sink-mode 0600 rewrites them from the store")
    func layoutAndModes() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let sink = scratch.file("sink")
        try FileManager.default.createDirectory(atPath: sink + "/vehicle", withIntermediateDirectories: true)
        try #require(FileManager.default.createFile(atPath: sink + "/vehicle/gone.jwt", contents: Data("old".utf8)))
        try #require(FileManager.default.createFile(atPath: sink + "/vehicle/notes.txt", contents: Data("mine".utf8)))
        let subjects = [("vehicle", "v-1"), ("vehicle", "fleet/a b"), ("trip", ".t 'x' %41 é")]
        let files = [sink + "/vehicle/v-1.jwt", sink + "/vehicle/fleet%2Fa b.jwt", sink + "/trip/%2Et 'x' %2541 é.jwt"]
        let arguments = ["--vehicle", "v-1", "--vehicle", "fleet/a b", "--trip", ".t 'x' %41 é"]

        let agent = try Self.startAgent(scratch, provider: issuer.template, arguments)
        #expect(await eventually(within: 15) { files.allSatisfy { FileManager.default.fileExists(atPath: $0) } }, "\(agent.stderr)")
        for ((kind, id), file) in zip(subjects, files) {
            let token = try #require(try await Self.revealed(scratch, kind, id))
            #expect(Self.contents(file) == token, "\(file) holds the stored token, without a newline")
            #expect(fileMode(file) == 0o640)
        }
        #expect(fileMode(sink + "/trip") == 0o750, "a directory the sink creates: 0750 (an existing one is left as it is)")
        #expect(!FileManager.default.fileExists(atPath: sink + "/vehicle/gone.jwt"), "a *.jwt of no tracked subject is removed")
        #expect(Self.contents(sink + "/vehicle/notes.txt") == "mine", "other files are left alone")
        #expect(try FileManager.default.contentsOfDirectory(atPath: sink + "/vehicle").sorted() == ["fleet%2Fa b.jwt", "notes.txt", "v-1.jwt"])
        for file in files {
            let token = try #require(Self.contents(file))
            #expect(!agent.stderr.contains(token) && !agent.stdout.contains(token), "no token in the agent's output")
        }
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 10) == 0, "\(agent.stderr)")

        // A restart with 0600: the tokens come from the store (no fetch) and the files get the new mode.
        let issued = try await issuer.stats().issued
        let again = try Self.startAgent(scratch, provider: issuer.template, arguments + ["--sink-mode", "0600"])
        #expect(await eventually(within: 30) { files.allSatisfy { fileMode($0) == 0o600 } }, "\(again.stderr)")
        for ((kind, id), file) in zip(subjects, files) {
            #expect(Self.contents(file) == (try await Self.revealed(scratch, kind, id)))
        }
        #expect(try await issuer.stats().issued == issued, "written from the store at start, not fetched")
        again.signal(SIGTERM)
        #expect(await again.wait(upTo: 10) == 0, "\(again.stderr)")
    }

    @Test("a reader looping on the file while the agent refreshes every second never sees a missing, empty or partial file", .exclusive)
    func readerNeverSeesPartialFile() async throws {
        let scratch = Scratch()
        // 2 s tokens: refreshed at about 1.5 s of their life, so about once a second.
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: 2)
        let agent = try Self.startAgent(scratch, provider: issuer.template, ["--vehicle", "v-1"])
        let file = scratch.file("sink/vehicle/v-1.jwt")
        #expect(await eventually(within: 15) { FileManager.default.fileExists(atPath: file) }, "\(agent.stderr)")

        let (reads, bad, distinct) = await Task {
            var reads = 0
            var bad: [String] = []
            var distinct: Set<String> = []
            let deadline = Date().addingTimeInterval(4.5)
            while Date() < deadline {
                guard let data = FileManager.default.contents(atPath: file) else {
                    bad.append("missing")
                    continue
                }
                reads += 1
                let text = String(decoding: data, as: UTF8.self)
                if Self.authorization(of: text)?["vehicleid"] == "v-1" {
                    distinct.insert(text)
                } else {
                    bad.append("\(data.count) bytes")
                }
                if reads % 64 == 0 { await Task.yield() }
            }
            return (reads, bad, distinct.count)
        }.value
        #expect(bad.isEmpty, "\(bad.count) bad reads of \(reads): \(bad.prefix(5))")
        #expect(reads > 500, "the reader looped (\(reads) reads)")
        #expect(distinct >= 2, "the token was replaced while reading (\(distinct) distinct)")
        // The agent goes on refreshing v-1 every second: a listing can catch the temporary file
        // of a write in progress. One left behind stays (the sweep takes only those 60 s old).
        func temporaries() -> [String] {
            ((try? FileManager.default.contentsOfDirectory(atPath: scratch.file("sink/vehicle"))) ?? ["unreadable"]).filter { $0 != "v-1.jwt" }
        }
        #expect(await eventually(within: 10) { temporaries().isEmpty }, "no temporary file left behind: \(temporaries())")
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 10) == 0, "\(agent.stderr)")
    }

    @Test("tokenctl purge removes the file; a tracked subject is fetched again at once and its file comes back with the new token; with the provider down it stays away")
    func purgeRemovesTheFile() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        // Each fetch takes 3 s, so the gap between removal and the new file can be seen even
        // on a loaded machine (0.8 s was missed once in a full parallel run).
        let agent = try Self.startAgent(scratch, provider: issuer.template + "?fault=slow&delay_ms=3000", ["--vehicle", "v-1"])
        let file = scratch.file("sink/vehicle/v-1.jwt")
        #expect(await eventually(within: 60) { FileManager.default.fileExists(atPath: file) }, "\(agent.stderr)")
        let first = try #require(Self.contents(file))
        // The next token's iat must be a later second, so that it is a different JWT.
        let firstSecond = Int(Date().timeIntervalSince1970)
        #expect(await eventually(within: 5) { Int(Date().timeIntervalSince1970) > firstSecond })

        let purge = try await runToEnd("tokenctl", ["--db", scratch.file("tokens.sqlite"), "purge", "--vehicle", "v-1"], in: scratch)
        #expect(purge.status == 0, "\(purge.stderr)")
        #expect(await eventually(within: 5) { !FileManager.default.fileExists(atPath: file) }, "the purged subject's file is removed")
        #expect(await eventually(within: 60) { Self.contents(file).map { $0 != first } == true }, "\(agent.stderr)")
        let second = try #require(Self.contents(file))
        #expect(Self.authorization(of: second)?["vehicleid"] == "v-1")
        #expect(second == (try await Self.revealed(scratch, "vehicle", "v-1")), "the file holds the refetched, stored token")
        #expect(agent.stdout.contains(#""event":"removed""#))

        // The provider goes away: the purged subject has no token, so no file, once the agent has
        // tried and reported the failed fetch (the event a wrongly written file would follow).
        issuer.process.signal(SIGKILL)
        _ = await issuer.process.wait(upTo: 5)
        let failures = {
            agent.stdout.split(separator: "\n").filter { $0.contains(#""event":"failed""#) && $0.contains(#""id":"v-1""#) }.count
        }
        let failuresBefore = failures()
        let again = try await runToEnd("tokenctl", ["--db", scratch.file("tokens.sqlite"), "purge", "--vehicle", "v-1"], in: scratch)
        #expect(again.status == 0, "\(again.stderr)")
        #expect(await eventually(within: 5) { !FileManager.default.fileExists(atPath: file) })
        #expect(await eventually(within: 30) { failures() > failuresBefore }, "no failed fetch reported: \(agent.stdout.suffix(2000))")
        #expect(!FileManager.default.fileExists(atPath: file), "no token, no file")
        #expect(agent.isRunning, "a failing provider does not stop the agent")
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 10) == 0, "\(agent.stderr)")
    }

    @Test("a write that fails is logged without the token and retried; the agent keeps running")
    func writeErrorsAreRetried() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: 2)
        let agent = try Self.startAgent(scratch, provider: issuer.template, ["--vehicle", "v-1"])
        let directory = scratch.file("sink/vehicle")
        #expect(await eventually(within: 15) { FileManager.default.fileExists(atPath: directory + "/v-1.jwt") }, "\(agent.stderr)")
        // The kind directory becomes a plain file (tests run as root: modes would not stop a write).
        try FileManager.default.moveItem(atPath: directory, toPath: scratch.file("moved"))
        #expect(FileManager.default.createFile(atPath: directory, contents: Data()))
        #expect(await eventually(within: 5) { agent.stderr.contains("could not write a token file") }, "\(agent.stderr)")
        #expect(agent.isRunning)
        try FileManager.default.removeItem(atPath: directory)
        #expect(await eventually(within: 5) { Self.authorization(of: Self.contents(directory + "/v-1.jwt") ?? "")?["vehicleid"] == "v-1" },
                "rewritten at the next refresh: \(agent.stderr)")
        let token = try #require(Self.contents(directory + "/v-1.jwt"))
        #expect(!agent.stderr.contains(token) && !agent.stderr.contains(String(token.split(separator: ".").last!)))
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 10) == 0, "\(agent.stderr)")
    }

    @Test("--sink-mode must be an octal file mode without execute bits, write bits for group and others, or any bit for others; --sink does not go with --once", arguments: [
        ["--sink-mode", "rw-r-----"], ["--sink-mode", "0750"], ["--sink-mode", "0660"], ["--sink-mode", "0642"], ["--sink-mode", "1640"],
        ["--sink-mode", "0644"], ["--sink-mode", "0604"],
        ["--sink-mode", "0640", "--once"],
    ])
    func badSinkFlags(_ arguments: [String]) async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--db", scratch.file("tokens.sqlite"), "--provider-url", "http://127.0.0.1:9/token/{kind}/{id}",
                                                        "--vehicle", "v-1", "--sink", scratch.file("sink")] + arguments, in: scratch, timeout: 20)
        #expect(result.status == 64, "\(result.stderr)")
        #expect(result.stderr.contains(arguments.contains("--once") ? "--once" : "--sink-mode"))
        #expect(!FileManager.default.fileExists(atPath: scratch.file("sink")))
    }

    @Test("file names: readable for simple ids, /, % and a leading . escaped, long ids cut with a hash")
    func fileNames() {
        #expect(TokenFileSink.fileName(for: "truck-7") == "truck-7.jwt")
        #expect(TokenFileSink.fileName(for: "fleet/a b") == "fleet%2Fa b.jwt")
        #expect(TokenFileSink.fileName(for: "100%") == "100%25.jwt")
        #expect(TokenFileSink.fileName(for: "..x/.y") == "%2E.x%2F.y.jwt")
        #expect(TokenFileSink.fileName(for: "a \"b\" 'c' é 🚚") == "a \"b\" 'c' é 🚚.jwt")
        // Distinct ids, distinct names, even where escapes could be confused with text.
        let ids = ["a/b", "a%2Fb", "a%252Fb", ".a", "%2Ea", "a", "a.jwt"]
        #expect(Set(ids.map(TokenFileSink.fileName(for:))).count == ids.count)

        let long = String(repeating: "/", count: 100) + String(repeating: "é", count: 150)
        let name = TokenFileSink.fileName(for: long)
        #expect(name.utf8.count <= 255)
        #expect(name.hasPrefix(String(repeating: "%2F", count: 79)) && name.hasSuffix("%%" + TokenFingerprint(of: long).description + ".jwt"))
        #expect(TokenFileSink.fileName(for: long + "x") != name)
        let atLimit = String(repeating: "x", count: 251)
        #expect(TokenFileSink.fileName(for: atLimit) == atLimit + ".jwt")
        #expect(TokenFileSink.fileName(for: atLimit + "x").contains("%%"))
    }
}
