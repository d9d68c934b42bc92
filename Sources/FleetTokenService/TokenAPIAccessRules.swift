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
    static let host = HTTPField.Name("Host")!

    /// The answer refusing the request with `head` before routing, or nil when it may be routed.
    func refusal(_ head: HTTPRequest) -> Response? {
        refusal(RequestHeadFacts(head))
    }

    /// The answer refusing a request whose head reads as `facts`, or nil when it may be routed.
    /// The one statement of these rules: the router's requests and the held tokens' both meet it.
    func refusal(_ facts: RequestHeadFacts) -> Response? {
        if facts.forwarded {
            return TokenAPI.json(.forbidden, ["error": "requests through a proxy are refused (X-Forwarded-For or Forwarded present)"])
        }
        if let problem = RequestTarget.problem(facts.target) {
            return TokenAPI.json(.badRequest, ["error": "the request target \(problem): send the path in normal form, e.g. /v1/token/vehicle/truck-7"])
        }
        // RFC 9112 (3.2) has a request with two Host fields refused: which one names the
        // listener is unclear.
        if facts.moreThanOneHost {
            return TokenAPI.json(.badRequest, ["error": "the request has more than one Host header: send one"])
        }
        guard case .tcp(let listenHost) = transport else { return nil }
        // A page a browser loaded from a name that an attacker's DNS then points at 127.0.0.1
        // is same-origin with the API, so it may set the request header: the Host it sends
        // still names the attacker's host, and a page never omits Origin on a cross-origin
        // request. Local programs send neither problem.
        guard let host = facts.host, LoopbackHost.isAllowedHostHeader(host, listenHost: listenHost) else {
            return TokenAPI.json(.misdirectedRequest, ["error": "the Host header must name this listener (localhost, a loopback address): requests for other host names are refused as DNS rebinding"])
        }
        if facts.origin {
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

/// What the rules before routing read of a request's head, whichever form it came in: the
/// router's HTTPTypes request, or the HTTP/1 head the held-token route reads before that
/// conversion. Two readings of one head, one set of rules (``TokenAPIAccessRules/refusal(_:)-(RequestHeadFacts)``).
struct RequestHeadFacts: Equatable {
    /// The target as received (path and query).
    var target: String
    /// The first Host field's value (HTTPTypes' authority), or nil.
    var host: String?
    /// A second Host field came.
    var moreThanOneHost = false
    /// `X-Forwarded-For` or `Forwarded` came.
    var forwarded = false
    /// `Origin` came.
    var origin = false

    /// The facts of a request read as HTTPTypes, whose conversion took the first Host as the
    /// authority and left any other among the fields.
    init(_ head: HTTPRequest) {
        target = head.path ?? ""
        host = head.authority
        // `contains`: the subscript would join the values of every field with the name.
        moreThanOneHost = head.headerFields.contains(TokenAPIAccessRules.host)
        forwarded = head.headerFields.contains(TokenAPIAccessRules.forwardedFor) || head.headerFields.contains(TokenAPIAccessRules.forwarded)
        origin = head.headerFields.contains(.origin)
    }

    /// The facts of a request with `target` whose header fields are `fields` (name and value,
    /// as received): names compare without regard to case.
    init(target: String, fields: some Sequence<(name: String, value: String)>) {
        self.target = target
        for (name, value) in fields {
            if LoopbackHost.equalsIgnoringASCIICase(name, "host") {
                if host == nil { host = value } else { moreThanOneHost = true }
            } else if LoopbackHost.equalsIgnoringASCIICase(name, "origin") {
                origin = true
            } else if LoopbackHost.equalsIgnoringASCIICase(name, "forwarded") || LoopbackHost.equalsIgnoringASCIICase(name, "x-forwarded-for") {
                forwarded = true
            }
        }
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

    /// True when the request with `head` carries the header once, with the value `true` (any
    /// case). Two such fields read as `true, true`, which is not `true`.
    static func isMarked(_ head: HTTPRequest) -> Bool {
        // Field by field: the subscript joins the values into a new string, a tenth of a held
        // token's answer under load.
        isMarked(values: head.headerFields.lazy.filter { $0.name == TokenAPI.requestHeader }.map(\.value))
    }

    /// True when `values`, those of every `Fleet-Token-Request` field of a request, are one: `true` (any case).
    static func isMarked(values: some Sequence<String>) -> Bool {
        var marked = false
        for value in values {
            guard !marked, LoopbackHost.equalsIgnoringASCIICase(value, "true") else { return false }
            marked = true
        }
        return marked
    }
}

/// What a request target must look like to be routed: origin form (`/path?query`), no empty,
/// `.` or `..` segment, no percent-encoded unreserved character, well-formed escapes. A pure rule.
package enum RequestTarget {
    /// A target in absolute form (`http://127.0.0.1:8080/v1/…`, RFC 9112 3.2.2) split into its
    /// authority, which then names the server instead of the Host header, and the rest in origin
    /// form (`/` when there is no path); nil for a target in any other form.
    ///
    /// HTTPTypes' conversion of an HTTP/1.1 request keeps the path of such a target and takes
    /// the authority from Host, so `GET http://rebind.attacker.example/v1/token/…` with a
    /// loopback Host passed the Host rule while naming another server.
    package static func absoluteForm(_ target: String) -> (authority: String, originForm: String)? {
        // Every request meets this: an origin-form target is told apart by its first byte.
        guard let first = target.utf8.first, first != UInt8(ascii: "/"), first != UInt8(ascii: "*"),
              let separator = target.range(of: "://") else { return nil }
        let scheme = target[..<separator.lowerBound]
        guard LoopbackHost.equalsIgnoringASCIICase(scheme, "http") || LoopbackHost.equalsIgnoringASCIICase(scheme, "https") else {
            return nil
        }
        let rest = target[separator.upperBound...]
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
        let path = rest[authorityEnd...]
        return (String(rest[..<authorityEnd]), path.first == "/" ? String(path) : "/" + path)
    }

    /// Why `target` (the path with its query, as received) is not in normal form, or nil.
    package static func problem(_ target: String) -> String? {
        // Every request meets this rule: one pass over the bytes, nothing allocated.
        if let answer = target.utf8.withContiguousStorageIfAvailable(problem(in:)) { return answer }
        return Array(target.utf8).withUnsafeBufferPointer(problem(in:))
    }

    /// The rule over the target's bytes: the path (up to `?`) is `/` or `/`-separated segments,
    /// each non-empty, not `.` or `..`, with well-formed escapes that encode only what needs it.
    /// The first segment with a problem names it.
    private static func problem(in bytes: UnsafeBufferPointer<UInt8>) -> String? {
        let end = bytes.firstIndex(of: UInt8(ascii: "?")) ?? bytes.endIndex
        guard end > 0, bytes[0] == UInt8(ascii: "/") else { return "is not a path (origin form)" }
        if end == 1 { return nil }
        var segmentStart = 1
        var index = 1
        while true {
            if index == end || bytes[index] == UInt8(ascii: "/") {
                let length = index - segmentStart
                if length == 0 { return "has an empty path segment" }
                if length <= 2, bytes[segmentStart..<index].allSatisfy({ $0 == UInt8(ascii: ".") }) { return "has a . or .. path segment" }
                if index == end { return nil }
                index += 1
                segmentStart = index
                continue
            }
            switch bytes[index] {
            case UInt8(ascii: "%"):
                // Two hex digits in the same segment (neither `/` nor `?` is a hex digit).
                guard index + 2 < end, let upper = hexValue(bytes[index + 1]), let lower = hexValue(bytes[index + 2]) else {
                    return "has a malformed percent escape"
                }
                if isUnreserved(upper << 4 | lower) { return "percent-encodes a character that needs no encoding" }
                index += 3
            case UInt8(ascii: "\\"):
                return "has a backslash"
            default:
                index += 1
            }
        }
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
