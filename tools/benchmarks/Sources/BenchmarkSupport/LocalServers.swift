// What the tools that start a local server (nginx, the agent on TCP) share: a free loopback
// port, a check that a port accepts, and where Debian's nginx is.

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

/// Debian's nginx: where it is (nil when not installed) and the version it reports.
public enum DebianNginx {
    public static var executable: String? {
        ["/usr/sbin/nginx", "/usr/bin/nginx"].first { FileManager.default.isExecutableFile(atPath: $0) }
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
