// The Fleet Engine proxy of a release `token-agent` process, measured from outside against the
// same calls sent straight to the same upstream with the token attached by the caller. Prints
// one JSON object on stdout; ../../run merges it into results.json.
//
//   fleet-engine-proxy-measurements --agent PATH [--rounds 15] [--calls-per-round 400]
//                                   [--throughput-seconds 5] [--callers 64]
//
// - The upstream: a Fleet Engine stand-in in this process (its own event loop) on loopback,
//   HTTP/2 with prior knowledge and HTTP/1.1 on one port (told apart by the preface), answering
//   every call at once with a fixed answer: a GetVehicle message with gRPC's trailers, or a
//   delivery vehicle's JSON. It checks nothing: what is measured is the proxy's own work.
// - gRPC: GetVehicle over HTTP/2 (one connection per side, one stream per call) through the
//   proxy's TCP listener, and straight to the upstream with `authorization: Bearer <token>`.
// - REST: GET /v1/providers/p/deliveryVehicles/ID over HTTP/1.1 keep-alive (one connection per
//   side), through the proxy (with `x-goog-api-client`, as Google's clients send) and straight.
// - Calls alternate between the two sides one by one (proxy, direct, proxy, …) so that drift in
//   the machine's state falls on both alike; each round's ratio is of the two p50s, and the
//   figure is the median of the rounds' ratios. Every answer is checked (HTTP 200, grpc-status 0):
//   a refusal would be fast and wrong.
// - The clients run on one event loop of this process, with no hop to another thread per call,
//   so that the client's cost, the same on both sides, stays small beside what is measured.
// - The limit for a proxy in a process of its own (when Debian's nginx is installed): nginx
//   relaying the same calls with the caller's token (grpc_pass, proxy_pass, kept-alive upstream
//   connections), against direct and against the agent, alternating the same way.
// - Throughput: `--callers` gRPC callers, each on its own connection to the proxy, each looping
//   calls for a few seconds after a warm-up second; calls per second, and any failure.
//
// The token provider is the in-process development issuer, on loopback; the agent's log level
// is `notice` (its per-call access log, at `info`, is off, as in the token API's figures).

import BenchmarkSupport
import DevTokenIssuer
import Foundation
import Logging
import NIOCore
import NIOHPACK
import NIOHTTP1
import NIOHTTP2
import NIOPosix
#if canImport(Glibc)
import Glibc
#endif

// MARK: - Main

guard let agentPath = option("--agent") else {
    note("usage: fleet-engine-proxy-measurements --agent PATH [--rounds 15] [--calls-per-round 400] [--throughput-seconds 5] [--callers 64]")
    exit(64)
}
let rounds = Int(option("--rounds") ?? "") ?? 15
let callsPerRound = Int(option("--calls-per-round") ?? "") ?? 400
let throughputSeconds = Double(option("--throughput-seconds") ?? "") ?? 5
let callerCount = Int(option("--callers") ?? "") ?? 64

var quietLogger = Logger(label: "fleet-engine-proxy-measurements")
quietLogger.logLevel = .warning
let scratch = NSTemporaryDirectory() + "fleet-proxy-bench-\(UUID().uuidString.prefix(8))"
try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)

let upstreamGroup = MultiThreadedEventLoopGroup(numberOfThreads: 1)
let clientGroup = MultiThreadedEventLoopGroup(numberOfThreads: 1)
let upstream = try await ServerBootstrap(group: upstreamGroup)
    .serverChannelOption(.backlog, value: 256)
    .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
    .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
    .childChannelInitializer { channel in
        channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(UpstreamSniffer()) }
    }
    .bind(host: "127.0.0.1", port: 0).get()
let upstreamPort = upstream.localAddress!.port!

let issuer = try await DevTokenIssuer.start(logger: quietLogger)
let agentLog = scratch + "/agent.log"
let agent = try Child(agentPath, [
    "--db", scratch + "/tokens.sqlite", "--provider-url", issuer.urlTemplate, "--no-proxy",
    "--vehicle", "bench-1", "--delivery-vehicle", "bench-dv", "--log-level", "notice",
    "--fleet-engine-listen", "127.0.0.1:0", "--fleet-engine-url", "http://127.0.0.1:\(upstreamPort)",
], log: agentLog)

do {
    // The proxy's port, from its "listening" notice.
    var proxyPort: Int?
    let deadline = monotonicNanoseconds() + 60_000_000_000
    while proxyPort == nil {
        guard agent.isRunning else { throw MeasurementError("token-agent exited: \(agent.logTail)") }
        guard monotonicNanoseconds() < deadline else { throw MeasurementError("the proxy did not listen within 60 s: \(agent.logTail)") }
        let log = (try? String(contentsOfFile: agentLog, encoding: .utf8)) ?? ""
        for line in log.split(separator: "\n") where line.contains("Fleet Engine proxy listening") {
            if let range = line.range(of: "address=127.0.0.1:") { proxyPort = Int(line[range.upperBound...].prefix { $0.isNumber }) }
        }
        if proxyPort == nil { try await Task.sleep(for: .milliseconds(20)) }
    }
    let port = proxyPort!

    // A token of the same issuer, as the direct caller would hold (the upstream checks none).
    let issued = Data(try loopbackGET(port: Int(URL(string: issuer.urlTemplate)!.port!), path: "/token/vehicle/bench-1").body)
    guard let object = try JSONSerialization.jsonObject(with: issued) as? [String: Any],
          let token = object["token"] as? String ?? object.values.compactMap({ $0 as? String }).max(by: { $0.count < $1.count }) else {
        throw MeasurementError("the issuer's answer holds no token")
    }

    let loop = clientGroup.next()
    let grpcPath = "/maps.fleetengine.v1.VehicleService/GetVehicle"
    func grpcHeaders(port: Int, token: String?) -> HPACKHeaders {
        var headers: HPACKHeaders = [":method": "POST", ":scheme": "http", ":path": grpcPath, ":authority": "127.0.0.1:\(port)",
                                     "content-type": "application/grpc", "te": "trailers", "x-goog-api-client": "gl-swift/bench grpc/bench",
                                     "x-goog-request-params": "provider_id=providers/p"]
        if let token { headers.add(name: "authorization", value: "Bearer \(token)", indexing: .neverIndexed) }
        return headers
    }
    let proxyGRPC = grpcCall(try await http2Connection(port: port, group: loop), loop: loop, headers: grpcHeaders(port: port, token: nil))
    let directGRPC = grpcCall(try await http2Connection(port: upstreamPort, group: loop), loop: loop,
                              headers: grpcHeaders(port: upstreamPort, token: token))
    // The agent's context switches per call it proxied (warm-up and rounds): where a call's time
    // goes on an idle machine, with each hop between threads a wake-up. And its CPU time per call
    // (all its threads), beside nginx's for the same calls below: the work a proxy does per call,
    // apart from the wake-ups.
    let proxiedCalls = Double(200 + rounds * callsPerRound)
    let switchesBefore = contextSwitches(of: agent.pid)
    let (grpc, agentGRPCMicroseconds) = try await cpuPerCall(of: agent.pid, calls: proxiedCalls) {
        try await paired(proxy: proxyGRPC, direct: directGRPC, rounds: rounds, callsPerRound: callsPerRound, loop: loop)
    }
    let switchesAfter = contextSwitches(of: agent.pid)

    func restHead(port: Int, token: String?) -> HTTPRequestHead {
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: "127.0.0.1:\(port)")
        headers.add(name: "x-goog-api-client", value: "gl-python/bench rest/bench")
        if let token { headers.add(name: "Authorization", value: "Bearer \(token)") }
        return HTTPRequestHead(version: .http1_1, method: .GET, uri: "/v1/\(deliveryVehicleName)", headers: headers)
    }
    let proxyREST = try await http1Call(port: port, group: loop, head: restHead(port: port, token: nil))
    let directREST = try await http1Call(port: upstreamPort, group: loop, head: restHead(port: upstreamPort, token: token))
    let (rest, agentRESTMicroseconds) = try await cpuPerCall(of: agent.pid, calls: proxiedCalls) {
        try await paired(proxy: proxyREST, direct: directREST, rounds: rounds, callsPerRound: callsPerRound, loop: loop)
    }

    // The limit for any proxy in a process of its own: nginx (Debian's) relaying the same calls,
    // the caller's token passed through, gRPC by grpc_pass and REST by proxy_pass, each with
    // kept-alive upstream connections. Its ratio to direct is what the two extra loopback hops
    // and wake-ups cost with a proxy doing the least work; the agent's ratio to it is the agent's
    // own cost beyond that.
    var reference: [String: Any] = [:]
    if let relay = try await NginxRelay.start(upstreamPort: upstreamPort, scratch: scratch) {
        defer { relay.stop() }
        let nginxGRPC = grpcCall(try await http2Connection(port: relay.grpcPort, group: loop), loop: loop,
                                 headers: grpcHeaders(port: relay.grpcPort, token: token))
        let nginxREST = try await http1Call(port: relay.restPort, group: loop, head: restHead(port: relay.restPort, token: token))
        let (nginxGRPCvsDirect, nginxGRPCMicroseconds) = try await cpuPerCall(of: relay.pid, calls: proxiedCalls) {
            try await paired(proxy: nginxGRPC, direct: directGRPC, rounds: rounds, callsPerRound: callsPerRound, loop: loop)
        }
        let proxyGRPCvsNginx = try await paired(proxy: proxyGRPC, direct: nginxGRPC, rounds: rounds, callsPerRound: callsPerRound, loop: loop)
        let (nginxRESTvsDirect, nginxRESTMicroseconds) = try await cpuPerCall(of: relay.pid, calls: proxiedCalls) {
            try await paired(proxy: nginxREST, direct: directREST, rounds: rounds, callsPerRound: callsPerRound, loop: loop)
        }
        let proxyRESTvsNginx = try await paired(proxy: proxyREST, direct: nginxREST, rounds: rounds, callsPerRound: callsPerRound, loop: loop)
        reference = [
            "nginx_relay_grpc_vs_direct": nginxGRPCvsDirect.ratio,
            "nginx_relay_rest_vs_direct": nginxRESTvsDirect.ratio,
            "proxy_grpc_vs_nginx_relay": proxyGRPCvsNginx.ratio,
            "proxy_rest_vs_nginx_relay": proxyRESTvsNginx.ratio,
            "nginx_relay_grpc_p50_microseconds": nginxGRPCvsDirect.proxyP50,
            "nginx_relay_rest_p50_microseconds": nginxRESTvsDirect.proxyP50,
            "nginx_relay": relay.version,
            "nginx_relay_grpc_cpu_microseconds_per_call": rounded(nginxGRPCMicroseconds, 1),
            "nginx_relay_rest_cpu_microseconds_per_call": rounded(nginxRESTMicroseconds, 1),
        ]
    } else {
        note("nginx not found: the relay reference is not measured (apt-get install nginx-light or nginx)")
    }

    let rate = try await throughput(port: port, headers: grpcHeaders(port: port, token: nil), callers: callerCount,
                                    seconds: throughputSeconds, group: clientGroup)
    if rate.failures > 0 { note("\(rate.failures) calls failed during the throughput run, first: \(rate.firstFailure ?? "")") }

    var result: [String: Any] = [
        "proxy_grpc_vs_direct": grpc.ratio,
        "proxy_grpc_ratio_p25_p75": grpc.quartiles,
        "proxy_grpc_ratios_each_round": grpc.eachRound,
        "proxy_grpc_p50_microseconds": grpc.proxyP50,
        "direct_grpc_p50_microseconds": grpc.directP50,
        "proxy_rest_vs_direct": rest.ratio,
        "proxy_rest_ratio_p25_p75": rest.quartiles,
        "proxy_rest_ratios_each_round": rest.eachRound,
        "proxy_rest_p50_microseconds": rest.proxyP50,
        "direct_rest_p50_microseconds": rest.directP50,
        "proxy_grpc_agent_voluntary_switches_per_call": rounded(Double(switchesAfter.voluntary - switchesBefore.voluntary) / proxiedCalls, 2),
        "proxy_grpc_agent_involuntary_switches_per_call": rounded(Double(switchesAfter.involuntary - switchesBefore.involuntary) / proxiedCalls, 2),
        "proxy_grpc_agent_cpu_microseconds_per_call": rounded(agentGRPCMicroseconds, 1),
        "proxy_rest_agent_cpu_microseconds_per_call": rounded(agentRESTMicroseconds, 1),
        "proxy_grpc_calls_per_second": rounded(rate.perSecond, 0),
        "proxy_grpc_throughput_callers": callerCount,
        "proxy_grpc_throughput_failures": rate.failures,
        "proxy_rounds": rounds,
        "proxy_calls_per_round_per_side": callsPerRound,
    ]
    result.merge(reference) { $1 }
    agent.stop()
    await issuer.stop()
    try? await upstream.close()
    try? FileManager.default.removeItem(atPath: scratch)
    let data = try JSONSerialization.data(withJSONObject: result, options: [.sortedKeys, .prettyPrinted])
    FileHandle.standardOutput.write(data)
    FileHandle.standardOutput.write(Data("\n".utf8))
} catch {
    note("\(error)")
    agent.stop()
    await issuer.stop()
    try? await upstream.close()
    exit(1)
}
