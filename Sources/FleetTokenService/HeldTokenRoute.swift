// Service layer: the token API's hot route answered on the event loop that read the request,
// when memory holds the token and every rule lets it through; anything else goes on to the
// router, which decides it as before.

import FleetTokenStore
import Foundation
import HTTPTypes
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTPTypes
#if canImport(Glibc)
import Glibc
#endif

/// `GET /v1/token/{kind}/{id}` for a token memory holds, decided without a task.
///
/// Through the router a hit went from the event loop to the connection's task and back, and
/// that hop, with the router's request and response values, was most of a hit's cost under
/// load. This answers only what the router would answer `200`: the same rules are asked in the
/// same order (``TokenAPIAccessRules/refusal(_:)``, the request header, the subject's access
/// and cap), and on any refusal, miss or other path it answers nil and the request is routed.
struct HeldTokenRoute: Sendable {
    let api: TokenAPI
    let rules: TokenAPIAccessRules

    /// The token route's path up to its parameters; the router's route is built from it too.
    static let prefix = "/v1/token/"

    /// The whole `200` answer (head and body) to the request with `head` from `peer`, or nil
    /// when the router must decide it. Logs the access line when it answers.
    func answer(_ head: HTTPRequest, peer: PeerIdentity?, date: @autoclosure () -> String) -> (HTTPResponse, ByteBuffer)? {
        let started = ContinuousClock.now
        guard head.method == .get, let target = head.path, target.hasPrefix(Self.prefix) else { return nil }
        let path = target.utf8.firstIndex(of: UInt8(ascii: "?")).map { target[..<$0] } ?? target[...]
        let rest = path.dropFirst(Self.prefix.count)
        // Exactly KIND/ID; an escaped id is left to the router (it decodes it).
        guard let slash = rest.utf8.firstIndex(of: UInt8(ascii: "/")), !rest[..<slash].isEmpty else { return nil }
        let id = rest[rest.index(after: slash)...]
        // (Byte searches: Substring.contains(String) is Foundation's, a CFString search.)
        guard !id.isEmpty, !id.utf8.contains(UInt8(ascii: "/")), !id.utf8.contains(UInt8(ascii: "%")) else { return nil }
        guard rules.refusal(head) == nil, TokenRequestHeaderRule.isMarked(head),
              case .success(let key) = api.subject(kind: rest[..<slash], id: String(id), peer: peer),
              api.dynamicCapRefusal(key) == nil else { return nil }
        api.limiter.sweep(now: .now)
        guard let token = api.engine.tokenIfHeld(for: key) else { return nil }
        let (fields, body) = api.handout(token, source: api.engine.source(of: key), key: key, to: peer,
                                         accept: head.headerFields[.accept])
        var headers = fields
        // Neither is among the handout's fields: appended without a search.
        headers.append(HTTPField(name: .contentLength, value: String(body.readableBytes)))
        headers.append(HTTPField(name: .date, value: date()))
        rules.logger.info("token API request", metadata: TokenAPIAccessRules.metadata(
            method: head.method, path: path, status: .ok, fingerprint: headers[TokenAPI.fingerprintHeader], peer: peer, since: started))
        // What tells a held answer from a routed one when debugging (and in the tests).
        rules.logger.debug("token API request answered from memory on its event loop", metadata: ["path": "\(path)"])
        return (HTTPResponse(status: .ok, headerFields: headers), body)
    }
}

/// In a token API connection's pipeline, between Hummingbird's connection state handler and its
/// request task: answers what ``HeldTokenRoute`` can, passes the rest on.
///
/// - Answers are written in request order: a request is answered here only while no request
///   passed on is still unanswered (HTTP/1.1 pipelining); a request with a body is passed on.
/// - A client that does not read its answers is not answered here: while the connection is not
///   writable requests go to Hummingbird, which waits for each write (so nothing piles up here).
/// - After a request asking to close (`Connection: close`, matched as Hummingbird matches it),
///   nothing more is answered, here or there; a close waits for the answers written here.
/// - The connection state handler sees every request and answer: idle timeouts and graceful
///   shutdown work as for routed requests.
final class HeldTokenHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let route: HeldTokenRoute
    private let peer: PeerIdentity?
    /// Requests passed on whose answer's end has not been written yet.
    private var passedOn = 0
    /// The head of a request that may be answered here, held until its end arrives.
    private var held: HTTPRequest?
    private var needsFlush = false
    /// A request asked to close the connection; what follows it is dropped once `discarding`.
    private var closing = false
    private var discarding = false
    /// The last answer written here: a close waits for it (closing drops writes still queued).
    private var lastAnswer: EventLoopFuture<Void>?
    /// This connection's `Date` value and its second (one event loop: no lock).
    private var date = (second: -1, text: "")

    init(_ route: HeldTokenRoute, peer: PeerIdentity?) {
        self.route = route
        self.peer = peer
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            if closing { discarding = true }
            guard !discarding else { return }
            // Hummingbird's own test: this value exactly.
            if head.headerFields[.connection] == "close" { closing = true }
            if passedOn == 0, head.method == .get, context.channel.isWritable { held = head } else { passOn(head, context) }
        case .body:
            guard !discarding else { return }
            if let head = held { passOn(head, context) }
            context.fireChannelRead(data)
        case .end:
            guard !discarding else { return }
            guard let head = held else { return context.fireChannelRead(data) }
            held = nil
            guard let (response, body) = route.answer(head, peer: peer, date: httpDate()) else {
                passOn(head, context)
                return context.fireChannelRead(data)
            }
            let written = context.eventLoop.makePromise(of: Void.self)
            context.write(wrapOutboundOut(.head(response)), promise: nil)
            context.write(wrapOutboundOut(.body(body)), promise: nil)
            context.write(wrapOutboundOut(.end(nil)), promise: written)
            lastAnswer = written.futureResult
            needsFlush = true
            if closing {
                context.flush()
                needsFlush = false
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

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        // (A parse error's 400 answers no request passed on: never below 0.)
        if case .end = unwrapOutboundIn(data) { passedOn = max(0, passedOn - 1) }
        context.write(data, promise: promise)
    }

    /// Hummingbird's close (or half-close) after its last answer: once the answers written here are out.
    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard let lastAnswer else { return context.close(mode: mode, promise: promise) }
        lastAnswer.assumeIsolated().whenComplete { _ in context.close(mode: mode, promise: promise) }
    }

    private func passOn(_ head: HTTPRequest, _ context: ChannelHandlerContext) {
        held = nil
        passedOn += 1
        context.fireChannelRead(wrapInboundOut(.head(head)))
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
