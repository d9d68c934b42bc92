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
    var answer: (status: Int, bodyBytes: Int) = (0, 0)
    while answer.status != 200 {
        guard agent.isRunning, monotonicNanoseconds() < deadline else { throw MeasurementError("the TCP agent did not serve:\n\(agent.logTail)") }
        answer = (try? fetchOverTCP(port: agentPort, path: path)) ?? (0, 0)
        if answer.status != 200 { usleep(20_000) }
    }

    // nginx serving a file of the answer's body size at the same path.
    let root = directory + "/nginx-root"
    try FileManager.default.createDirectory(atPath: root + "/v1/token/vehicle", withIntermediateDirectories: true)
    try Data(repeating: UInt8(ascii: "x"), count: answer.bodyBytes).write(to: URL(fileURLWithPath: root + path))
    let nginxPort = try freeLoopbackPort()
    let temporary = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"].map { "\($0)_temp_path \(directory)/\($0);" }.joined(separator: " ")
    try """
        daemon off; worker_processes auto;
        error_log \(directory)/nginx-error.log warn; pid \(directory)/nginx.pid;
        events { worker_connections 1024; }
        http {
          access_log off; \(temporary)
          keepalive_requests 100000000; keepalive_timeout 600s;
          default_type application/json;
          server { listen 127.0.0.1:\(nginxPort); root \(root); }
        }
        """.write(toFile: directory + "/nginx.conf", atomically: true, encoding: .utf8)
    let server = try Child(nginx, ["-p", directory, "-c", directory + "/nginx.conf", "-e", directory + "/nginx-error.log"],
                           log: directory + "/nginx-stdout.log")
    defer { server.stop() }
    while (try? fetchOverTCP(port: nginxPort, path: path))?.status != 200 {
        guard server.isRunning, monotonicNanoseconds() < deadline else {
            throw MeasurementError("nginx did not serve: \((try? String(contentsOfFile: directory + "/nginx-error.log", encoding: .utf8)) ?? "")")
        }
        usleep(20_000)
    }
    let nginxBodyBytes = try fetchOverTCP(port: nginxPort, path: path).bodyBytes

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
        "nginx_static_body_bytes": nginxBodyBytes,
        "api_tcp_body_bytes": answer.bodyBytes,
    ]
}

/// One GET over a new TCP connection to 127.0.0.1:`port`: the status and the body's length.
func fetchOverTCP(port: Int, path: String) throws -> (status: Int, bodyBytes: Int) {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard descriptor >= 0 else { throw MeasurementError("socket(): \(String(cString: strerror(errno)))") }
    defer { close(descriptor) }
    var address = loopbackAddress(port: port)
    let connected = withUnsafePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard connected == 0 else { throw MeasurementError("connect(127.0.0.1:\(port)): \(String(cString: strerror(errno)))") }
    let request = Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nFleet-Token-Request: true\r\nConnection: close\r\n\r\n".utf8)
    guard request.withUnsafeBytes({ send(descriptor, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }) == request.count else {
        throw MeasurementError("send(): \(String(cString: strerror(errno)))")
    }
    var received: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress!, $0.count) }
        if count < 0 && errno == EINTR { continue }
        guard count > 0 else { break }
        received += chunk[0..<count]
    }
    let text = String(decoding: received, as: UTF8.self)
    guard let headEnd = text.range(of: "\r\n\r\n"), text.hasPrefix("HTTP/1.1 "),
          let status = Int(text.dropFirst(9).prefix(3)) else { throw MeasurementError("not an HTTP answer from port \(port)") }
    return (status, text.utf8.distance(from: headEnd.upperBound.samePosition(in: text.utf8)!, to: text.utf8.endIndex))
}
