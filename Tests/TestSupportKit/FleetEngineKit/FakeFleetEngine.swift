// A fake Fleet Engine for the proxy's tests: HTTP/2 with prior knowledge on 127.0.0.1 (gRPC and
// REST), judging every call's JWT as Fleet Engine would (RS256 signature by the issuer's key,
// aud, lifetime, the authorization claim against the resource the call names), answering a
// small well-formed message, and recording what it saw.

import _CryptoExtras
import Crypto
import FleetTokenService
import Foundation
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix
import NIOSSL
import Synchronization

/// What the fake saw of one call.
package struct FakeFleetEngineCall: Sendable {
    /// `grpc` or `rest`.
    package let wire: String
    /// The method's name (`GetVehicle`), or the path when unknown.
    package let method: String
    /// The resource named, `providers/p/vehicles/v`, if any.
    package let resource: String?
    /// The JWT's `iat`, if it had one.
    package let issuedAt: Double?
    /// What the fake answered: 0 (OK), 16, 7, … for gRPC; 200, 401, 403 for REST.
    package let code: Int
    /// Why it refused, when it did.
    package let refusal: String?
    /// The request's headers (lower-case names), as received (the last of a repeated one).
    package let headers: [String: String]
    /// How many `authorization` fields the request carried.
    package let authorizationFields: Int
}

/// A fake Fleet Engine on 127.0.0.1 (HTTP/2 with prior knowledge).
package final class FakeFleetEngine: Sendable {
    private struct State {
        var calls: [FakeFleetEngineCall] = []
        var rejectIssuedBefore: Double?
        var deniedResources: Set<String> = []
        var delay: Duration = .zero
        /// The next call's answer waits this long, after a GOAWAY on its connection.
        var goAwayThenAnswerAfter: Duration?
        var traffic = FakeFleetEngineTraffic()
    }

    private let publicKey: _RSA.Signing.PublicKey
    private let state = Mutex(State())
    private let server = Mutex<(any Channel)?>(nil)
    /// The fake's own event loop: on NIO's shared group, another test's servers could keep it
    /// from answering (twice a call through the proxy got no answer within 15 s in full runs,
    /// and never when the suite ran alone).
    private let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    /// The port bound, once started.
    package let port = Mutex(0)

    /// A fake trusting JWTs signed by the RSA key whose public half is `publicKeyPEM`.
    package init(publicKeyPEM: String) throws {
        publicKey = try _RSA.Signing.PublicKey(pemRepresentation: publicKeyPEM)
    }

    private let secure = Mutex(false)

    /// `http://127.0.0.1:PORT`, or `https://localhost:PORT` with TLS.
    package var url: String {
        secure.withLock { $0 } ? "https://localhost:\(port.withLock { $0 })" : "http://127.0.0.1:\(port.withLock { $0 })"
    }

    /// Every call so far.
    package var calls: [FakeFleetEngineCall] { state.withLock { $0.calls } }

    /// What the fake's connections carried so far: for a failure's message.
    package var traffic: FakeFleetEngineTraffic { state.withLock { $0.traffic } }

    fileprivate func note(_ change: (inout FakeFleetEngineTraffic) -> Void) {
        state.withLock { change(&$0.traffic) }
    }

    /// From now on, tokens issued before `moment` are refused as `UNAUTHENTICATED` / 401 (a
    /// key rotation at Fleet Engine).
    package func rejectTokens(issuedBefore moment: Date) {
        state.withLock { $0.rejectIssuedBefore = moment.timeIntervalSince1970 }
    }

    /// Calls on `resource` are refused `PERMISSION_DENIED` / 403 whatever their token.
    package func deny(_ resource: String) {
        state.withLock { _ = $0.deniedResources.insert(resource) }
    }

    /// Each answer waits this long first.
    package func delayAnswers(by delay: Duration) {
        state.withLock { $0.delay = delay }
    }

    /// At the next call, the fake drains its connection as a server at its age limit does: a
    /// GOAWAY (`NO_ERROR`, that call's stream the last it serves) at once, that call's answer
    /// `delay` later. The connection stays open until its client closes it.
    package func goAwayAtNextCall(answeringAfter delay: Duration) {
        state.withLock { $0.goAwayThenAnswerAfter = delay }
    }

    fileprivate func takeGoAway() -> Duration? {
        state.withLock { state in
            defer { state.goAwayThenAnswerAfter = nil }
            return state.goAwayThenAnswerAfter
        }
    }

    /// Serves plain HTTP/2 (prior knowledge), or with `identity` TLS offering only `h2` by ALPN,
    /// as Fleet Engine does.
    package func start(tls identity: TestPKI.Identity? = nil) async throws {
        let fake = self
        var context: NIOSSLContext?
        if let identity {
            var configuration = TLSConfiguration.makeServerConfiguration(
                certificateChain: [.certificate(try NIOSSLCertificate(bytes: Array(identity.certificatePEM.utf8), format: .pem))],
                privateKey: .privateKey(try NIOSSLPrivateKey(bytes: Array(identity.keyPEM.utf8), format: .pem)))
            configuration.applicationProtocols = ["h2"]
            context = try NIOSSLContext(configuration: configuration)
            secure.withLock { $0 = true }
        }
        let tls = context
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                fake.note { $0.connections += 1 }
                channel.closeFuture.whenComplete { _ in fake.note { $0.connectionsClosed += 1 } }
                return channel.eventLoop.makeCompletedFuture {
                    if let tls { try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls)) }
                    _ = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
                        mode: .server, connectionConfiguration: .init(), streamConfiguration: .init()
                    ) { stream in
                        stream.eventLoop.makeCompletedFuture { try stream.pipeline.syncOperations.addHandler(FakeStreamHandler(fake)) }
                    }
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        server.withLock { $0 = channel }
        port.withLock { $0 = channel.localAddress?.port ?? 0 }
    }

    /// Closes the listener without waiting (connections end with their clients).
    package func close() {
        server.withLock { $0 }?.close(promise: nil)
        group.shutdownGracefully { _ in }
    }

    package func stop() async {
        let channel = server.withLock { $0 }
        try? await channel?.close()
        try? await group.shutdownGracefully()
    }

    /// How long each answer waits first.
    fileprivate var answerDelay: Duration { state.withLock { $0.delay } }

    /// The answer to one call, and its record. Synchronous: the fake answers on its event loop,
    /// never waiting for Swift's cooperative pool, which other tests of the suite may hold.
    fileprivate func answer(headers: HPACKHeaders, body: ByteBuffer) -> (status: Int, headers: [(String, String)], body: ByteBuffer, trailers: [(String, String)]?) {
        let path = headers.first(name: ":path") ?? ""
        let grpc = headers.first(name: "content-type")?.hasPrefix("application/grpc") == true
        var call: FleetEngineCall?
        var problem: (code: Int, message: String)?
        if grpc {
            var frame = body
            if frame.readInteger(as: UInt8.self) == 0, let length = frame.readInteger(as: UInt32.self), let message = frame.readBytes(length: Int(length)) {
                call = try? FleetEngineCall(grpcPath: path, message: message)
            }
        } else {
            call = try? FleetEngineCall(httpMethod: headers.first(name: ":method") ?? "", target: path)
        }
        var issuedAt: Double?
        if call == nil {
            problem = (grpc ? 12 : 404, "unknown method \(path)")
        } else {
            switch judge(headers.first(name: "authorization"), for: call!) {
            case .success(let iat): issuedAt = iat
            case .failure(let refusal):
                issuedAt = refusal.issuedAt
                problem = (grpc ? refusal.grpcCode : refusal.httpCode, refusal.message)
            }
        }
        var seen: [String: String] = [:]
        for field in headers where !field.name.hasPrefix(":") { seen[field.name] = field.value }
        let resource = call?.resource?.description
        let code = problem?.code ?? (grpc ? 0 : 200)
        state.withLock {
            $0.calls.append(FakeFleetEngineCall(wire: grpc ? "grpc" : "rest", method: call?.method.name ?? path, resource: resource,
                                                issuedAt: issuedAt, code: code, refusal: problem?.message, headers: seen,
                                                authorizationFields: headers["authorization"].count))
        }
        if grpc {
            if let problem {
                return (200, [("content-type", "application/grpc"), ("grpc-status", "\(problem.code)"), ("grpc-message", problem.message)], ByteBuffer(), nil)
            }
            // A message whose field 1 (every Fleet Engine resource's name) is the resource.
            let frame = GRPCTestMessage.framed(GRPCTestMessage.string(field: 1, resource ?? ""))
            return (200, [("content-type", "application/grpc")], frame, [("grpc-status", "0")])
        }
        if let problem {
            let status = problem.code == 401 ? "UNAUTHENTICATED" : problem.code == 403 ? "PERMISSION_DENIED" : "NOT_FOUND"
            let json = "{\"error\":{\"code\":\(problem.code),\"message\":\"\(problem.message)\",\"status\":\"\(status)\"}}"
            return (problem.code, [("content-type", "application/json")], ByteBuffer(string: json), nil)
        }
        return (200, [("content-type", "application/json")], ByteBuffer(string: "{\"name\":\"\(resource ?? "")\"}"), nil)
    }

    private struct Refusal: Error {
        let grpcCode: Int
        let httpCode: Int
        let message: String
        var issuedAt: Double?
    }

    /// The token's `iat` when Fleet Engine would accept it for `call`.
    private func judge(_ authorization: String?, for call: FleetEngineCall) -> Result<Double, Refusal> {
        func unauthenticated(_ why: String, _ iat: Double? = nil) -> Result<Double, Refusal> {
            .failure(Refusal(grpcCode: 16, httpCode: 401, message: why, issuedAt: iat))
        }
        guard let authorization, authorization.hasPrefix("Bearer ") else { return unauthenticated("no bearer token") }
        let parts = authorization.dropFirst(7).split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let signature = Self.base64URL(parts[2]), let payloadData = Self.base64URL(parts[1]),
              let payload = try? JSONSerialization.jsonObject(with: Data(payloadData)) as? [String: Any] else {
            return unauthenticated("not a JWT")
        }
        let signed = Data("\(parts[0]).\(parts[1])".utf8)
        guard publicKey.isValidSignature(_RSA.Signing.RSASignature(rawRepresentation: signature), for: signed, padding: .insecurePKCS1v1_5) else {
            return unauthenticated("bad signature")
        }
        let now = Date().timeIntervalSince1970
        guard let iat = (payload["iat"] as? NSNumber)?.doubleValue, let exp = (payload["exp"] as? NSNumber)?.doubleValue else {
            return unauthenticated("no iat or exp")
        }
        guard payload["aud"] as? String == "https://fleetengine.googleapis.com/" else { return unauthenticated("wrong aud", iat) }
        guard exp > now, iat <= now + 60, exp - iat <= 3600 else { return unauthenticated("expired or too long-lived", iat) }
        if let cutoff = state.withLock({ $0.rejectIssuedBefore }), iat < cutoff { return unauthenticated("issued before the key rotation", iat) }
        let resource = call.resource
        if let resource, state.withLock({ $0.deniedResources.contains(resource.description) }) {
            return .failure(Refusal(grpcCode: 7, httpCode: 403, message: "denied", issuedAt: iat))
        }
        let claims = payload["authorization"] as? [String: Any] ?? [:]
        let covered: Bool
        switch resource?.collection {
        case .vehicles?: covered = [resource!.id, "*"].contains(claims["vehicleid"] as? String)
        case .trips?: covered = [resource!.id, "*"].contains(claims["tripid"] as? String)
        case .deliveryVehicles?: covered = [resource!.id, "*"].contains(claims["deliveryvehicleid"] as? String)
        case .tasks?: covered = [resource!.id, "*"].contains(claims["taskid"] as? String)
        // Fleet-wide calls: Fleet Engine wants a server token there; the dev issuer mints one
        // subject's claim only, so any well-signed token of a subject passes (the tests check
        // which subject's token the proxy chose from the issuer's records).
        default: covered = !claims.isEmpty
        }
        guard covered else { return .failure(Refusal(grpcCode: 7, httpCode: 403, message: "the token does not cover the resource", issuedAt: iat)) }
        return .success(iat)
    }

    private static func base64URL(_ text: Substring) -> [UInt8]? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64).map(Array.init)
    }
}

/// gRPC messages as the tests write them: one length-delimited string field, in gRPC's
/// five-byte framing.
package enum GRPCTestMessage {
    /// Protobuf wire format: field `field` (length-delimited) holding `value`.
    package static func string(field: Int, _ value: String) -> [UInt8] {
        let bytes = Array(value.utf8)
        var message: [UInt8] = [UInt8(field << 3 | 2)]
        var length = bytes.count
        repeat {
            message.append(UInt8(length & 0x7F) | (length > 0x7F ? 0x80 : 0))
            length >>= 7
        } while length > 0
        return message + bytes
    }

    /// `message` as a gRPC unary body: uncompressed, its length, the message.
    package static func framed(_ message: [UInt8]) -> ByteBuffer {
        var frame = ByteBuffer()
        frame.writeInteger(UInt8(0))
        frame.writeInteger(UInt32(message.count))
        frame.writeBytes(message)
        return frame
    }
}

/// Counts of what the fake's connections carried.
package struct FakeFleetEngineTraffic: Sendable, CustomStringConvertible {
    package var connections = 0
    package var connectionsClosed = 0
    package var streams = 0
    package var requests = 0
    package var answersSent = 0
    package var answersFailed: [String] = []
    package var goAwaysSent = 0

    package var description: String {
        "connections \(connections) (closed \(connectionsClosed)), streams \(streams), requests read \(requests), answers sent \(answersSent), failed \(answersFailed.prefix(3)), GOAWAYs \(goAwaysSent)"
    }
}

/// One stream at the fake: the request read whole, then the answer.
private final class FakeStreamHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    private let fake: FakeFleetEngine
    private var headers: HPACKHeaders?
    private var body = ByteBuffer()

    init(_ fake: FakeFleetEngine) { self.fake = fake }

    func handlerAdded(context: ChannelHandlerContext) {
        fake.note { $0.streams += 1 }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .headers(let frame):
            if headers == nil { headers = frame.headers }
            if frame.endStream { respond(context) }
        case .data(let frame):
            if case .byteBuffer(var bytes) = frame.data { body.writeBuffer(&bytes) }
            if frame.endStream { respond(context) }
        default:
            break
        }
    }

    private func respond(_ context: ChannelHandlerContext) {
        guard let headers else { return }
        self.headers = nil
        fake.note { $0.requests += 1 }
        let (fake, body, channel) = (fake, body, context.channel)
        var delay = fake.answerDelay
        if let drain = fake.takeGoAway(), let parent = channel.parent,
           let stream = try? channel.syncOptions?.getOption(HTTP2StreamChannelOptions.streamID) {
            delay = drain
            parent.writeAndFlush(HTTP2Frame(streamID: .rootStream, payload: .goAway(lastStreamID: stream, errorCode: .noError, opaqueData: nil)), promise: nil)
            fake.note { $0.goAwaysSent += 1 }
        }
        let nanoseconds = delay.components.seconds * 1_000_000_000 + delay.components.attoseconds / 1_000_000_000
        context.eventLoop.scheduleTask(in: .nanoseconds(nanoseconds)) {
            let answer = fake.answer(headers: headers, body: body)
            var head = HPACKHeaders()
            head.add(name: ":status", value: "\(answer.status)")
            for (name, value) in answer.headers { head.add(name: name, value: value) }
            let hasBody = answer.body.readableBytes > 0
            // The last frame's write tells whether the answer left (for a failure's message).
            let sent = channel.eventLoop.makePromise(of: Void.self)
            sent.futureResult.whenComplete { result in
                switch result {
                case .success: fake.note { $0.answersSent += 1 }
                case .failure(let error): fake.note { $0.answersFailed.append("\(error)") }
                }
            }
            let last = !hasBody && answer.trailers == nil
            channel.write(HTTP2Frame.FramePayload.headers(.init(headers: head, endStream: last)), promise: last ? sent : nil)
            if hasBody {
                channel.write(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(answer.body), endStream: answer.trailers == nil)),
                              promise: answer.trailers == nil ? sent : nil)
            }
            if let trailers = answer.trailers {
                var fields = HPACKHeaders()
                for (name, value) in trailers { fields.add(name: name, value: value) }
                channel.write(HTTP2Frame.FramePayload.headers(.init(headers: fields, endStream: true)), promise: sent)
            }
            channel.flush()
        }
    }
}
