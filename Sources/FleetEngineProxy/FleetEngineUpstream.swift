// The Fleet Engine proxy's connections to Fleet Engine: one HTTP/2 connection per event loop
// (TLS with ALPN, or prior knowledge to a loopback host), made when first needed and again after
// it closes; each call one stream, its whole answer (headers, body, trailers) collected.

package import FleetTokenHTTP
import FleetTokenService
import FleetTokenStore
import Foundation
package import Logging
package import NIOCore
import NIOExtras
import NIOHPACK
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL
import NIOTLS
import Synchronization

/// Why a call got no answer from Fleet Engine.
package enum UpstreamFailure: Error, Sendable, Equatable, CustomStringConvertible {
    /// No connection could be made (name, refused, TLS): the detail says which.
    case unreachable(String)
    /// No whole answer within the call's time.
    case timeout
    /// The stream or connection ended before the whole answer came.
    case cutShort(String)
    /// The answer's body is larger than the proxy reads.
    case answerTooLarge

    package var description: String {
        switch self {
        case .unreachable(let detail): "Fleet Engine could not be reached: \(detail)"
        case .timeout: "Fleet Engine did not answer in time"
        case .cutShort(let detail): "Fleet Engine's answer was cut short: \(detail)"
        case .answerTooLarge: "Fleet Engine's answer is larger than the proxy reads (\(ProxyRequestRules.maxBodyBytes) bytes)"
        }
    }
}

/// HTTP/2 connections to Fleet Engine, one per event loop, each shared by the calls of its loop
/// (HTTP/2 multiplexes them) and made again when it closes.
package final class FleetEngineUpstream: Sendable {
    private struct Connection: Sendable {
        let channel: any Channel
        let multiplexer: NIOHTTP2Handler.StreamMultiplexer
        /// Completes when Fleet Engine sends GOAWAY (or the connection closes): from then on
        /// new calls go on a new connection while this one finishes the calls it has.
        let goneAway: EventLoopFuture<Void>
        /// The last stream Fleet Engine serves once it sent GOAWAY.
        let drain: ConnectionDrain
    }

    /// A stream could not be opened on the connection (closed, or told to go away): nothing
    /// reached Fleet Engine, so the call may go on another connection.
    fileprivate struct StreamNotOpened: Error {
        let underlying: any Error
    }

    /// The call's stream came after a GOAWAY: refused by HTTP/2, or opened after the last stream
    /// the GOAWAY said Fleet Engine would serve (RFC 9113 §6.8: not processed, may be retried).
    fileprivate struct OpenedAfterGoAway: Error, CustomStringConvertible {
        var description: String { "Fleet Engine told the connection to go away before this call's stream" }
    }

    let endpoint: FleetEngineEndpoint
    /// The forward proxy the connection tunnels through (CONNECT), or nil: direct.
    let proxy: ProxySettings.Proxy?
    /// The TLS settings (nil for plain `http://`), built again for new connections when the CA
    /// file changes on disk (a rotated CA); a version that cannot be used keeps the last good one.
    private let tls: ReloadedOnChange<NIOSSLContext?, FleetEngineProxyError>
    /// The loop of calls made with ``send(_:token:timeout:)`` (not from an event loop).
    let defaultLoop: any EventLoop
    private let logger: Logger
    /// How long a new connection waits between connecting and setting up HTTP/2: zero, but for
    /// tests standing in for a loaded event loop (whatever the server sends meanwhile must wait).
    private let setUpDelay: TimeAmount
    /// The longest a connection may take from TCP connected (and tunnel opened) to the server's
    /// first HTTP/2 SETTINGS frame, the TLS handshake included. Default 10 s, as for the connect.
    private let setUpTimeout: TimeAmount
    /// How long a connection has to acknowledge the PING sent when a call's time ran out on
    /// it, before it is closed and made again (``ConnectionErrorCloser``).
    private let livenessTimeout: TimeAmount
    /// Each event loop's connection made or being made (an entry goes when it fails or closes),
    /// and whether ``close()`` was called.
    private struct Connections: Sendable {
        var slots: [ObjectIdentifier: EventLoopFuture<Connection>] = [:]
        var closed = false
    }

    private let connections = Mutex(Connections())

    /// A connection to `endpoint`, trusting the system's roots or, when given, only the
    /// certificates in the PEM file `caFile`, through the forward proxy `proxySettings` name for
    /// it (`NO_PROXY` applies; a plain `http://` loopback endpoint is reached directly).
    /// - Throws: ``FleetEngineProxyError`` when `caFile` cannot be used.
    package init(endpoint: FleetEngineEndpoint, caFile: String?, proxySettings: ProxySettings = .direct,
                 logger: Logger, setUpDelay: TimeAmount = .zero, setUpTimeout: TimeAmount = .seconds(10),
                 livenessTimeout: TimeAmount = .seconds(5)) throws(FleetEngineProxyError) {
        self.endpoint = endpoint
        self.setUpDelay = setUpDelay
        self.setUpTimeout = setUpTimeout
        self.livenessTimeout = livenessTimeout
        // Plain HTTP/2 goes only to loopback, which a forward proxy does not reach as this
        // host's: direct. (Its server also speaks first, right after a tunnel opens.)
        self.proxy = endpoint.secure ? proxySettings.proxy(scheme: "https", host: endpoint.host, port: endpoint.port) : nil
        self.defaultLoop = MultiThreadedEventLoopGroup.singleton.next()
        self.logger = logger
        self.tls = try ReloadedOnChange(paths: caFile.map { [$0] } ?? []) { () throws(FleetEngineProxyError) in
            try Self.tlsContext(for: endpoint, caFile: caFile)
        }
    }

    /// The TLS settings for `endpoint` (nil for plain `http://`): the system's roots, or only the
    /// certificates in `caFile`, read only when no other user could have written or replaced it
    /// (whoever can write it can trust their own server, and read every call's token).
    static func tlsContext(for endpoint: FleetEngineEndpoint, caFile: String?) throws(FleetEngineProxyError) -> NIOSSLContext? {
        guard endpoint.secure else { return nil }
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.applicationProtocols = ["h2"]
        if let caFile {
            let pem: Data
            do { pem = try SteeringFileCheck.read(path: caFile, role: "Fleet Engine CA file") } catch {
                switch error.code {
                case .missing, .unreadable:
                    throw FleetEngineProxyError(.caFile, "cannot read the Fleet Engine CA file \(caFile): check that it exists and is readable")
                default:
                    throw FleetEngineProxyError(.caFile, error.description)
                }
            }
            guard let certificates = try? NIOSSLCertificate.fromPEMBytes(Array(pem)), !certificates.isEmpty else {
                throw FleetEngineProxyError(.caFile, "the Fleet Engine CA file \(caFile) holds no PEM certificate: give the CA certificate(s) that sign Fleet Engine's (or your relay's) certificate")
            }
            configuration.trustRoots = .certificates(certificates)
        }
        do {
            return try NIOSSLContext(configuration: configuration)
        } catch {
            throw FleetEngineProxyError(.caFile, "the TLS settings for Fleet Engine cannot be used: \(error)")
        }
    }

    /// Sends `request` to Fleet Engine with `token` as its bearer token; the whole answer, or a
    /// ``UpstreamFailure`` after at most `timeout`. The call goes on the connection of one fixed
    /// event loop; ``start(_:token:timeout:on:)`` is the form for a caller on an event loop.
    package func send(_ request: ProxyRequest, token: String, timeout: TimeAmount) async throws(UpstreamFailure) -> ProxyResponse {
        do {
            return try await start(request, token: token, timeout: timeout, on: defaultLoop).get()
        } catch let failure as UpstreamFailure {
            throw failure
        } catch {
            throw .cutShort(Self.describe(error))
        }
    }

    /// Sends `request` on `loop`'s own connection (made when first needed): the whole answer, or
    /// a ``UpstreamFailure`` after at most `timeout`, on `loop`. Called on `loop` (the caller's
    /// connection's), the call goes from the caller's bytes to Fleet Engine's answer without
    /// another thread: one connection per event loop keeps a call on its loop.
    package func start(_ request: ProxyRequest, token: String, timeout: TimeAmount, on loop: any EventLoop) -> EventLoopFuture<ProxyResponse> {
        // One deadline for the whole call: the wait for a connection, the exchange, and the one
        // attempt on a new connection each take from it.
        attempt(request, token: token, deadline: .now() + timeout, on: loop, first: true)
    }

    private func attempt(_ request: ProxyRequest, token: String, deadline: NIODeadline, on loop: any EventLoop, first: Bool) -> EventLoopFuture<ProxyResponse> {
        Self.before(deadline, connection(on: loop), on: loop).flatMapErrorThrowing { error in
            throw (error as? UpstreamFailure) ?? .unreachable(Self.describe(error))
        }.flatMap { connection in
            self.exchange(request, token: token, on: connection, timeout: deadline - .now()).flatMapError { error in
                switch error {
                case let failure as UpstreamFailure:
                    return loop.makeFailedFuture(failure)
                case let notOpened as StreamNotOpened:
                    // The connection closed or went away meanwhile: nothing reached Fleet
                    // Engine, so the call goes on a new connection, once.
                    guard first else { return loop.makeFailedFuture(UpstreamFailure.unreachable(Self.describe(notOpened.underlying))) }
                    self.logger.debug("Fleet Engine connection unusable; connecting again", metadata: ["error": "\(Self.describe(notOpened.underlying))"])
                    // A connection told to go away is left to finish its calls (it is no
                    // longer the loop's); any other is closed.
                    if !(notOpened.underlying is OpenedAfterGoAway) { self.drop(connection, on: loop) }
                    return self.attempt(request, token: token, deadline: deadline, on: loop, first: false)
                default:
                    return loop.makeFailedFuture(UpstreamFailure.cutShort(Self.describe(error)))
                }
            }
        }
    }

    /// `connection`, or ``UpstreamFailure/timeout`` on `loop` when it is not made by the call's
    /// `deadline`. (The connection goes on being made for the calls after it.)
    private static func before(_ deadline: NIODeadline, _ connection: EventLoopFuture<Connection>, on loop: any EventLoop) -> EventLoopFuture<Connection> {
        let waited = loop.makePromise(of: Connection.self)
        let timer = loop.scheduleTask(deadline: deadline) { waited.fail(UpstreamFailure.timeout) }
        connection.hop(to: loop).whenComplete { result in
            timer.cancel()
            waited.completeWith(result)  // ignored when the timer came first
        }
        return waited.futureResult
    }

    /// Closes every connection (the service's shutdown); a call made afterwards fails at once
    /// instead of opening a connection nobody would close.
    package func close() {
        let open = connections.withLock { state in
            defer { state = Connections(closed: true) }
            return Array(state.slots.values)
        }
        for future in open { future.whenSuccess { $0.channel.close(promise: nil) } }
    }

    /// `loop`'s connection, made or being made.
    private func connection(on loop: any EventLoop) -> EventLoopFuture<Connection> {
        let id = ObjectIdentifier(loop)
        let (future, made) = connections.withLock { state -> (EventLoopFuture<Connection>, Bool) in
            if state.closed { return (loop.makeFailedFuture(UpstreamFailure.unreachable("the proxy is stopping")), false) }
            if let current = state.slots[id] { return (current, false) }
            let made = connect(on: loop)
            state.slots[id] = made
            return (made, true)
        }
        // Outside the lock: a callback of a future already complete runs at once, and takes it.
        if made {
            future.whenComplete { [weak self] result in
                switch result {
                case .failure: self?.clear(future, of: id)
                case .success(let connection):
                    // At close, and at GOAWAY (a server draining the connection, e.g. at its age
                    // limit), whichever comes first: the close's own future, not the handler's
                    // later removal, so that the next call never finds a closed connection.
                    connection.channel.closeFuture.whenComplete { [weak self] _ in self?.clear(future, of: id) }
                    connection.goneAway.whenComplete { [weak self] _ in self?.clear(future, of: id) }
                }
            }
        }
        return future
    }

    private func clear(_ future: EventLoopFuture<Connection>, of id: ObjectIdentifier) {
        connections.withLock { if $0.slots[id] === future { $0.slots[id] = nil } }
    }

    /// Closes `connection` and forgets it at once, so the next call of `loop` connects again.
    private func drop(_ connection: Connection, on loop: any EventLoop) {
        connection.channel.close(promise: nil)
        let id = ObjectIdentifier(loop)
        guard let future = connections.withLock({ $0.slots[id] }) else { return }
        // Only when the entry is still this connection's (another call may have replaced it).
        future.whenSuccess { [weak self] current in
            if current.channel === connection.channel { self?.clear(future, of: id) }
        }
    }

    private func connect(on loop: any EventLoop) -> EventLoopFuture<Connection> {
        let logger = logger
        let tls = tls.current(rebuilt: { _ in
            logger.notice("the Fleet Engine CA file changed; new connections to Fleet Engine trust it")
        }, failed: { error in
            logger.warning("the Fleet Engine CA file changed but cannot be used; keeping the previous one", metadata: ["error": "\(error)"])
        })
        let serverName = endpoint.host
        let sniName: String? = LoopbackHost.isAddressLiteral(serverName) ? nil : serverName
        let (proxy, endpoint, setUpDelay, setUpTimeout, livenessTimeout) = (proxy, endpoint, setUpDelay, setUpTimeout, livenessTimeout)
        return ClientBootstrap(group: loop)
            .connectTimeout(.seconds(10))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                // Before anything is read: a server speaks first (HTTP/2's SETTINGS, right after
                // the TLS handshake or at once without TLS), and what it sends before HTTP/2 is
                // in place must wait for it, not be dropped by an empty pipeline.
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(InboundHolder()) }
            }
            .connect(host: proxy?.host ?? endpoint.host, port: proxy?.port ?? endpoint.port)
            .flatMap { channel in
                // Through a forward proxy: a CONNECT tunnel first, then TLS inside it.
                guard let proxy else { return channel.eventLoop.makeSucceededFuture(channel) }
                return Self.tunnel(channel, through: proxy, to: endpoint)
            }
            .flatMap { channel in
                // A server that accepts and then says nothing (a hung relay, a black-holed TLS
                // handshake, no HTTP/2 settings) must not hold this loop's connection, and every
                // call of the loop waiting on it, for ever: unless the server's first SETTINGS
                // frame has come by the deadline, the connection is closed and made again.
                let expired = NIOLoopBoundBox(false, eventLoop: channel.eventLoop)
                let deadline = channel.eventLoop.assumeIsolated().scheduleTask(in: setUpTimeout) {
                    expired.value = true
                    if channel.isActive {
                        logger.warning("Fleet Engine sent no HTTP/2 settings in time: connection closed, made again for the next call",
                                       metadata: ["upstream": "\(endpoint)", "within": "\(Self.describeDuration(setUpTimeout))"])
                    }
                    channel.close(promise: nil)
                }
                // With TLS, HTTP/2 starts once the handshake agreed on it: a refused certificate
                // fails the connection, and every call waiting for it, with the TLS error.
                let handshake: EventLoopFuture<Void>
                if let tls {
                    handshake = channel.eventLoop.submit {
                        let waiter = HandshakeWaiter(channel.eventLoop.makePromise())
                        let operations = channel.pipeline.syncOperations
                        let holder = try operations.handler(type: InboundHolder.self)
                        try operations.addHandler(NIOSSLClientHandler(context: tls, serverHostname: sniName), position: .before(holder))
                        try operations.addHandler(waiter, position: .before(holder))
                        return waiter.done.futureResult
                    }.flatMap { $0 }
                } else {
                    handshake = channel.eventLoop.makeSucceededVoidFuture()
                }
                return handshake.flatMap {
                    channel.eventLoop.scheduleTask(in: setUpDelay) {
                        let operations = channel.pipeline.syncOperations
                        let multiplexer = try operations.configureHTTP2Pipeline(
                            mode: .client, connectionConfiguration: .init(), streamConfiguration: .init()
                        ) { stream in stream.close() }  // Fleet Engine pushes nothing
                        let goneAway = channel.eventLoop.makePromise(of: Void.self)
                        let drain = ConnectionDrain()
                        do {
                            try operations.addHandler(ConnectionErrorCloser(settingsDeadline: deadline, goneAway: goneAway, drain: drain,
                                                                            liveness: ConnectionLiveness(timeout: livenessTimeout, logger: logger, upstream: "\(endpoint)")))
                        } catch {
                            goneAway.succeed(())
                            throw error
                        }
                        // HTTP/2 is in place: what the server sent meanwhile goes to it now.
                        operations.removeHandler(try operations.handler(type: InboundHolder.self), promise: nil)
                        return Connection(channel: channel, multiplexer: multiplexer, goneAway: goneAway.futureResult, drain: drain)
                    }.futureResult
                }.flatMapErrorThrowing { error in
                    deadline.cancel()
                    channel.close(promise: nil)
                    guard !expired.value else {
                        throw UpstreamFailure.unreachable("\(endpoint.authority) accepted the connection but did not complete \(tls == nil ? "" : "the TLS handshake and ")HTTP/2's set-up within \(Self.describeDuration(setUpTimeout))")
                    }
                    throw error
                }
            }
    }

    /// `10 s` or `500 ms`.
    static func describeDuration(_ amount: TimeAmount) -> String {
        amount.nanoseconds % 1_000_000_000 == 0 ? "\(amount.nanoseconds / 1_000_000_000) s" : "\(amount.nanoseconds / 1_000_000) ms"
    }

    /// Asks `proxy` (over `channel`) for a tunnel to `endpoint`; the channel once the proxy said
    /// yes. What came after the proxy's answer (the server's first bytes) waits in the channel's
    /// ``InboundHolder`` until HTTP/2 is in place.
    private static func tunnel(_ channel: any Channel, through proxy: ProxySettings.Proxy, to endpoint: FleetEngineEndpoint) -> EventLoopFuture<any Channel> {
        let established = channel.eventLoop.makePromise(of: Void.self)
        var headers = HTTPHeaders()
        if let credentials = proxy.credentials {
            let basic = Data("\(credentials.username):\(credentials.password)".utf8).base64EncodedString()
            headers.add(name: "Proxy-Authorization", value: "Basic \(basic)")
        }
        let connectHeaders = headers
        return channel.eventLoop.submit {
            let operations = channel.pipeline.syncOperations
            let holder = try operations.handler(type: InboundHolder.self)
            try operations.addHandler(HTTPRequestEncoder(), name: "proxy-request-encoder", position: .before(holder))
            try operations.addHandler(ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .forwardBytes)),
                                      name: "proxy-response-decoder", position: .before(holder))
            try operations.addHandler(NIOHTTP1ProxyConnectHandler(
                targetHost: endpoint.host, targetPort: endpoint.port, headers: connectHeaders,
                deadline: .now() + .seconds(10), promise: established), position: .before(holder))
        }.flatMap {
            established.futureResult
        }.flatMap {
            // The HTTP/1.1 codec goes now (it would take HTTP/2's or TLS's writes for requests);
            // what the server sent after the proxy's answer waits in the holder.
            channel.eventLoop.submit {
                let operations = channel.pipeline.syncOperations
                for name in ["proxy-request-encoder", "proxy-response-decoder"] {
                    operations.removeHandler(context: try operations.context(name: name), promise: nil)
                }
                return channel
            }
        }.flatMapErrorThrowing { error in
            channel.close(promise: nil)
            throw UpstreamFailure.unreachable("the forward proxy \(proxy) did not open a tunnel to \(endpoint.authority): \(error)")
        }
    }

    private func exchange(_ request: ProxyRequest, token: String, on connection: Connection, timeout: TimeAmount) -> EventLoopFuture<ProxyResponse> {
        var fields = HPACKHeaders()
        fields.add(name: ":method", value: request.method)
        fields.add(name: ":scheme", value: endpoint.secure ? "https" : "http")
        fields.add(name: ":authority", value: endpoint.authority)
        fields.add(name: ":path", value: request.target)
        for field in ProxyRequestRules.upstreamHeaders(request, remaining: timeout) { fields.add(name: field.name, value: field.value) }
        // Never into HPACK's dynamic table: a later header could probe for it.
        fields.add(name: "authorization", value: "Bearer \(token)", indexing: .neverIndexed)
        let headers = fields
        let body = request.body
        let answer = AnswerSlot(connection.channel.eventLoop.makePromise(of: ProxyResponse.self))
        let drain = connection.drain
        let channel = connection.channel
        // A drained connection closes after its last call (Fleet Engine may leave it open).
        drain.callStarted()
        answer.future.whenComplete { _ in if drain.callEnded() { channel.close(promise: nil) } }
        connection.multiplexer.createStreamChannel { stream in
            stream.eventLoop.makeCompletedFuture {
                try stream.pipeline.syncOperations.addHandler(UpstreamStreamHandler(answer: answer, timeout: timeout, refused: {
                    drain.refused(stream) ? StreamNotOpened(underlying: OpenedAfterGoAway()) : nil
                }))
            }
        }.whenComplete { result in
            switch result {
            case .failure(let error):
                answer.complete(.failure(StreamNotOpened(underlying: error)))
            case .success(let stream):
                let hasBody = body.readableBytes > 0
                // HTTP/2 refuses to open a stream on a connection Fleet Engine has told to go away
                // (a GOAWAY that came after this call took the connection): nothing was sent.
                let opened = stream.eventLoop.makePromise(of: Void.self)
                opened.futureResult.whenFailure { error in
                    if error is NIOHTTP2Errors.CreatedStreamAfterGoaway { answer.complete(.failure(StreamNotOpened(underlying: OpenedAfterGoAway()))) }
                }
                stream.write(HTTP2Frame.FramePayload.headers(.init(headers: headers, endStream: !hasBody)), promise: opened)
                if hasBody { stream.write(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(body), endStream: true)), promise: nil) }
                stream.flush()
            }
        }
        return answer.future
    }

    static func describe(_ error: any Error) -> String {
        if let error = error as? NIOSSLError { return "TLS: \(error)" }
        if let error = error as? BoringSSLError { return "TLS: \(error)" }
        return "\(error)"
    }
}

/// Holds what is read until it is removed, then hands it on: the bytes a server sends before
/// the handlers that read them are in place (HTTP/2's SETTINGS, which a server sends first).
final class InboundHolder: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny

    private var held: [NIOAny] = []

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        held.append(data)
    }

    func removeHandler(context: ChannelHandlerContext, removalToken: ChannelHandlerContext.RemovalToken) {
        let held = held
        self.held = []
        for data in held { context.fireChannelRead(data) }
        if !held.isEmpty { context.fireChannelReadComplete() }
        context.leavePipeline(removalToken: removalToken)
    }
}

/// Closes the connection when an error reaches the end of its pipeline (HTTP/2 gave up on it and
/// sent GOAWAY, a TLS read failed): its calls then end at once and the next call connects again,
/// instead of each waiting for its timeout on a connection that stays open and answers nothing.
/// A stream's own errors close the connection too; Fleet Engine does not send such streams, and
/// the calls in flight that end with it are answered `UNAVAILABLE`, which clients retry. It also
/// ends the set-up's deadline when the server's first SETTINGS frame arrives.
///
/// A GOAWAY from Fleet Engine is a drain, not a failure (a server sends one at a connection's age
/// limit, or before a restart): `goneAway` completes, so that new calls connect again, and the
/// calls in flight finish here; the connection closes when the last of them ends (``ConnectionDrain``).
/// A stream refused because the GOAWAY came first is not the connection's failure either.
///
/// A call whose time ran out may have been lost with the connection itself (a path that
/// black-holes packets: a NAT or firewall that dropped its state, a hung relay), which nothing
/// else would notice for the quarter of an hour TCP takes to give up: every call of the loop
/// would time out meanwhile. So a timed-out call has the connection sent a PING
/// (``ConnectionLiveness``); without its acknowledgement in time the connection is closed and
/// the next call connects again. A slow answer on a live connection closes nothing.
final class ConnectionErrorCloser: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame
    typealias OutboundOut = HTTP2Frame

    /// Cancelled by the server's first SETTINGS frame: until then the connection is not set up.
    private var settingsDeadline: Scheduled<Void>?
    private let goneAway: EventLoopPromise<Void>
    private let drain: ConnectionDrain
    private let liveness: ConnectionLiveness
    /// The PING in flight after a call timed out, and the timer that closes the connection
    /// unless its acknowledgement comes first.
    private var pingPending: (data: HTTP2PingData, timer: Scheduled<Void>)?
    /// When the last PING was acknowledged: the connection is known alive for a while, and
    /// servers answer PINGs sent too often with GOAWAY (gRPC's `too_many_pings`).
    private var lastAcknowledged: NIODeadline?

    init(settingsDeadline: Scheduled<Void>, goneAway: EventLoopPromise<Void>, drain: ConnectionDrain, liveness: ConnectionLiveness) {
        self.settingsDeadline = settingsDeadline
        self.goneAway = goneAway
        self.drain = drain
        self.liveness = liveness
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard event is ConnectionLiveness.Check else { return context.fireUserInboundEventTriggered(event) }
        // One PING at a time: calls timing out together ask once; none within a while of an
        // acknowledgement.
        guard pingPending == nil, context.channel.isActive else { return }
        if let lastAcknowledged, .now() - lastAcknowledged < ConnectionLiveness.quietAfterAcknowledgement { return }
        let data = HTTP2PingData(withInteger: UInt64.random(in: 1...UInt64.max))
        let (channel, liveness, goneAway) = (context.channel, liveness, goneAway)
        let timer = context.eventLoop.assumeIsolated().scheduleTask(in: liveness.timeout) {
            // No longer the loop's connection at once: a TLS close may wait for the server's
            // close_notify, which a dead path never brings, and the next calls must not wait on it.
            goneAway.succeed(())
            liveness.logger.warning("Fleet Engine did not acknowledge a PING after a call timed out: connection closed, made again for the next call",
                                    metadata: ["upstream": "\(liveness.upstream)", "within": "\(FleetEngineUpstream.describeDuration(liveness.timeout))"])
            channel.close(promise: nil)
        }
        pingPending = (data, timer)
        context.writeAndFlush(wrapOutboundOut(HTTP2Frame(streamID: .rootStream, payload: .ping(data, ack: false))), promise: nil)
    }

    /// The connection's own frames (stream 0): the first SETTINGS ends the set-up's deadline; a
    /// GOAWAY starts the drain.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data).payload {
        case .settings(.settings):
            settingsDeadline?.cancel()
            settingsDeadline = nil
        case .goAway(let lastStreamID, _, _):
            goneAway.succeed(())
            if drain.goneAway(lastServed: Int(lastStreamID)) { context.close(promise: nil) }
        case .ping(let data, ack: true) where data == pingPending?.data:
            pingPending?.timer.cancel()
            pingPending = nil
            lastAcknowledged = .now()
        default:
            break
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // The call whose stream was refused goes on a new connection; this one serves its own.
        if error is NIOHTTP2Errors.CreatedStreamAfterGoaway { return }
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        pingPending?.timer.cancel()
        pingPending = nil
        goneAway.succeed(())
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        goneAway.succeed(())
    }
}

/// What a connection's liveness check after a timed-out call needs: how long the PING's
/// acknowledgement may take, and where to log a connection given up.
struct ConnectionLiveness: Sendable {
    /// Sent up a connection's pipeline by a call whose time ran out on it.
    struct Check: Sendable {}

    /// How long after a PING's acknowledgement no other is sent.
    static let quietAfterAcknowledgement = TimeAmount.seconds(10)

    let timeout: TimeAmount
    let logger: Logger
    let upstream: String
}

/// A connection's calls, and what a GOAWAY from Fleet Engine said (the last stream it serves).
/// Changed on the connection's loop, where its calls' streams and answers are too.
final class ConnectionDrain: Sendable {
    private let lastServed = Atomic<Int>(Int.max)
    private let calls = Atomic<Int>(0)

    /// A call took the connection.
    func callStarted() { calls.add(1, ordering: .relaxed) }

    /// A call's answer (or failure) came; true when the connection drains and this was its last.
    func callEnded() -> Bool {
        calls.subtract(1, ordering: .relaxed).newValue == 0 && lastServed.load(ordering: .relaxed) != Int.max
    }

    /// Fleet Engine sent GOAWAY serving streams up to `id`; true when no call is left on it.
    func goneAway(lastServed id: Int) -> Bool {
        lastServed.store(min(id, lastServed.load(ordering: .relaxed)), ordering: .relaxed)
        return calls.load(ordering: .relaxed) == 0
    }

    /// True when the stream `channel` was opened after the last stream Fleet Engine serves.
    func refused(_ channel: any Channel) -> Bool {
        let last = lastServed.load(ordering: .relaxed)
        guard last != Int.max, let id = try? channel.syncOptions?.getOption(HTTP2StreamChannelOptions.streamID) else { return false }
        return Int(id) > last
    }
}

/// Completes `done` when the TLS handshake has agreed on HTTP/2, or fails it with why not.
final class HandshakeWaiter: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny

    /// The handshake's outcome.
    struct NotHTTP2: Error, CustomStringConvertible {
        let negotiated: String?
        var description: String { "TLS: the server did not agree to HTTP/2 by ALPN (it chose \(negotiated ?? "nothing"))" }
    }

    let done: EventLoopPromise<Void>

    init(_ done: EventLoopPromise<Void>) { self.done = done }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case .handshakeCompleted(let negotiated) = event as? TLSUserEvent {
            if negotiated == "h2" { done.succeed() } else { done.fail(NotHTTP2(negotiated: negotiated)) }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        done.fail(error)
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        done.fail(UpstreamFailure.cutShort("the connection closed during the TLS handshake"))
        context.fireChannelInactive()
    }
}

/// The one answer of a call: completed once, by whichever comes first (the answer, a failure,
/// the timeout).
final class AnswerSlot: Sendable {
    private let promise: EventLoopPromise<ProxyResponse>
    private let done = Mutex(false)

    init(_ promise: EventLoopPromise<ProxyResponse>) { self.promise = promise }

    var future: EventLoopFuture<ProxyResponse> { promise.futureResult }

    func complete(_ result: Result<ProxyResponse, any Error>) {
        let first = done.withLock { done in
            defer { done = true }
            return !done
        }
        if first { promise.completeWith(result) }
    }
}

/// Collects one stream's answer from Fleet Engine: `:status` and headers, the body, the
/// trailers; fails it when the stream ends early, is reset, or the time runs out.
final class UpstreamStreamHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    private let answer: AnswerSlot
    private let timeout: TimeAmount
    private var status: Int?
    private var headers: [(name: String, value: String)] = []
    private var body = ByteBuffer()
    private var trailers: [(name: String, value: String)]?
    private var timer: Scheduled<Void>?

    /// Why the stream ended unanswered and unprocessed (a GOAWAY came before it), or nil.
    private let refused: () -> (any Error)?

    init(answer: AnswerSlot, timeout: TimeAmount, refused: @escaping () -> (any Error)? = { nil }) {
        self.answer = answer
        self.timeout = timeout
        self.refused = refused
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let answer = answer
        let channel = context.channel
        timer = context.eventLoop.scheduleTask(in: timeout) {
            answer.complete(.failure(UpstreamFailure.timeout))
            channel.close(promise: nil)
            // The connection may be what lost the answer: it is asked whether it is alive.
            channel.parent?.pipeline.fireUserInboundEventTriggered(ConnectionLiveness.Check())
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .headers(let frame):
            if status == nil {
                guard let code = frame.headers.first(name: ":status").flatMap({ Int($0) }) else {
                    return fail(context, .cutShort("an answer without :status"))
                }
                if (100..<200).contains(code) { return }  // informational
                status = code
                headers = frame.headers.filter { !$0.name.hasPrefix(":") }.map { ($0.name, $0.value) }
            } else {
                trailers = frame.headers.map { ($0.name, $0.value) }
            }
            if frame.endStream { finish(context) }
        case .data(let frame):
            guard case .byteBuffer(var bytes) = frame.data else { return }
            guard body.readableBytes + bytes.readableBytes <= ProxyRequestRules.maxBodyBytes else {
                return fail(context, .answerTooLarge)
            }
            body.writeBuffer(&bytes)
            if frame.endStream { finish(context) }
        case .rstStream(let frame):
            fail(context, .cutShort("stream reset (\(frame))"))
        default:
            break
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.cancel()
        answer.complete(.failure(refused() ?? UpstreamFailure.cutShort("the stream closed before the answer ended")))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let refusal = refused() {
            timer?.cancel()
            answer.complete(.failure(refusal))
            context.close(promise: nil)
            return
        }
        fail(context, .cutShort(FleetEngineUpstream.describe(error)))
    }

    private func finish(_ context: ChannelHandlerContext) {
        timer?.cancel()
        answer.complete(.success(ProxyResponse(status: status ?? 0, headers: headers, body: body, trailers: trailers)))
    }

    private func fail(_ context: ChannelHandlerContext, _ failure: UpstreamFailure) {
        timer?.cancel()
        answer.complete(.failure(failure))
        context.close(promise: nil)
    }
}
