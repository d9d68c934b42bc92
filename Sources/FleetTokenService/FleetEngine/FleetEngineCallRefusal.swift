// Service layer: why the Fleet Engine proxy refuses a call before it reaches Fleet Engine, with
// the gRPC status and HTTP status the caller gets. Pure.

/// A call the proxy refuses itself: a method it does not know, a request it cannot read, or a
/// fleet-wide method with no subject configured for it.
///
/// The message names the method and what to do; it never holds a token (there is none yet).
public struct FleetEngineCallRefusal: Error, Sendable, Equatable, CustomStringConvertible {
    /// Why the call is refused.
    public enum Reason: String, Sendable, Equatable {
        /// Not a method (gRPC path or REST route) of Fleet Engine's that the proxy knows.
        case unknownMethod
        /// The request message or path cannot be read, or names a resource of another
        /// collection than the method's.
        case malformedRequest
        /// The method acts on one resource, and the request names none.
        case missingResourceName
        /// The method acts on no single resource (create, list, search, batch) or on one no
        /// token kind covers, and no `--fleet-engine-default-subject` is set.
        case noSubject
        /// The resource's id is not one the store accepts as a subject id.
        case invalidSubjectID
    }

    /// Why.
    public let reason: Reason
    /// The method (`GetVehicle`), or the gRPC path or REST route when it is not one.
    public let method: String
    /// What was wrong, for the caller.
    public let detail: String

    /// A refusal.
    public init(_ reason: Reason, method: String, detail: String) {
        self.reason = reason
        self.method = method
        self.detail = detail
    }

    /// The refusal of the gRPC `path`, a method the proxy does not know.
    public static func unknownGRPCMethod(_ path: String) -> FleetEngineCallRefusal {
        FleetEngineCallRefusal(.unknownMethod, method: path, detail: "not a Fleet Engine method the proxy knows")
    }

    /// The gRPC status code the caller gets: `UNIMPLEMENTED` (12) for an unknown method,
    /// `PERMISSION_DENIED` (7) when no subject's token may be put on the call, and
    /// `INVALID_ARGUMENT` (3) for a request that cannot be read.
    public var grpcStatus: Int {
        switch reason {
        case .unknownMethod: 12
        case .noSubject: 7
        case .malformedRequest, .missingResourceName, .invalidSubjectID: 3
        }
    }

    /// The HTTP status a REST caller gets: 404, 403 or 400, as ``grpcStatus``.
    public var httpStatus: Int {
        switch reason {
        case .unknownMethod: 404
        case .noSubject: 403
        case .malformedRequest, .missingResourceName, .invalidSubjectID: 400
        }
    }

    /// `token-agent's Fleet Engine proxy refused GetVehicle: …`.
    public var description: String { "token-agent's Fleet Engine proxy refused \(method): \(detail)" }
}
