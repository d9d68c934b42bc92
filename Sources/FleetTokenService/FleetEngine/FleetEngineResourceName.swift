// Service layer: a Fleet Engine resource name (`providers/p/vehicles/truck-7`) and the token
// kind whose subject it names. Pure.

public import FleetTokenStore

/// The name of one Fleet Engine resource: `providers/{provider}/{collection}/{id}`.
///
/// Parsed strictly: exactly four `/`-separated segments, the first `providers`, none empty.
/// Fleet Engine refuses anything else, and a name the proxy read differently from Fleet Engine
/// could put one vehicle's token on another's call.
public struct FleetEngineResourceName: Sendable, Hashable, CustomStringConvertible {
    /// The collections a Fleet Engine resource name can name.
    public enum Collection: String, Sendable, Hashable, CaseIterable {
        /// On-demand vehicles (`VehicleService`).
        case vehicles
        /// On-demand trips (`TripService`).
        case trips
        /// Billable trips (`ReportBillableTrip`, a server-only method).
        case billableTrips
        /// Delivery vehicles (`DeliveryService`).
        case deliveryVehicles
        /// Scheduled tasks (`DeliveryService`).
        case tasks
        /// Task tracking information, named by a tracking id (`DeliveryService`).
        case taskTrackingInfo

        /// The token kind whose subject a resource of this collection is, or nil when no kind
        /// of the store's covers it (billable trips, tracking ids).
        public var tokenKind: TokenKind? {
            switch self {
            case .vehicles: .vehicle
            case .trips: .trip
            case .deliveryVehicles: .deliveryVehicle
            case .tasks: .task
            case .billableTrips, .taskTrackingInfo: nil
            }
        }
    }

    /// The provider (the Google Cloud project id) the resource belongs to.
    public let provider: String
    /// The collection.
    public let collection: Collection
    /// The resource's id within the collection: a vehicle id, a trip id, a task id.
    public let id: String

    /// Parses `providers/{provider}/{collection}/{id}`; nil for anything else.
    public init?(parsing name: String) {
        let segments = name.split(separator: "/", omittingEmptySubsequences: false)
        guard segments.count == 4, segments[0] == "providers",
              !segments[1].isEmpty, !segments[3].isEmpty,
              let collection = Collection(rawValue: String(segments[2])) else { return nil }
        self.init(provider: String(segments[1]), collection: collection, id: String(segments[3]))
    }

    /// A name from its parts (not checked).
    public init(provider: String, collection: Collection, id: String) {
        self.provider = provider
        self.collection = collection
        self.id = id
    }

    /// `providers/{provider}/{collection}/{id}`.
    public var description: String { "providers/\(provider)/\(collection.rawValue)/\(id)" }
}
