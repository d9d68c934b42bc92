// Service layer: the rules every request to the local token API meets before it is routed
// (normal-form target, no forwarding headers, the Host and Origin rules of TCP listeners), the
// rule the token routes add once matched (the request header), and the access log.

import Foundation
import HTTPTypes
import Hummingbird
import Logging

/// The kind of listener a request arrived on: the Host and Origin rules apply to TCP only (a
/// browser reaches loopback TCP, never a Unix socket).
enum APITransport: Sendable, Equatable {
    /// A Unix domain socket.
    case unix
    /// A TCP listener on `host` (as given to `--listen`).
    case tcp(host: String)
}

/// Looks up the identity of the caller on a Unix-socket connection (read when it was accepted).
typealias PeerLookup = @Sendable (ObjectIdentifier) -> PeerIdentity?

/// The rules every request meets before routing, and the access log (kind, id, status,
/// fingerprint, latency; never a token).
///
/// What reaches the router is a request whose target is in normal form (see ``RequestTarget``),
/// so the route that matches is the route whose rules are applied: no second reading of the path
/// can disagree with the router's.
struct TokenAPIAccessRules: RouterMiddleware {
    typealias Context = TokenAPIRequestContext
    let logger: Logger
    let transport: APITransport
    let peers: PeerLookup

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let started = ContinuousClock.now
        var context = context
        if case .unix = transport { context.peer = peers(context.connection) }
        let response: Response
        if let refusal = refusal(request.head) {
            response = refusal
        } else {
            do {
                response = try await next(request, context)
            } catch let error as HTTPError {
                response = TokenAPI.json(error.status, ["error": error.body ?? error.status.reasonPhrase])
            }
        }
        // Built only when the log level lets it through (the metadata is an autoclosure).
        logger.info("token API request", metadata: Self.metadata(
            method: request.method, path: request.uri.path, status: response.status, fingerprint: response.headers[TokenAPI.fingerprintHeader],
            peer: context.peer, since: started))
        return response
    }

    static let forwardedFor = HTTPField.Name("X-Forwarded-For")!
    static let forwarded = HTTPField.Name("Forwarded")!

    /// The answer refusing the request with `head` before routing, or nil when it may be routed.
    func refusal(_ head: HTTPRequest) -> Response? {
        if head.headerFields[Self.forwardedFor] != nil || head.headerFields[Self.forwarded] != nil {
            return TokenAPI.json(.forbidden, ["error": "requests through a proxy are refused (X-Forwarded-For or Forwarded present)"])
        }
        if let problem = RequestTarget.problem(head.path ?? "") {
            return TokenAPI.json(.badRequest, ["error": "the request target \(problem): send the path in normal form, e.g. /v1/token/vehicle/truck-7"])
        }
        guard case .tcp(let listenHost) = transport else { return nil }
        // A page a browser loaded from a name that an attacker's DNS then points at 127.0.0.1
        // is same-origin with the API, so it may set the request header: the Host it sends
        // still names the attacker's host, and a page never omits Origin on a cross-origin
        // request. Local programs send neither problem.
        guard let host = head.authority, LoopbackHost.isAllowedHostHeader(host, listenHost: listenHost) else {
            return TokenAPI.json(.misdirectedRequest, ["error": "the Host header must name this listener (localhost, a loopback address): requests for other host names are refused as DNS rebinding"])
        }
        if head.headerFields[.origin] != nil {
            return TokenAPI.json(.forbidden, ["error": "requests from web pages (with an Origin header) are refused"])
        }
        return nil
    }

    /// The access log line's fields: no token, whichever path answered.
    static func metadata(method: HTTPRequest.Method, path: some StringProtocol, status: HTTPResponse.Status, fingerprint: String?,
                         peer: PeerIdentity?, since started: ContinuousClock.Instant) -> Logger.Metadata {
        var metadata: Logger.Metadata = [
            "method": "\(method)", "path": "\(path)", "status": "\(status.code)",
            "latency_ms": "\((ContinuousClock.now - started).accessLogMilliseconds)",
        ]
        if let peer {
            metadata["uid"] = "\(peer.uid)"
            metadata["pid"] = "\(peer.pid)"
        }
        if let fingerprint { metadata["fingerprint"] = "\(fingerprint)" }
        return metadata
    }
}

/// The rule of every route that hands out or changes tokens, applied once the route matched:
/// the request carries `Fleet-Token-Request: true`, which a server-side request forgery or an
/// HTML form cannot add.
struct TokenRequestHeaderRule: RouterMiddleware {
    typealias Context = TokenAPIRequestContext

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard Self.isMarked(request.head) else {
            return TokenAPI.json(.forbidden, ["error": "add the header Fleet-Token-Request: true"])
        }
        return try await next(request, context)
    }

    /// True when the request with `head` carries the header with the value `true`.
    static func isMarked(_ head: HTTPRequest) -> Bool {
        head.headerFields[TokenAPI.requestHeader]?.lowercased() == "true"
    }
}

/// What a request target must look like to be routed: origin form (`/path?query`), no empty,
/// `.` or `..` segment, no percent-encoded unreserved character, well-formed escapes. A pure rule.
enum RequestTarget {
    /// Why `target` (the path with its query, as received) is not in normal form, or nil.
    static func problem(_ target: String) -> String? {
        let path = target.utf8.split(separator: UInt8(ascii: "?"), maxSplits: 1, omittingEmptySubsequences: false).first ?? Substring(target).utf8[...]
        guard path.first == UInt8(ascii: "/") else { return "is not a path (origin form)" }
        if path.count == 1 { return nil }
        for segment in path.dropFirst().split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false) {
            if segment.isEmpty { return "has an empty path segment" }
            if segment.elementsEqual(".".utf8) || segment.elementsEqual("..".utf8) { return "has a . or .. path segment" }
            if let problem = escapeProblem(segment) { return problem }
        }
        return nil
    }

    /// Escapes must be `%` and two hex digits, and must not encode what needs no encoding.
    private static func escapeProblem(_ segment: Substring.UTF8View.SubSequence) -> String? {
        var index = segment.startIndex
        while index < segment.endIndex {
            if segment[index] == UInt8(ascii: "%") {
                let high = segment.index(after: index)
                guard high < segment.endIndex, segment.index(after: high) < segment.endIndex,
                      let upper = hexValue(segment[high]), let lower = hexValue(segment[segment.index(after: high)]) else {
                    return "has a malformed percent escape"
                }
                if isUnreserved(upper << 4 | lower) { return "percent-encodes a character that needs no encoding" }
                index = segment.index(index, offsetBy: 3)
            } else {
                if segment[index] == UInt8(ascii: "\\") { return "has a backslash" }
                index = segment.index(after: index)
            }
        }
        return nil
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    /// RFC 3986's unreserved set: letters, digits, `-`, `.`, `_`, `~`.
    private static func isUnreserved(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"): true
        case UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"): true
        default: false
        }
    }
}

extension Duration {
    /// In milliseconds with two decimals, as the token API's and the Fleet Engine proxy's access
    /// logs write latency.
    package var accessLogMilliseconds: String {
        let (seconds, attoseconds) = components
        return String(format: "%.2f", Double(seconds) * 1000 + Double(attoseconds) / 1e15)
    }
}
