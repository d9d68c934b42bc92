// Service layer: Hummingbird's HTTP/1 child channel behind the connection gate (with the held
// token route on its event loop), and the handler that answers a refused connection 503 and
// closes it.

import HummingbirdCore
import Logging
import NIOCore
// Implementation-only: see AbsoluteFormTargetHandler.swift.
@_implementationOnly import NIOHTTPTypesHTTP1

/// Hummingbird's HTTP/1 child channel behind a ``ConnectionGate``: an admitted connection is
/// set up as usual and released when it closes; a refused one gets a handler in front of the
/// HTTP codec that answers 503 and closes it.
struct GatedHTTP1Channel: ServerChildChannel {
    typealias Value = HTTP1Channel.Value

    let normal: HTTP1Channel
    let busy: HTTP1Channel
    let gate: ConnectionGate
    let unixSocket: Bool
    /// Answers held tokens on the event loop (nil: every request is routed).
    let heldTokens: HeldTokenRoute?
    /// The idle timeouts of connections accepted below the busy threshold and above it, kept by
    /// the held-token handler when there is one (Hummingbird's are then off).
    let idleTimeouts: (normal: TimeAmount?, busy: TimeAmount?)

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        guard channel.eventLoop.inEventLoop else {
            return channel.eventLoop.flatSubmit { self.setup(channel: channel, logger: logger) }
        }
        let identity = unixSocket ? ConnectionPeer.identity(channel) : nil
        let peer = ConnectionPeer.of(channel, unixSocket: unixSocket, identity: identity)
        let admission = gate.admit(peer)
        guard case .admitted(let isBusy) = admission else {
            let caps = gate.caps
            do {
                try channel.pipeline.syncOperations.addHandler(RefusedConnectionHandler(Self.refusal(admission, caps: caps), gate: gate))
            } catch {
                channel.close(promise: nil)
            }
            return normal.setup(channel: channel, logger: logger)
        }
        let gate = gate
        let connection = ObjectIdentifier(channel)
        if let identity { gate.remember(identity, for: connection) }
        channel.closeFuture.whenComplete { _ in
            gate.release(peer)
            if identity != nil { gate.forget(connection) }
        }
        let heldTokens = heldTokens
        let unixSocket = unixSocket
        return (isBusy ? busy : normal).setup(channel: channel, logger: logger).flatMapThrowing { value in
            let pipeline = channel.pipeline.syncOperations
            let conversion = try pipeline.handler(type: HTTP1ToHTTPServerCodec.self)
            // Before the conversion to HTTPTypes, which keeps an absolute-form target's path
            // and drops its authority; on TCP only, where the Host rule applies.
            if !unixSocket {
                try pipeline.addHandler(AbsoluteFormTargetHandler(), position: .before(conversion))
            }
            // After the absolute-form handler, before the conversion: a held token's request
            // and answer skip the conversions and Hummingbird's connection handler.
            if let heldTokens {
                try pipeline.addHandler(HeldTokenHandler(heldTokens, peer: identity, idleTimeout: isBusy ? idleTimeouts.busy : idleTimeouts.normal),
                                        position: .before(conversion))
            }
            return value
        }
    }

    func handle(value: Value, logger: Logger) async {
        await normal.handle(value: value, logger: logger)
    }

    /// The whole `503` answer to a refused connection.
    static func refusal(_ admission: ConnectionGate.Admission, caps: APIConnectionCaps) -> String {
        let message = switch admission {
        case .refusedPerPeer:
            "this client already has \(caps.perPeer) connections open to the token agent, its cap per peer (max-api-connections-per-peer): close idle connections or reuse one, and retry"
        default:
            "the token agent has \(caps.overall) connections open, its cap (max-api-connections, within the open-files limit): retry shortly"
        }
        return RefusedConnectionHandler.answer(json: "{\"error\":\(JSONText.quoted(message))}")
    }
}

/// In front of the HTTP codec of a refused connection: writes the 503 answer as soon as the
/// connection is active and closes. When one of the gate's few linger slots is free it first
/// waits (at most ``ConnectionGate/refusalLinger``) for the client's request and reads it: a
/// socket closed with unread data sends a reset, which the client may see instead of the 503.
///
/// With an HTTP/2 answer as well (a listener serving both, as the Fleet Engine proxy's), it
/// answers once the client's first bytes tell which it speaks: the HTTP/2 answer after the
/// connection preface, the 503 after anything else (or at the linger's end, or at once when no
/// linger slot is free). A gRPC client then reports the refusal's message, not a protocol error.
package final class RefusedConnectionHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let answer: String
    private let http2Answer: [UInt8]?
    private let gate: ConnectionGate
    private var written: EventLoopFuture<Void>?
    private var lingering = false
    private var deadline: Scheduled<Void>?
    /// The client's first bytes, while it is not yet known which protocol they are.
    private var seen: [UInt8] = []
    /// The HTTP/2 answer went: what the client sends after its preface (settings, a call) is
    /// read and dropped until it closes or the linger ends, so that no reset overtakes the answer.
    private var answeredHTTP2 = false

    /// HTTP/2's connection preface, which a client speaking it sends first.
    package static let http2Preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    /// The whole `503` answer with the JSON `body`: retry in a second, the connection closes.
    package static func answer(json body: String) -> String {
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + body
    }

    /// The whole HTTP/2 refusal: the server's (empty) SETTINGS, then GOAWAY with no stream
    /// processed, `REFUSED_STREAM` (nothing was done: the client may retry) and `message` as its
    /// debug data.
    package static func http2Answer(message: String) -> [UInt8] {
        let debug = Array(message.utf8)
        let length = 8 + debug.count
        let settings: [UInt8] = [0, 0, 0, 0x4, 0, 0, 0, 0, 0]
        let goAwayHead: [UInt8] = [UInt8(truncatingIfNeeded: length >> 16), UInt8(truncatingIfNeeded: length >> 8), UInt8(truncatingIfNeeded: length),
                                   0x7, 0, 0, 0, 0, 0]
        return settings + goAwayHead + [0, 0, 0, 0] + [0, 0, 0, 0x7] + debug
    }

    /// Refuses with `answer` (HTTP/1.1), or with `http2Answer` to a client sending HTTP/2's preface.
    package init(_ answer: String, http2Answer: [UInt8]? = nil, gate: ConnectionGate) {
        self.answer = answer
        self.http2Answer = http2Answer
        self.gate = gate
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { refuse(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        refuse(context)
        context.fireChannelActive()
    }

    /// The request (or what came of it): dropped once answered, so close now; before that (an
    /// HTTP/2 answer is possible), the first bytes choose the answer.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !answeredHTTP2 else { return }
        guard written == nil, let http2Answer else { return closeWhenWritten(context) }
        seen += unwrapInboundIn(data).readableBytesView.prefix(Self.http2Preface.count - seen.count)
        if !seen.elementsEqual(Self.http2Preface.prefix(seen.count)) {
            write(context.channel.allocator.buffer(string: answer), context)
            closeWhenWritten(context)
        } else if seen.count == Self.http2Preface.count {
            // The client closes on GOAWAY; the linger's end closes otherwise.
            write(context.channel.allocator.buffer(bytes: http2Answer), context)
            answeredHTTP2 = true
        }
        // Else a part of the preface: wait for the rest.
    }

    func channelInactive(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
        if lingering {
            lingering = false
            gate.endLinger()
        }
        context.fireChannelInactive()
    }

    private func refuse(_ context: ChannelHandlerContext) {
        guard written == nil, deadline == nil else { return }
        guard gate.beginLinger() else {
            write(context.channel.allocator.buffer(string: answer), context)
            return closeWhenWritten(context)
        }
        lingering = true
        // Without an HTTP/2 answer the 503 goes now; with one, when the first bytes come.
        if http2Answer == nil { write(context.channel.allocator.buffer(string: answer), context) }
        deadline = context.eventLoop.assumeIsolated().scheduleTask(in: ConnectionGate.refusalLinger) {
            if self.written == nil { self.write(context.channel.allocator.buffer(string: self.answer), context) }
            self.closeWhenWritten(context)
        }
    }

    private func write(_ bytes: ByteBuffer, _ context: ChannelHandlerContext) {
        guard written == nil else { return }
        let promise = context.eventLoop.makePromise(of: Void.self)
        written = promise.futureResult
        context.writeAndFlush(wrapOutboundOut(bytes), promise: promise)
    }

    private func closeWhenWritten(_ context: ChannelHandlerContext) {
        guard let written else { return }
        written.assumeIsolated().whenComplete { _ in
            if context.channel.isActive { context.close(promise: nil) }
        }
    }
}

@available(*, unavailable)
extension RefusedConnectionHandler: Sendable {}
