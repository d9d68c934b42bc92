// The Fleet Engine proxy's rules, as pure functions of what a caller sent and what Fleet Engine
// answered: which requests are refused before anything else, which headers go on, how a unary
// gRPC request's message is framed, and which answers reject the token.

import FleetTokenService
package import NIOCore

/// The kind of listener a call arrived on: the Host and Origin rules apply to TCP only (a
/// browser reaches loopback TCP, never a Unix socket).
package enum ProxyTransport: Sendable, Equatable {
    /// A Unix domain socket.
    case unix
    /// A TCP listener on `host` (as given to `--fleet-engine-listen`).
    case tcp(host: String)
}

/// What a caller's request must be to be forwarded at all, and what of it is forwarded.
package enum ProxyRequestRules {
    /// The largest request body read: 16 MiB (a batch of tasks is far smaller).
    package static let maxBodyBytes = 16 * 1024 * 1024

    /// Headers that describe one hop (RFC 9110 §7.6.1, and HTTP/2's rules), the caller's
    /// credentials, and ours: never forwarded as they came.
    static let notForwarded: Set<String> = [
        "authorization", "host", "connection", "keep-alive", "proxy-connection", "proxy-authorization",
        "proxy-authenticate", "transfer-encoding", "upgrade", "te", "trailer", "content-length",
        "http2-settings", "fleet-token-request", "expect",
    ]

    /// Why `request` is refused before its method is read, or nil.
    package static func refusal(_ request: ProxyRequest, transport: ProxyTransport) -> ProxyRefusal? {
        if request.headers.contains(where: { $0.name == "forwarded" || $0.name.hasPrefix("x-forwarded-") }) {
            return .forbidden("requests that went through another proxy (Forwarded or X-Forwarded-* present) are refused")
        }
        // RFC 9112 (3.2): a request with two Host headers is refused; which one names the
        // listener is unclear.
        if request.headers.lazy.filter({ $0.name == "host" }).count > 1 {
            return ProxyRefusal(grpcStatus: 3, httpStatus: 400, message: "token-agent's Fleet Engine proxy refused the call: it has more than one Host header")
        }
        if case .tcp(let listenHost) = transport {
            // A page from a name an attacker's DNS points at 127.0.0.1 is same-origin with the
            // listener: its Host still names the attacker's host, and a page always sends
            // Origin on such a request. Local programs send neither.
            guard let authority = request.authority, LoopbackHost.isAllowedHostHeader(authority, listenHost: listenHost) else {
                return ProxyRefusal(grpcStatus: 7, httpStatus: 421, message:
                    "token-agent's Fleet Engine proxy refused the call: the Host (or :authority) must name this listener (localhost, a loopback address); other host names are refused as DNS rebinding")
            }
            if request.header("origin") != nil {
                return .forbidden("requests from web pages (with an Origin header) are refused")
            }
        }
        // An HTML form or a server-side request forgery cannot add either header; Google's
        // clients always send x-goog-api-client.
        if request.wire == .rest && request.header("x-goog-api-client") == nil
            && request.header("fleet-token-request")?.lowercased() != "true" {
            return .forbidden("a REST call must carry x-goog-api-client (Google's clients send it) or Fleet-Token-Request: true")
        }
        return nil
    }

    /// The headers sent to Fleet Engine: the caller's, less those of ``notForwarded`` and those
    /// its `Connection` header names (hop-by-hop by the caller's word, RFC 9110 §7.6.1), plus
    /// `te: trailers` on gRPC (HTTP/2 allows no other `te`). A caller's `grpc-timeout` goes on
    /// as the time `remaining` (what a wait for the token, or a first attempt, left of it), in
    /// milliseconds, at least one. The token is added by the sender.
    package static func upstreamHeaders(_ request: ProxyRequest, remaining: TimeAmount? = nil) -> [(name: String, value: String)] {
        let named = Set(request.headers.filter { $0.name == "connection" }.flatMap { field in
            // A field name holds no white space: what is around a name is all there is to drop.
            field.value.split(separator: ",").map { String($0.filter { $0 != " " && $0 != "\t" }).lowercased() }
        })
        var headers = request.headers.filter { !notForwarded.contains($0.name) && !named.contains($0.name) }
        if let remaining, let index = headers.firstIndex(where: { $0.name == "grpc-timeout" }) {
            headers[index].value = "\(max(1, remaining.nanoseconds / 1_000_000))m"
        }
        if request.wire == .grpc { headers.append(("te", "trailers")) }
        return headers
    }

    /// The headers of Fleet Engine's answer that go back to the caller (the writer sets the
    /// length and connection handling of its own hop).
    package static func callerHeaders(_ headers: [(name: String, value: String)]) -> [(name: String, value: String)] {
        headers.filter { !notForwarded.contains($0.name) }
    }
}

/// gRPC's length-prefixed framing of a unary request: one message, uncompressed.
package enum GRPCUnaryFrame {
    /// The message in `body`: a flag byte (0: not compressed), a 4-byte big-endian length and
    /// that many bytes, exactly once.
    /// - Throws: ``ProxyRefusal`` for a compressed message (`UNIMPLEMENTED`), a frame that is cut
    ///   short or followed by another message (`INVALID_ARGUMENT`: every Fleet Engine method is
    ///   unary).
    package static func message(in body: ByteBuffer) throws(ProxyRefusal) -> [UInt8] {
        var body = body
        guard let flag = body.readInteger(as: UInt8.self), let length = body.readInteger(endianness: .big, as: UInt32.self) else {
            throw .badRequest("the gRPC request carries no whole message")
        }
        guard flag == 0 else {
            throw ProxyRefusal(grpcStatus: 12, httpStatus: 415, message:
                "token-agent's Fleet Engine proxy refused the call: compressed request messages are not read; call without compression")
        }
        guard let message = body.readBytes(length: Int(length)) else {
            throw .badRequest("the gRPC request message is cut short")
        }
        guard body.readableBytes == 0 else {
            throw .badRequest("more than one request message: Fleet Engine's methods are unary, streaming calls are not proxied")
        }
        return message
    }
}

/// Which answers from Fleet Engine reject the token put on a call (and only those): the only
/// answers after which the proxy fetches a new token and sends the call once more.
package enum TokenRejection {
    /// True for `UNAUTHENTICATED` (16) and `PERMISSION_DENIED` (7) on gRPC (a gRPC answer
    /// without `grpc-status` has the code its HTTP status maps to: 401 and 403 are these two), 401
    /// and 403 on REST. Fleet Engine applies nothing when it refuses a call for its token.
    package static func rejectsToken(_ response: ProxyResponse, wire: ProxyWire) -> Bool {
        switch wire {
        case .grpc: response.effectiveGRPCStatus == 16 || response.effectiveGRPCStatus == 7
        case .rest: response.status == 401 || response.status == 403
        }
    }
}
