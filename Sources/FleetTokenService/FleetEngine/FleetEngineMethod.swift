// Service layer: Fleet Engine's methods, the table the proxy reads every call by: where each
// request names its resource, and the REST route of each. Pure values.

/// One Fleet Engine method: its gRPC path, where its request names the one resource it acts on
/// (or that it acts fleet-wide), and its REST route.
///
/// ``all`` is the table, read from Google's published API (`google-maps-fleetengine` and
/// `google-maps-fleetengine-delivery`): every unary method of `VehicleService`, `TripService` and
/// `DeliveryService`. A call to a method outside it is refused, never forwarded with a guess.
public struct FleetEngineMethod: Sendable, Hashable, CustomStringConvertible {
    /// A Fleet Engine gRPC service.
    public enum Service: String, Sendable, Hashable, CaseIterable {
        /// On-demand vehicles.
        case vehicles = "maps.fleetengine.v1.VehicleService"
        /// On-demand trips.
        case trips = "maps.fleetengine.v1.TripService"
        /// Last Mile Fleet Solution: delivery vehicles and tasks.
        case delivery = "maps.fleetengine.delivery.v1.DeliveryService"
    }

    /// What a method's request acts on.
    public enum Resource: Sendable, Hashable {
        /// One resource, named by the string at `fieldPath` of the request (field numbers, outer
        /// first: `[3]` for `GetVehicleRequest.name`, `[3, 1]` for `UpdateTaskRequest.task.name`),
        /// in `collection`; on REST, by the path.
        case named(fieldPath: [Int], collection: FleetEngineResourceName.Collection)
        /// No single resource: create, list, search, batch and server-only methods.
        case fleetWide
    }

    /// A method's REST route: `/v1/providers/{provider}/{collection}…`.
    public struct RESTRoute: Sendable, Hashable {
        /// What follows the provider in the path.
        public enum Form: Sendable, Hashable {
            /// `/{collection}/{id}`.
            case item
            /// `/{collection}/{id}:{verb}`.
            case itemVerb(String)
            /// `/{collection}`.
            case collection
            /// `/{collection}:{verb}`.
            case collectionVerb(String)
        }

        /// The HTTP method.
        public let httpMethod: String
        /// The collection in the path.
        public let collection: FleetEngineResourceName.Collection
        /// The path's form after the provider.
        public let form: Form
    }

    /// The service.
    public let service: Service
    /// The method's name, e.g. `GetVehicle`.
    public let name: String
    /// What the request acts on.
    public let resource: Resource
    /// The REST route.
    public let rest: RESTRoute

    /// The gRPC path, `/maps.fleetengine.v1.VehicleService/GetVehicle`.
    public var grpcPath: String { "/\(service.rawValue)/\(name)" }

    /// The method's name, e.g. `GetVehicle`.
    public var description: String { name }

    private init(_ service: Service, _ name: String, _ resource: Resource, _ httpMethod: String,
                 _ collection: FleetEngineResourceName.Collection, _ form: RESTRoute.Form) {
        self.service = service
        self.name = name
        self.resource = resource
        self.rest = RESTRoute(httpMethod: httpMethod, collection: collection, form: form)
    }

    /// The method with this gRPC path, or nil.
    public static func grpc(path: String) -> FleetEngineMethod? { byGRPCPath[path] }

    private static let byGRPCPath: [String: FleetEngineMethod] =
        Dictionary(uniqueKeysWithValues: all.map { ($0.grpcPath, $0) })

    /// Every method the proxy knows.
    public static let all: [FleetEngineMethod] = [
        .init(.vehicles, "CreateVehicle", .fleetWide, "POST", .vehicles, .collection),
        .init(.vehicles, "GetVehicle", .named(fieldPath: [3], collection: .vehicles), "GET", .vehicles, .item),
        .init(.vehicles, "UpdateVehicle", .named(fieldPath: [3], collection: .vehicles), "PUT", .vehicles, .item),
        .init(.vehicles, "UpdateVehicleAttributes", .named(fieldPath: [3], collection: .vehicles), "POST", .vehicles, .itemVerb("updateAttributes")),
        .init(.vehicles, "DeleteVehicle", .named(fieldPath: [2], collection: .vehicles), "DELETE", .vehicles, .item),
        .init(.vehicles, "ListVehicles", .fleetWide, "GET", .vehicles, .collection),
        .init(.vehicles, "SearchVehicles", .fleetWide, "POST", .vehicles, .collectionVerb("search")),

        .init(.trips, "CreateTrip", .fleetWide, "POST", .trips, .collection),
        .init(.trips, "GetTrip", .named(fieldPath: [3], collection: .trips), "GET", .trips, .item),
        .init(.trips, "UpdateTrip", .named(fieldPath: [3], collection: .trips), "PUT", .trips, .item),
        .init(.trips, "DeleteTrip", .named(fieldPath: [2], collection: .trips), "DELETE", .trips, .item),
        .init(.trips, "SearchTrips", .fleetWide, "POST", .trips, .collectionVerb("search")),
        .init(.trips, "ReportBillableTrip", .fleetWide, "POST", .billableTrips, .itemVerb("report")),

        .init(.delivery, "CreateDeliveryVehicle", .fleetWide, "POST", .deliveryVehicles, .collection),
        .init(.delivery, "GetDeliveryVehicle", .named(fieldPath: [3], collection: .deliveryVehicles), "GET", .deliveryVehicles, .item),
        .init(.delivery, "UpdateDeliveryVehicle", .named(fieldPath: [3, 1], collection: .deliveryVehicles), "PATCH", .deliveryVehicles, .item),
        .init(.delivery, "DeleteDeliveryVehicle", .named(fieldPath: [2], collection: .deliveryVehicles), "DELETE", .deliveryVehicles, .item),
        .init(.delivery, "ListDeliveryVehicles", .fleetWide, "GET", .deliveryVehicles, .collection),
        .init(.delivery, "CreateTask", .fleetWide, "POST", .tasks, .collection),
        .init(.delivery, "BatchCreateTasks", .fleetWide, "POST", .tasks, .collectionVerb("batchCreate")),
        .init(.delivery, "GetTask", .named(fieldPath: [3], collection: .tasks), "GET", .tasks, .item),
        .init(.delivery, "UpdateTask", .named(fieldPath: [3, 1], collection: .tasks), "PATCH", .tasks, .item),
        .init(.delivery, "DeleteTask", .named(fieldPath: [2], collection: .tasks), "DELETE", .tasks, .item),
        .init(.delivery, "ListTasks", .fleetWide, "GET", .tasks, .collection),
        .init(.delivery, "GetTaskTrackingInfo", .named(fieldPath: [3], collection: .taskTrackingInfo), "GET", .taskTrackingInfo, .item),
    ]
}
