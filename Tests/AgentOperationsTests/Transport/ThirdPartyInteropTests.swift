// Issue 14's "done when": a token server someone else wrote, behind a private CA with mutual TLS
// and reached through a proxy, gives the agent tokens that verify against the signing key.
//
// Nothing here is our own network code on the far side: Debian's nginx terminates TLS with the
// test's private CA, requires a client certificate (`ssl_verify_client on`) and reverse-proxies
// to the development issuer; Debian's tinyproxy is the forward proxy (CONNECT, BasicAuth). A
// real token-agent process fetches through both; the tokens it stored are read back with
// tokenctl and their RS256 signatures checked with JWTKit against the key the issuer signs with.
//
// Without nginx or tinyproxy the suite is skipped, unless FLEET_REQUIRE_THIRD_PARTY=1 (CI sets
// it after installing them), when it fails saying what is missing.

import _CryptoExtras
import DevTokenIssuer
import Foundation
import JWTKit
import Logging
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("Third-party servers: nginx (private CA, mutual TLS) reached through tinyproxy (CONNECT, BasicAuth)", .paced, .serialized, .exclusive,
       // Skipped quietly on a machine without the Debian packages, so `swift test` works on a
       // fresh machine; CI installs them and sets FLEET_REQUIRE_THIRD_PARTY=1 so it cannot skip.
       .enabled(if: ThirdPartyTools.shouldRun,
                "needs Debian's nginx (/usr/sbin/nginx) and tinyproxy; FLEET_REQUIRE_THIRD_PARTY=1 makes their absence a failure"))
struct ThirdPartyInteropTests {
    static let subjects: [(kind: String, id: String, claim: String)] = [
        ("vehicle", "truck-7", "vehicleid"), ("deliveryVehicle", "dv-1", "deliveryvehicleid"), ("task", "task-1", "taskid"),
    ]
    static var subjectFlags: [String] { ["--vehicle", "truck-7", "--delivery-vehicle", "dv-1", "--task", "task-1"] }

    @Test("through tinyproxy and nginx with a client certificate: three tokens stored, each verifying against the issuer's key")
    func tokensVerifyAgainstTheSigningKey() async throws {
        try await withThirdPartyRig { rig in
            let db = rig.scratch.file("tokens.sqlite")
            let run = try await rig.agent(["--db", db, "--provider-url", rig.providerTemplate, "--ca-file", rig.pki.caPath,
                                           "--client-cert", rig.client.certificatePath, "--client-key", rig.client.keyPath,
                                           "--once", "--json"] + Self.subjectFlags,
                                          proxyURL: rig.proxyURL(password: rig.proxyPassword))
            #expect(run.status == 0, "token-agent failed: \(run.stderr)")
            let results = try onceResults(run.stdout)
            #expect(Set(results.map { "\($0["kind"] ?? "")/\($0["id"] ?? "")" }) == Set(Self.subjects.map { "\($0.kind)/\($0.id)" }))
            #expect(results.allSatisfy { $0["source"] == "provider" }, "\(results)")
            #expect(!run.stdout.contains(rig.proxyPassword) && !run.stderr.contains(rig.proxyPassword),
                    "the proxy password appeared in token-agent's output")
            #expect(rig.issuer.issuedCount == 3)

            // Every stored token is the issuer's: RS256 under its key, naming its own subject.
            let verifier = JWTKeyCollection()
            await verifier.add(rsa: try Insecure.RSA.PublicKey(pem: rig.signingKey.publicKey.pemRepresentation),
                               digestAlgorithm: .sha256, kid: JWKIdentifier(string: rig.issuer.keyID))
            let impostor = JWTKeyCollection()
            await impostor.add(rsa: try Insecure.RSA.PublicKey(pem: try _RSA.Signing.PrivateKey(keySize: .bits2048).publicKey.pemRepresentation),
                               digestAlgorithm: .sha256, kid: JWKIdentifier(string: rig.issuer.keyID))
            for subject in Self.subjects {
                let shown = try await runToEnd("tokenctl", ["--db", db, "show", subject.kind, subject.id, "--reveal", "--json"], in: rig.scratch)
                #expect(shown.status == 0, "\(shown.stderr)")
                let object = try JSONSerialization.jsonObject(with: Data(shown.stdout.utf8)) as? [String: Any]
                let token = try #require(object?["token"] as? String, "no token for \(subject.kind)/\(subject.id)")
                let header = try #require(jwtSegment(token, 0))
                #expect(header["alg"] as? String == "RS256")
                #expect(header["kid"] as? String == rig.issuer.keyID)
                let claims = try await verifier.verify(token, as: FleetTokenClaims.self)
                #expect(claims.aud.value == ["https://fleetengine.googleapis.com/"])
                #expect(claims.exp.value.timeIntervalSince(claims.iat.value) == 3600)
                #expect(claims.authorization == [subject.claim: subject.id], "\(subject.kind) token authorizes \(claims.authorization)")
                // The check has teeth: another key under the same kid rejects the token.
                await #expect(throws: (any Error).self) { try await impostor.verify(token, as: FleetTokenClaims.self) }
            }

            // The third parties saw it: a CONNECT tunnel to nginx, and nginx's requests carrying
            // the client certificate (and never the proxy credential, which stays with the proxy).
            #expect(await rig.proxyLogContains("CONNECT 127.0.0.1:\(rig.nginxPort) "), "tinyproxy log:\n\(rig.proxyLog)")
            let requests = try await rig.nginxRequests(count: 3)
            for subject in Self.subjects {
                let line = requests.first { $0.contains("\"GET /token/\(subject.kind)/\(subject.id) HTTP/1.1\"") }
                #expect(line?.contains("dn=\"CN=gateway-7,O=FleetTokenStore tests\" verify=SUCCESS TLSv1.3 ") == true, "\(requests)")
                #expect(line?.hasSuffix(" 200") == true, "\(requests)")
            }
            #expect(requests.allSatisfy { $0.contains("proxy_auth=\"-\"") }, "\(requests)")
        }
    }

    @Test("without a client certificate: nginx completes the handshake, answers 400, token-agent exits 1 and stores no token")
    func withoutClientCertificate() async throws {
        try await withThirdPartyRig { rig in
            let db = rig.scratch.file("tokens.sqlite")
            let run = try await rig.agent(["--db", db, "--provider-url", rig.providerTemplate, "--ca-file", rig.pki.caPath,
                                           "--once", "--json"] + Self.subjectFlags,
                                          proxyURL: rig.proxyURL(password: rig.proxyPassword))
            #expect(run.status == 1)
            // What really happens: nginx's `ssl_verify_client on` does not fail the handshake when
            // no certificate comes; it completes it and answers "400 No required SSL certificate
            // was sent" without forwarding. The agent says a client certificate is missing and
            // names the flags.
            for subject in Self.subjects {
                #expect(run.stderr.contains("no usable token for \(subject.kind)/\(subject.id): TLS certificate problem with the token provider (the provider answered HTTP 400: it requires a client certificate and none was sent)"), "\(run.stderr)")
            }
            #expect(run.stderr.contains("--client-cert"))
            #expect(!run.stdout.contains(rig.proxyPassword) && !run.stderr.contains(rig.proxyPassword))
            let requests = try await rig.nginxRequests(count: 3)
            #expect(requests.allSatisfy { $0.contains("dn=\"-\" verify=NONE") && $0.hasSuffix(" 400") }, "\(requests)")
            #expect(rig.issuer.requestCount == 0, "nginx forwarded a request without a client certificate")
            #expect(try await storedTokens(db, rig.scratch).isEmpty)
        }
    }

    @Test("a wrong proxy password: tinyproxy refuses the tunnel, nothing reaches nginx, the password never shows")
    func wrongProxyPassword() async throws {
        try await withThirdPartyRig { rig in
            let db = rig.scratch.file("tokens.sqlite")
            let wrong = "not-the-Pa55word"
            let run = try await rig.agent(["--db", db, "--provider-url", rig.providerTemplate, "--ca-file", rig.pki.caPath,
                                           "--client-cert", rig.client.certificatePath, "--client-key", rig.client.keyPath,
                                           "--once", "--vehicle", "truck-7"],
                                          proxyURL: rig.proxyURL(password: wrong))
            #expect(run.status == 1)
            // tinyproxy answers the CONNECT with "401 Unauthorized" (not 407), which the agent
            // reports as the proxy refusing the tunnel, pointing at the credentials first.
            #expect(run.stderr.contains("proxy 127.0.0.1:\(rig.proxyPort)"), "\(run.stderr)")
            #expect(run.stderr.contains("check the user and password in HTTPS_PROXY"), "\(run.stderr)")
            #expect(!run.stdout.contains(wrong) && !run.stderr.contains(wrong))
            #expect(await rig.proxyLogContains("CONNECT 127.0.0.1:\(rig.nginxPort) "), "tinyproxy log:\n\(rig.proxyLog)")
            #expect(rig.nginxAccessLog.isEmpty, "\(rig.nginxAccessLog)")
            #expect(rig.issuer.requestCount == 0)
            #expect(try await storedTokens(db, rig.scratch).isEmpty)
        }
    }
}

// MARK: - The third-party tools

private enum ThirdPartyTools {
    static let nginxTool = ThirdPartyTool("nginx", candidates: ["/usr/sbin/nginx"], installHint: "apt-get install nginx tinyproxy-bin (.ci/run does this)")
    static let tinyproxyTool = ThirdPartyTool("tinyproxy", candidates: ["/usr/bin/tinyproxy", "/usr/sbin/tinyproxy"],
                                              installHint: "apt-get install nginx tinyproxy-bin (.ci/run does this)")
    static let nginx = "/usr/sbin/nginx"
    static let tinyproxy = tinyproxyTool.path
    /// Run when both are installed, or when required (then a missing one fails the test).
    static var shouldRun: Bool { (nginxTool.path != nil && tinyproxy != nil) || ThirdPartyTool.required }

    static func requireInstalled() throws {
        _ = try nginxTool.require()
        _ = try tinyproxyTool.require()
    }
}

// MARK: - The rig: issuer, nginx in front of it, tinyproxy in front of nginx

/// Everything one test runs against. Built and torn down by ``withThirdPartyRig(_:)``.
private struct ThirdPartyRig {
    let scratch: Scratch
    let pki: TestPKI
    let client: TestPKI.Identity
    let signingKey: _RSA.Signing.PrivateKey
    let issuer: DevTokenIssuer
    let nginx: RunningProcess
    let nginxPort: Int
    let nginxAccessLogPath: String
    let tinyproxy: RunningProcess
    let proxyPort: Int
    let proxyLogPath: String
    static let proxyUser = "fleetproxy"
    static let proxyPassword = "s3cret-Pa55word"
    var proxyPassword: String { Self.proxyPassword }

    var providerTemplate: String { "https://127.0.0.1:\(nginxPort)/token/{kind}/{id}" }
    func proxyURL(password: String) -> String { "http://\(Self.proxyUser):\(password)@127.0.0.1:\(proxyPort)" }
    var proxyLog: String { (try? String(contentsOfFile: proxyLogPath, encoding: .utf8)) ?? "" }
    var nginxAccessLog: String { (try? String(contentsOfFile: nginxAccessLogPath, encoding: .utf8)) ?? "" }

    /// Runs token-agent with only `proxyURL` as its proxy setting (none from this machine's environment).
    func agent(_ arguments: [String], proxyURL: String) async throws -> (status: Int32, stdout: String, stderr: String) {
        let environment = ["HTTPS_PROXY": proxyURL, "https_proxy": "", "HTTP_PROXY": "", "http_proxy": "",
                           "NO_PROXY": "", "no_proxy": "", "ALL_PROXY": "", "all_proxy": ""]
        return try await AgentFixture.run(arguments, environment: environment, in: scratch, timeout: 60)
    }

    /// Waits (bounded) until tinyproxy's log holds `text`.
    func proxyLogContains(_ text: String) async -> Bool {
        await eventually(within: 5) { proxyLog.contains(text) }
    }

    /// nginx's access log lines once there are `count` of them (bounded wait).
    func nginxRequests(count: Int) async throws -> [String] {
        let lines = { nginxAccessLog.split(separator: "\n").map(String.init) }
        guard await eventually(within: 5, { lines().count >= count }) else {
            throw ProcessFailure(message: "nginx logged \(lines().count) requests, expected \(count): \(nginxAccessLog)")
        }
        return lines()
    }
}

/// Starts the issuer (signing with a key this test made), nginx and tinyproxy; runs `body`; stops
/// all three, also when something throws.
private func withThirdPartyRig<T>(_ body: (ThirdPartyRig) async throws -> T) async throws -> T {
    try ThirdPartyTools.requireInstalled()
    let scratch = Scratch()
    let pki = try TestPKI(directory: URL(fileURLWithPath: scratch.file("pki")))
    let client = try pki.issueClient(commonName: "gateway-7")
    let signingKey = try _RSA.Signing.PrivateKey(keySize: .bits2048)
    let keyPath = scratch.file("issuer-key.pem")
    try writeFile(signingKey.pemRepresentation, to: keyPath, mode: 0o600)
    var configuration = DevTokenIssuer.Configuration()
    configuration.keyFile = keyPath
    let issuer = try await DevTokenIssuer.start(configuration, logger: Logger(label: "third-party-issuer") { _ in SwiftLogNoOpLogHandler() })
    var started: [RunningProcess] = []
    do {
        let nginx = try await startNginx(scratch: scratch, pki: pki, upstreamPort: issuer.port)
        started.append(nginx.process)
        let proxy = try await startTinyproxy(scratch: scratch, user: ThirdPartyRig.proxyUser, password: ThirdPartyRig.proxyPassword, connectPort: nginx.port)
        started.append(proxy.process)
        let rig = ThirdPartyRig(scratch: scratch, pki: pki, client: client, signingKey: signingKey, issuer: issuer,
                                nginx: nginx.process, nginxPort: nginx.port, nginxAccessLogPath: nginx.accessLog,
                                tinyproxy: proxy.process, proxyPort: proxy.port, proxyLogPath: proxy.log)
        let result = try await body(rig)
        await terminate(started)
        await issuer.stop()
        return result
    } catch {
        await terminate(started)
        await issuer.stop()
        throw error
    }
}

/// nginx in one foreground process (no master, so no privilege drop: it reads the 0600 keys as
/// whoever runs the tests), every path in the scratch directory. Retries on a port lost to a race.
private func startNginx(scratch: Scratch, pki: TestPKI, upstreamPort: Int) async throws -> (process: RunningProcess, port: Int, accessLog: String) {
    let directory = scratch.file("nginx")
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    let errorLog = "\(directory)/error.log"
    let accessLog = "\(directory)/access.log"
    var lastError = ""
    for _ in 0..<5 {
        let port = try freeLoopbackPort()
        let configuration = """
            pid \(directory)/nginx.pid;
            error_log \(errorLog) info;
            events { worker_connections 64; }
            http {
                client_body_temp_path \(directory)/client_body;
                proxy_temp_path \(directory)/proxy;
                fastcgi_temp_path \(directory)/fastcgi;
                uwsgi_temp_path \(directory)/uwsgi;
                scgi_temp_path \(directory)/scgi;
                log_format interop '$remote_addr dn="$ssl_client_s_dn" verify=$ssl_client_verify $ssl_protocol proxy_auth="$http_proxy_authorization" "$request" $status';
                access_log \(accessLog) interop;
                server {
                    listen 127.0.0.1:\(port) ssl;
                    ssl_certificate \(pki.server.certificatePath);
                    ssl_certificate_key \(pki.server.keyPath);
                    ssl_client_certificate \(pki.caPath);
                    ssl_verify_client on;
                    ssl_protocols TLSv1.2 TLSv1.3;
                    location /token/ { proxy_pass http://127.0.0.1:\(upstreamPort); }
                }
            }
            """
        let path = "\(directory)/nginx.conf"
        try writeFile(configuration, to: path, mode: 0o644)
        let process = try launchUnblocked(ThirdPartyTools.nginx, ["-e", errorLog, "-p", directory + "/", "-c", path,
                                                                  "-g", "daemon off; master_process off;"], scratch)
        if await eventually(within: 10, { acceptsConnections(port: port) || !process.isRunning }), process.isRunning {
            return (process, port, accessLog)
        }
        await terminate([process])
        lastError = ((try? String(contentsOfFile: errorLog, encoding: .utf8)) ?? "") + process.stderr
        guard lastError.contains("Address already in use") else { break }
    }
    throw ProcessFailure(message: "nginx did not start: \(lastError)")
}

/// tinyproxy in the foreground, listening on loopback, requiring BasicAuth and allowing CONNECT
/// to nginx's port only. Retries on a port lost to a race.
private func startTinyproxy(scratch: Scratch, user: String, password: String, connectPort: Int) async throws -> (process: RunningProcess, port: Int, log: String) {
    let log = scratch.file("tinyproxy.log")
    var lastError = ""
    for _ in 0..<5 {
        let port = try freeLoopbackPort()
        // As root tinyproxy only warns that no User is set and keeps running as root: no
        // User/Group lines needed, and its log file stays writable.
        let configuration = """
            Port \(port)
            Listen 127.0.0.1
            Timeout 30
            MaxClients 20
            LogFile "\(log)"
            PidFile "\(scratch.file("tinyproxy.pid"))"
            LogLevel Connect
            Allow 127.0.0.1
            BasicAuth \(user) \(password)
            ConnectPort \(connectPort)
            """
        let path = scratch.file("tinyproxy.conf")
        try writeFile(configuration, to: path, mode: 0o600)
        let process = try launchUnblocked(ThirdPartyTools.tinyproxy!, ["-d", "-c", path], scratch)
        if await eventually(within: 10, { acceptsConnections(port: port) || !process.isRunning }), process.isRunning {
            return (process, port, log)
        }
        await terminate([process])
        lastError = ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "") + process.stderr
        guard lastError.contains("in use") || lastError.contains("bind") else { break }
    }
    throw ProcessFailure(message: "tinyproxy did not start: \(lastError)")
}

// MARK: - Helpers

/// The claims the development issuer puts in a Fleet Engine token.
private struct FleetTokenClaims: JWTPayload {
    var iss: IssuerClaim
    var aud: AudienceClaim
    var iat: IssuedAtClaim
    var exp: ExpirationClaim
    var authorization: [String: String]

    func verify(using algorithm: some JWTAlgorithm) async throws {
        try exp.verifyNotExpired()
    }
}

/// The JSON object in segment `index` of a compact JWT.
private func jwtSegment(_ token: String, _ index: Int) -> [String: Any]? {
    let parts = token.split(separator: ".", omittingEmptySubsequences: false)
    guard parts.count == 3 else { return nil }
    var base64 = parts[index].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
    guard let data = Data(base64Encoded: base64) else { return nil }
    return try? JSONSerialization.jsonObject(with: data) as? [String: Any]
}

/// `kind/id` of every stored row that holds a token (rows with only a failure state do not count).
private func storedTokens(_ db: String, _ scratch: Scratch) async throws -> [String] {
    guard FileManager.default.fileExists(atPath: db) else { return [] }
    let listed = try await runToEnd("tokenctl", ["--db", db, "list", "--json"], in: scratch)
    let rows = try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]] ?? []
    return rows.filter { ($0["expires_at"] as? String) != nil || ($0["fingerprint"] as? String) != nil }
        .map { "\($0["kind"] ?? "")/\($0["id"] ?? "")" }
}

private func writeFile(_ text: String, to path: String, mode: Int) throws {
    try Data(text.utf8).write(to: URL(fileURLWithPath: path))
    try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: path)
}

/// Starts `executable` with every signal unblocked and at its default. A child inherits the
/// signal mask of the thread that spawns it, and Swift concurrency's worker threads block
/// SIGTERM, SIGHUP, SIGINT, SIGCHLD and more: nginx and tinyproxy started from a test would
/// never see SIGTERM. coreutils `env --default-signal` unblocks and resets them, then execs (same pid).
private func launchUnblocked(_ executable: String, _ arguments: [String], _ scratch: Scratch) throws -> RunningProcess {
    try RunningProcess("/usr/bin/env", ["--default-signal", executable] + arguments, in: scratch)
}

/// SIGTERM to all, then SIGKILL to any still running after 3 s (each wait bounded).
private func terminate(_ processes: [RunningProcess]) async {
    let running = processes.filter(\.isRunning)
    for process in running { process.signal(SIGTERM) }
    for process in running where await process.wait(upTo: 3) == nil {
        process.signal(SIGKILL)
        _ = await process.wait(upTo: 3)
    }
}

/// A loopback port nothing listens on right now (bound to port 0, read back, closed).
private func freeLoopbackPort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw ProcessFailure(message: "socket() failed: errno \(errno)") }
    defer { close(fd) }
    var address = loopbackAddress(port: 0)
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let status = withUnsafeMutablePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    guard status else { throw ProcessFailure(message: "bind/getsockname on 127.0.0.1:0 failed: errno \(errno)") }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// Whether a TCP connection to 127.0.0.1:`port` is accepted (closed at once).
private func acceptsConnections(port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    var address = loopbackAddress(port: port)
    return withUnsafePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
}

private func loopbackAddress(port: Int) -> sockaddr_in {
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr = in_addr(s_addr: UInt32(0x7F00_0001).bigEndian)
    return address
}
