// Service layer: the rules every request to the local token API meets, and its access log.

import Foundation
import HTTPTypes
import Hummingbird
import Logging

/// The rules every request meets, and the access log (kind, id, status, fingerprint, latency;
/// never a token).
struct TokenAPIAccessRules: RouterMiddleware {
    typealias Context = BasicRequestContext
    let logger: Logger

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let started = ContinuousClock.now
        let response: Response
        if request.headers[.init("X-Forwarded-For")!] != nil || request.headers[.init("Forwarded")!] != nil {
            response = TokenAPI.json(.forbidden, ["error": "requests through a proxy are refused (X-Forwarded-For or Forwarded present)"])
        } else if request.uri.path.hasPrefix("/v1/"), request.headers[TokenAPI.requestHeader]?.lowercased() != "true" {
            response = TokenAPI.json(.forbidden, ["error": "add the header Fleet-Token-Request: true"])
        } else {
            do {
                response = try await next(request, context)
            } catch let error as HTTPError {
                response = TokenAPI.json(error.status, ["error": error.body ?? error.status.reasonPhrase])
            }
        }
        // Built only when the log level lets it through (the metadata is an autoclosure).
        logger.info("token API request", metadata: Self.metadata(request, response, since: started))
        return response
    }

    static func metadata(_ request: Request, _ response: Response, since started: ContinuousClock.Instant) -> Logger.Metadata {
        var metadata: Logger.Metadata = [
            "method": "\(request.method)", "path": "\(request.uri.path)", "status": "\(response.status.code)",
            "latency_ms": "\(milliseconds(ContinuousClock.now - started))",
        ]
        if let fingerprint = response.headers[TokenAPI.fingerprintHeader] { metadata["fingerprint"] = "\(fingerprint)" }
        return metadata
    }

    static func milliseconds(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        return String(format: "%.2f", Double(seconds) * 1000 + Double(attoseconds) / 1e15)
    }
}
