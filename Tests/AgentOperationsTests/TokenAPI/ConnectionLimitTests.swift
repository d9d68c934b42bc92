// Issue 26 item 5: caps on the token API's concurrent connections, overall and per peer, with
// descriptors kept in reserve for the store and the provider. Real token-agent processes (one
// started under `ulimit -n 128`), real sockets, a real dev-token-server.

@testable import FleetTokenService
import Foundation
import Logging
import NIOCore
import NIOPosix
import Synchronization
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token API connection caps", .paced, .exclusive)
struct ConnectionLimitTests {
    static let marked = [("Fleet-Token-Request", "true")]

    @Test("open-files limit 128: 200 idle TCP connections neither stall a cached-token GET nor the store; past the per-peer cap they are answered 503 and closed; closing them restores TCP service")
    func lowOpenFilesLimit() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await CappedAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-1"], openFiles: 128)
        let unix = RawHTTP.Endpoint.unix(agent.socket)
        let tcp = RawHTTP.Endpoint.tcp(port: agent.tcpPort)
        #expect(await eventually(within: 60) { (try? RawHTTP.send(unix, "GET", "/readyz", timeout: 5))?.status == 200 })
        let first = try RawHTTP.send(unix, "GET", "/v1/token/vehicle/v-1", headers: Self.marked, timeout: 5)
        #expect(first.status == 200, "\(first)")
        let firstPrint = try #require(first.header("Fleet-Token-Fingerprint"))

        var idle: [Int32] = []
        defer { for descriptor in idle where descriptor >= 0 { close(descriptor) } }
        for _ in 0..<200 { idle.append(RawHTTP.openIdle(tcp)) }
        #expect(idle.allSatisfy { $0 >= 0 }, "the kernel completes every handshake (backlog 1024)")
        // Until the agent has taken them all from the listener's queue (or cannot: out of descriptors).
        let drained = await eventually(within: 60) { CappedAgent.acceptQueue(port: agent.tcpPort) == 0 }

        // The cached token, at once: the measured defect was a timeout here.
        // A bounded wait (liveness, not a timing goal): before the caps, no answer ever came.
        let cached = try? RawHTTP.send(unix, "GET", "/v1/token/vehicle/v-1", headers: Self.marked, timeout: 10)
        #expect(cached?.status == 200, "a cached-token GET beside 200 idle TCP connections; got \(cached.map(\.description) ?? "no answer")")
        #expect(drained, "the agent accepts (and refuses) connections past its caps instead of leaving them queued")
        // A store write and a provider fetch still get their descriptors.
        let invalidated = try? RawHTTP.send(unix, "POST", "/v1/invalidate/vehicle/v-1", headers: Self.marked, timeout: 5)
        #expect(invalidated?.status == 204, "\(invalidated.map(\.description) ?? "no answer")")
        let refetched = try? RawHTTP.send(unix, "GET", "/v1/token/vehicle/v-1", headers: Self.marked, timeout: 10)
        #expect(refetched?.status == 200, "\(refetched.map(\.description) ?? "no answer")")
        #expect(refetched?.header("Fleet-Token-Fingerprint").map { $0 != firstPrint } == true, "the invalidated token was replaced by a new fetch")
        // The new token is served before its commit lands.
        let newPrint = refetched?.header("Fleet-Token-Fingerprint") ?? "?"
        var shown = ""
        let stored = await eventually(within: 10) {
            guard let run = try? await runToEnd("tokenctl", ["--db", scratch.file("tokens.sqlite"), "show", "vehicle", "v-1", "--json"], in: scratch) else { return false }
            shown = run.stdout
            return run.status == 0 && run.stdout.contains(newPrint)
        }
        #expect(stored, "the new token is in the store: \(shown)")
        #expect(!agent.process.stderr.contains("unable to open database file"), "\(agent.process.stderr.suffix(2000))")

        // The cap in force is logged with its reason; past the per-peer cap (all TCP clients are
        // 127.0.0.1, one peer) connections are answered 503 and closed at once.
        let caps = try #require(CappedAgent.caps(in: agent.process.stderr), "the caps in force are logged: \(agent.process.stderr.suffix(3000))")
        #expect(caps.overall < 128 - 64, "the reserve of 64 descriptors is kept: \(caps)")
        #expect(caps.perPeer < caps.overall)
        #expect(agent.process.stderr.contains("open-files limit 128"))
        let outcome = await refusals(idle, expected: 200 - caps.perPeer)
        #expect(outcome.refused == 200 - caps.perPeer, "\(outcome)")
        #expect(outcome.unanswered == 0, "refused connections are told why: \(outcome)")
        let overTCP = try? RawHTTP.send(tcp, "GET", "/v1/token/vehicle/v-1", headers: Self.marked, timeout: 5)
        #expect(overTCP?.status == 503, "\(overTCP.map(\.description) ?? "no answer")")
        #expect(overTCP?.header("Retry-After") == "1")
        #expect(overTCP?.body.contains("per peer") == true, "\(overTCP.map(\.description) ?? "")")

        for descriptor in idle where descriptor >= 0 { close(descriptor) }
        idle = []
        #expect(await eventually(within: 30) {
            (try? RawHTTP.send(tcp, "GET", "/v1/token/vehicle/v-1", headers: Self.marked, timeout: 5))?.status == 200
        }, "closing the idle connections frees their slots")
        #expect(!agent.process.stderr.contains("unable to open database file"))
        #expect(await agent.stop() == 0, "\(agent.process.stderr.suffix(2000))")
    }

    // Each listener's gate once took "open-files limit minus open descriptors minus the reserve"
    // for its own: together the token API and the Fleet Engine proxy could hold twice what is
    // free, and the store's reserve went with it.
    @Test("the token API and the Fleet Engine proxy draw on one set of caps: from one peer, connections to both together stop at the per-peer cap, and the caps are logged once")
    func oneBudgetForBothListeners() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await CappedAgent.start(scratch, provider: issuer.template, [
            "--vehicle", "v-1", "--fleet-engine-listen", "127.0.0.1:0", "--fleet-engine-url", "http://127.0.0.1:9",
        ], openFiles: 128)
        let log = { agent.process.stderr }
        #expect(await eventually(within: 30) { log().contains("Fleet Engine proxy listening") }, "\(log().suffix(2000))")
        // Each listener's port from its own line (CappedAgent's is the first TCP address logged).
        func port(_ listener: String) throws -> Int {
            let line = try #require(log().split(separator: "\n").first { $0.contains(listener) && $0.contains("127.0.0.1:") })
            return try #require(line.range(of: #"127\.0\.0\.1:\d+"#, options: .regularExpression).flatMap { Int(line[$0].split(separator: ":").last!) })
        }
        let (apiPort, proxyPort) = (try port("token API listening"), try port("Fleet Engine proxy listening"))
        #expect(apiPort != proxyPort)
        let caps = try #require(CappedAgent.caps(in: log()), "\(log().suffix(2000))")
        #expect(log().components(separatedBy: "connection caps in force").count - 1 == 1, "one set of caps: \(log().suffix(3000))")
        #expect(log().contains("token API and Fleet Engine proxy connection caps in force"))

        // As many idle connections to each listener as the per-peer cap (all from 127.0.0.1).
        var idle: [Int32] = []
        defer { for descriptor in idle where descriptor >= 0 { close(descriptor) } }
        for _ in 0..<caps.perPeer {
            idle.append(RawHTTP.openIdle(.tcp(port: apiPort)))
            idle.append(RawHTTP.openIdle(.tcp(port: proxyPort)))
        }
        #expect(idle.allSatisfy { $0 >= 0 })
        let outcome = await refusals(idle, expected: caps.perPeer)
        #expect(outcome.refused == caps.perPeer, "half of them refused, the per-peer cap counting both listeners: \(outcome), caps \(caps)")
        #expect(outcome.unanswered == 0, "\(outcome)")
        for descriptor in idle where descriptor >= 0 { close(descriptor) }
        idle = []
        #expect(await agent.stop() == 0, "\(log().suffix(2000))")
    }

    @Test("--max-api-connections 6, --max-api-connections-per-peer 4: a fifth connection from one user on the Unix socket is answered 503, a TCP client (another peer) still gets in, the seventh overall is refused, and a closed connection frees its slot")
    func configuredCaps() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await CappedAgent.start(scratch, provider: issuer.template,
                                                ["--vehicle", "v-1", "--max-api-connections", "6", "--max-api-connections-per-peer", "4"])
        let unix = RawHTTP.Endpoint.unix(agent.socket)
        let tcp = RawHTTP.Endpoint.tcp(port: agent.tcpPort)
        #expect(await eventually(within: 60) { (try? RawHTTP.send(unix, "GET", "/readyz", timeout: 5))?.status == 200 })
        let caps = try #require(CappedAgent.caps(in: agent.process.stderr), "\(agent.process.stderr.suffix(3000))")
        #expect(caps.overall == 6 && caps.perPeer == 4)
        #expect(agent.process.stderr.contains("reason=configured"), "\(agent.process.stderr.suffix(3000))")

        var open: [Int32] = []
        defer { for descriptor in open { close(descriptor) } }
        // Kept-alive connections that were served once: admitted for sure.
        #expect(await keptAlive(4, unix, into: &open), "\(agent.process.stderr.suffix(2000))")
        let fifth = try RawHTTP.send(unix, "GET", "/v1/token/vehicle/v-1", headers: Self.marked, timeout: 5)
        #expect(fifth.status == 503 && fifth.header("Retry-After") == "1", "\(fifth)")
        #expect(fifth.body.contains("per peer"), "\(fifth)")
        // On a Unix socket the peer is the client's user, read with SO_PEERCRED.
        #expect(agent.process.stderr.contains("peer=uid \(getuid())"), "\(agent.process.stderr.suffix(2000))")
        let otherPeer = try RawHTTP.send(tcp, "GET", "/v1/token/vehicle/v-1", headers: Self.marked, timeout: 5)
        #expect(otherPeer.status == 200, "a TCP client is another peer: \(otherPeer)")

        #expect(await keptAlive(2, tcp, into: &open), "\(agent.process.stderr.suffix(2000))")
        let seventh = try RawHTTP.send(tcp, "GET", "/v1/token/vehicle/v-1", headers: Self.marked, timeout: 5)
        #expect(seventh.status == 503 && seventh.header("Retry-After") == "1", "\(seventh)")
        #expect(seventh.body.contains("6 connections"), "\(seventh)")

        close(open.removeFirst())
        #expect(await eventually(within: 30) {
            (try? RawHTTP.send(tcp, "GET", "/v1/token/vehicle/v-1", headers: Self.marked, timeout: 5))?.status == 200
        }, "a closed connection frees its slot")
        #expect(await agent.stop() == 0, "\(agent.process.stderr.suffix(2000))")
    }

    @Test("a connection accepted while half the overall cap or more is in use is closed after 5 s idle; the earlier ones keep the 30 s timeout")
    func busyIdleTimeout() async throws {
        let scratch = Scratch()
        let (issuer, agent, unix) = try await Self.agentCappedAtFour(scratch)
        defer { withExtendedLifetime(issuer) {} }
        var open: [Int32] = []
        defer { for descriptor in open { close(descriptor) } }
        // No closed connection before these two: the agent releases a closed one's slot a little
        // after the client sees it close, and a slot not yet released made the second of these
        // count as accepted past the threshold (seen under load: closed after 5 s).
        #expect(await keptAlive(2, unix, into: &open), "\(agent.process.stderr.suffix(2000))")
        let late = try keptAlive(unix)
        open.append(late)
        let accepted = Date()
        #expect(await eventually(within: 15) { isClosedByPeer(late) }, "the busy connection is closed")
        let idleFor = Date().timeIntervalSince(accepted)
        #expect(idleFor > 2, "closed for being idle (about 5 s), not at once: \(idleFor)")
        #expect(!isClosedByPeer(open[0]) && !isClosedByPeer(open[1]), "connections accepted before the threshold stay")
        #expect(await agent.stop() == 0, "\(agent.process.stderr.suffix(2000))")
    }

    @Test("a busy connection kept in use by held-token GETs (answered before Hummingbird's connection handler sees them) outlives its 5 s idle timeout, and closes about 5 s after its last answer")
    func busyConnectionInUse() async throws {
        let scratch = Scratch()
        let (issuer, agent, unix) = try await Self.agentCappedAtFour(scratch)
        defer { withExtendedLifetime(issuer) {} }
        var open: [Int32] = []
        defer { for descriptor in open { close(descriptor) } }
        // v-1 is configured, so held once fetched: its GETs are answered from memory.
        #expect(await eventually(within: 60) { (try? RawHTTP.send(unix, "GET", "/v1/token/vehicle/v-1", headers: Self.marked, timeout: 5))?.status == 200 })
        #expect(await keptAlive(2, unix, into: &open), "\(agent.process.stderr.suffix(2000))")
        let late = try keptAlive(unix)
        open.append(late)
        let get = "GET /v1/token/vehicle/v-1 HTTP/1.1\r\nHost: localhost\r\nFleet-Token-Request: true\r\n\r\n"
        let started = Date()
        var answered = 0
        while Date().timeIntervalSince(started) < 9 {
            let answer: String
            do { answer = try RawHTTP.answer(on: late, get) } catch {
                Issue.record("the connection in use was closed after \(Date().timeIntervalSince(started)) s: \(error)")
                break
            }
            #expect(answer.hasPrefix("HTTP/1.1 200") && answer.contains("\"id\":\"v-1\""), "\(answer.prefix(300))")
            answered += 1
            try await Task.sleep(for: .milliseconds(500))
        }
        let last = Date()
        #expect(answered >= 10 && !isClosedByPeer(late), "in use for 9 s, past its 5 s idle timeout: still open")
        #expect(await eventually(within: 15) { isClosedByPeer(late) }, "then idle: closed")
        let idleFor = Date().timeIntervalSince(last)
        #expect(idleFor > 2, "closed for being idle (about 5 s after the last answer): \(idleFor)")
        // A request whose body never comes is idle too, once its parts stop coming: it does not
        // hold its connection (and a slot under the caps) for good.
        // Busy only while two other connections are open. The two earlier ones may have reached
        // their own 30 s idle timeout by now on a loaded machine (a CI run's `stalled` was then
        // accepted below the threshold, with the 30 s timeout): a request on each restarts it,
        // and one the agent closed is replaced.
        let healthz = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
        let stillOpen = open.prefix(2).filter { (try? RawHTTP.answer(on: $0, healthz))?.hasPrefix("HTTP/1.1 200") == true }
        #expect(await keptAlive(2 - stillOpen.count, unix, into: &open), "\(agent.process.stderr.suffix(2000))")
        // Retried past a 503 while the agent has yet to release the slots of closed ones.
        try #require(await keptAlive(1, unix, into: &open), "\(agent.process.stderr.suffix(2000))")
        let stalled = open[open.count - 1]
        let partial = Array("GET /v1/token/vehicle/v-1 HTTP/1.1\r\nHost: localhost\r\nFleet-Token-Request: true\r\nContent-Length: 1\r\n\r\n".utf8)
        #expect(RawHTTP.writeAll(stalled, partial))
        let sent = Date()
        #expect(await eventually(within: 15) { isClosedByPeer(stalled) }, "a stalled request's connection is closed")
        #expect(Date().timeIntervalSince(sent) > 2, "closed for being idle, not at once")
        #expect(await agent.stop() == 0, "\(agent.process.stderr.suffix(2000))")
    }

    @Test("the Fleet Engine proxy keeps the same rule: a connection accepted while half the overall cap or more is in use is closed after 5 s idle, not 90 s")
    func proxyBusyIdleTimeout() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await CappedAgent.start(scratch, provider: issuer.template, [
            "--vehicle", "v-1", "--max-api-connections", "4", "--max-api-connections-per-peer", "4",
            "--fleet-engine-listen", "127.0.0.1:0", "--fleet-engine-url", "http://127.0.0.1:9",
        ])
        let log = { agent.process.stderr }
        #expect(await eventually(within: 30) { log().contains("Fleet Engine proxy listening") }, "\(log().suffix(2000))")
        let line = try #require(log().split(separator: "\n").first { $0.contains("Fleet Engine proxy listening") })
        let proxyPort = try #require(line.range(of: #"127\.0\.0\.1:\d+"#, options: .regularExpression).flatMap { Int(line[$0].split(separator: ":").last!) })
        let unix = RawHTTP.Endpoint.unix(agent.socket)
        var open: [Int32] = []
        defer { for descriptor in open { close(descriptor) } }
        // Two kept-alive token API connections: half the overall cap of 4 (one budget for both listeners).
        #expect(await keptAlive(2, unix, into: &open), "\(log().suffix(2000))")
        let late = RawHTTP.openIdle(.tcp(port: proxyPort))
        try #require(late >= 0)
        open.append(late)
        let accepted = Date()
        #expect(await eventually(within: 15) { isClosedByPeer(late) }, "the proxy's busy connection is closed")
        let idleFor = Date().timeIntervalSince(accepted)
        #expect(idleFor > 2, "closed for being idle (about 5 s), not at once: \(idleFor)")
        #expect(!isClosedByPeer(open[0]) && !isClosedByPeer(open[1]), "connections accepted before the threshold stay")
        #expect(await agent.stop() == 0, "\(log().suffix(2000))")
    }

    @Test("the caps in force: the configured ones, or what the open-files limit leaves after the open descriptors and the reserve; per peer half the overall unless set; never below 1")
    func capsInForce() {
        let plenty = APIConnectionLimits().caps(openFilesLimit: 1_048_576, openDescriptors: 40)
        #expect(plenty.overall == 4096 && plenty.perPeer == 2048 && plenty.busyThreshold == 2048 && !plenty.limitedByOpenFiles)
        #expect(APIConnectionLimits().caps(openFilesLimit: nil, openDescriptors: 40).overall == 4096)
        let tight = APIConnectionLimits().caps(openFilesLimit: 128, openDescriptors: 38)
        #expect(tight.overall == 26 && tight.perPeer == 13 && tight.limitedByOpenFiles)
        #expect(tight.reason.contains("open-files limit 128") && tight.reason.contains("38") && tight.reason.contains("reserve of 64"))
        let set = APIConnectionLimits(maxConnections: 100, maxConnectionsPerPeer: 500).caps(openFilesLimit: 1024, openDescriptors: 40)
        #expect(set.overall == 100 && set.perPeer == 100, "a per-peer cap above the overall one is the overall one")
        let starved = APIConnectionLimits().caps(openFilesLimit: 64, openDescriptors: 40)
        #expect(starved.overall == 1 && starved.perPeer == 1 && starved.busyThreshold == 1)
        #expect(APIConnectionLimits(descriptorReserve: 0).caps(openFilesLimit: 128, openDescriptors: 28).overall == 100)
    }

    @Test("the gate counts per peer and overall, refuses without counting, and frees a slot on release")
    func gateCounts() {
        let gate = ConnectionGate(limits: APIConnectionLimits(maxConnections: 4, maxConnectionsPerPeer: 2), logger: Logger(label: "test"))
        #expect(gate.caps.overall == 4 && gate.caps.perPeer == 2)
        let a = ConnectionPeer.user(1000), b = ConnectionPeer.address("127.0.0.1"), c = ConnectionPeer.unixSocket
        #expect(gate.admit(a) == .admitted(busy: false))
        #expect(gate.admit(a) == .admitted(busy: false))
        #expect(gate.admit(a) == .refusedPerPeer(open: 2))
        #expect(gate.admit(b) == .admitted(busy: true), "from half the overall cap on, busy")
        #expect(gate.admit(b) == .admitted(busy: true))
        #expect(gate.admit(c) == .refusedOverall(open: 4))
        let full = gate.openConnections(from: a)
        #expect(full.overall == 4 && full.peer == 2)
        gate.release(a)
        #expect(gate.openConnections(from: a).peer == 1)
        #expect(gate.admit(c) == .admitted(busy: true))
        #expect(gate.openConnections(from: c).overall == 4)
    }

    @Test("a Unix-socket client's peer is its user (SO_PEERCRED), a TCP client's its address")
    func peers() async throws {
        let scratch = Scratch()
        let seen = SeenPeers()
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
        let unixServer = try await bootstrap.childChannelInitializer { channel in
            seen.add(ConnectionPeer.of(channel, unixSocket: true))
            return channel.eventLoop.makeSucceededVoidFuture()
        }.bind(unixDomainSocketPath: scratch.file("peer.sock")).get()
        let tcpServer = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).childChannelInitializer { channel in
            seen.add(ConnectionPeer.of(channel, unixSocket: false))
            return channel.eventLoop.makeSucceededVoidFuture()
        }.bind(host: "127.0.0.1", port: 0).get()
        let unixClient = RawHTTP.openIdle(.unix(scratch.file("peer.sock")))
        #expect(await eventually(within: 5) { seen.peers.count == 1 })
        let tcpClient = RawHTTP.openIdle(.tcp(port: try #require(tcpServer.localAddress?.port)))
        #expect(await eventually(within: 5) { seen.peers.count == 2 })
        close(unixClient)
        close(tcpClient)
        #expect(seen.peers == [.user(getuid()), .address("127.0.0.1")])
        try await unixServer.close()
        try await tcpServer.close()
    }

    @Test("the caps are options like any other: a config-file key, checked (0 is a usage error naming the option)")
    func capOptions() async throws {
        let scratch = Scratch()
        let config = scratch.file("token-agent.yaml")
        try "max-api-connections: 300\nmax-api-connections-per-peer: 20\n".write(toFile: config, atomically: true, encoding: .utf8)
        let printed = try await AgentFixture.run(["--config", config, "--print-config"], in: scratch)
        #expect(printed.status == 0, "\(printed.stderr)")
        #expect(printed.stdout.contains("max-api-connections: 300"), "\(printed.stdout)")
        #expect(printed.stdout.contains("max-api-connections-per-peer: 20"), "\(printed.stdout)")

        for arguments in [["--max-api-connections", "0"], ["--max-api-connections-per-peer", "0"], ["--max-api-connections", "many"]] {
            let refused = try await AgentFixture.run(arguments + ["--listen", "unix:\(scratch.file("api.sock"))"], in: scratch)
            #expect(refused.status == 64, "\(arguments): \(refused.stderr)")
            #expect(refused.stderr.contains(arguments[0]), "\(arguments): \(refused.stderr)")
        }
    }

    /// Waits (at most 10 s) until `expected` of `descriptors` were closed by the agent; counts
    /// those answered `503` first and those closed without an answer.
    func refusals(_ descriptors: [Int32], expected: Int) async -> (refused: Int, unanswered: Int, stillOpen: Int) {
        var answered = Set<Int32>()
        var silent = Set<Int32>()
        let deadline = Date().addingTimeInterval(10)
        var buffer = [UInt8](repeating: 0, count: 4096)
        while answered.count + silent.count < expected && Date() < deadline {
            for descriptor in descriptors where descriptor >= 0 && !answered.contains(descriptor) && !silent.contains(descriptor) {
                let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                if count > 0 {
                    if String(decoding: buffer[..<count], as: UTF8.self).hasPrefix("HTTP/1.1 503") { answered.insert(descriptor) } else { silent.insert(descriptor) }
                } else if count == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) {
                    silent.insert(descriptor)
                }
            }
            // Polled, not waited for in poll(2): a blocking call would hold one of the few
            // cooperative threads every test of this process shares.
            try? await Task.sleep(for: .milliseconds(50))
        }
        return (answered.count, silent.count, descriptors.count - answered.count - silent.count)
    }

    /// A token issuer (kept by the caller: it stops when released), an agent tracking v-1 from
    /// it whose caps are 4 connections overall and per peer (busy from 2 open), and its Unix socket.
    static func agentCappedAtFour(_ scratch: Scratch) async throws -> (IssuerProcess, CappedAgent, RawHTTP.Endpoint) {
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await CappedAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-1", "--max-api-connections", "4", "--max-api-connections-per-peer", "4"])
        return (issuer, agent, .unix(agent.socket))
    }

    /// Opens kept-alive connections to `endpoint` until `count` more are in `open` (at most
    /// 30 s). A connection the client closed (a probe, a refused one) holds its slot until the
    /// agent sees it closed: a 503 meanwhile (runs of this suite met one) is tried again.
    func keptAlive(_ count: Int, _ endpoint: RawHTTP.Endpoint, into open: inout [Int32]) async -> Bool {
        let target = open.count + count
        return await eventually(within: 30) {
            while open.count < target, let descriptor = try? keptAlive(endpoint) { open.append(descriptor) }
            return open.count == target
        }
    }

    /// A connection that was served one keep-alive request (`GET /healthz`) and is left open.
    func keptAlive(_ endpoint: RawHTTP.Endpoint) throws -> Int32 {
        try RawHTTP.keptAlive(endpoint, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    }
}

/// True when the agent closed `descriptor` (end of stream, or a reset), without waiting.
func isClosedByPeer(_ descriptor: Int32) -> Bool {
    var byte: UInt8 = 0
    let count = recv(descriptor, &byte, 1, Int32(MSG_DONTWAIT | MSG_PEEK))
    return count == 0 || (count < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
}

/// The peers a test server's child-channel initializer saw.
final class SeenPeers: Sendable {
    private let list = Mutex<[ConnectionPeer]>([])
    func add(_ peer: ConnectionPeer) { list.withLock { $0.append(peer) } }
    var peers: [ConnectionPeer] { list.withLock { $0 } }
}

/// A long-lived token-agent listening on a Unix socket and 127.0.0.1:0, optionally under a
/// lowered open-files limit (`ulimit -n`, soft and hard, so the agent cannot raise it).
struct CappedAgent {
    let process: RunningProcess
    let socket: String
    let tcpPort: Int

    static func start(_ scratch: Scratch, provider: String, _ arguments: [String], openFiles: Int? = nil) async throws -> CappedAgent {
        let socket = scratch.file("api.sock")
        let agentArguments = ["--db", scratch.file("tokens.sqlite"), "--provider-url", provider, "--log-level", "info",
                              "--listen", "unix:\(socket)", "--listen", "127.0.0.1:0"] + arguments
        let wrapper = openFiles.map { limit in ["/bin/sh", "-c", "ulimit -n \(limit); exec \"$0\" \"$@\""] } ?? []
        let agent = try await AgentFixture.serving(agentArguments, wrapper: wrapper, listeners: 2, in: scratch)
        guard let port = agent.tcpPort else {
            throw ProcessFailure(message: "token-agent did not log its TCP address: \(agent.process.stderr)")
        }
        return CappedAgent(process: agent.process, socket: socket, tcpPort: port)
    }

    /// The caps the agent logged at start: `overall=N per_peer=M`.
    static func caps(in log: String) -> (overall: Int, perPeer: Int)? {
        func number(_ key: String) -> Int? {
            guard let range = log.range(of: key + #"=\d+"#, options: .regularExpression) else { return nil }
            return Int(log[range].split(separator: "=").last!)
        }
        guard let overall = number("overall"), let perPeer = number("per_peer") else { return nil }
        return (overall, perPeer)
    }

    /// Connections waiting in the accept queue of the loopback TCP listener on `port` (the
    /// `rx_queue` of its LISTEN row in /proc/net/tcp), nil when there is no such listener.
    static func acceptQueue(port: Int) -> Int? {
        RawHTTP.loopbackTCPRows()?.first { $0.localPort == port && $0.state == "0A" }?.receiveQueue
    }

    func stop() async -> Int32? {
        process.signal(SIGTERM)
        return await process.wait(upTo: 20)
    }
}
