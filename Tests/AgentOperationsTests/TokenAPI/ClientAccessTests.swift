// Issue 26 item 3: callers by identity. A real token-agent with --allow-client rules, asked
// over its real Unix socket by curl processes run as other users (setpriv), not by mocks.

@testable import FleetTokenService
import FleetTokenStore
import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token API: callers by identity (--allow-client, SO_PEERCRED)", .paced, .exclusive)
struct ClientAccessTests {
    /// `curl` run as `uid`/`gid` (with group 0 beside, for the socket's 0660 mode) against the
    /// agent's socket: each URL's status and body.
    static func ask(_ socket: String, uid: UInt32, gid: UInt32, groups: String = "0", _ paths: [String], method: String = "GET",
                    headers: Bool = false, in scratch: Scratch) async throws -> [(status: Int, body: String)] {
        let setpriv = try #require(executable(["/usr/bin/setpriv", "/bin/setpriv"]), "needs setpriv (util-linux)")
        let curl = try #require(executable(["/usr/bin/curl", "/usr/local/bin/curl"]), "needs curl")
        var arguments = ["--reuid=\(uid)", "--regid=\(gid)", "--groups=\(groups)", curl, "-s", "--unix-socket", socket,
                         "-H", "Fleet-Token-Request: true", "-X", method] + (headers ? ["-i"] : [])
        for path in paths { arguments += ["-w", "\n@@%{http_code}@@\n", "http://localhost\(path)"] }
        let result = try await runToEnd(setpriv, arguments, in: scratch, timeout: 30)
        #expect(result.status == 0, "\(result.stderr)")
        var answers: [(Int, String)] = []
        var rest = Substring(result.stdout)
        while let marker = rest.range(of: "\n@@") {
            let body = String(rest[..<marker.lowerBound])
            let after = rest[marker.upperBound...]
            guard let end = after.range(of: "@@\n") else { break }
            answers.append((Int(after[..<end.lowerBound]) ?? 0, body))
            rest = after[end.upperBound...]
        }
        return answers
    }

    @Test("with client rules, each caller gets (and invalidates) only what a rule for its uid or gid grants; configured subjects and --allow grant nothing alone")
    func perCallerAccess() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let nobody = try #require(SystemAccounts.uid(named: "nobody"))
        let agent = try await APIAgent.start(scratch, provider: issuer.template, [
            "--vehicle", "v-1", "--trip", "t-conf", "--allow", "trip:*",
            "--allow-client", "user:nobody vehicle:v-*", "--allow-client", "gid:1 trip:*",
        ], logLevel: "info")
        #expect(await eventually(within: 60) { (try? RawHTTP.send(.unix(agent.socket), "GET", "/readyz"))?.status == 200 })
        let socket = agent.socket

        // nobody: the vehicles its rule names, and nothing else (not the configured trip, not --allow's trips).
        let asNobody = try await Self.ask(socket, uid: nobody, gid: 65534, ["/v1/token/vehicle/v-1", "/v1/token/vehicle/v-1", "/v1/token/vehicle/v-9",
                                                                           "/v1/token/trip/t-conf", "/v1/token/trip/t-1", "/v1/token/vehicle/x-1"], in: scratch)
        #expect(asNobody.map(\.status) == [200, 200, 200, 403, 403, 403], "\(asNobody)")
        #expect(asNobody[3].body.contains("uid \(nobody)") && !asNobody[3].body.contains("vehicle/v-1"), "\(asNobody[3].body)")
        // gid 1: trips; not the configured vehicle.
        let asDaemon = try await Self.ask(socket, uid: 4242, gid: 1, ["/v1/token/trip/t-1", "/v1/token/trip/t-conf", "/v1/token/vehicle/v-1"], in: scratch)
        #expect(asDaemon.map(\.status) == [200, 200, 403], "\(asDaemon)")
        // A supplementary group counts (SO_PEERGROUPS): gid 1 beside group 0.
        let supplementary = try await Self.ask(socket, uid: 4545, gid: 4545, groups: "0,1", ["/v1/token/trip/t-7", "/v1/token/vehicle/v-1"], in: scratch)
        #expect(supplementary.map(\.status) == [200, 403], "\(supplementary)")
        // A caller no rule names: nothing; nor may it invalidate.
        let stranger = try await Self.ask(socket, uid: 4343, gid: 4343, ["/v1/token/vehicle/v-1", "/v1/token/trip/t-1"], in: scratch)
        #expect(stranger.map(\.status) == [403, 403], "\(stranger)")
        let strangerInvalidates = try await Self.ask(socket, uid: 4343, gid: 4343, ["/v1/invalidate/vehicle/v-1"], method: "POST", in: scratch)
        #expect(strangerInvalidates.map(\.status) == [403])
        let daemonInvalidatesVehicle = try await Self.ask(socket, uid: 4242, gid: 1, ["/v1/invalidate/vehicle/v-1"], method: "POST", in: scratch)
        #expect(daemonInvalidatesVehicle.map(\.status) == [403])
        let nobodyInvalidates = try await Self.ask(socket, uid: nobody, gid: 65534, ["/v1/invalidate/vehicle/v-1"], method: "POST", in: scratch)
        #expect(nobodyInvalidates.map(\.status) == [204])
        // The agent's own user (root here) has no rule either.
        #expect(try RawHTTP.send(.unix(socket), "GET", "/v1/token/vehicle/v-1", headers: [("Fleet-Token-Request", "true")]).status == 403)
        // /v1/subjects shows a caller only what it may have.
        let listed = try await Self.ask(socket, uid: nobody, gid: 65534, ["/v1/subjects"], in: scratch)
        let list = try #require(try JSONSerialization.jsonObject(with: Data(listed[0].body.utf8)) as? [[String: Any]], "\(listed)")
        #expect(Set(list.map { "\($0["kind"] ?? "")/\($0["id"] ?? "")" }).isSubset(of: ["vehicle/v-1", "vehicle/v-9"]))
        #expect(!list.isEmpty)
        // Pages are of what the caller may see: a next link never names another's subject.
        let firstPage = try await Self.ask(socket, uid: nobody, gid: 65534, ["/v1/subjects?limit=1"], headers: true, in: scratch)
        let link = firstPage[0].body.split(separator: "\r\n").first { $0.lowercased().hasPrefix("link:") }
        #expect(link.map { $0.contains("after=vehicle/") } ?? true, "\(firstPage[0].body.prefix(400))")
        #expect(!firstPage[0].body.contains("trip/"), "\(firstPage[0].body.prefix(400))")
        let ready = try RawHTTP.send(.unix(socket), "GET", "/readyz")
        #expect(!ready.body.contains("vehicle/") && !ready.body.contains("trip/"), "/readyz names no subject with client rules: \(ready)")

        // The access log names the caller; the audit line says who got which token, once per
        // caller (pid), subject and token: nobody's two GETs of v-1 in one curl gave one line.
        let log = agent.process.stderr
        let accessLines = log.split(separator: "\n").filter { $0.contains("token API request") && $0.contains("path=/v1/token/vehicle/v-1") }
        #expect(accessLines.contains { $0.contains("uid=\(nobody)") && $0.contains("pid=") }, "\(accessLines)")
        let audits = log.split(separator: "\n").filter { $0.contains("token handed to a local client") }
        let nobodyV1 = audits.filter { $0.contains("uid=\(nobody)") && $0.contains("key=vehicle/v-1") }
        #expect(nobodyV1.count == 1, "\(audits)")
        #expect(audits.allSatisfy { $0.contains("fingerprint=") })
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }

    @Test("client rules are usage errors when unreadable, naming an unknown user, or beside a TCP listener (the token API's or the Fleet Engine proxy's)", arguments: [
        (["--allow-client", "user:no-such-user-fts vehicle:*"], "no user named no-such-user-fts"),
        (["--allow-client", "group:no-such-group-fts vehicle:*"], "no group named no-such-group-fts"),
        (["--allow-client", "vehicle:*"], "WHO KIND:GLOB"),
        (["--allow-client", "uid:abc vehicle:*"], "not a number"),
        (["--allow-client", "user:nobody bus:*"], "unknown kind"),
        (["--allow-client", "user:nobody vehicle:*", "--listen", "127.0.0.1:0"], "cannot be identified"),
        (["--allow-client", "user:nobody vehicle:*", "--fleet-engine-listen", "127.0.0.1:0"], "(--fleet-engine-listen 127.0.0.1:0) cannot be identified"),
        // The sink's files are readable by the agent's group, which every socket caller is in.
        (["--allow-client", "user:nobody vehicle:*", "--sink", "sink"], "(--sink-mode 0640) are readable by the agent's group"),
        (["--allow-client", "user:nobody vehicle:*", "--sink", "sink", "--sink-mode", "0440"], "give --sink-mode 0600"),
    ])
    func usage(arguments: [String], message: String) async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--db", scratch.file("t.sqlite"), "--provider-url", "http://127.0.0.1:9/{kind}/{id}",
                                                        "--vehicle", "v", "--listen", "unix:\(scratch.file("api.sock"))"] + arguments,
                                        in: scratch, timeout: 30)
        #expect(result.status == 64, "\(result.stderr)")
        #expect(result.stderr.contains(message), "\(result.stderr)")
    }

    @Test("client rules beside a sink whose files only the agent's user may read pass the start-up checks")
    func sinkForTheAgentAlone() async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--db", scratch.file("t.sqlite"), "--provider-url", "http://127.0.0.1:9/{kind}/{id}",
                                                 "--vehicle", "v", "--listen", "unix:\(scratch.file("api.sock"))", "--check-config",
                                                 "--allow-client", "user:nobody vehicle:*", "--sink", scratch.file("sink"), "--sink-mode", "0600"],
                                                in: scratch, timeout: 30)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("configuration OK"), "\(result.stdout)")
    }

    @Test("a reload resolves the rules anew and applies them; a rule naming an unknown user refuses the reload and the rules in force stay")
    func reload() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let nobody = try #require(SystemAccounts.uid(named: "nobody"))
        let config = scratch.file("agent.yaml")
        func write(_ rules: [String]) throws {
            let text = "vehicle: [v-1]\nallow-client:\n" + rules.map { "  - \"\($0)\"\n" }.joined()
            try text.write(toFile: config, atomically: true, encoding: .utf8)
            chmod(config, 0o600)
        }
        try write(["user:nobody vehicle:v-*"])
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--config", config], logLevel: "info")
        #expect(await eventually(within: 60) { (try? RawHTTP.send(.unix(agent.socket), "GET", "/readyz"))?.status == 200 })
        #expect(try await Self.ask(agent.socket, uid: nobody, gid: 65534, ["/v1/token/trip/t-1"], in: scratch).map(\.status) == [403])

        try write(["user:nobody vehicle:v-*", "user:nobody trip:*"])
        agent.process.signal(SIGHUP)
        #expect(await eventually(within: 60) {
            (try? await Self.ask(agent.socket, uid: nobody, gid: 65534, ["/v1/token/trip/t-1"], in: scratch).map(\.status)) == [200]
        }, "\(agent.process.stderr.suffix(1500))")

        try write(["user:no-such-user-fts trip:*"])
        agent.process.signal(SIGHUP)
        #expect(await eventually(within: 60) { agent.process.stderr.contains("no user named no-such-user-fts") }, "\(agent.process.stderr.suffix(1500))")
        #expect(try await Self.ask(agent.socket, uid: nobody, gid: 65534, ["/v1/token/trip/t-2"], in: scratch).map(\.status) == [200],
                "the rules in force stay")
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }

    @Test("rules parse and decide as written (pure)")
    func rules() throws {
        let policy = try ClientAccessPolicy(rules: [try ClientRule(parsing: "user:alice vehicle:v-*"), try ClientRule(parsing: "group:fleet trip:*"),
                                                    try ClientRule(parsing: "uid:7 task:k-1")],
                                            user: { $0 == "alice" ? 1001 : nil }, group: { $0 == "fleet" ? 2002 : nil })
        let alice = PeerIdentity(uid: 1001, gid: 1001, pid: 1)
        #expect(policy.allows(try .vehicle("v-3"), for: alice))
        #expect(!policy.allows(try .trip("t"), for: alice))
        #expect(policy.allows(try .trip("t"), for: PeerIdentity(uid: 1001, gid: 1001, pid: 1, groups: [2002])), "a supplementary group")
        #expect(policy.allows(try .trip("t"), for: PeerIdentity(uid: 5, gid: 2002, pid: 1)), "the primary group")
        #expect(policy.allows(try .task("k-1"), for: PeerIdentity(uid: 7, gid: 7, pid: 1)))
        #expect(!policy.allows(try .task("k-2"), for: PeerIdentity(uid: 7, gid: 7, pid: 1)))
        #expect(throws: ClientRuleError.self) { try ClientAccessPolicy(rules: [try ClientRule(parsing: "user:bob vehicle:*")], user: { _ in nil }) }
        #expect(try ClientRule(parsing: "gid:12  trip:T-*").description == "gid:12 trip:T-*")
    }
}
