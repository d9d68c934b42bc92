// Service layer: whose token goes on a Fleet Engine call, the resource → subject rule. Pure.

public import FleetTokenStore

/// Decides whose token the proxy puts on a Fleet Engine call.
///
/// A call that names one vehicle, trip, delivery vehicle or task gets that subject's token
/// (`providers/p/vehicles/truck-7` → `vehicle:truck-7`). A call that names no single resource
/// (create, list, search, batch, a billable trip) or one that no token kind covers (a tracking
/// id) gets the ``defaultSubject``'s token when one is set (a subject whose token the
/// customer's server mints for fleet-wide calls, e.g. with `"vehicleid": "*"`), and is refused
/// with `PERMISSION_DENIED` naming the method otherwise. Whether the caller may use that
/// subject is the edge's access rule, decided after this one.
public struct FleetEngineSubjectRule: Sendable, Equatable {
    /// The subject for fleet-wide calls (`--fleet-engine-default-subject KIND:ID`), or nil.
    public let defaultSubject: TokenKey?

    /// A rule, with or without a subject for fleet-wide calls.
    public init(defaultSubject: TokenKey? = nil) {
        self.defaultSubject = defaultSubject
    }

    /// The subject whose token goes on `call`.
    /// - Throws: ``FleetEngineCallRefusal`` (`noSubject`) for a fleet-wide call without a default
    ///   subject, (`invalidSubjectID`) for an id the store does not accept.
    public func subject(for call: FleetEngineCall) throws(FleetEngineCallRefusal) -> TokenKey {
        guard let resource = call.resource, let kind = resource.collection.tokenKind else {
            if let defaultSubject { return defaultSubject }
            let what = call.resource.map { "\($0.collection.rawValue), which no token kind covers" } ?? "no single vehicle, trip or task"
            throw FleetEngineCallRefusal(.noSubject, method: call.method.name, detail:
                "the method acts on \(what); set --fleet-engine-default-subject KIND:ID to a subject whose token your server mints for fleet-wide calls")
        }
        do {
            return try TokenKey(kind: kind, subjectID: resource.id)
        } catch {
            throw FleetEngineCallRefusal(.invalidSubjectID, method: call.method.name, detail: "\(error)")
        }
    }
}
