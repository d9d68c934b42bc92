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
import Synchronization
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

    static let prefix = "/v1/token/"

    /// The whole `200` answer (head and body) to the request with `head` from `peer`, or nil
    /// when the router must decide it. Logs the access line when it answers.
    func answer(_ head: HTTPRequest, peer: PeerIdentity?) -> (HTTPResponse, ByteBuffer)? {
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
        headers[.contentLength] = String(body.readableBytes)
        headers[.date] = HTTPDate.now()
        rules.logger.info("token API request", metadata: TokenAPIAccessRules.metadata(
            method: head.method, path: path, status: .ok, fingerprint: headers[TokenAPI.fingerprintHeader], peer: peer, since: started))
        return (HTTPResponse(status: .ok, headerFields: headers), body)
    }
}

/// In a token API connection's pipeline, between Hummingbird's connection state handler and its
/// request task: answers what ``HeldTokenRoute`` can, passes the rest on.
///
/// Answers are written in request order: a request is answered here only while no request
/// passed on is still unanswered (HTTP/1.1 pipelining), and a request with a body is passed on.
/// The connection state handler sees every request and answer, so idle timeouts, `Connection:
/// close` and graceful shutdown work as for routed ones.
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

    init(_ route: HeldTokenRoute, peer: PeerIdentity?) {
        self.route = route
        self.peer = peer
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            if passedOn == 0, head.method == .get { held = head } else { passOn(head, context) }
        case .body:
            if let head = held { passOn(head, context) }
            context.fireChannelRead(data)
        case .end:
            guard let head = held else { return context.fireChannelRead(data) }
            held = nil
            guard let (response, body) = route.answer(head, peer: peer) else {
                passOn(head, context)
                return context.fireChannelRead(data)
            }
            context.write(wrapOutboundOut(.head(response)), promise: nil)
            context.write(wrapOutboundOut(.body(body)), promise: nil)
            context.write(wrapOutboundOut(.end(nil)), promise: nil)
            needsFlush = true
            if head.headerFields[.connection]?.lowercased() == "close" {
                context.flush()
                needsFlush = false
                context.close(promise: nil)
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

    private func passOn(_ head: HTTPRequest, _ context: ChannelHandlerContext) {
        held = nil
        passedOn += 1
        context.fireChannelRead(wrapInboundOut(.head(head)))
    }
}

@available(*, unavailable)
extension HeldTokenHandler: Sendable {}

/// The `Date` header's value (RFC 9110's IMF-fixdate), made once a second.
enum HTTPDate {
    private static let cache = Mutex<(second: Int, text: String)>((-1, ""))
    private static let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// Now, e.g. `Sun, 29 Nov 2026 15:58:32 GMT`.
    static func now() -> String {
        var seconds = time(nil)
        return cache.withLock { cache in
            if cache.second == seconds { return cache.text }
            var parts = tm()
            guard gmtime_r(&seconds, &parts) != nil else { return cache.text }
            func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
            cache = (seconds, "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
                + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT")
            return cache.text
        }
    }
}
