// Service layer: one Fleet Engine call as the proxy reads it, gRPC (path and request message)
// or REST (method and path): the method and the resource it names. Pure.

import Foundation

/// A Fleet Engine call, read from what the caller sent: which method, and the resource it acts
/// on when the method names one.
public struct FleetEngineCall: Sendable, Hashable {
    /// The method called.
    public let method: FleetEngineMethod
    /// The resource named by the call; nil for a fleet-wide method.
    public let resource: FleetEngineResourceName?

    /// A call from its parts.
    public init(method: FleetEngineMethod, resource: FleetEngineResourceName?) {
        self.method = method
        self.resource = resource
    }

    /// Reads a gRPC call: the method from its path, the resource from the request message (the
    /// bytes inside gRPC's frame, uncompressed).
    /// - Throws: ``FleetEngineCallRefusal`` for a method outside the table, a message that is not
    ///   well-formed, a resource name missing, malformed, or of another collection than the
    ///   method's.
    public init(grpcPath path: String, message: [UInt8]) throws(FleetEngineCallRefusal) {
        guard let method = FleetEngineMethod.grpc(path: path) else {
            throw .unknownGRPCMethod(path)
        }
        guard case .named(let fieldPath, let collection) = method.resource else {
            self.init(method: method, resource: nil)
            return
        }
        let text: String?
        do {
            text = try ProtobufFieldReader(message: message).string(atPath: fieldPath)
        } catch {
            throw FleetEngineCallRefusal(.malformedRequest, method: method.name, detail: "the request message cannot be read: \(error)")
        }
        guard let text, !text.isEmpty else {
            throw FleetEngineCallRefusal(.missingResourceName, method: method.name, detail: "the request names no \(collection.rawValue) resource")
        }
        try self.init(method: method, resourceName: text, expected: collection)
    }

    /// Reads a REST call: the method from the HTTP method and path (`/v1/providers/…`), the
    /// resource from the path. The query, if any, is ignored.
    /// - Throws: ``FleetEngineCallRefusal`` for a route outside the table, a path segment that
    ///   does not percent-decode, or a bad resource name.
    public init(httpMethod: String, target: String) throws(FleetEngineCallRefusal) {
        let path = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
        let routeText = "\(httpMethod) \(path)"
        let raw = path.split(separator: "/", omittingEmptySubsequences: false)
        // "", "v1", "providers", provider, collection[:verb], [id[:verb]]
        guard raw.count == 5 || raw.count == 6, raw[0].isEmpty, raw[1] == "v1", raw[2] == "providers" else {
            throw FleetEngineCallRefusal(.unknownMethod, method: routeText, detail: "not a Fleet Engine route the proxy knows")
        }
        var segments: [String] = []
        for segment in raw.dropFirst(3) {
            // A segment must decode to itself without a `/`: `%2F` would move the resource.
            guard let decoded = segment.removingPercentEncoding, !decoded.contains("/") else {
                throw FleetEngineCallRefusal(.malformedRequest, method: routeText, detail: "a path segment does not percent-decode to one segment")
            }
            segments.append(decoded)
        }
        let provider = segments[0]
        let (collectionText, collectionVerb) = Self.splitVerb(segments[1])
        var id: String?
        var form: FleetEngineMethod.RESTRoute.Form
        if segments.count == 3 {
            guard collectionVerb == nil else {
                throw FleetEngineCallRefusal(.unknownMethod, method: routeText, detail: "not a Fleet Engine route the proxy knows")
            }
            let (idText, verb) = Self.splitVerb(segments[2])
            id = idText
            form = verb.map { .itemVerb($0) } ?? .item
        } else {
            form = collectionVerb.map { .collectionVerb($0) } ?? .collection
        }
        guard let collection = FleetEngineResourceName.Collection(rawValue: collectionText),
              let method = FleetEngineMethod.all.first(where: {
                  $0.rest.httpMethod == httpMethod && $0.rest.collection == collection && $0.rest.form == form
              }) else {
            throw FleetEngineCallRefusal(.unknownMethod, method: routeText, detail: "not a Fleet Engine route the proxy knows")
        }
        guard case .named(_, let expected) = method.resource else {
            self.init(method: method, resource: nil)
            return
        }
        guard let id, !provider.isEmpty else {
            throw FleetEngineCallRefusal(.missingResourceName, method: method.name, detail: "the path names no \(expected.rawValue) resource")
        }
        try self.init(method: method, resourceName: "providers/\(provider)/\(collection.rawValue)/\(id)", expected: expected)
    }

    private init(method: FleetEngineMethod, resourceName text: String, expected: FleetEngineResourceName.Collection) throws(FleetEngineCallRefusal) {
        guard let name = FleetEngineResourceName(parsing: text) else {
            throw FleetEngineCallRefusal(.malformedRequest, method: method.name, detail: "\"\(text)\" is not providers/{provider}/\(expected.rawValue)/{id}")
        }
        guard name.collection == expected else {
            throw FleetEngineCallRefusal(.malformedRequest, method: method.name, detail: "\(method.name) acts on \(expected.rawValue), not \(name.collection.rawValue)")
        }
        self.init(method: method, resource: name)
    }

    /// `tasks:batchCreate` → (`tasks`, `batchCreate`); `truck-7` → (`truck-7`, nil).
    private static func splitVerb(_ segment: String) -> (String, String?) {
        guard let colon = segment.lastIndex(of: ":") else { return (segment, nil) }
        return (String(segment[..<colon]), String(segment[segment.index(after: colon)...]))
    }
}
