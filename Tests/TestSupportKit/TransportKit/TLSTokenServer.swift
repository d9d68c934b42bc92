// Test kit (issue 14): a real HTTPS/1.1 token server on 127.0.0.1 (SwiftNIO + NIOSSL), optionally
// requiring a client certificate, recording every request and every failed handshake.

import FleetTokenStoreTesting
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization
import X509

/// An HTTPS/1.1 server on `127.0.0.1` (a free port) answering with a closure and recording every
/// request with the client certificate it came over. With a client CA it requires a client
/// certificate signed by that CA (verification `.noHostnameVerification`): a missing or foreign
/// certificate fails the TLS handshake, counted in ``handshakeFailures``.
///
/// Runs on `MultiThreadedEventLoopGroup.singleton`; each connection is a child task of the
/// server's task, so ``stop()`` (cancellation) closes the listener and every connection.
/// Answer closures must return promptly when cancelled.
package final class TLSTokenServer: LoopbackService {
    /// One request as the server read it.
    package struct RecordedRequest: Sendable {
        package let method: HTTPMethod
        /// The request target as sent (origin form: path and query).
        package let uri: String
        package let headers: HTTPHeaders
        package let body: [UInt8]
        /// The certificate the client presented (nil without mutual TLS or without one).
        package let clientCertificate: Certificate?
        /// 1 for the server's first connection, 2 for the next…: tells reused connections apart.
        package let connection: Int
        package let date: Date

        /// The client certificate's subject common name.
        package var clientCommonName: String? { clientCertificate.flatMap(TestPKI.commonName(of:)) }
        package var bodyText: String { String(decoding: body, as: UTF8.self) }
        /// The path without the query.
        package var path: String { String(uri.prefix { $0 != "?" }) }
        /// The last path segment, percent-decoded (the subject id in `/token/vehicle/{id}`).
        package var lastPathComponent: String {
            let last = path.split(separator: "/").last.map(String.init) ?? ""
            return last.removingPercentEncoding ?? last
        }
    }

    /// What the server answers. `Content-Length` is set by the server.
    package struct Answer: Sendable {
        package var status: HTTPResponseStatus
        package var headers: HTTPHeaders
        package var body: [UInt8]

        package init(status: HTTPResponseStatus = .ok, headers: HTTPHeaders = ["Content-Type": "application/json"], body: String = "") {
            self.status = status
            self.headers = headers
            self.body = Array(body.utf8)
        }
    }

    package typealias Respond = @Sendable (RecordedRequest) async -> Answer

    /// Answers with the samples' JSON `{"VEHICLE_TOKEN_KEY": <JWT>, "TOKEN_EXPIRATION": <epoch s>}`,
    /// the test kit's vehicle JWT (`TestJWT`) for `subject(request)` (default: the last path
    /// segment), issued now. Minted values are remembered by `secrets` when given.
    package static func fleetEngineToken(lifetime: TimeInterval = 3600, secrets: SecretScanner? = nil,
                                 subject: @escaping @Sendable (RecordedRequest) -> String = { $0.lastPathComponent }) -> Respond {
        { request in
            let now = Date()
            let token = TestJWT.make(kind: .vehicle, subject: subject(request), issuedAt: now, lifetime: lifetime)
            secrets?.remember(token)
            let expiration = Int(now.timeIntervalSince1970) + Int(lifetime)
            return Answer(body: #"{"VEHICLE_TOKEN_KEY":"\#(token)","TOKEN_EXPIRATION":\#(expiration)}"#)
        }
    }

    /// Largest request body kept; a larger one closes the connection.
    package static let bodyLimit = 1 << 20

    private let tls: TLSConfiguration
    /// The answer in a struct, as ScriptedFetcher keeps its script: a bare closure read out of a
    /// `Mutex` at -Onone gains a pair of reabstraction thunks on every read (swiftlang/swift#91348).
    private struct Script: Sendable {
        let respond: Respond
    }

    private let respond: Mutex<Script>
    private let state = Mutex(State())

    private struct State {
        var port = 0
        var requests: [RecordedRequest] = []
        var handshakeFailures: [String] = []
        var connections = 0
        var task: Task<Void, Never>?
    }

    /// A server presenting `identity` (its leaf certificate and key).
    /// - Parameters:
    ///   - identity: the server certificate, e.g. ``TestPKI/server``.
    ///   - clientCA: when given, a client certificate signed by this CA is required.
    ///   - answer: what to answer; default ``fleetEngineToken(lifetime:secrets:subject:)``.
    package init(identity: TestPKI.Identity, clientCA: TestPKI.Identity? = nil, answer: @escaping Respond = TLSTokenServer.fleetEngineToken()) throws {
        var tls = TLSConfiguration.makeServerConfiguration(
            certificateChain: [.certificate(try NIOSSLCertificate(bytes: Array(identity.certificatePEM.utf8), format: .pem))],
            privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(identity.keyPEM.utf8), format: .pem)))
        if let clientCA {
            tls.trustRoots = .certificates([try NIOSSLCertificate(bytes: Array(clientCA.certificatePEM.utf8), format: .pem)])
            tls.certificateVerification = .noHostnameVerification
        } else {
            tls.certificateVerification = .none
        }
        self.tls = tls
        respond = Mutex(Script(respond: answer))
    }

    /// A server presenting `pki.server`, requiring a client certificate from `pki.ca` when
    /// `requireClientCertificate`.
    package convenience init(pki: TestPKI, requireClientCertificate: Bool = false, answer: @escaping Respond = TLSTokenServer.fleetEngineToken()) throws {
        try self.init(identity: pki.server, clientCA: requireClientCertificate ? pki.ca : nil, answer: answer)
    }

    /// The bound port (0 before ``start()``).
    package var port: Int { state.withLock { $0.port } }
    /// `https://127.0.0.1:<port>`.
    package var baseURL: String { "https://127.0.0.1:\(port)" }
    /// Every request so far, in arrival order.
    package var requests: [RecordedRequest] { state.withLock { $0.requests } }
    /// One description per connection whose TLS handshake failed: the error, or "closed before
    /// the handshake completed" (a connection that ended before any request byte).
    package var handshakeFailures: [String] { state.withLock { $0.handshakeFailures } }
    /// Connections accepted so far.
    package var connectionCount: Int { state.withLock { $0.connections } }

    /// Replaces the answer for later requests.
    package func setAnswer(_ answer: @escaping Respond) {
        respond.withLock { $0 = Script(respond: answer) }
    }

    /// Binds 127.0.0.1 on a free port and starts serving. Call once.
    /// - Throws: TLS configuration or bind errors.
    package func start() async throws {
        let context = try NIOSSLContext(configuration: tls)
        let listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 64)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .bind(host: "127.0.0.1", port: 0) { [self] channel in
                channel.eventLoop.makeCompletedFuture {
                    let number = state.withLock { $0.connections += 1; return $0.connections }
                    let operations = channel.pipeline.syncOperations
                    try operations.addHandler(NIOSSLServerHandler(context: context))
                    try operations.addHandler(HandshakeWatcher { [self] failure in
                        state.withLock { $0.handshakeFailures.append(failure) }
                    })
                    try operations.configureHTTPServerPipeline(withErrorHandling: true)
                    return (number, try NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>(wrappingChannelSynchronously: channel))
                }
            }
        let port = listener.channel.localAddress?.port ?? 0
        let task = Task { [self] in
            _ = try? await listener.executeThenClose { inbound in
                try await withThrowingDiscardingTaskGroup { group in
                    for try await (number, connection) in inbound {
                        group.addTask { await self.serve(connection, number: number) }
                    }
                }
            }
        }
        state.withLock {
            $0.port = port
            $0.task = task
        }
    }

    /// Closes the listener and every connection, and waits until they are closed.
    package func stop() async {
        let task = state.withLock { state -> Task<Void, Never>? in
            defer { state.task = nil }
            return state.task
        }
        task?.cancel()
        await task?.value
    }

    private func serve(_ connection: NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>, number: Int) async {
        let channel = connection.channel
        try? await connection.executeThenClose { inbound, outbound in
            var head: HTTPRequestHead?
            var body: [UInt8] = []
            for try await part in inbound {
                switch part {
                case .head(let received):
                    head = received
                    body = []
                case .body(var chunk):
                    guard body.count + chunk.readableBytes <= Self.bodyLimit else { return }
                    body += chunk.readBytes(length: chunk.readableBytes) ?? []
                case .end:
                    guard let requestHead = head else { continue }
                    head = nil
                    let peer = try? await channel.nioSSL_peerCertificate().get()
                    let request = RecordedRequest(
                        method: requestHead.method, uri: requestHead.uri, headers: requestHead.headers, body: body,
                        clientCertificate: peer.flatMap { try? Certificate(derEncoded: $0.toDERBytes()) },
                        connection: number, date: Date())
                    state.withLock { $0.requests.append(request) }
                    let answering = respond.withLock { $0 }.respond
                    let answer = await answering(request)
                    var headers = answer.headers
                    headers.replaceOrAdd(name: "Content-Length", value: String(answer.body.count))
                    if !requestHead.isKeepAlive { headers.replaceOrAdd(name: "Connection", value: "close") }
                    try await outbound.write(.head(HTTPResponseHead(version: requestHead.version, status: answer.status, headers: headers)))
                    try await outbound.write(.body(.byteBuffer(ByteBuffer(bytes: answer.body))))
                    try await outbound.write(.end(nil))
                    if !requestHead.isKeepAlive { return }
                }
            }
        }
    }
}

/// Reports, once per connection, a TLS handshake that did not complete: an error, or the
/// connection closing, before any decrypted byte arrived. (An HTTP client always sends its request
/// right after the handshake, so "no decrypted byte yet" is "handshake not done" here; this avoids
/// depending on NIOTLS for `TLSUserEvent`.)
private final class HandshakeWatcher: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    private let report: @Sendable (String) -> Void
    private var decrypted = false
    private var reported = false

    init(report: @escaping @Sendable (String) -> Void) {
        self.report = report
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        decrypted = true
        context.fireChannelRead(data)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(String(describing: error))
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        fail("connection closed before the TLS handshake completed")
        context.fireChannelInactive()
    }

    private func fail(_ description: String) {
        guard !decrypted, !reported else { return }
        reported = true
        report(description)
    }
}
