// The Fleet Engine proxy's wires: a connection's first bytes tell HTTP/2 with prior knowledge
// (gRPC, or REST over HTTP/2) from HTTP/1.1 (REST); each call is read whole, handed to the
// proxy's core through the service's call queue, and its answer written in the caller's terms.

import FleetTokenService
import NIOCore
import NIOHPACK
import NIOHTTP1
import NIOHTTP2
import Synchronization

/// What a connection's handlers need: how to run a call, where it came from, and the count of
/// its calls still waiting for their answers.
struct ProxyCallContext: Sendable {
    let calls: ProxyCallQueue
    let proxy: FleetEngineProxy
    let transport: ProxyTransport
    let peer: PeerIdentity?
    let waiting: CallsAwaitingAnswers

    /// Answers `request`, read on `loop`, and gives the answer to `reply` (any thread): on `loop`
    /// when its token is in memory, else in a child task of the service. The call counts as
    /// waiting until its answer is written (the writer calls ``CallsAwaitingAnswers/answered()``).
    func run(_ request: ProxyRequest, on loop: any EventLoop, reply: @escaping @Sendable (ProxyResponse) -> Void) {
        let calls = calls
        waiting.started()
        proxy.handle(request, transport: transport, peer: peer, on: loop, inTask: { calls.submit($0) }, reply: reply)
    }
}

/// A connection's calls between their request and their answer's write: while one waits (for a
/// fetch, for Fleet Engine, for a retry), nothing moves on the connection, and it is not idle.
final class CallsAwaitingAnswers: Sendable {
    private let count = Atomic<Int>(0)

    func started() { count.add(1, ordering: .relaxed) }

    func answered() { count.subtract(1, ordering: .relaxed) }

    var any: Bool { count.load(ordering: .relaxed) > 0 }
}

/// Reads a connection's first bytes: the HTTP/2 connection preface sets up HTTP/2, anything
/// else HTTP/1.1; then steps aside, handing on what it read.
final class ProtocolSniffer: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
    static let preface = RefusedConnectionHandler.http2Preface

    private let context: ProxyCallContext
    private var buffered: ByteBuffer?

    init(_ context: ProxyCallContext) { self.context = context }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        if var earlier = buffered {
            earlier.writeBuffer(&bytes)
            bytes = earlier
        }
        let seen = bytes.readableBytesView.prefix(Self.preface.count)
        guard seen.elementsEqual(Self.preface.prefix(seen.count)) else { return choose(http2: false, bytes, context) }
        guard seen.count == Self.preface.count else {
            buffered = bytes
            return
        }
        choose(http2: true, bytes, context)
    }

    /// A shutdown before the first bytes: nothing to finish.
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is ChannelShouldQuiesceEvent {
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    private func choose(http2: Bool, _ bytes: ByteBuffer, _ context: ChannelHandlerContext) {
        buffered = nil
        let calls = self.context
        do {
            let pipeline = context.pipeline.syncOperations
            if http2 {
                // At a graceful shutdown, HTTP/2 callers are told to go (GOAWAY, a PING, GOAWAY
                // naming the last stream served) and the connection closes once its calls are
                // answered: without it a caller kept an idle connection until the shutdown's
                // 10 s limit. Idle and dead connections are the idle handler's, as for HTTP/1.1.
                let manager = NIOHTTP2ServerConnectionManagementHandler(eventLoop: context.eventLoop, configuration: .init(
                    maxIdleTime: nil, maxAge: nil, maxGraceTime: nil, keepalive: nil))
                _ = try pipeline.configureHTTP2Pipeline(mode: .server, connectionConfiguration: .init(), streamConfiguration: .init(),
                                                        streamDelegate: manager.http2StreamDelegate) { stream in
                    stream.eventLoop.makeCompletedFuture {
                        try stream.pipeline.syncOperations.addHandler(HTTP2CallHandler(calls))
                    }
                }
                try pipeline.addHandler(manager)
            } else {
                try pipeline.configureHTTPServerPipeline(withPipeliningAssistance: true, withErrorHandling: true)
                try pipeline.addHandler(makeAbsoluteFormTargetHandler())
                try pipeline.addHandler(HTTP1CallHandler(calls))
            }
        } catch {
            context.close(promise: nil)
            return
        }
        context.fireChannelRead(wrapInboundOut(bytes))
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }
}

/// One HTTP/2 stream: a call read whole (headers, body up to the cap), answered with the
/// status and headers, the body, and the trailers.
final class HTTP2CallHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    private let calls: ProxyCallContext
    private var request: ProxyRequest?
    private var dispatched = false

    init(_ calls: ProxyCallContext) { self.calls = calls }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !dispatched else { return }
        switch unwrapInboundIn(data) {
        case .headers(let frame):
            if request == nil {
                let read = Self.request(from: frame.headers)
                request = read
                // A gRPC method the proxy does not know (a streaming one among them: every
                // Fleet Engine method is unary) is answered now, not after a body that a
                // streaming client may never end.
                if read.wire == .grpc && FleetEngineMethod.grpc(path: read.target) == nil { return dispatch(context) }
            }
            // A second HEADERS frame is the request's trailers: nothing of them is forwarded.
            if frame.endStream { dispatch(context) }
        case .data(let frame):
            guard case .byteBuffer(var bytes) = frame.data, request != nil else { return }
            guard request!.body.readableBytes + bytes.readableBytes <= ProxyRequestRules.maxBodyBytes else {
                return refuse(context, ProxyRefusal(grpcStatus: 8, httpStatus: 413, message:
                    "token-agent's Fleet Engine proxy refused the call: the request body is larger than \(ProxyRequestRules.maxBodyBytes) bytes"))
            }
            guard calls.proxy.bodyBudget.take(bytes.readableBytes, for: &request!.reservation) else { return refuse(context, .bodyBudgetSpent(calls.proxy.bodyBudget)) }
            request!.body.writeBuffer(&bytes)
            if frame.endStream { dispatch(context) }
        default:
            break
        }
    }

    static func request(from headers: HPACKHeaders) -> ProxyRequest {
        var method = "GET", path = "/", authority: String?
        var fields: [(name: String, value: String)] = []
        for field in headers {
            switch field.name {
            case ":method": method = field.value
            case ":path": path = field.value
            case ":authority": authority = field.value
            case let name where name.hasPrefix(":"): break
            default: fields.append((field.name, field.value))
            }
        }
        let wire: ProxyWire = fields.first { $0.name == "content-type" }?.value.lowercased().hasPrefix("application/grpc") == true ? .grpc : .rest
        if authority == nil { authority = fields.first { $0.name == "host" }?.value }
        return ProxyRequest(wire: wire, method: method, target: path, authority: authority, headers: fields, body: ByteBuffer())
    }

    private func dispatch(_ context: ChannelHandlerContext) {
        guard let request, !dispatched else { return }
        dispatched = true
        self.request = nil
        let channel = context.channel
        let waiting = calls.waiting
        calls.run(request, on: context.eventLoop) { response in
            Self.write(response, to: channel).whenComplete { _ in waiting.answered() }
        }
    }

    private func refuse(_ context: ChannelHandlerContext, _ refusal: ProxyRefusal) {
        dispatched = true
        guard let request else { return }
        Self.write(calls.proxy.refusedUnread(request, refusal, peer: calls.peer), to: context.channel)
        self.request = nil
    }

    /// Writes `response` on the stream `channel`; the future completes with the last frame's write.
    @discardableResult
    static func write(_ response: ProxyResponse, to channel: any Channel) -> EventLoopFuture<Void> {
        var head = HPACKHeaders()
        head.add(name: ":status", value: "\(response.status)")
        for field in response.headers { head.add(name: field.name, value: field.value) }
        let hasBody = response.body.readableBytes > 0
        let trailers = response.trailers
        // The promise goes with the frame that ends the stream.
        let written = channel.eventLoop.makePromise(of: Void.self)
        let headEnds = !hasBody && trailers == nil
        channel.write(HTTP2Frame.FramePayload.headers(.init(headers: head, endStream: headEnds)), promise: headEnds ? written : nil)
        if hasBody {
            channel.write(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(response.body), endStream: trailers == nil)),
                          promise: trailers == nil ? written : nil)
        }
        if let trailers {
            var fields = HPACKHeaders()
            for field in trailers { fields.add(name: field.name, value: field.value) }
            channel.write(HTTP2Frame.FramePayload.headers(.init(headers: fields, endStream: true)), promise: written)
        }
        channel.flush()
        return written.futureResult
    }
}

/// One HTTP/1.1 connection: REST calls, one at a time (NIO's pipelining helper holds the next),
/// each read whole and answered with a length.
final class HTTP1CallHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let calls: ProxyCallContext
    private var head: HTTPRequestHead?
    private var body = ByteBuffer()
    /// The body's bytes in the proxy's budget, handed to the request at its end.
    private var reservation: BodyReservation?
    private var refused = false

    init(_ calls: ProxyCallContext) { self.calls = calls }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
            body.clear()
            reservation = nil
            refused = false
            if let length = head.headers.first(name: "content-length").flatMap(Int.init), length > ProxyRequestRules.maxBodyBytes {
                refuseTooLarge(context)
            }
        case .body(var bytes):
            guard !refused else { return }
            guard body.readableBytes + bytes.readableBytes <= ProxyRequestRules.maxBodyBytes else { return refuseTooLarge(context) }
            guard calls.proxy.bodyBudget.take(bytes.readableBytes, for: &reservation) else { return refuseUnread(context, .bodyBudgetSpent(calls.proxy.bodyBudget)) }
            body.writeBuffer(&bytes)
        case .end:
            guard let head, !refused else { return }
            self.head = nil
            let request = ProxyRequest(
                wire: .rest, method: head.method.rawValue, target: head.uri, authority: head.headers.first(name: "host"),
                headers: head.headers.map { ($0.name.lowercased(), $0.value) }, body: body, reservation: reservation)
            body = ByteBuffer()
            reservation = nil
            let keepAlive = head.isKeepAlive
            let version = head.version
            let channel = context.channel
            let loop = context.eventLoop
            // Written in a later turn of the loop, never inside this read: an answer written at
            // once (a refusal) makes NIO's pipelining helper hand over the next request from
            // inside that write, so a burst of refused requests would nest one call per request.
            let waiting = calls.waiting
            calls.run(request, on: loop) { response in
                loop.execute {
                    Self.write(response, version: version, keepAlive: keepAlive, to: channel).whenComplete { _ in waiting.answered() }
                }
            }
        }
    }

    /// 413, then the connection closed after a linger: the rest of the body is read and dropped
    /// meanwhile (``write(_:version:keepAlive:lingering:to:)``).
    private func refuseTooLarge(_ context: ChannelHandlerContext) {
        refuseUnread(context, ProxyRefusal(grpcStatus: 8, httpStatus: 413, message:
            "token-agent's Fleet Engine proxy refused the call: the request body is larger than \(ProxyRequestRules.maxBodyBytes) bytes"))
    }

    /// `refusal` before the body was read whole: answered, then the connection closed after
    /// a linger; what the body held so far is dropped.
    private func refuseUnread(_ context: ChannelHandlerContext, _ refusal: ProxyRefusal) {
        guard let head, !refused else { return }
        refused = true
        body = ByteBuffer()
        reservation = nil
        let request = ProxyRequest(wire: .rest, method: head.method.rawValue, target: head.uri, authority: head.headers.first(name: "host"),
                                   headers: head.headers.map { ($0.name.lowercased(), $0.value) }, body: ByteBuffer())
        Self.write(calls.proxy.refusedUnread(request, refusal, peer: calls.peer), version: head.version, keepAlive: false,
                   lingering: true, to: context.channel)
    }

    /// How long a connection refused mid-body stays open for reading (and dropping) what its
    /// client still sends, after the answer and this end's half-close.
    static let linger = TimeAmount.seconds(2)

    /// Writes `response`; the future completes with the write of its end. Without `keepAlive`
    /// the connection is closed after it; `lingering`, only this end is at once (a FIN after the
    /// answer), and the rest of the connection within ``linger``: a client still sending a body
    /// when the answer came (a 413) gets to read it. Closed at once, its unread bytes made the
    /// kernel reset the connection, and a client that sends the whole body before reading saw
    /// the reset, not the 413.
    @discardableResult
    static func write(_ response: ProxyResponse, version: HTTPVersion, keepAlive: Bool, lingering: Bool = false,
                      to channel: any Channel) -> EventLoopFuture<Void> {
        var headers = HTTPHeaders(response.headers.map { ($0.name, $0.value) })
        headers.replaceOrAdd(name: "content-length", value: "\(response.body.readableBytes)")
        if !keepAlive { headers.replaceOrAdd(name: "connection", value: "close") }
        let head = HTTPResponseHead(version: version, status: HTTPResponseStatus(statusCode: response.status), headers: headers)
        channel.write(HTTPServerResponsePart.head(head), promise: nil)
        if response.body.readableBytes > 0 { channel.write(HTTPServerResponsePart.body(.byteBuffer(response.body)), promise: nil) }
        let done = channel.writeAndFlush(HTTPServerResponsePart.end(nil))
        if !keepAlive {
            done.whenComplete { _ in
                guard lingering else { return channel.close(promise: nil) }
                channel.close(mode: .output, promise: nil)
                channel.eventLoop.scheduleTask(in: linger) { channel.close(promise: nil) }
            }
        }
        return done
    }
}

/// Closes a connection idle (nothing read or written) for the idle timeout, unless a call of
/// its own is still waiting for its answer (the idle handler asks again a timeout later).
final class IdleConnectionCloser: ChannelInboundHandler {
    typealias InboundIn = NIOAny

    private let waiting: CallsAwaitingAnswers

    init(_ waiting: CallsAwaitingAnswers) { self.waiting = waiting }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is IdleStateHandler.IdleStateEvent {
            if !waiting.any { context.close(promise: nil) }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }
}
