// The Fleet Engine proxy's view of one call, whichever wire it came over: the caller's request
// (gRPC or REST, HTTP/2 or HTTP/1.1) and the answer it gets. Plain values.

package import NIOCore

/// How a call is framed: gRPC (HTTP/2, `application/grpc`, status in trailers) or REST (JSON
/// over HTTP/1.1 or HTTP/2, status in the HTTP status).
package enum ProxyWire: String, Sendable, Equatable {
    /// gRPC.
    case grpc
    /// REST.
    case rest
}

/// One call as the caller sent it: header names in lower case, the whole body.
package struct ProxyRequest: Sendable {
    /// How the call is framed.
    package var wire: ProxyWire
    /// The HTTP method (`POST` for every gRPC call).
    package var method: String
    /// The request target: the path and query.
    package var target: String
    /// The authority the caller named (`Host`, or `:authority` on HTTP/2); nil when none.
    package var authority: String?
    /// The header fields, names in lower case, in order; no pseudo-headers.
    package var headers: [(name: String, value: String)]
    /// The body.
    package var body: ByteBuffer
    /// The body's bytes in the proxy's budget, given back when the last copy of the request
    /// goes (its call answered).
    package var reservation: BodyReservation?

    package init(wire: ProxyWire, method: String, target: String, authority: String?,
                 headers: [(name: String, value: String)], body: ByteBuffer, reservation: BodyReservation? = nil) {
        self.reservation = reservation
        self.wire = wire
        self.method = method
        self.target = target
        self.authority = authority
        self.headers = headers
        self.body = body
    }

    /// The first value of header `name` (lower case), or nil.
    package func header(_ name: String) -> String? {
        headers.first { $0.name == name }?.value
    }
}

/// The answer a caller gets: from Fleet Engine, or from the proxy refusing the call.
package struct ProxyResponse: Sendable {
    /// The HTTP status (200 for every gRPC answer but a transport failure).
    package var status: Int
    /// The header fields, names in lower case; no pseudo-headers.
    package var headers: [(name: String, value: String)]
    /// The body.
    package var body: ByteBuffer
    /// The trailers (gRPC's status); nil when none came.
    package var trailers: [(name: String, value: String)]?

    package init(status: Int, headers: [(name: String, value: String)], body: ByteBuffer,
                 trailers: [(name: String, value: String)]? = nil) {
        self.status = status
        self.headers = headers
        self.body = body
        self.trailers = trailers
    }

    /// The gRPC status code: from the trailers, or from the headers of a trailers-only answer;
    /// nil when the answer carries none.
    package var grpcStatus: Int? {
        let field = trailers?.first { $0.name == "grpc-status" } ?? headers.first { $0.name == "grpc-status" }
        return field.flatMap { Int($0.value) }
    }

    /// The gRPC status a client reads from this answer: ``grpcStatus``, or without one the code
    /// gRPC maps its HTTP status to (400 `INTERNAL`, 401 `UNAUTHENTICATED`, 403
    /// `PERMISSION_DENIED`, 404 `UNIMPLEMENTED`, 429, 502, 503, 504 `UNAVAILABLE`, else `UNKNOWN`).
    package var effectiveGRPCStatus: Int {
        if let grpcStatus { return grpcStatus }
        switch status {
        case 400: return 13
        case 401: return 16
        case 403: return 7
        case 404: return 12
        case 429, 502, 503, 504: return 14
        default: return 2
        }
    }
}
