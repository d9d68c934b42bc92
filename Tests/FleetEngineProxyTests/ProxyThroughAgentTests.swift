// The Fleet Engine proxy in a real token-agent, called by Google's own Python clients over gRPC
// (Unix socket and TCP) and REST, in front of a fake Fleet Engine that judges every JWT.

import _CryptoExtras
import FleetTokenStoreTesting
import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// An issuer signing with a key the fake knows, the fake, and a token-agent proxying to it.
final class ProxyRig: Sendable {
    let scratch: Scratch
    let issuer: IssuerProcess
    let fake: FakeFleetEngine
    let agent: RunningProcess
    let socket: String
    let port: Int
    let python: String
    let script: String

    /// `pki`: the fake serves TLS with its server certificate, and the agent trusts its CA when
    /// `trustCA`.
    init(extraArguments: [String] = [], pki: TestPKI? = nil, trustCA: Bool = true) async throws {
        let scratch = Scratch()
        self.scratch = scratch
        let key = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let keyFile = scratch.file("issuer-key.pem")
        try key.pemRepresentation.write(toFile: keyFile, atomically: true, encoding: .utf8)
        let issuer = try await IssuerProcess(scratch: scratch, recordTokens: true, keyFile: keyFile)
        self.issuer = issuer
        let fake = try FakeFleetEngine(publicKeyPEM: key.publicKey.pemRepresentation)
        self.fake = fake
        try await fake.start(tls: pki?.server)
        let trust = pki.map { trustCA ? ["--fleet-engine-ca-file", $0.caPath] : [] } ?? []
        let socket = scratch.file("fleet.sock")
        self.socket = socket
        let agent = try RunningProcess("token-agent", [
            "--db", scratch.file("tokens.sqlite"), "--provider-url", issuer.template, "--vehicle", "truck-1",
            "--allow", "vehicle:*", "--allow", "trip:*", "--allow", "deliveryVehicle:*",
            "--fleet-engine-listen", "unix:\(socket)", "--fleet-engine-listen", "127.0.0.1:0",
            "--fleet-engine-url", fake.url,
        ] + trust + extraArguments, in: scratch)
        self.agent = agent
        guard await eventually(within: 60, { Self.tcpPort(in: agent.stderr) != nil && FileManager.default.fileExists(atPath: socket) }),
              let port = Self.tcpPort(in: agent.stderr) else {
            throw ProcessFailure(message: "the proxy did not listen: \(agent.stderr)")
        }
        self.port = port
        python = try await offCooperativePool { try FleetEnginePython.interpreter() }
        let script = scratch.file("fleet_client.py")
        self.script = script
        try FleetEnginePython.script.write(toFile: script, atomically: true, encoding: .utf8)
    }

    static func tcpPort(in log: String) -> Int? {
        for line in log.split(separator: "\n") where line.contains("Fleet Engine proxy listening") && line.contains("address=127.0.0.1:") {
            let after = line.split(separator: "address=127.0.0.1:").last ?? ""
            if let port = Int(after.prefix { $0.isNumber }) { return port }
        }
        return nil
    }

    /// Runs Google's client: one result per call, each within `deadline` seconds.
    func call(_ mode: String, _ target: String, _ name: String, count: Int = 1, parallel: Int = 1,
              deadline: Int = 60) async throws -> [[String: Any]] {
        let run: (status: Int32, stdout: String, stderr: String)
        do {
            run = try await runToEnd(python, [script, mode, target, name, "\(count)", "\(parallel)", "\(deadline)"], in: scratch, timeout: 300)
        } catch {
            throw await failure("\(mode) \(name): \(error)")
        }
        guard run.status == 0 else { throw await failure("the Python client failed (\(run.status)): \(run.stderr)") }
        return run.stdout.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
    }

    /// A raw HTTP/1.1 exchange with the TCP listener, answered within 60 s (a liveness bound); a
    /// failure carries what the fake and the issuer saw and the end of the agent's log.
    func tcp(_ method: String, _ target: String, host: String?, headers: [(String, String)] = []) async throws -> RawHTTP.Answer {
        do {
            return try await raw(.tcp(port: port), method, target, host: host, headers: headers, timeout: 60)
        } catch {
            throw await failure("\(method) \(target): \(error)")
        }
    }

    /// `what` went wrong, with what the fake saw, what the issuer issued and the end of the
    /// agent's log.
    private func failure(_ what: String) async -> ProcessFailure {
        let calls = fake.calls.map { "\($0.method) \($0.code)" }
        let summary = calls.count > 20 ? "\(calls.count) calls, the last \(calls.suffix(5))" : "\(calls)"
        let issued = (try? await issued()) ?? [:]
        return ProcessFailure(message: "\(what); the fake saw \(summary), the fake's connections carried \(fake.traffic), the issuer issued \(issued); the agent's log ends: \(agent.stderr.suffix(6000))")
    }

    /// Tokens issued per `kind/id`.
    func issued() async throws -> [String: Int] {
        try await issuer.issuedTimes().mapValues(\.count)
    }

    /// Ends the agent and the issuer and closes the fake's listener, at once (from a `defer`):
    /// explicitly, since a process object may outlive the test and a process left running would
    /// outlive the test run (seen: every test's issuer was still running after the run).
    func stop() {
        agent.signal(SIGTERM)
        issuer.process.signal(SIGTERM)
        fake.close()
    }

    /// Every token the issuer handed out is absent from the agent's output.
    func expectNoTokenInLogs(sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let tokens = try await issuer.issuedTokens().values.flatMap { $0 }
        #expect(!tokens.isEmpty, sourceLocation: sourceLocation)
        let output = agent.stdout + agent.stderr
        for token in tokens { #expect(!output.contains(token), "a token value in the agent's output", sourceLocation: sourceLocation) }
    }
}

/// A raw HTTP/1.1 exchange, off Swift's cooperative pool (it blocks).
func raw(_ endpoint: RawHTTP.Endpoint, _ method: String, _ target: String, host: String?,
         headers: [(String, String)] = [], timeout: Int = 15) async throws -> RawHTTP.Answer {
    try await offCooperativePool { try RawHTTP.send(endpoint, method, target, host: host, headers: headers, timeout: timeout) }
}

@Suite("Fleet Engine proxy in a real agent, called by Google's Python clients", .paced, .serialized)
struct ProxyThroughAgentTests {
    @Test("VehicleService and TripService over gRPC (Unix socket, TCP) and DeliveryService over REST: every call reaches Fleet Engine with its resource's token")
    func googleClients() async throws {
        let rig = try await ProxyRig()
        defer { rig.stop() }
        let vehicle = try await rig.call("grpc-vehicle", "unix:\(rig.socket)", "providers/p/vehicles/truck-1", count: 3)
        #expect(vehicle.count == 3 && vehicle.allSatisfy { $0["ok"] as? Bool == true && $0["name"] as? String == "providers/p/vehicles/truck-1" }, "\(vehicle)")
        let trip = try await rig.call("grpc-trip", "127.0.0.1:\(rig.port)", "providers/p/trips/trip-9", count: 2)
        #expect(trip.count == 2 && trip.allSatisfy { $0["ok"] as? Bool == true && $0["name"] as? String == "providers/p/trips/trip-9" }, "\(trip)")
        let delivery = try await rig.call("rest-delivery", "127.0.0.1:\(rig.port)", "providers/p/deliveryVehicles/dv-3", count: 2)
        #expect(delivery.count == 2 && delivery.allSatisfy { $0["ok"] as? Bool == true && $0["name"] as? String == "providers/p/deliveryVehicles/dv-3" }, "\(delivery)")

        let calls = rig.fake.calls
        #expect(calls.count == 7 && calls.allSatisfy { $0.code == 0 || $0.code == 200 }, "\(calls.map { ($0.method, $0.code, $0.refusal ?? "") })")
        #expect(Set(calls.map(\.method)) == ["GetVehicle", "GetTrip", "GetDeliveryVehicle"])
        // Google's headers and the caller's routing metadata pass; the caller's own credential
        // does not (one authorization field, the resource's token, which the fake accepted).
        #expect(calls.allSatisfy { $0.headers["x-goog-api-client"] != nil && $0.headers["x-goog-request-params"] == "provider_id=providers/p" })
        #expect(calls.filter { $0.wire == "grpc" }.allSatisfy { $0.headers["grpc-timeout"] != nil })
        #expect(calls.allSatisfy { $0.authorizationFields == 1 && $0.headers["authorization"] != "Bearer caller-credential" })
        // One fetch per subject for all its calls.
        let issued = try await rig.issued()
        #expect(issued["vehicle/truck-1"] == 1 && issued["trip/trip-9"] == 1 && issued["deliveryVehicle/dv-3"] == 1, "\(issued)")
        #expect(rig.agent.stderr.contains("Fleet Engine call") && rig.agent.stderr.contains("method=GetTrip"))
        try await rig.expectNoTokenInLogs()
    }

    @Test("over TLS (HTTP/2 by ALPN) to an upstream signed by --fleet-engine-ca-file; without that CA, calls fail UNAVAILABLE and nothing reaches it")
    func tlsUpstream() async throws {
        let pki = try TestPKI()
        defer { pki.removeFiles() }
        let rig = try await ProxyRig(pki: pki)
        defer { rig.stop() }
        let vehicle = try await rig.call("grpc-vehicle", "unix:\(rig.socket)", "providers/p/vehicles/truck-1", count: 2)
        #expect(vehicle.count == 2 && vehicle.allSatisfy { $0["ok"] as? Bool == true }, "\(vehicle)")
        let delivery = try await rig.call("rest-delivery", "127.0.0.1:\(rig.port)", "providers/p/deliveryVehicles/dv-3")
        #expect(delivery.first?["ok"] as? Bool == true, "\(delivery)")
        #expect(rig.fake.calls.count == 3)

        // The system's roots do not know the test CA.
        let untrusted = try await ProxyRig(pki: pki, trustCA: false)
        defer { untrusted.stop() }
        // The client retries UNAVAILABLE until its deadline: the default one, 15 s.
        let refused = try await untrusted.call("grpc-vehicle", "unix:\(untrusted.socket)", "providers/p/vehicles/truck-2", deadline: 15)
        #expect(refused.first?["code"] as? String == "UNAVAILABLE", "\(refused)")
        #expect((refused.first?["message"] as? String)?.contains("TLS") == true, "\(refused)")
        #expect(untrusted.fake.calls.isEmpty)
    }

    @Test("through the forward proxy of --proxy (with credentials): one CONNECT tunnel to an https Fleet Engine carries the calls, TLS inside it; a plain http:// loopback one is reached directly",
          arguments: [false, true])
    func forwardProxy(tls: Bool) async throws {
        let connectProxy = ConnectProxy(username: "agent", password: "s3cret")
        try await connectProxy.start()
        defer { Task { await connectProxy.stop() } }
        let pki = tls ? try TestPKI() : nil
        defer { pki?.removeFiles() }
        let rig = try await ProxyRig(extraArguments: ["--proxy", "http://agent:s3cret@127.0.0.1:\(connectProxy.port)"], pki: pki)
        defer { rig.stop() }
        let vehicle = try await rig.call("grpc-vehicle", "unix:\(rig.socket)", "providers/p/vehicles/truck-1", count: 3)
        #expect(vehicle.count == 3 && vehicle.allSatisfy { $0["ok"] as? Bool == true }, "\(vehicle) \(rig.agent.stderr)")
        #expect(rig.fake.calls.count == 3)
        // The provider's fetches tunnel through it too (to the issuer's port).
        let fakeAddress = "\(tls ? "localhost" : "127.0.0.1"):\(rig.fake.port.withLock { $0 })"
        let tunnels = connectProxy.requests.filter { $0.method == "CONNECT" && $0.target == fakeAddress }
        #expect(tunnels.count == (tls ? 1 : 0) && tunnels.allSatisfy { $0.outcome == .tunnelled },
                "\(connectProxy.requests.map { ($0.method, $0.target, $0.outcome) })")
        #expect(!rig.agent.stderr.contains("s3cret"))
    }

    @Test("a key rotation at Fleet Engine: the rejected call is sent once more with a token fetched after the rejection, and succeeds")
    func rotation() async throws {
        let rig = try await ProxyRig()
        defer { rig.stop() }
        let first = try await rig.call("grpc-vehicle", "unix:\(rig.socket)", "providers/p/vehicles/truck-1")
        #expect(first.first?["ok"] as? Bool == true, "\(first)")
        // The issuer writes iat in whole seconds: refuse everything issued before the next one.
        let cutoff = (Date().timeIntervalSince1970 + 1).rounded(.down)
        rig.fake.rejectTokens(issuedBefore: Date(timeIntervalSince1970: cutoff))
        while Date().timeIntervalSince1970 < cutoff { try await Task.sleep(for: .milliseconds(50)) }
        let rotated = try await rig.call("grpc-vehicle", "unix:\(rig.socket)", "providers/p/vehicles/truck-1")
        #expect(rotated.first?["ok"] as? Bool == true, "\(rotated)")
        let codes = rig.fake.calls.map(\.code)
        #expect(codes == [0, 16, 0], "\(rig.fake.calls.map { ($0.code, $0.refusal ?? "") })")
        #expect(try await rig.issued()["vehicle/truck-1"] == 2)
        #expect(rig.agent.stderr.contains("sending the call once more with a new one"))
        // REST likewise: 401, then 200.
        let rest = try await rig.call("rest-delivery", "127.0.0.1:\(rig.port)", "providers/p/deliveryVehicles/dv-1")
        #expect(rest.first?["ok"] as? Bool == true, "\(rest)")
        try await rig.expectNoTokenInLogs()
    }

    @Test("Fleet Engine refusing whatever token the provider mints: PERMISSION_DENIED after exactly one retry, and no loop")
    func refusedEveryToken() async throws {
        let rig = try await ProxyRig()
        defer { rig.stop() }
        rig.fake.deny("providers/p/vehicles/truck-x")
        let denied = try await rig.call("grpc-vehicle", "127.0.0.1:\(rig.port)", "providers/p/vehicles/truck-x")
        #expect(denied.first?["code"] as? String == "PERMISSION_DENIED", "\(denied)")
        #expect(rig.fake.calls.count == 2)
        #expect(try await rig.issued()["vehicle/truck-x"] == 2)
        // Within the invalidation interval: the rejection goes back as it came, no new fetch.
        let again = try await rig.call("grpc-vehicle", "127.0.0.1:\(rig.port)", "providers/p/vehicles/truck-x", count: 3)
        #expect(again.count == 3 && again.allSatisfy { $0["code"] as? String == "PERMISSION_DENIED" }, "\(again)")
        #expect(rig.fake.calls.count == 5)
        #expect(try await rig.issued()["vehicle/truck-x"] == 2)
    }

    @Test("1,000 concurrent calls for one cold vehicle: one provider fetch")
    func singleFlight() async throws {
        let rig = try await ProxyRig()
        defer { rig.stop() }
        let results = try await rig.call("grpc-vehicle", "unix:\(rig.socket)", "providers/p/vehicles/cold-7", count: 1000, parallel: 100)
        #expect(results.count == 1000 && results.allSatisfy { $0["ok"] as? Bool == true }, "\(results.filter { $0["ok"] as? Bool != true }.prefix(3))")
        #expect(try await rig.issued()["vehicle/cold-7"] == 1)
        #expect(rig.fake.calls.count == 1000)
    }

    @Test("a fleet-wide method is refused, naming it, without --fleet-engine-default-subject")
    func fleetWideRefused() async throws {
        let rig = try await ProxyRig()
        defer { rig.stop() }
        let refused = try await rig.call("grpc-search", "unix:\(rig.socket)", "providers/p")
        #expect(refused.first?["code"] as? String == "PERMISSION_DENIED", "\(refused)")
        #expect((refused.first?["message"] as? String)?.contains("SearchVehicles") == true, "\(refused)")
        #expect((refused.first?["message"] as? String)?.contains("--fleet-engine-default-subject") == true)
        #expect(rig.fake.calls.isEmpty)
    }

    @Test("a fleet-wide method with --fleet-engine-default-subject gets that subject's token")
    func fleetWideAllowed() async throws {
        let rig = try await ProxyRig(extraArguments: ["--fleet-engine-default-subject", "vehicle:fleet-admin"])
        defer { rig.stop() }
        let allowed = try await rig.call("grpc-search", "unix:\(rig.socket)", "providers/p")
        #expect(allowed.first?["ok"] as? Bool == true, "\(allowed)")
        #expect(rig.fake.calls.map(\.method) == ["SearchVehicles"])
        #expect(try await rig.issued()["vehicle/fleet-admin"] == 1)
    }

    @Test("forged REST requests are refused before anything is fetched or sent")
    func forgedREST() async throws {
        let rig = try await ProxyRig()
        defer { rig.stop() }
        let path = "/v1/providers/p/deliveryVehicles/dv-1"
        let google = [("x-goog-api-client", "gl-python/3.11")]
        let bare = try await rig.tcp("GET", path, host: "127.0.0.1:\(rig.port)")
        #expect(bare.status == 403 && bare.body.contains("x-goog-api-client"), "\(bare)")
        let foreign = try await rig.tcp("GET", path, host: "evil.example", headers: google)
        #expect(foreign.status == 421, "\(foreign)")
        let page = try await rig.tcp("GET", path, host: "localhost", headers: google + [("Origin", "http://evil.example")])
        #expect(page.status == 403, "\(page)")
        let relayed = try await rig.tcp("GET", path, host: "localhost", headers: google + [("X-Forwarded-For", "10.0.0.9")])
        #expect(relayed.status == 403, "\(relayed)")
        let unknown = try await rig.tcp("GET", "/v1/providers/p/secrets/x", host: "localhost", headers: google)
        #expect(unknown.status == 404, "\(unknown)")
        #expect(rig.fake.calls.isEmpty)
        #expect(try await rig.issued()["deliveryVehicle/dv-1"] == nil)
        // And a well-formed one passes, with the header alone.
        let marked = try await rig.tcp("GET", path, host: "localhost", headers: [("Fleet-Token-Request", "true")])
        #expect(marked.status == 200 && marked.body.contains("providers/p/deliveryVehicles/dv-1"), "\(marked)")
    }

    @Test("past the connection caps, a REST caller gets 503 and a gRPC caller (HTTP/2) a GOAWAY, each with the message; the slot freed, calls pass")
    func refusedConnectionsSpeakTheirProtocol() async throws {
        let rig = try await ProxyRig(extraArguments: ["--max-api-connections", "8", "--max-api-connections-per-peer", "1"])
        defer { rig.stop() }
        let port = rig.port
        // One kept-alive connection, served once (so surely admitted: a connection admitted on
        // its event loop after a later one's would be the one refused), holds this peer's
        // (127.0.0.1's) only slot.
        let idle = try await offCooperativePool {
            try RawHTTP.keptAlive(.tcp(port: port), "GET /v1/providers/p/deliveryVehicles/dv-1 HTTP/1.1\r\nHost: localhost\r\nx-goog-api-client: test\r\n\r\n")
        }
        let message = "has as many connections open as its caps allow"
        let rest = try await offCooperativePool { try RawHTTP.send(.tcp(port: port), "GET", "/v1/providers/p/deliveryVehicles/dv-1", headers: [("x-goog-api-client", "test")]) }
        #expect(rest.status == 503 && rest.body.contains(message), "\(rest); the agent's log ends: \(rig.agent.stderr.suffix(3000))")
        // HTTP/2: the preface and an empty SETTINGS; the answer is frames, not HTTP/1.1 text.
        let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + [0, 0, 0, 0x4, 0, 0, 0, 0, 0]
        let bytes = try await offCooperativePool { try RawHTTP.exchange(.tcp(port: port), preface, timeout: 15) }
        var frames: [(type: UInt8, payload: ArraySlice<UInt8>)] = []
        var index = 0
        while index + 9 <= bytes.count {
            let length = Int(bytes[index]) << 16 | Int(bytes[index + 1]) << 8 | Int(bytes[index + 2])
            guard index + 9 + length <= bytes.count else { break }
            frames.append((bytes[index + 3], bytes[(index + 9)..<(index + 9 + length)]))
            index += 9 + length
        }
        #expect(!String(decoding: bytes.prefix(8), as: UTF8.self).hasPrefix("HTTP/1."), "an HTTP/1.1 answer to an HTTP/2 client")
        #expect(frames.first?.type == 0x4, "the server's SETTINGS first: \(frames.map(\.type))")
        let goAway = try #require(frames.first { $0.type == 0x7 }, "no GOAWAY in \(bytes.count) bytes")
        let payload = Array(goAway.payload)
        #expect(payload.count > 8 && payload[0..<4] == [0, 0, 0, 0] && payload[4..<8] == [0, 0, 0, 0x7], "last stream 0, REFUSED_STREAM")
        #expect(String(decoding: payload.dropFirst(8), as: UTF8.self).contains(message))
        // The slot freed, a call passes.
        close(idle)
        #expect(await eventually(within: 10) {
            (try? await rig.tcp("GET", "/v1/providers/p/deliveryVehicles/dv-1", host: "localhost", headers: [("Fleet-Token-Request", "true")]))?.status == 200
        })
    }

    @Test("3,000 refused REST requests pipelined on one connection: each answered, in order, and the agent goes on serving")
    func pipelinedRefusals() async throws {
        let rig = try await ProxyRig()
        defer { rig.stop() }
        // A refusal is decided without waiting; answered inside the read that carried it, each
        // answer made NIO hand over the next request from inside that write, one nesting per request.
        let count = 3000
        let refused = "GET /v1/providers/p/secrets/x HTTP/1.1\r\nHost: localhost\r\nFleet-Token-Request: true\r\n\r\n"
        let last = "GET /v1/providers/p/secrets/last HTTP/1.1\r\nHost: localhost\r\nFleet-Token-Request: true\r\nConnection: close\r\n\r\n"
        let port = rig.port
        let answers = try await offCooperativePool { try RawHTTP.pipelined(.tcp(port: port), Array(repeating: refused, count: count - 1) + [last]) }
        let statuses = answers.components(separatedBy: "HTTP/1.1 ").dropFirst().map { $0.prefix(3) }
        #expect(statuses.count == count, "\(statuses.count) answers; the agent's log ends: \(rig.agent.stderr.suffix(2000))")
        #expect(statuses.allSatisfy { $0 == "404" })
        #expect(rig.agent.isRunning)
        let marked = try await rig.tcp("GET", "/v1/providers/p/deliveryVehicles/dv-1", host: "localhost", headers: [("Fleet-Token-Request", "true")])
        #expect(marked.status == 200, "\(marked)")
    }
}
