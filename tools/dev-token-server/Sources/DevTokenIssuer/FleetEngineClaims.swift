import Foundation
import JWTKit

/// The claims of a Fleet Engine token, as Google's auth library mints them: the service
/// account as `iss` and `sub`, the Fleet Engine audience, `iat`/`exp`, and the private
/// `authorization` claim naming the one subject the token may act on.
struct FleetEngineClaims: JWTPayload {
    struct Authorization: Codable, Sendable {
        var vehicleid: String?
        var tripid: String?
        var deliveryvehicleid: String?
        var taskid: String?
    }

    var iss: IssuerClaim
    var sub: SubjectClaim
    var aud: AudienceClaim
    var iat: IssuedAtClaim
    var exp: ExpirationClaim
    var authorization: Authorization

    /// The issuer signs; it never verifies its own tokens.
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}
