// Service layer: the token API's hot route answered on the event loop that read the request,
// from the HTTP/1 parser's head, when memory holds the token and every rule lets it through;
// anything else goes on to the conversion to HTTPTypes and the router, which decide it as before.

import FleetTokenStore
import Foundation
import HTTPTypes
import HummingbirdCore
import Logging
import NIOCore
// Implementation-only: see AbsoluteFormTargetHandler.swift.
@_implementationOnly import NIOHTTP1
#if canImport(Glibc)
import Glibc
#endif

/// `GET /v1/token/{kind}/{id}` for a token memory holds, decided without a task.
///
/// Through the router a hit went from the event loop to the connection's task and back, and
/// that hop, with the router's request and response values, was most of a hit's cost under
/// load; then the conversions to and from HTTPTypes and the HTTP/1 encoder were. This reads the
/// parser's head and writes the answer's bytes. It answers only what the router would answer
/// `200`: the same rules are asked in the same order (``TokenAPIAccessRules/refusal(_:)-(RequestHeadFacts)``,
/// the request header, the subject's access and cap), and on any refusal, miss or other path it
/// answers nil and the request is routed.
struct HeldTokenRoute: Sendable {
    let api: TokenAPI
    let rules: TokenAPIAccessRules

    /// The token route's path up to its parameters; the router's route is built from it too.
    static let prefix = "/v1/token/"

    /// The whole `200` answer (status line, fields, body) to the HTTP/1.1 request with `head`
    /// from `peer`, or nil when the router must decide it. Logs the access line when it answers.
    func answer(_ head: HTTPRequestHead, peer: PeerIdentity?, date: @autoclosure () -> String) -> ByteBuffer? {
        let started = ContinuousClock.now
        let target = head.uri
        guard head.method == .GET, head.version == .http1_1, target.hasPrefix(Self.prefix) else { return nil }
        let path = target.utf8.firstIndex(of: UInt8(ascii: "?")).map { target[..<$0] } ?? target[...]
        let rest = path.dropFirst(Self.prefix.count)
        // Exactly KIND/ID; an escaped id is left to the router (it decodes it).
        guard let slash = rest.utf8.firstIndex(of: UInt8(ascii: "/")), !rest[..<slash].isEmpty else { return nil }
        let id = rest[rest.index(after: slash)...]
        // (Byte searches: Substring.contains(String) is Foundation's, a CFString search.)
        guard !id.isEmpty, !id.utf8.contains(UInt8(ascii: "/")), !id.utf8.contains(UInt8(ascii: "%")) else { return nil }
        let facts = RequestHeadFacts(target: target, fields: head.headers)
        guard rules.refusal(facts) == nil, TokenRequestHeaderRule.isMarked(values: head.headers[TokenAPI.requestHeader.rawName]),
              case .success(let key) = api.subject(kind: rest[..<slash], id: String(id), peer: peer),
              api.dynamicCapRefusal(key) == nil else { return nil }
        api.limiter.sweep(now: .now)
        guard let token = api.engine.tokenIfHeld(for: key) else { return nil }
        let accept = head.headers["accept"]
        let (fields, body) = api.handout(token, source: api.engine.source(of: key), key: key, to: peer,
                                         accept: accept.isEmpty ? nil : accept.joined(separator: ", "))
        var answer = ByteBuffer()
        answer.reserveCapacity(body.readableBytes + 256)
        answer.writeStaticString("HTTP/1.1 200 OK\r\n")
        for field in fields {
            answer.writeString(field.name.rawName)
            answer.writeStaticString(": ")
            answer.writeString(field.value)
            answer.writeStaticString("\r\n")
        }
        // Neither is among the handout's fields.
        answer.writeStaticString("Content-Length: ")
        answer.writeString(String(body.readableBytes))
        answer.writeStaticString("\r\nDate: ")
        answer.writeString(date())
        answer.writeStaticString("\r\n\r\n")
        answer.writeImmutableBuffer(body)
        rules.logger.info("token API request", metadata: TokenAPIAccessRules.metadata(
            method: .get, path: path, status: .ok, fingerprint: fields[TokenAPI.fingerprintHeader], peer: peer, since: started))
        // What tells a held answer from a routed one when debugging (and in the tests).
        rules.logger.debug("token API request answered from memory on its event loop", metadata: ["path": "\(path)"])
        return answer
    }
}

/// Where a ``HeldTokenHandler`` writes its answers' bytes: in front of the HTTP/1 encoder, which
/// takes only response parts. Passes every write on unchanged.
final class HeldTokenOutlet: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
}

@available(*, unavailable)
extension HeldTokenOutlet: Sendable {}

/// In a token API connection's pipeline, between the HTTP/1 parser (and the absolute-form
/// handler) and the conversion to HTTPTypes: answers what ``HeldTokenRoute`` can, passes the
/// rest on; and the connection's idle timeout, which Hummingbird's connection state handler
/// kept before (it does not see the requests answered here).
///
/// - Answers are written in request order: a request is answered here only while no request
///   passed on is still unanswered (HTTP/1.1 pipelining); a request with a body is passed on.
/// - A client that does not read its answers is not answered here: while the connection is not
///   writable requests go to Hummingbird, which waits for each write (so nothing piles up here).
/// - After a request asking to close (HTTP/1.1's `Connection: close`), nothing more is answered,
///   here or there; a close waits for the answers written here.
/// - Idle: the connection closes when no request has been in progress (being read, passed on
///   and not yet answered) for `idleTimeout`, as Hummingbird's handler closed it. Graceful
///   shutdown still goes through Hummingbird's handler, which sees every routed request.
final class HeldTokenHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    private let route: HeldTokenRoute
    private let peer: PeerIdentity?
    private let idleTimeout: TimeAmount?
    /// Requests passed on whose answer's end has not been written yet.
    private var passedOn = 0
    /// The head of a request that may be answered here, held until its end arrives.
    private var held: HTTPRequestHead?
    private var needsFlush = false
    /// A request asked to close the connection; what follows it is dropped once `discarding`.
    private var closing = false
    private var discarding = false
    /// The last answer written here: a close waits for it (closing drops writes still queued).
    private var lastAnswer: EventLoopFuture<Void>?
    /// Where this handler's answers go, before the HTTP/1 encoder.
    private var outlet: ChannelHandlerContext?
    /// The last time a request began or an answer ended, and the idle check's timer.
    private var lastActive = NIODeadline.now()
    private var idleCheck: Scheduled<Void>?
    /// This connection's `Date` value and its second (one event loop: no lock).
    private var date = (second: -1, text: "")

    init(_ route: HeldTokenRoute, peer: PeerIdentity?, idleTimeout: TimeAmount?) {
        self.route = route
        self.peer = peer
        self.idleTimeout = idleTimeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        outlet = try? context.pipeline.syncOperations.context(handlerType: HeldTokenOutlet.self)
        if context.channel.isActive { scheduleIdleCheck(context, at: .now() + (idleTimeout ?? .zero)) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        idleCheck?.cancel()
        idleCheck = nil
        outlet = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        lastActive = .now()
        scheduleIdleCheck(context, at: lastActive + (idleTimeout ?? .zero))
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        idleCheck?.cancel()
        idleCheck = nil
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            if closing { discarding = true }
            guard !discarding else { return }
            lastActive = .now()
            if !head.isKeepAlive { closing = true }
            if passedOn == 0, head.method == .GET, outlet != nil, context.channel.isWritable { held = head } else { passOn(head, context) }
        case .body:
            guard !discarding else { return }
            if let head = held { passOn(head, context) }
            context.fireChannelRead(data)
        case .end:
            guard !discarding else { return }
            guard let head = held else { return context.fireChannelRead(data) }
            held = nil
            guard let outlet, let answer = route.answer(head, peer: peer, date: httpDate()) else {
                passOn(head, context)
                return context.fireChannelRead(data)
            }
            let written = context.eventLoop.makePromise(of: Void.self)
            outlet.write(NIOAny(answer), promise: written)
            lastAnswer = written.futureResult
            lastActive = .now()
            needsFlush = true
            if closing {
                outlet.flush()
                needsFlush = false
                written.futureResult.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
            }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if needsFlush {
            needsFlush = false
            outlet?.flush()
        }
        context.fireChannelReadComplete()
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        // (A parse error's 400 answers no request passed on: never below 0.)
        if case .end = unwrapOutboundIn(data) {
            passedOn = max(0, passedOn - 1)
            lastActive = .now()
        }
        context.write(data, promise: promise)
    }

    /// Hummingbird's close (or half-close) after its last answer: once the answers written here are out.
    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard let lastAnswer else { return context.close(mode: mode, promise: promise) }
        lastAnswer.assumeIsolated().whenComplete { _ in context.close(mode: mode, promise: promise) }
    }

    private func passOn(_ head: HTTPRequestHead, _ context: ChannelHandlerContext) {
        held = nil
        passedOn += 1
        context.fireChannelRead(wrapInboundOut(.head(head)))
    }

    /// Checks at `deadline` whether the connection has been idle for the idle timeout: closes
    /// it then, else checks again when it could first be.
    private func scheduleIdleCheck(_ context: ChannelHandlerContext, at deadline: NIODeadline) {
        guard let idleTimeout, idleCheck == nil else { return }
        idleCheck = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) {
            self.idleCheck = nil
            guard context.channel.isActive else { return }
            let now = NIODeadline.now()
            if self.held != nil || self.passedOn > 0 {
                self.scheduleIdleCheck(context, at: now + idleTimeout)
            } else if now >= self.lastActive + idleTimeout {
                context.close(promise: nil)
            } else {
                self.scheduleIdleCheck(context, at: self.lastActive + idleTimeout)
            }
        }
    }

    /// The `Date` header's value now, made once a second.
    private func httpDate() -> String {
        let now = time(nil)
        if Int(now) != date.second { date = (Int(now), HTTPDate.format(now)) }
        return date.text
    }
}

@available(*, unavailable)
extension HeldTokenHandler: Sendable {}

/// The `Date` header's value: RFC 9110's IMF-fixdate.
enum HTTPDate {
    private static let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// `seconds` since 1970 as `Sun, 29 Nov 2026 15:58:32 GMT`.
    static func format(_ seconds: time_t) -> String {
        guard let parts = UTCTime.parts(seconds) else { return "" }
        let two = UTCTime.twoDigits
        return "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }
}
