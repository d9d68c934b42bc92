// Issue 26: the token API decides access on the route that matched, refuses targets not in
// normal form, DNS rebinding and web pages, and listens only where it says. Against a real
// token-agent process, with requests written byte for byte over a real Unix socket and loopback
// TCP (a normalizing client would never send //v1/…).

import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token API edges: access on the matched route, Host and Origin, listeners", .paced, .exclusive)
struct EdgeAccessTests {
    /// Targets that name a token route only after a reader drops empty or dot segments or
    /// decodes escapes: each must be 400 before routing, with or without the request header.
    static let abnormalTargets = [
        "//v1/token/vehicle/v-1", "/v1//token/vehicle/v-1", "/./v1/token/vehicle/v-1", "/v1/./token/vehicle/v-1",
        "/v1/token/vehicle/v-1/", "/x/../v1/token/vehicle/v-1", "/v1/%74oken/vehicle/v-1",
        "http://localhost//v1/token/vehicle/v-1", "//v1/subjects", "/v1/subjects/", "//healthz",
    ]

    @Test("abnormal targets are 400 before routing, GET and POST, TCP and Unix socket; the header is required on every token route")
    func accessOnTheMatchedRoute() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-1", "--allow", "trip:t-*"], tcp: true)
        let port = try #require(agent.tcpPort)
        let endpoints: [RawHTTP.Endpoint] = [.unix(agent.socket), .tcp(port: port)]
        let host = "127.0.0.1:\(port)"
        #expect(await eventually(within: 60) { (try? RawHTTP.send(.unix(agent.socket), "GET", "/readyz"))?.status == 200 })
        for endpoint in endpoints {
            // The normal form is served, and only with the header.
            #expect(try RawHTTP.send(endpoint, "GET", "/v1/token/vehicle/v-1", host: host, headers: [("Fleet-Token-Request", "true")]).status == 200)
            for target in ["/v1/token/vehicle/v-1", "/v1/subjects", "/v1/token/trip/t-3"] {
                let answer = try RawHTTP.send(endpoint, "GET", target, host: host)
                #expect(answer.status == 403, "\(endpoint) GET \(target) without the header: \(answer)")
            }
            #expect(try RawHTTP.send(endpoint, "POST", "/v1/invalidate/vehicle/v-1", host: host).status == 403)
            for target in Self.abnormalTargets {
                for marked in [false, true] {
                    let headers = marked ? [("Fleet-Token-Request", "true")] : []
                    let get = try RawHTTP.send(endpoint, "GET", target, host: host, headers: headers)
                    #expect(get.status == 400, "\(endpoint) GET \(target) marked=\(marked): \(get)")
                    #expect(!get.body.contains("\"token\""))
                    let invalidate = target.replacingOccurrences(of: "token", with: "invalidate")
                    let post = try RawHTTP.send(endpoint, "POST", invalidate, host: host, headers: headers)
                    #expect(post.status == 400, "\(endpoint) POST \(invalidate) marked=\(marked): \(post)")
                }
            }
            // Health, readiness and metrics carry no token and need no header.
            #expect(try RawHTTP.send(endpoint, "GET", "/healthz", host: host).status == 200)
            #expect(try RawHTTP.send(endpoint, "GET", "/readyz", host: host).status == 200)
        }
        // No abnormal request invalidated anything: v-1 was fetched once.
        #expect(try await issuer.stats().issued == 1)
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }

    @Test("DNS rebinding: on TCP only a loopback Host is served (421 otherwise), any Origin is 403; an absolute-form target's authority counts as Host; the Unix socket ignores Host; two Host headers are 400 on both")
    func hostAndOrigin() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-1"], tcp: true)
        let port = try #require(agent.tcpPort)
        let marked = [("Fleet-Token-Request", "true")]
        #expect(await eventually(within: 60) { (try? RawHTTP.send(.unix(agent.socket), "GET", "/readyz"))?.status == 200 })
        for host in ["localhost", "localhost:\(port)", "127.0.0.1", "127.0.0.1:\(port)", "[::1]", "[::1]:\(port)", "LOCALHOST:\(port)"] {
            let answer = try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1", host: host, headers: marked)
            #expect(answer.status == 200, "Host: \(host): \(answer)")
        }
        for host in ["rebind.attacker.example:\(port)", "rebind.attacker.example", "127.attacker.example", "localhost.attacker.example:\(port)",
                     "127.0.0.1.nip.io:\(port)", "10.0.0.8:\(port)", "[::2]:\(port)", "localhost:80:80", ""] {
            let answer = try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1", host: host, headers: marked)
            #expect([421, 400].contains(answer.status), "Host: \(host): \(answer)")
            #expect(!answer.body.contains("\"token\""))
        }
        let noHost = try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1", host: nil, headers: marked)
        #expect([421, 400].contains(noHost.status), "no Host: \(noHost)")
        // Two Host headers (RFC 9112, 3.2), whichever comes first, on TCP and on the Unix socket.
        for (first, second) in [("localhost:\(port)", "rebind.attacker.example"), ("rebind.attacker.example", "localhost:\(port)"),
                                ("localhost:\(port)", "localhost:\(port)")] {
            let answer = try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1", host: first, headers: marked + [("Host", second)])
            #expect(answer.status == 400, "Host: \(first), Host: \(second): \(answer)")
            #expect(answer.body.contains("more than one Host"), "\(answer)")
        }
        // An absolute-form target names the server by its authority, not by Host (RFC 9112 3.2.2).
        let elsewhere = try RawHTTP.send(.tcp(port: port), "GET", "http://rebind.attacker.example/v1/token/vehicle/v-1", host: "localhost:\(port)", headers: marked)
        #expect(elsewhere.status == 421 && !elsewhere.body.contains("\"token\""), "absolute form naming another host: \(elsewhere)")
        let here = try RawHTTP.send(.tcp(port: port), "GET", "http://127.0.0.1:\(port)/v1/token/vehicle/v-1", host: "rebind.attacker.example", headers: marked)
        #expect(here.status == 200, "absolute form naming the listener: \(here)")
        let twiceOnUnix = try RawHTTP.send(.unix(agent.socket), "GET", "/v1/token/vehicle/v-1", host: "localhost", headers: marked + [("Host", "localhost")])
        #expect(twiceOnUnix.status == 400, "\(twiceOnUnix)")
        for origin in ["http://localhost:\(port)", "http://rebind.attacker.example:\(port)", "null"] {
            let answer = try RawHTTP.send(.tcp(port: port), "GET", "/v1/token/vehicle/v-1", host: "localhost:\(port)", headers: marked + [("Origin", origin)])
            #expect(answer.status == 403, "Origin: \(origin): \(answer)")
            let post = try RawHTTP.send(.tcp(port: port), "POST", "/v1/invalidate/vehicle/v-1", host: "localhost:\(port)", headers: marked + [("Origin", origin)])
            #expect(post.status == 403, "POST with Origin: \(origin): \(post)")
        }
        // A Unix-socket caller is not a browser: any Host is served.
        let unix = try RawHTTP.send(.unix(agent.socket), "GET", "/v1/token/vehicle/v-1", host: "anything.example", headers: marked)
        #expect(unix.status == 200, "\(unix)")
        #expect(try await issuer.stats().issued == 1, "no refused request invalidated the token")
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }

    @Test("listen hosts are parsed, not prefix-matched; a socket mode for others and a group-writable socket directory are refused",
          arguments: [
            (["--listen", "127.attacker.example:18791"], 64, "--allow-non-loopback-listen"),
            (["--listen", "127.0.0.1.nip.io:18791"], 64, "--allow-non-loopback-listen"),
            (["--listen", "localhost.attacker.example:18791"], 64, "--allow-non-loopback-listen"),
            (["--listen", "::1:18791"], 64, "[IPv6]"),
            (["--socket-mode", "0666"], 64, "every user on the host"),
            (["--socket-mode", "0661"], 64, "every user on the host"),
          ])
    func listenerHygiene(arguments: [String], status: Int32, message: String) async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--db", scratch.file("t.sqlite"), "--provider-url", "http://127.0.0.1:9/{kind}/{id}",
                                                        "--vehicle", "v", "--listen", "unix:\(scratch.file("api.sock"))"] + arguments,
                                        in: scratch, timeout: 30)
        #expect(result.status == status, "\(result.stderr)")
        #expect(result.stderr.contains(message), "\(result.stderr)")
    }

    // Sticky ones of the agent's were accepted: whoever may write one can listen on the socket's
    // name while the agent is stopped; the agent then refuses to start and its clients reach
    // the other user's socket.
    @Test("a socket directory writable by its group is refused like a world-writable one, sticky or not")
    func groupWritableSocketDirectory() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        for (mode, refused) in [(mode_t(0o770), true), (0o777, true), (0o1770, true), (0o1777, true), (0o750, false)] {
            let directory = scratch.file("sockets-\(String(mode, radix: 8))")
            #expect(mkdir(directory, 0o700) == 0)
            #expect(chmod(directory, mode) == 0)
            let arguments = ["--db", scratch.file("t-\(mode).sqlite"), "--provider-url", issuer.template, "--vehicle", "v",
                             "--listen", "unix:\(directory)/api.sock"]
            if refused {
                let result = try await AgentFixture.run(arguments, in: scratch, timeout: 30)
                #expect(result.status == 1, "mode \(String(mode, radix: 8)): \(result.stderr)")
                #expect(result.stderr.contains("writable by"), "\(result.stderr)")
            } else {
                let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v"], socket: "\(directory)/api.sock")
                #expect(fileMode("\(directory)/api.sock") == 0o660)
                // Nothing of the private staging directory is left beside the socket.
                #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["api.sock"])
                #expect(await agent.stop() == 0)
            }
        }
    }

    @Test("a socket directory under a directory others may write (not sticky) is refused, as a steering file's would be: they could put their own directory, and socket, in its place; under a sticky one it is fine")
    func socketDirectoryAncestors() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        for (mode, refused) in [(mode_t(0o777), true), (0o775, true), (0o1777, false)] {
            let shared = scratch.file("shared-\(String(mode, radix: 8))")
            #expect(mkdir(shared, 0o700) == 0 && chmod(shared, mode) == 0)
            let directory = shared + "/run"
            #expect(mkdir(directory, 0o750) == 0)
            let arguments = ["--db", scratch.file("t-\(mode).sqlite"), "--provider-url", issuer.template, "--vehicle", "v",
                             "--listen", "unix:\(directory)/api.sock"]
            if refused {
                let result = try await AgentFixture.run(arguments, in: scratch, timeout: 30)
                #expect(result.status == 1, "mode \(String(mode, radix: 8)): \(result.stderr)")
                #expect(result.stderr.contains("is under \(shared)") && result.stderr.contains("could replace the socket"), "\(result.stderr)")
                #expect(!FileManager.default.fileExists(atPath: directory + "/api.sock"))
            } else {
                let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v"], socket: "\(directory)/api.sock")
                #expect(fileMode("\(directory)/api.sock") == 0o660)
                #expect(await agent.stop() == 0)
            }
        }
    }

    @Test("the socket is never reachable with another mode than --socket-mode, even with umask 0")
    func socketModeBeforeReachable() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let directory = scratch.file("run")
        #expect(mkdir(directory, 0o755) == 0)
        let socket = "\(directory)/api.sock"
        // umask 0 for the agent (through sh): a socket bound in place would appear as 0777.
        let agent = try AgentFixture.launch(["--db", scratch.file("t.sqlite"), "--provider-url", issuer.template, "--vehicle", "v",
                                             "--listen", "unix:\(socket)", "--socket-mode", "0600", "--log-level", "notice"],
                                            wrapper: ["/bin/sh", "-c", "umask 0; exec \"$0\" \"$@\""], in: scratch)
        // Watch the path from before it exists: the first mode seen must be the one asked for.
        var seen: [mode_t] = []
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline && !agent.stderr.contains("token API listening") {
            if let mode = fileMode(socket), seen.last != mode { seen.append(mode) }
            if seen.count > 3 { break }
        }
        if let mode = fileMode(socket), seen.last != mode { seen.append(mode) }
        #expect(seen == [0o600], "modes seen at \(socket): \(seen.map { String($0, radix: 8) }); \(agent.stderr)")
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 20) == 0)
    }
}
