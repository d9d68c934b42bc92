// What the tools that start a local server (nginx, the agent on TCP) share: a free loopback
// port, a check that a port accepts, one plain GET over TCP, and Debian's nginx.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A loopback TCP port nobody listens on now (bound to port 0 and released).
public func freeLoopbackPort() throws -> Int {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard descriptor >= 0 else { throw MeasurementError("socket(): \(String(cString: strerror(errno)))") }
    defer { close(descriptor) }
    var address = loopbackAddress(port: 0)
    let bound = withUnsafePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard bound == 0 else { throw MeasurementError("bind(127.0.0.1:0): \(String(cString: strerror(errno)))") }
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let named = withUnsafeMutablePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
    }
    guard named == 0 else { throw MeasurementError("getsockname(): \(String(cString: strerror(errno)))") }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// True when something accepts a TCP connection on 127.0.0.1:`port`.
public func loopbackAccepts(port: Int) -> Bool {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard descriptor >= 0 else { return false }
    defer { close(descriptor) }
    var address = loopbackAddress(port: port)
    return withUnsafePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
}

/// 127.0.0.1:`port` as a socket address.
public func loopbackAddress(port: Int) -> sockaddr_in {
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = UInt16(port).bigEndian
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    return address
}

/// One GET of `path` over a new TCP connection to 127.0.0.1:`port` (`Connection: close`, read to
/// the end), with `headers` ("Name: value") added: the status and the body.
public func loopbackGET(port: Int, path: String, headers: [String] = []) throws -> (status: Int, body: [UInt8]) {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard descriptor >= 0 else { throw MeasurementError("socket(): \(String(cString: strerror(errno)))") }
    defer { close(descriptor) }
    var address = loopbackAddress(port: port)
    let connected = withUnsafePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard connected == 0 else { throw MeasurementError("connect(127.0.0.1:\(port)): \(String(cString: strerror(errno)))") }
    let head = (["GET \(path) HTTP/1.1", "Host: 127.0.0.1:\(port)"] + headers + ["Connection: close"]).joined(separator: "\r\n")
    let request = Array((head + "\r\n\r\n").utf8)
    guard request.withUnsafeBytes({ send(descriptor, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }) == request.count else {
        throw MeasurementError("send(): \(String(cString: strerror(errno)))")
    }
    var response: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65_536)
    while true {
        let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress!, $0.count) }
        if count < 0 && errno == EINTR { continue }
        guard count > 0 else { break }
        response += chunk[0..<count]
    }
    guard let split = response.firstRange(of: Array("\r\n\r\n".utf8)), response.starts(with: Array("HTTP/1.1 ".utf8)),
          let status = Int(String(decoding: response[9..<min(12, response.count)], as: UTF8.self)) else {
        throw MeasurementError("no HTTP answer from 127.0.0.1:\(port)\(path)")
    }
    return (status, Array(response[split.upperBound...]))
}

/// Debian's nginx: where it is (nil when not installed), started in the foreground on a
/// configuration of a tool's own, and the version it reports.
public enum DebianNginx {
    public static var executable: String? {
        ["/usr/sbin/nginx", "/usr/bin/nginx"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// Starts `nginx` in the foreground with its files in `directory`: `main` is the main
    /// context's process settings (e.g. `worker_processes auto;`), `http` the servers. Every
    /// configuration has no access log and keeps a connection for the whole run (nginx closes
    /// one after 1,000 requests by default, a reconnection the measured side would not pay).
    /// Returns once every one of `ports` accepts.
    public static func start(_ nginx: String, in directory: String, main: String, http: String, ports: [Int]) throws -> Child {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let temporary = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"].map { "\($0)_temp_path \(directory)/\($0);" }.joined(separator: " ")
        try """
            daemon off; \(main)
            error_log \(directory)/error.log warn; pid \(directory)/nginx.pid;
            events { worker_connections 1024; }
            http {
              access_log off; \(temporary)
              keepalive_requests 100000000; keepalive_timeout 600s;
              \(http)
            }
            """.write(toFile: directory + "/nginx.conf", atomically: true, encoding: .utf8)
        let child = try Child(nginx, ["-p", directory, "-c", directory + "/nginx.conf", "-e", directory + "/error.log"], log: directory + "/stdout.log")
        let deadline = monotonicNanoseconds() + 20_000_000_000
        while !ports.allSatisfy(loopbackAccepts(port:)) {
            guard child.isRunning, monotonicNanoseconds() < deadline else {
                child.stop()
                throw MeasurementError("nginx did not listen: \((try? String(contentsOfFile: directory + "/error.log", encoding: .utf8)) ?? "")")
            }
            usleep(20_000)
        }
        return child
    }

    /// `nginx -v`'s version, e.g. "nginx/1.22.1".
    public static func version(_ nginx: String) -> String {
        let log = NSTemporaryDirectory() + "nginx-version-\(getpid()).txt"
        defer { try? FileManager.default.removeItem(atPath: log) }
        guard let child = try? Child(nginx, ["-v"], log: log) else { return "nginx" }
        _ = child.wait()
        return ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "nginx").replacingOccurrences(of: "nginx version: ", with: "")
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }
}
