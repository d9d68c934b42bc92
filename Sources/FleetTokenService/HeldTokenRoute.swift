// Service layer: the token API's hot route answered on the event loop that read the request,
// from the HTTP/1 parser's head, when memory holds the token and every rule lets it through;
// anything else goes on to the conversion to HTTPTypes and the router, which decide it as before.

import FleetTokenHTTPSyntax
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
/// load; then the conversions to and from HTTPTypes and Hummingbird's connection handler were.
/// This reads the parser's head and writes NIO's HTTP/1 answer parts. It answers only what the router would answer
/// `200`: the same rules are asked in the same order (``TokenAPIAccessRules/refusal(_:)-(RequestHeadFacts)``,
/// the request header, the subject's access and cap), and on any refusal, miss or other path it
/// answers nil and the request is routed.
struct HeldTokenRoute: Sendable {
    let api: TokenAPI
    let rules: TokenAPIAccessRules

    /// The token route's path up to its parameters; the router's route is built from it too.
    static let prefix = "/v1/token/"

    /// The `200` answer (its head and body) to the HTTP/1.1 request with `head` from `peer`, or
    /// nil when the router must decide it. Logs the access line when it answers.
    func answer(_ head: HTTPRequestHead, peer: PeerIdentity?, date: @autoclosure () -> String) -> (HTTPResponseHead, ByteBuffer)? {
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
        var headers = HTTPHeaders()
        headers.reserveCapacity(fields.count + 2)
        for field in fields { headers.add(name: field.name.rawName, value: field.value) }
        // Neither is among the handout's fields.
        headers.add(name: "Content-Length", value: String(body.readableBytes))
        headers.add(name: "Date", value: date())
        rules.logger.info("token API request", metadata: TokenAPIAccessRules.metadata(
            method: .get, path: path, status: .ok, fingerprint: fields[TokenAPI.fingerprintHeader], peer: peer, since: started))
        // What tells a held answer from a routed one when debugging (and in the tests).
        rules.logger.debug("token API request answered from memory on its event loop", metadata: ["path": "\(path)"])
        return (HTTPResponseHead(version: .http1_1, status: .ok, headers: headers), body)
    }
}

/// In a token API connection's pipeline, between the HTTP/1 parser (and the absolute-form
/// handler) and the conversion to HTTPTypes: answers what ``HeldTokenRoute`` can, passes the
/// rest on, and keeps the connection's idle timeout, which Hummingbird's connection state handler
/// kept before (it does not see the requests answered here).
///
/// - Answers are written in request order: a request is answered here only while no request
///   passed on is still unanswered (HTTP/1.1 pipelining); a request with a body is passed on.
///   They go through the HTTP/1 encoder, which pairs each answer with its request's method.
/// - A client that does not read its answers is not answered here: while the connection is not
///   writable requests go to Hummingbird, which waits for each write (so nothing piles up here).
/// - After a request asking to close (`Connection: close`, matched as Hummingbird matches it),
///   nothing more is answered, here or there; a close waits for the answers written here.
/// - Idle: ``ConnectionIdleRule``, over every request and answer.
/// - Graceful shutdown: Hummingbird's handler closes a connection with no routed request in
///   progress; a request held here (its end not yet read) is answered first (or passed on
///   before the shutdown is).
final class HeldTokenHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    private let route: HeldTokenRoute
    private let peer: PeerIdentity?
    /// Requests passed on whose answer's end has not been written yet.
    private var passedOn = 0
    /// The head of a request that may be answered here, held until its end arrives.
    private var held: HTTPRequestHead?
    private var needsFlush = false
    /// A request asked to close the connection; what follows it is dropped once `discarding`.
    private var closing = false
    private var discarding = false
    /// A graceful shutdown came while a request was held: passed on after it, if it is.
    private var quiesceAfterHeld = false
    /// The last request was answered here and asked to close: the connection closes after it.
    private var closesAfterAnswer = false
    /// The last answer written here: a close waits for it (closing drops writes still queued).
    private var lastAnswer: EventLoopFuture<Void>?
    private let idleTimeout: TimeAmount?
    /// The idle rule from the connection's start (nil: not active yet, or no idle timeout) and
    /// its check's timer.
    private var idle: ConnectionIdleRule?
    private var idleCheck: Scheduled<Void>?
    /// This connection's `Date` value and its second (one event loop: no lock).
    private var date = (second: -1, text: "")

    init(_ route: HeldTokenRoute, peer: PeerIdentity?, idleTimeout: TimeAmount?) {
        self.route = route
        self.peer = peer
        self.idleTimeout = idleTimeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { startIdleRule(context) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        idleCheck?.cancel()
        idleCheck = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        startIdleRule(context)
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
            idle?.read(head: true, now: .now())
            // Hummingbird's own test: the field's value exactly (HTTPTypes joins several with ", ").
            let asksToClose = head.headers["connection"].joined(separator: ", ") == "close"
            if asksToClose { closing = true }
            if passedOn == 0, head.method == .GET, head.isKeepAlive || asksToClose, context.channel.isWritable {
                held = head
            } else {
                passOn(head, context)
            }
        case .body:
            guard !discarding else { return }
            idle?.read(now: .now())
            if let head = held { passOn(head, context) }
            context.fireChannelRead(data)
        case .end:
            guard !discarding else { return }
            idle?.read(end: true, now: .now())
            guard let head = held else { return context.fireChannelRead(data) }
            held = nil
            guard let (response, body) = route.answer(head, peer: peer, date: httpDate()) else {
                passOn(head, context)
                return context.fireChannelRead(data)
            }
            let written = context.eventLoop.makePromise(of: Void.self)
            context.write(wrapOutboundOut(.head(response)), promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
            context.write(wrapOutboundOut(.end(nil)), promise: written)
            answerEnded(context)
            lastAnswer = written.futureResult
            needsFlush = true
            if quiesceAfterHeld {
                quiesceAfterHeld = false
                closing = true
            }
            if closing {
                context.flush()
                needsFlush = false
                closesAfterAnswer = true
                written.futureResult.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
            }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if needsFlush {
            needsFlush = false
            context.flush()
        }
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // Hummingbird's handler does not know of a held request: it would close at once.
        if event is ChannelShouldQuiesceEvent, held != nil {
            quiesceAfterHeld = true
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        // (A parse error's 400 answers no request passed on: never below 0.)
        if case .end = unwrapOutboundIn(data) {
            passedOn = max(0, passedOn - 1)
            answerEnded(context)
        }
        context.write(data, promise: promise)
    }

    /// The parser refuses what a client sends after a request asking to close; when that request
    /// was answered here, the connection closes once its answer is out, and Hummingbird (which
    /// never saw the request) must not answer the refusal with a 400 behind it.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if closesAfterAnswer { return }
        context.fireErrorCaught(error)
    }

    /// Hummingbird's close (or half-close) after its last answer: once the answers written here
    /// are out. After a full close nothing more is answered here.
    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if mode == .all { closing = true }
        guard let lastAnswer else { return context.close(mode: mode, promise: promise) }
        lastAnswer.assumeIsolated().whenComplete { _ in context.close(mode: mode, promise: promise) }
    }

    private func passOn(_ head: HTTPRequestHead, _ context: ChannelHandlerContext) {
        held = nil
        passedOn += 1
        context.fireChannelRead(wrapInboundOut(.head(head)))
        if quiesceAfterHeld {
            // Now Hummingbird's handler sees the request in progress, and closes after its answer.
            quiesceAfterHeld = false
            context.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        }
    }

    private func startIdleRule(_ context: ChannelHandlerContext) {
        guard let idleTimeout else { return }
        let rule = ConnectionIdleRule(timeout: idleTimeout, now: .now())
        idle = rule
        scheduleIdleCheck(context, at: rule.firstCheck())
    }

    private func answerEnded(_ context: ChannelHandlerContext) {
        if let next = idle?.answered(now: .now()) { scheduleIdleCheck(context, at: next) }
    }

    /// The idle rule's check at `deadline` (one timer at a time: a later check waits for the
    /// earlier one, which reschedules from the rule's facts).
    private func scheduleIdleCheck(_ context: ChannelHandlerContext, at deadline: NIODeadline) {
        guard idle != nil, idleCheck == nil else { return }
        idleCheck = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) {
            self.idleCheck = nil
            guard context.channel.isActive, let rule = self.idle else { return }
            switch rule.check(now: .now()) {
            case .close: context.close(promise: nil)
            case .checkAgain(let at): self.scheduleIdleCheck(context, at: at)
            case .waitForAnswer: break
            }
        }
    }

    /// The `Date` header's value now, made once a second.
    private func httpDate() -> String {
        let now = time(nil)
        if Int(now) != date.second { date = (Int(now), HTTPDate.format(Int(now))) }
        return date.text
    }
}

@available(*, unavailable)
extension HeldTokenHandler: Sendable {}
