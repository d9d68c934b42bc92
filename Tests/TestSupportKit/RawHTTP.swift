// A raw HTTP/1.1 exchange over a real socket: the request's bytes exactly as written (clients
// such as AsyncHTTPClient normalize targets like //v1/…, which is what edge tests must send).

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// One request, written byte for byte, and the response read to the connection's end.
public enum RawHTTP {
    /// Where to connect.
    public enum Endpoint: Sendable {
        case unix(String)
        case tcp(port: Int)
    }

    /// A response: status, header lines (lowercased names) and body.
    public struct Answer: Sendable, CustomStringConvertible {
        public let status: Int
        public let headers: [(name: String, value: String)]
        public let body: String
        public var description: String { "\(status) \(body)" }
        public func header(_ name: String) -> String? { headers.first { $0.name == name.lowercased() }?.value }
    }

    /// Sends `method target` with `headers` (a `Connection: close` is added) and reads the answer,
    /// within `timeout` seconds. `host` nil sends no Host header.
    public static func send(_ endpoint: Endpoint, _ method: String, _ target: String, host: String? = "localhost",
                            headers: [(String, String)] = [], timeout: Int = 15) throws -> Answer {
        var head = "\(method) \(target) HTTP/1.1\r\n"
        if let host { head += "Host: \(host)\r\n" }
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if method == "POST" { head += "Content-Length: 0\r\n" }
        head += "Connection: close\r\n\r\n"
        let raw = try exchange(endpoint, Array(head.utf8), timeout: timeout)
        return try parse(raw)
    }

    /// Sends every request of `requests` (whole HTTP/1.1 requests, the last one asking to close)
    /// in one burst on one connection, from a thread of its own, while reading the answers here
    /// until the server closes or `timeout` seconds pass without a byte; everything read. Returns
    /// once the writing thread has stopped using the connection.
    public static func pipelined(_ endpoint: Endpoint, _ requests: [String], timeout: Int = 60) throws -> String {
        let fd = try connect(endpoint, timeout: timeout)
        let written = DispatchSemaphore(value: 0)
        // The writer must be done with `fd` before it is closed: its next send would go to
        // whatever socket of the process took the number since. shutdown() ends a send that
        // waits for a server no longer reading.
        defer {
            shutdown(fd, Int32(SHUT_RDWR))
            written.wait()
            close(fd)
        }
        let bytes = Array(requests.joined().utf8)
        Thread {
            _ = writeAll(fd, bytes)
            written.signal()
        }.start()
        return String(decoding: try readToEnd(fd), as: UTF8.self)
    }

    /// A connection that was served `request` (a whole keep-alive HTTP/1.1 request) with a 200
    /// and is left open: the descriptor. Proves the server admitted it, as an idle one cannot.
    public static func keptAlive(_ endpoint: Endpoint, _ request: String) throws -> Int32 {
        let descriptor = openIdle(endpoint)
        guard descriptor >= 0 else { throw ProcessFailure(message: "connect \(endpoint) failed") }
        do {
            let answer = try answer(on: descriptor, request)
            guard answer.hasPrefix("HTTP/1.1 200") else { throw ProcessFailure(message: "not admitted: \(answer)") }
            return descriptor
        } catch {
            close(descriptor)
            throw error
        }
    }

    /// Writes `request` (a whole HTTP/1.1 request) on the open connection `descriptor` and reads
    /// its whole answer (head and a body of its Content-Length), which it returns as text; the
    /// connection stays open. Throws when the connection ends first.
    public static func answer(on descriptor: Int32, _ request: String) throws -> String {
        guard writeAll(descriptor, Array(request.utf8)) else { throw ProcessFailure(message: "write failed") }
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            guard count > 0 else {
                throw ProcessFailure(message: "the kept-alive connection ended: \(String(decoding: received, as: UTF8.self))")
            }
            received += buffer[..<count]
            let text = String(decoding: received, as: UTF8.self)
            guard let end = text.range(of: "\r\n\r\n") else { continue }
            let length = text[..<end.lowerBound].split(separator: "\r\n")
                .first { $0.lowercased().hasPrefix("content-length:") }
                .flatMap { Int($0.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) } ?? 0
            if text.utf8.count - text[..<end.upperBound].utf8.count >= length { return text }
        }
    }

    /// Opens a connection and keeps it open without sending anything; the descriptor, or -1.
    public static func openIdle(_ endpoint: Endpoint) -> Int32 {
        (try? connect(endpoint, timeout: 5)) ?? -1
    }

    /// A connection to `endpoint` whose reads and writes time out after `timeout` seconds: the descriptor.
    public static func connect(_ endpoint: Endpoint, timeout: Int) throws -> Int32 {
        let fd: Int32
        let result: Int32
        switch endpoint {
        case .unix(let path):
            fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            result = withUnixSocketAddress(path) { Glibc.connect(fd, $0, $1) }
        case .tcp(let port):
            fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = in_port_t(UInt16(port).bigEndian)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
        }
        guard fd >= 0, result == 0 else {
            let reason = String(cString: strerror(errno))
            if fd >= 0 { close(fd) }
            throw ProcessFailure(message: "connect \(endpoint): \(reason)")
        }
        var limit = timeval(tv_sec: timeout, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        return fd
    }

    /// Sends `request` (any bytes) on a new connection and reads until the server closes, each
    /// read within `timeout` seconds: everything read.
    public static func exchange(_ endpoint: Endpoint, _ request: [UInt8], timeout: Int) throws -> [UInt8] {
        let fd = try connect(endpoint, timeout: timeout)
        defer { close(fd) }
        guard writeAll(fd, request) else { throw ProcessFailure(message: "write: \(String(cString: strerror(errno)))") }
        return try readToEnd(fd)
    }

    /// Writes all of `bytes` to `fd`; false when a write fails (errno says why).
    public static func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var sent = 0
        while sent < bytes.count {
            // MSG_NOSIGNAL: a connection the server closed fails the write instead of ending
            // the test process with SIGPIPE.
            let count = bytes[sent...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard count > 0 else { return false }
            sent += count
        }
        return true
    }

    /// Whether the server has read everything written on the loopback TCP connection `fd`, from
    /// /proc/net/tcp: this end's send queue is empty (the server's TCP acknowledged every byte,
    /// so all of it reached the server's socket) and so is the server end's receive queue (its
    /// process took all of it). Tells a request the server's event loop has read from one still
    /// in the kernel. Nil when either row is not found.
    public static func serverHasRead(_ fd: Int32) -> Bool? {
        func port(_ get: (Int32, UnsafeMutablePointer<sockaddr>, UnsafeMutablePointer<socklen_t>) -> Int32) -> Int? {
            var address = sockaddr_in()
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let result = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { get(fd, $0, &length) } }
            return result == 0 ? Int(UInt16(bigEndian: address.sin_port)) : nil
        }
        guard let client = port({ getsockname($0, $1, $2) }), let server = port({ getpeername($0, $1, $2) }),
              let rows = loopbackTCPRows() else { return nil }
        guard let mine = rows.first(where: { $0.localPort == client && $0.remotePort == server }),
              let theirs = rows.first(where: { $0.localPort == server && $0.remotePort == client }) else { return nil }
        return mine.sendQueue == 0 && theirs.receiveQueue == 0
    }

    /// One socket of 127.0.0.1 as /proc/net/tcp lists it.
    public struct TCPRow: Sendable {
        public let localPort: Int
        public let remotePort: Int
        /// The kernel's state, in hexadecimal as listed (`0A`: listening).
        public let state: String
        /// Bytes not yet acknowledged by the peer.
        public let sendQueue: Int
        /// Bytes received and not yet read; for a listening socket, connections not yet accepted.
        public let receiveQueue: Int
    }

    /// The sockets of 127.0.0.1 in /proc/net/tcp (read whole), or nil when it cannot be read.
    public static func loopbackTCPRows() -> [TCPRow]? {
        guard let table = procTable("/proc/net/tcp") else { return nil }
        func port(_ address: Substring, prefix: String) -> Int? {
            address.hasPrefix(prefix) ? Int(address.dropFirst(prefix.count), radix: 16) : nil
        }
        return table.split(separator: "\n").dropFirst().compactMap { line in
            // sl, local address, remote address, state, tx_queue:rx_queue, ... (hexadecimal)
            let fields = line.split(separator: " ")
            guard fields.count > 4, let local = port(fields[1], prefix: "0100007F:") else { return nil }
            let queues = fields[4].split(separator: ":").compactMap { Int($0, radix: 16) }
            guard queues.count == 2 else { return nil }
            // A listening socket's remote address is 00000000:0000.
            let remote = port(fields[2], prefix: "0100007F:") ?? 0
            return TCPRow(localPort: local, remotePort: remote, state: String(fields[3]), sendQueue: queues[0], receiveQueue: queues[1])
        }
    }

    /// A /proc table read whole: its files state a size of 0, and Foundation's
    /// `String(contentsOfFile:)` trusts that and returns the first read only (about 4 KiB).
    static func procTable(_ path: String) -> String? {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        return (try? readToEnd(fd)).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Reads `fd` until the peer closes; a read error (the receive timeout) throws.
    public static func readToEnd(_ fd: Int32) throws -> [UInt8] {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count > 0 { received += buffer[..<count]; continue }
            if count == 0 { break }
            throw ProcessFailure(message: "read: \(String(cString: strerror(errno))) after \(received.count) bytes")
        }
        return received
    }

    static func parse(_ raw: [UInt8]) throws -> Answer {
        let text = String(decoding: raw, as: UTF8.self)
        guard let end = text.range(of: "\r\n\r\n") else { throw ProcessFailure(message: "no response head in \(text.prefix(200))") }
        let lines = text[..<end.lowerBound].components(separatedBy: "\r\n")
        let statusParts = lines[0].split(separator: " ")
        guard statusParts.count >= 2, let status = Int(statusParts[1]) else { throw ProcessFailure(message: "bad status line \(lines[0])") }
        let headers = lines.dropFirst().compactMap { line -> (name: String, value: String)? in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            return (line[..<colon].lowercased(), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
        var body = String(text[end.upperBound...])
        if headers.contains(where: { $0.name == "transfer-encoding" && $0.value.lowercased() == "chunked" }) { body = dechunk(body) }
        return Answer(status: status, headers: headers, body: body)
    }

    static func dechunk(_ text: String) -> String {
        var rest = Substring(text)
        var out = ""
        while let lineEnd = rest.range(of: "\r\n"), let size = Int(rest[..<lineEnd.lowerBound], radix: 16), size > 0 {
            let start = lineEnd.upperBound
            let utf8 = rest.utf8
            guard let stop = utf8.index(start, offsetBy: size, limitedBy: utf8.endIndex) else { break }
            out += String(rest[start..<stop])
            rest = rest[stop...].dropFirst(2)
        }
        return out
    }
}
