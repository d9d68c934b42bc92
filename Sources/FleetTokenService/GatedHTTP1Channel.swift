// Service layer: Hummingbird's HTTP/1 child channel behind the connection gate (with the held
// token route on its event loop), and the handler that answers a refused connection 503 and
// closes it.

import HummingbirdCore
import Logging
import NIOCore

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
        let setUp = (isBusy ? busy : normal).setup(channel: channel, logger: logger)
        guard let heldTokens else { return setUp }
        // After the connection state handler, so that it sees every request and answer.
        return setUp.flatMapThrowing { value in
            let pipeline = channel.pipeline.syncOperations
            try pipeline.addHandler(HeldTokenHandler(heldTokens, peer: identity),
                                    position: .after(try pipeline.handler(type: HTTPConnectionStateHandler.self)))
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
package final class RefusedConnectionHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let answer: String
    private let gate: ConnectionGate
    private var written: EventLoopFuture<Void>?
    private var lingering = false
    private var deadline: Scheduled<Void>?

    /// The whole `503` answer with the JSON `body`: retry in a second, the connection closes.
    package static func answer(json body: String) -> String {
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + body
    }

    package init(_ answer: String, gate: ConnectionGate) {
        self.answer = answer
        self.gate = gate
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { refuse(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        refuse(context)
        context.fireChannelActive()
    }

    /// The request (or what came of it): dropped; the answer is out, so close now.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        closeWhenWritten(context)
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
        guard written == nil else { return }
        let promise = context.eventLoop.makePromise(of: Void.self)
        written = promise.futureResult
        context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(string: answer)), promise: promise)
        guard gate.beginLinger() else { return closeWhenWritten(context) }
        lingering = true
        deadline = context.eventLoop.assumeIsolated().scheduleTask(in: ConnectionGate.refusalLinger) { self.closeWhenWritten(context) }
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
