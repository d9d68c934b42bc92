// Test kit (issue 14): a real forward proxy on 127.0.0.1 (SwiftNIO): CONNECT tunnels (TLS stays
// end to end) and absolute-form plain HTTP, optional Basic credentials, loopback targets only.

import Foundation
import NIOCore
import NIOPosix
import Synchronization

/// A forward proxy on `127.0.0.1` (a free port). `CONNECT host:port` answers
/// `200 Connection established` and relays bytes both ways until either side closes; an
/// absolute-form request (`GET http://host:port/path`) is sent on in origin form with
/// `Connection: close` (one request per proxy connection). With ``init(username:password:)``
/// a request without the matching `Proxy-Authorization: Basic …` gets 407 and
/// `Proxy-Authenticate`. Only `127.0.0.1` and `localhost` targets are reached (always via
/// 127.0.0.1); others get 403, so a test never reaches outside. An unreachable target gets 502.
///
/// Runs on `MultiThreadedEventLoopGroup.singleton`; every connection is a child task of the
/// proxy's task, so ``stop()`` closes the listener, every tunnel and every upstream connection.
package final class ConnectProxy: LoopbackService {
    /// One request as the proxy read it, recorded once it decided what to do with it.
    package struct RecordedRequest: Sendable {
        /// `CONNECT`, `GET`, `POST`…
        package let method: String
        /// `host:port` for CONNECT, the absolute URL otherwise.
        package let target: String
        /// The `Proxy-Authorization` header as received (nil if absent).
        package let proxyAuthorization: String?
        package let outcome: Outcome
        package let date: Date
    }

    /// What the proxy did with a request.
    package enum Outcome: Sendable, Equatable {
        /// CONNECT answered 200; bytes relayed.
        case tunnelled
        /// A plain request sent on to the target.
        case forwarded
        /// Answered by the proxy itself: 400 malformed, 403 target not loopback, 407 missing or
        /// wrong credentials, 431 head too large, 502 target unreachable.
        case refused(status: Int)
    }

    /// Largest request or response head read; more is answered 431 (or ends the connection).
    package static let headLimit = 64 * 1024
    /// How long connecting to a target may take.
    package static let connectTimeout = TimeAmount.seconds(2)

    /// The `Proxy-Authorization` value required, or nil for an open proxy.
    package let requiredAuthorization: String?
    private let state = Mutex(State())

    private struct State {
        var port = 0
        var requests: [RecordedRequest] = []
        var task: Task<Void, Never>?
    }

    /// An open proxy (no credentials asked).
    package init() {
        requiredAuthorization = nil
    }

    /// A proxy requiring `Proxy-Authorization: Basic base64(username:password)`.
    package init(username: String, password: String) {
        requiredAuthorization = "Basic " + Data("\(username):\(password)".utf8).base64EncodedString()
    }

    /// The bound port (0 before ``start()``).
    package var port: Int { state.withLock { $0.port } }
    /// `http://127.0.0.1:<port>`: what `HTTPS_PROXY` takes.
    package var url: String { "http://127.0.0.1:\(port)" }
    /// Every request so far, in the order the proxy decided on them.
    package var requests: [RecordedRequest] { state.withLock { $0.requests } }

    /// Binds 127.0.0.1 on a free port and starts serving. Call once.
    /// - Throws: bind errors.
    package func start() async throws {
        let listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 64)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .bind(host: "127.0.0.1", port: 0) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        let port = listener.channel.localAddress?.port ?? 0
        let task = Task { [self] in
            _ = try? await listener.executeThenClose { inbound in
                try await withThrowingDiscardingTaskGroup { group in
                    for try await connection in inbound {
                        group.addTask { await self.serve(connection) }
                    }
                }
            }
        }
        state.withLock {
            $0.port = port
            $0.task = task
        }
    }

    /// Closes the listener, every tunnel and upstream connection, and waits until they are closed.
    package func stop() async {
        let task = state.withLock { state -> Task<Void, Never>? in
            defer { state.task = nil }
            return state.task
        }
        task?.cancel()
        await task?.value
    }

    // MARK: - One client connection

    private func serve(_ client: NIOAsyncChannel<ByteBuffer, ByteBuffer>) async {
        try? await client.executeThenClose { inbound, outbound in
            var iterator = inbound.makeAsyncIterator()
            var buffer = ByteBuffer()
            guard let head = try await Self.readHead(from: &iterator, into: &buffer) else {
                if buffer.readableBytes > Self.headLimit { try await outbound.write(Self.refusal(431)) }
                return
            }
            guard let request = RequestHead(head) else {
                try await outbound.write(Self.refusal(400))
                return
            }
            let authorization = request.header("proxy-authorization")
            func record(_ outcome: Outcome) {
                let entry = RecordedRequest(method: request.method, target: request.target, proxyAuthorization: authorization,
                                            outcome: outcome, date: Date())
                state.withLock { $0.requests.append(entry) }
            }
            func refuse(_ status: Int) async throws {
                record(.refused(status: status))
                try await outbound.write(Self.refusal(status))
            }
            if let requiredAuthorization, !Self.matches(authorization, requiredAuthorization) {
                return try await refuse(407)
            }
            guard let destination = request.destination else { return try await refuse(400) }
            guard ["127.0.0.1", "localhost"].contains(destination.host.lowercased()) else { return try await refuse(403) }
            let upstream: NIOAsyncChannel<ByteBuffer, ByteBuffer>
            do {
                upstream = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                    .connectTimeout(Self.connectTimeout)
                    .connect(host: "127.0.0.1", port: destination.port) { channel in
                        channel.eventLoop.makeCompletedFuture {
                            try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                        }
                    }
            } catch {
                return try await refuse(502)
            }
            let tunnel = request.method == "CONNECT"
            record(tunnel ? .tunnelled : .forwarded)
            if tunnel {
                try await outbound.write(ByteBuffer(string: "HTTP/1.1 200 Connection established\r\n\r\n"))
            }
            let first = tunnel ? buffer : ByteBuffer(string: request.originForm(path: destination.path)).appending(buffer)
            try await Self.relay(client: client.channel, iterator: &iterator, outbound: outbound, first: first,
                                 upstream: upstream, rewriteResponseHead: !tunnel)
        }
    }

    /// Sends `first`, then bytes both ways until either side ends; then closes both.
    private static func relay(client: any Channel, iterator: inout NIOAsyncChannelInboundStream<ByteBuffer>.AsyncIterator,
                              outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>, first: ByteBuffer,
                              upstream: NIOAsyncChannel<ByteBuffer, ByteBuffer>, rewriteResponseHead: Bool) async throws {
        try await upstream.executeThenClose { upstreamInbound, upstreamOutbound in
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    // Target to client; when the target is done, so is the client connection.
                    var responses = upstreamInbound.makeAsyncIterator()
                    if rewriteResponseHead {
                        var pending = ByteBuffer()
                        if let head = try await readHead(from: &responses, into: &pending) {
                            try await outbound.write(ByteBuffer(string: closingResponseHead(head)).appending(pending))
                        }
                    }
                    while let chunk = try await responses.next() { try await outbound.write(chunk) }
                    client.close(promise: nil)
                }
                // Client to target, in this task (the iterator cannot leave it).
                do {
                    if first.readableBytes > 0 { try await upstreamOutbound.write(first) }
                    while let chunk = try await iterator.next() { try await upstreamOutbound.write(chunk) }
                } catch {}
                upstream.channel.close(promise: nil)
                try await group.waitForAll()
            }
        }
    }

    // MARK: - Parsing

    /// Reads until the end of a head (`\r\n\r\n`); returns the head's text and leaves what
    /// follows in `buffer`. Nil when the stream ends first or the head exceeds ``headLimit``.
    private static func readHead(from iterator: inout NIOAsyncChannelInboundStream<ByteBuffer>.AsyncIterator,
                                 into buffer: inout ByteBuffer) async throws -> String? {
        let terminator = Array("\r\n\r\n".utf8)
        while true {
            let bytes = buffer.readableBytesView
            if let end = bytes.firstRange(of: terminator) {
                let length = end.upperBound - bytes.startIndex
                return buffer.readString(length: length)
            }
            guard buffer.readableBytes <= headLimit, var chunk = try await iterator.next() else { return nil }
            buffer.writeBuffer(&chunk)
        }
    }

    /// A response head with its `Connection`/`Keep-Alive` fields replaced by `Connection: close`.
    private static func closingResponseHead(_ head: String) -> String {
        let lines = head.components(separatedBy: "\r\n").filter { !$0.isEmpty }
        let kept = lines.filter { line in
            let name = line.prefix { $0 != ":" }.lowercased()
            return name != "connection" && name != "keep-alive"
        }
        return (kept + ["Connection: close"]).joined(separator: "\r\n") + "\r\n\r\n"
    }

    private static func matches(_ received: String?, _ required: String) -> Bool {
        guard let received else { return false }
        let parts = received.split(separator: " ", maxSplits: 1)
        return parts.count == 2 && parts[0].lowercased() == "basic" && "Basic " + parts[1] == required
    }

    private static func refusal(_ status: Int) -> ByteBuffer {
        let reasons = [400: "Bad Request", 403: "Forbidden", 407: "Proxy Authentication Required",
                       431: "Request Header Fields Too Large", 502: "Bad Gateway"]
        var head = "HTTP/1.1 \(status) \(reasons[status] ?? "Error")\r\n"
        if status == 407 { head += "Proxy-Authenticate: Basic realm=\"fleet-token-test-proxy\"\r\n" }
        head += "Content-Length: 0\r\nConnection: close\r\n\r\n"
        return ByteBuffer(string: head)
    }
}

/// A proxy request's head: the request line and the header fields.
private struct RequestHead {
    let method: String
    let target: String
    let version: String
    let fields: [(name: String, value: String)]

    init?(_ text: String) {
        var lines = text.components(separatedBy: "\r\n").filter { !$0.isEmpty }
        guard !lines.isEmpty else { return nil }
        let parts = lines.removeFirst().split(separator: " ", omittingEmptySubsequences: true).map(String.init)
        guard parts.count == 3 else { return nil }
        (method, target, version) = (parts[0].uppercased(), parts[1], parts[2])
        var fields: [(String, String)] = []
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { return nil }
            fields.append((String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
        }
        self.fields = fields
    }

    func header(_ name: String) -> String? {
        fields.first { $0.name.lowercased() == name }?.value
    }

    /// Host, port and (for absolute form) the origin-form path of the target.
    var destination: (host: String, port: Int, path: String)? {
        if method == "CONNECT" {
            guard let colon = target.lastIndex(of: ":"), let port = Int(target[target.index(after: colon)...]),
                  (1...65535).contains(port) else { return nil }
            return (String(target[..<colon]), port, "")
        }
        guard let url = URLComponents(string: target), url.scheme?.lowercased() == "http", let host = url.host else { return nil }
        let path = (url.percentEncodedPath.isEmpty ? "/" : url.percentEncodedPath) + (url.percentEncodedQuery.map { "?" + $0 } ?? "")
        return (host, url.port ?? 80, path)
    }

    /// The head to send to the target: origin form, without proxy fields, `Connection: close`.
    func originForm(path: String) -> String {
        let hopByHop: Set<String> = ["proxy-authorization", "proxy-connection", "connection", "keep-alive"]
        var lines = ["\(method) \(path) \(version)"]
        lines += fields.filter { !hopByHop.contains($0.name.lowercased()) }.map { "\($0.name): \($0.value)" }
        lines.append("Connection: close")
        return lines.joined(separator: "\r\n") + "\r\n\r\n"
    }
}

private extension ByteBuffer {
    func appending(_ other: ByteBuffer) -> ByteBuffer {
        var copy = self
        var other = other
        copy.writeBuffer(&other)
        return copy
    }
}
