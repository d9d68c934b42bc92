// The token API's throughput against the limit for a local HTTP answer (issue 32): token GETs
// per second over loopback TCP with keep-alive at 64 connections, against Debian's nginx serving
// a file of the token answer's size on the same machine, both driven by the same load generator
// (wrk, one thread, 64 connections), in alternating runs. The figure is the median of the runs'
// ratios.
//
// nginx runs as Debian configures it (a master and `worker_processes auto`), without an access
// log, with keep-alive for the whole run (its default closes a connection after 1,000 requests,
// which would cost it reconnections the agent does not pay).

import BenchmarkSupport
import DevTokenIssuer
import Foundation
#if canImport(Glibc)
import Glibc
#endif

struct NginxThroughputSettings {
    var runs = 5
    var seconds = 5
    var connections = 64
}

func measureThroughputAgainstNginx(agentPath: String, issuer: DevTokenIssuer, scratch: String,
                                   settings: NginxThroughputSettings) async throws -> [String: Any] {
    guard let nginx = DebianNginx.executable else { throw MeasurementError("nginx is not installed (apt-get install nginx)") }
    guard let wrk = ["/usr/bin/wrk", "/usr/local/bin/wrk"].first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
        throw MeasurementError("wrk is not installed (apt-get install wrk)")
    }
    let directory = scratch + "/throughput-tcp"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)

    // The agent on TCP, with its token fetched before any run.
    let agentPort = try freeLoopbackPort()
    let path = "/v1/token/vehicle/tcp-0"
    let agent = try Child(agentPath, ["--db", directory + "/tokens.sqlite", "--listen", "127.0.0.1:\(agentPort)",
                                      "--provider-url", issuer.urlTemplate, "--no-proxy", "--vehicle", "tcp-0",
                                      "--log-level", "warning"], log: directory + "/agent.log")
    defer { agent.stop() }
    let deadline = monotonicNanoseconds() + 60_000_000_000
    var answer: (status: Int, body: [UInt8]) = (0, [])
    while answer.status != 200 {
        guard agent.isRunning, monotonicNanoseconds() < deadline else { throw MeasurementError("the TCP agent did not serve:\n\(agent.logTail)") }
        answer = (try? loopbackGET(port: agentPort, path: path, headers: ["Fleet-Token-Request: true"])) ?? (0, [])
        if answer.status != 200 { usleep(20_000) }
    }

    // nginx serving a file of the answer's body size at the same path.
    let root = directory + "/nginx-root"
    try FileManager.default.createDirectory(atPath: root + "/v1/token/vehicle", withIntermediateDirectories: true)
    try Data(repeating: UInt8(ascii: "x"), count: answer.body.count).write(to: URL(fileURLWithPath: root + path))
    let nginxPort = try freeLoopbackPort()
    let server = try DebianNginx.start(nginx, in: directory + "/nginx", main: "worker_processes auto;", http: """
        default_type application/json;
          server { listen 127.0.0.1:\(nginxPort); root \(root); }
        """, ports: [nginxPort])
    defer { server.stop() }
    let nginxAnswer = try loopbackGET(port: nginxPort, path: path)
    guard nginxAnswer.status == 200 else { throw MeasurementError("nginx answered \(nginxAnswer.status) for \(path)") }

    func rate(port: Int) throws -> Double {
        let log = directory + "/wrk-\(port).txt"
        let child = try Child(wrk, ["-t1", "-c\(settings.connections)", "-d\(settings.seconds)s",
                                    "-H", "Fleet-Token-Request: true", "http://127.0.0.1:\(port)\(path)"], log: log)
        guard child.wait() == 0 else { throw MeasurementError("wrk failed: \(child.output)") }
        let output = child.output
        guard !output.contains("Non-2xx"), !output.contains("Socket errors") else {
            throw MeasurementError("wrk saw failed requests on port \(port):\n\(output)")
        }
        guard let line = output.split(separator: "\n").first(where: { $0.hasPrefix("Requests/sec:") }),
              let value = Double(line.split(separator: " ").last ?? "") else {
            throw MeasurementError("no Requests/sec in wrk's output:\n\(output)")
        }
        return value
    }

    // A warm-up run each, then alternating runs.
    _ = try rate(port: agentPort)
    _ = try rate(port: nginxPort)
    var agentRates: [Double] = [], nginxRates: [Double] = [], ratios: [Double] = []
    for run in 0..<settings.runs {
        let (agentRate, nginxRate): (Double, Double)
        if run.isMultiple(of: 2) {
            agentRate = try rate(port: agentPort)
            nginxRate = try rate(port: nginxPort)
        } else {
            nginxRate = try rate(port: nginxPort)
            agentRate = try rate(port: agentPort)
        }
        agentRates.append(agentRate)
        nginxRates.append(nginxRate)
        ratios.append(agentRate / nginxRate)
    }
    return [
        "api_throughput_vs_nginx_static": rounded(median(ratios)),
        "api_throughput_vs_nginx_static_each_run": ratios.map { rounded($0) },
        "api_tcp_hits_per_second": median(agentRates).rounded(),
        "nginx_static_hits_per_second": median(nginxRates).rounded(),
        "api_throughput_load_generator": "wrk -t1 -c\(settings.connections) -d\(settings.seconds)s",
        "nginx_static_version": DebianNginx.version(nginx),
        "nginx_static_body_bytes": nginxAnswer.body.count,
        "api_tcp_body_bytes": answer.body.count,
    ]
}
