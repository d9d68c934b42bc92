// Why the proxy answers a call itself instead of Fleet Engine, and that answer in each wire's
// terms: a gRPC trailers-only answer, or Google's JSON error shape for REST. Pure.

package import FleetTokenService
import NIOCore

/// A call the proxy answers itself: refused by a rule, or no token to put on it.
///
/// Its message says what was wrong and what to do, and never holds a token.
package struct ProxyRefusal: Error, Sendable, Equatable, CustomStringConvertible {
    /// The gRPC status code (7 `PERMISSION_DENIED`, 3 `INVALID_ARGUMENT`, …).
    package let grpcStatus: Int
    /// The HTTP status a REST caller gets.
    package let httpStatus: Int
    /// What was wrong and what to do.
    package let message: String
    /// Seconds to wait before retrying, for a REST caller's `Retry-After`; nil when not said.
    package let retryAfter: Int?

    package init(grpcStatus: Int, httpStatus: Int, message: String, retryAfter: Int? = nil) {
        self.grpcStatus = grpcStatus
        self.httpStatus = httpStatus
        self.message = message
        self.retryAfter = retryAfter
    }

    package init(_ refusal: FleetEngineCallRefusal) {
        self.init(grpcStatus: refusal.grpcStatus, httpStatus: refusal.httpStatus, message: refusal.description)
    }

    package var description: String { message }

    /// A forbidden call: `PERMISSION_DENIED` / 403.
    package static func forbidden(_ message: String) -> ProxyRefusal {
        ProxyRefusal(grpcStatus: 7, httpStatus: 403, message: "token-agent's Fleet Engine proxy refused the call: \(message)")
    }

    /// A request the proxy cannot read: `INVALID_ARGUMENT` / 400.
    /// The request bodies the proxy holds at once would pass its budget (many large calls at
    /// once, or a process sending bodies it never ends).
    static func bodyBudgetSpent(_ budget: RequestBodyBudget) -> ProxyRefusal {
        ProxyRefusal(grpcStatus: 8, httpStatus: 503, message:
            "token-agent's Fleet Engine proxy refused the call: the request bodies it holds at once would pass \(budget.limit) bytes; retry shortly",
                     retryAfter: 1)
    }

    package static func badRequest(_ message: String) -> ProxyRefusal {
        ProxyRefusal(grpcStatus: 3, httpStatus: 400, message: "token-agent's Fleet Engine proxy refused the call: \(message)")
    }

    /// gRPC's canonical name of a status code, as Google's REST errors spell it.
    static func statusName(_ code: Int) -> String {
        let names = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                     "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                     "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"]
        return names.indices.contains(code) ? names[code] : "UNKNOWN"
    }

    /// The answer for a caller on `wire`.
    package func response(for wire: ProxyWire) -> ProxyResponse {
        switch wire {
        case .grpc:
            // Trailers-only: the status in the one HEADERS frame, as gRPC allows for an error.
            return ProxyResponse(status: 200, headers: [
                ("content-type", "application/grpc"), ("grpc-status", "\(grpcStatus)"),
                ("grpc-message", GRPCStatusMessage.encode(message)),
            ], body: ByteBuffer())
        case .rest:
            // Google's error shape, which Google's REST clients turn into their exceptions.
            let body = "{\"error\":{\"code\":\(httpStatus),\"message\":\(JSONText.quoted(message)),\"status\":\"\(Self.statusName(grpcStatus))\"}}"
            var headers: [(name: String, value: String)] = [("content-type", "application/json; charset=UTF-8")]
            if let retryAfter { headers.append(("retry-after", "\(retryAfter)")) }
            return ProxyResponse(status: httpStatus, headers: headers, body: ByteBuffer(string: body))
        }
    }
}

/// gRPC's `grpc-message`: percent-encoded UTF-8, every byte outside printable ASCII and `%`.
enum GRPCStatusMessage {
    static func encode(_ message: String) -> String {
        var encoded = ""
        for byte in message.utf8 {
            if byte >= 0x20 && byte <= 0x7E && byte != UInt8(ascii: "%") {
                encoded.unicodeScalars.append(Unicode.Scalar(byte))
            } else {
                encoded += "%" + String(byte, radix: 16, uppercase: true).leftPadded(to: 2)
            }
        }
        return encoded
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
