import Crypto
import Foundation
import Synchronization
import Hummingbird
import JWTKit
import NIOCore

/// Answers one token request: mints the JWT, shapes the sample provider's JSON, or plays the
/// requested fault.
struct TokenIssuing: Sendable {
    let keys: JWTKeyCollection
    let keyID: String
    let configuration: DevTokenIssuer.Configuration
    let counters: Counters

    /// Token field names of the Fleet Engine samples, per kind.
    static func tokenField(for kind: String) -> String? {
        switch kind {
        case "vehicle": "VEHICLE_TOKEN_KEY"
        case "trip": "TRIP_TOKEN_KEY"
        case "deliveryVehicle": "DELIVERY_VEHICLE_TOKEN_KEY"
        case "task": "TASK_TOKEN_KEY"
        default: nil
        }
    }

    static func fingerprint(_ data: Data) -> String {
        SHA256.hash(data: data).map { String(format: "%02x", $0) }.joined()
    }

    func answer(_ request: Request, context: some RequestContext) async throws -> Response {
        counters.requests.withLock { $0 += 1 }
        let kind = try context.parameters.require("kind")
        // Path parameters arrive percent-encoded; the token names the decoded subject id.
        let rawID = try context.parameters.require("id")
        let id = rawID.removingPercentEncoding ?? rawID
        guard let field = Self.tokenField(for: kind) else {
            return json(.notFound, #"{"error":"unknown kind \#(kind); use vehicle, trip, deliveryVehicle or task"}"#)
        }
        let query = request.uri.queryParameters
        let fault = query.get("fault").flatMap(DevTokenIssuer.Fault.init(rawValue:))
        let now = configuration.now()
        var issuedAt = now
        var lifetime = configuration.lifetime
        var subject = id
        switch fault {
        case .status:
            let code = Int(query.get("status") ?? "") ?? 500
            guard (100...599).contains(code) else {
                return json(.badRequest, #"{"error":"status must be between 100 and 599"}"#)
            }
            var headers: HTTPFields = [.contentType: "application/json"]
            if let retryAfter = query.get("retry_after") { headers[.retryAfter] = retryAfter }
            return Response(status: .init(code: code), headers: headers,
                            body: .init(byteBuffer: ByteBuffer(string: #"{"error":"simulated failure"}"#)))
        case .html:
            return Response(status: .ok, headers: [.contentType: "text/html"],
                            body: .init(byteBuffer: ByteBuffer(string: "<html><body>Sign in</body></html>")))
        case .hang:
            try await Task.sleep(for: .seconds(3600))
        case .slow:
            try await Task.sleep(for: .milliseconds(min(max(Int(query.get("delay_ms") ?? "") ?? 500, 0), 60_000)))
        case .hugeBody:
            let chunk = ByteBuffer(repeating: UInt8(ascii: " "), count: 64 * 1024)
            return Response(status: .ok, headers: [.contentType: "application/json"],
                            body: .init { writer in
                                for _ in 0..<64 { try await writer.write(chunk) }
                                try await writer.finish(nil)
                            })
        case .wrongSubject: subject = id + "-other"
        case .expired: issuedAt = now.addingTimeInterval(-lifetime - 60)
        case .tooLong: lifetime = 7200
        case .sameToken: issuedAt = Date(timeIntervalSince1970: (now.timeIntervalSince1970 / lifetime).rounded(.down) * lifetime)
        default: break
        }
        var token = try await mint(kind: kind, subject: subject, issuedAt: issuedAt, lifetime: lifetime)
        if fault == .badBase64 {
            let parts = token.split(separator: ".")
            token = "\(parts[0]).%%%not-base64%%%.\(parts[2])"
        }
        counters.noteIssued(kind: kind, subject: id, at: now, token: token)
        let expiry = issuedAt.addingTimeInterval(lifetime)
        var members: [String] = []
        if fault != .missingToken { members.append(#""\#(field)":"\#(token)""#) }
        if fault != .missingExpiration, let expiration = expirationValue(expiry, now: now, format: query.get("expiration_format")) {
            members.append(#""TOKEN_EXPIRATION":\#(expiration)"#)
        }
        let body = "{" + members.joined(separator: ",") + "}"
        if fault == .slowBody {
            let delay = Int(query.get("delay_ms") ?? "") ?? 500
            return Response(status: .ok, headers: [.contentType: "application/json"],
                            body: .init { writer in
                                for byte in body.utf8 {
                                    try await writer.write(ByteBuffer(bytes: [byte]))
                                    try await Task.sleep(for: .milliseconds(delay))
                                }
                                try await writer.finish(nil)
                            })
        }
        return json(.ok, body)
    }

    private func mint(kind: String, subject: String, issuedAt: Date, lifetime: TimeInterval) async throws -> String {
        var authorization = FleetEngineClaims.Authorization()
        switch kind {
        case "vehicle": authorization.vehicleid = subject
        case "trip": authorization.tripid = subject
        case "deliveryVehicle": authorization.deliveryvehicleid = subject
        default: authorization.taskid = subject
        }
        let claims = FleetEngineClaims(
            iss: .init(value: configuration.serviceAccount), sub: .init(value: configuration.serviceAccount),
            aud: .init(value: "https://fleetengine.googleapis.com/"),
            iat: .init(value: Date(timeIntervalSince1970: issuedAt.timeIntervalSince1970.rounded(.down))),
            exp: .init(value: Date(timeIntervalSince1970: issuedAt.addingTimeInterval(lifetime).timeIntervalSince1970.rounded(.down))),
            authorization: authorization)
        return try await keys.sign(claims, kid: JWKIdentifier(string: keyID))
    }

    /// `TOKEN_EXPIRATION` in the requested format (default: epoch seconds, as the Swift sample reads it).
    private func expirationValue(_ expiry: Date, now: Date, format: String?) -> String? {
        switch format ?? "epoch-seconds" {
        case "epoch-millis": String(Int64(expiry.timeIntervalSince1970.rounded(.down) * 1000))
        case "relative-seconds": String(Int64(expiry.timeIntervalSince(now).rounded(.down)))
        case "none": nil
        default: String(Int64(expiry.timeIntervalSince1970.rounded(.down)))
        }
    }

    private func json(_ status: HTTPResponse.Status, _ body: String) -> Response {
        Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: body)))
    }
}
