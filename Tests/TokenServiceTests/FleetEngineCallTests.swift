@testable import FleetTokenService
import FleetTokenStore
import Foundation
import Testing

/// Protobuf wire format written by hand: the tests' own encoder, checked against bytes Google's
/// Python client serialized (`realClientBytes`).
private enum Wire {
    static func varint(_ value: UInt64) -> [UInt8] {
        var value = value
        var out: [UInt8] = []
        while value >= 0x80 {
            out.append(UInt8(value & 0x7f) | 0x80)
            value >>= 7
        }
        return out + [UInt8(value)]
    }

    static func bytes(_ field: Int, _ payload: [UInt8]) -> [UInt8] {
        varint(UInt64(field << 3 | 2)) + varint(UInt64(payload.count)) + payload
    }

    static func string(_ field: Int, _ text: String) -> [UInt8] { bytes(field, Array(text.utf8)) }
    static func number(_ field: Int, _ value: UInt64) -> [UInt8] { varint(UInt64(field << 3)) + varint(value) }
    static func fixed64(_ field: Int) -> [UInt8] { varint(UInt64(field << 3 | 1)) + [1, 2, 3, 4, 5, 6, 7, 8] }
    static func fixed32(_ field: Int) -> [UInt8] { varint(UInt64(field << 3 | 5)) + [1, 2, 3, 4] }
}

private func hex(_ text: String) -> [UInt8] {
    var out: [UInt8] = []
    var index = text.startIndex
    while index < text.endIndex {
        let next = text.index(index, offsetBy: 2)
        out.append(UInt8(text[index..<next], radix: 16)!)
        index = next
    }
    return out
}

private func call(_ method: String, _ message: [UInt8]) throws(FleetEngineCallRefusal) -> FleetEngineCall {
    try FleetEngineCall(grpcPath: method, message: message)
}

@Suite("Fleet Engine calls: method table, resource names, subjects (pure)", .paced)
struct FleetEngineCallTests {
    static let vehicles = "/maps.fleetengine.v1.VehicleService/"
    static let trips = "/maps.fleetengine.v1.TripService/"
    static let delivery = "/maps.fleetengine.delivery.v1.DeliveryService/"

    @Test("requests Google's Python client serialized name their resource (header, varints, doubles, nested messages around it)", arguments: [
        // GetVehicleRequest: a full RequestHeader (strings, enums, an int32) before name = 3.
        (vehicles + "GetVehicle", "0a2d0a05656e2d5553120255531a03312e302201782a016430023a016d42016e4801520461636d65582162036162631a1e70726f7669646572732f702d312f76656869636c65732f747275636b2d37", "vehicle/truck-7"),
        // UpdateTaskRequest: task = 3 holding name = 1, enums, a Duration; an update mask after.
        (delivery + "UpdateTask", "0a040a02656e1a2c0a1b70726f7669646572732f702d312f7461736b732f7461736b2d343210021801220574726b2d393a020878220e0a0c7461736b5f6f7574636f6d65", "task/task-42"),
        // UpdateDeliveryVehicleRequest: delivery_vehicle = 3 with a location of doubles.
        (delivery + "UpdateDeliveryVehicle", "1a3c0a2470726f7669646572732f702d312f64656c697665727956656869636c65732f76616e2d3312140a12090000000000404a4011cdcccccccccc2a40220f0a0d6c6173745f6c6f636174696f6e", "deliveryVehicle/van-3"),
    ])
    func realClientBytes(method: String, bytes: String, subject: String) throws {
        let read = try call(method, hex(bytes))
        #expect(try FleetEngineSubjectRule().subject(for: read).description == subject)
        #expect(read.resource?.provider == "p-1")
    }

    @Test("the tests' encoder writes what Google's client writes")
    func encoderMatchesRealBytes() {
        let create = Wire.string(3, "providers/p-1") + Wire.string(4, "truck-8")
            + Wire.bytes(5, Wire.string(1, "providers/p-1/vehicles/truck-8"))
        #expect(create == hex("1a0d70726f7669646572732f702d312207747275636b2d382a200a1e70726f7669646572732f702d312f76656869636c65732f747275636b2d38"))
    }

    @Test("every method of the table: its resource field and collection give the subject", arguments: FleetEngineMethod.all)
    func everyMethod(method: FleetEngineMethod) throws {
        guard case .named(let path, let collection) = method.resource else {
            let read = try call(method.grpcPath, Wire.string(3, "providers/p-1"))
            #expect(read.resource == nil)
            return
        }
        let name = "providers/p-1/\(collection.rawValue)/id-\(method.name)"
        // Fields before and after the name, of every wire type, are skipped.
        let inner = Wire.number(17, 7) + Wire.string(path.last!, name) + Wire.fixed32(9)
        var message = Wire.bytes(1, Wire.string(1, "en")) + Wire.fixed64(15)
        message += path.count == 1 ? inner : Wire.bytes(path[0], inner)
        message += Wire.number(19, 1)
        let read = try call(method.grpcPath, message)
        #expect(read.resource == FleetEngineResourceName(provider: "p-1", collection: collection, id: "id-\(method.name)"))
        if let kind = collection.tokenKind {
            #expect(try FleetEngineSubjectRule().subject(for: read) == TokenKey(kind: kind, subjectID: "id-\(method.name)"))
        }
    }

    @Test("protobuf's rules: the last name wins, repeated message fields merge, so the proxy reads what Fleet Engine reads")
    func lastOccurrenceWins() throws {
        let twice = Wire.string(3, "providers/p/vehicles/first") + Wire.string(3, "providers/p/vehicles/second")
        #expect(try call(Self.vehicles + "GetVehicle", twice).resource?.id == "second")
        // Two `task` messages merge; the later one sets no name, so the earlier name stands.
        let merged = Wire.bytes(3, Wire.string(1, "providers/p/tasks/t-1")) + Wire.bytes(3, Wire.number(2, 1))
        #expect(try call(Self.delivery + "UpdateTask", merged).resource?.id == "t-1")
        let overridden = Wire.bytes(3, Wire.string(1, "providers/p/tasks/t-1")) + Wire.bytes(3, Wire.string(1, "providers/p/tasks/t-2"))
        #expect(try call(Self.delivery + "UpdateTask", overridden).resource?.id == "t-2")
    }

    @Test("messages that are not well-formed are refused as INVALID_ARGUMENT, never half read", arguments: [
        ("truncated length", Wire.string(3, "providers/p/vehicles/v")[0..<10].map { $0 }),
        ("truncated varint", Wire.string(3, "providers/p/vehicles/v") + [0x10, 0x80]),
        ("truncated fixed64", Wire.string(3, "providers/p/vehicles/v") + [0x09, 1, 2]),
        ("eleven-byte varint", [0x10] + Array(repeating: 0xff, count: 10) + [0x01]),
        ("field number 0", [0x02, 0x00]),
        ("wire type 7", [0x1f]),
        ("a group", [0x0b, 0x0c]),
        ("name as a varint", Wire.number(3, 5)),
        ("name not UTF-8", Wire.bytes(3, Array("providers/p/vehicles/".utf8) + [0xff, 0xfe])),
        ("junk after the name", Wire.string(3, "providers/p/vehicles/v") + [0x80]),
    ] as [(String, [UInt8])])
    func malformed(label: String, message: [UInt8]) {
        #expect(throws: FleetEngineCallRefusal.self, "\(label)") {
            try call(Self.vehicles + "GetVehicle", message)
        }
        do {
            _ = try call(Self.vehicles + "GetVehicle", message)
        } catch {
            #expect(error.reason == .malformedRequest, "\(label)")
            #expect(error.grpcStatus == 3 && error.httpStatus == 400)
        }
    }

    @Test("resource names are read strictly: four segments, the method's own collection", arguments: [
        "providers/p/vehicles", "providers/p/vehicles/v/extra", "provider/p/vehicles/v", "providers//vehicles/v",
        "providers/p/vehicles/", "providers/p/trips/t-1", "providers/p/Vehicles/v", "/providers/p/vehicles/v",
    ])
    func strictNames(name: String) throws {
        do {
            _ = try call(Self.vehicles + "GetVehicle", Wire.string(3, name))
            Issue.record("\(name) was accepted")
        } catch {
            #expect(error.reason == .malformedRequest)
            #expect(error.description.contains("GetVehicle"))
        }
    }

    @Test("a request without its name, or with an empty one, is refused as missing")
    func missingName() {
        for message in [[], Wire.string(3, ""), Wire.bytes(1, Wire.string(1, "en"))] as [[UInt8]] {
            #expect(throws: FleetEngineCallRefusal(.missingResourceName, method: "GetTask", detail: "the request names no tasks resource")) {
                try call(Self.delivery + "GetTask", message)
            }
        }
    }

    @Test("an unknown method is UNIMPLEMENTED / 404, named in the message")
    func unknownMethod() {
        for path in ["/maps.fleetengine.v1.VehicleService/GetVehicles", "/grpc.health.v1.Health/Check", "GetVehicle", ""] {
            do {
                _ = try call(path, [])
                Issue.record("\(path) was accepted")
            } catch {
                #expect(error.reason == .unknownMethod && error.grpcStatus == 12 && error.httpStatus == 404)
                #expect(error.method == path)
            }
        }
    }

    @Test("fleet-wide methods and tracking ids: refused with PERMISSION_DENIED naming the method, or the default subject's token")
    func fleetWide() throws {
        let list = try call(Self.vehicles + "ListVehicles", Wire.string(1, "providers/p"))
        let tracking = try call(Self.delivery + "GetTaskTrackingInfo", Wire.string(3, "providers/p/taskTrackingInfo/trk-1"))
        for read in [list, tracking] {
            do {
                _ = try FleetEngineSubjectRule().subject(for: read)
                Issue.record("\(read.method) got a subject")
            } catch {
                #expect(error.reason == .noSubject && error.grpcStatus == 7 && error.httpStatus == 403)
                #expect(error.description.contains(read.method.name))
                #expect(error.description.contains("--fleet-engine-default-subject"))
            }
            let fleet = try TokenKey.vehicle("*")
            #expect(try FleetEngineSubjectRule(defaultSubject: fleet).subject(for: read) == fleet)
        }
        // A named resource never falls back to the default subject.
        let get = try call(Self.vehicles + "GetVehicle", Wire.string(3, "providers/p/vehicles/truck-7"))
        #expect(try FleetEngineSubjectRule(defaultSubject: .vehicle("*")).subject(for: get) == .vehicle("truck-7"))
    }

    @Test("an id the store refuses as a subject id is refused as INVALID_ARGUMENT")
    func badSubjectID() throws {
        let read = try call(Self.vehicles + "GetVehicle", Wire.string(3, "providers/p/vehicles/.."))
        #expect(throws: FleetEngineCallRefusal.self) { try FleetEngineSubjectRule().subject(for: read) }
        let control = try call(Self.trips + "GetTrip", Wire.string(3, "providers/p/trips/t\u{7}"))
        do {
            _ = try FleetEngineSubjectRule().subject(for: control)
            Issue.record("a control character was accepted")
        } catch {
            #expect(error.reason == .invalidSubjectID && error.grpcStatus == 3)
        }
    }

    @Test("REST routes of Google's REST transport map to the same methods and subjects", arguments: [
        ("GET", "/v1/providers/p-1/deliveryVehicles/van-3?%24alt=json%3Benum-encoding%3Dint", "GetDeliveryVehicle", "deliveryVehicle/van-3"),
        ("PATCH", "/v1/providers/p-1/deliveryVehicles/van-3?updateMask=lastLocation", "UpdateDeliveryVehicle", "deliveryVehicle/van-3"),
        ("DELETE", "/v1/providers/p-1/deliveryVehicles/van-3", "DeleteDeliveryVehicle", "deliveryVehicle/van-3"),
        ("GET", "/v1/providers/p-1/tasks/task-42", "GetTask", "task/task-42"),
        ("PATCH", "/v1/providers/p-1/tasks/task%2D42", "UpdateTask", "task/task-42"),
        ("DELETE", "/v1/providers/p-1/tasks/task-42", "DeleteTask", "task/task-42"),
        ("GET", "/v1/providers/p-1/vehicles/truck-7", "GetVehicle", "vehicle/truck-7"),
        ("PUT", "/v1/providers/p-1/vehicles/truck-7", "UpdateVehicle", "vehicle/truck-7"),
        ("POST", "/v1/providers/p-1/vehicles/truck-7:updateAttributes", "UpdateVehicleAttributes", "vehicle/truck-7"),
        ("GET", "/v1/providers/p-1/trips/trip-1", "GetTrip", "trip/trip-1"),
        ("PUT", "/v1/providers/p-1/trips/trip-1", "UpdateTrip", "trip/trip-1"),
    ])
    func restRoutes(method: String, target: String, name: String, subject: String) throws {
        let read = try FleetEngineCall(httpMethod: method, target: target)
        #expect(read.method.name == name)
        #expect(try FleetEngineSubjectRule().subject(for: read).description == subject)
    }

    @Test("REST fleet-wide routes have no resource; unknown routes and smuggled slashes are refused", arguments: [
        ("POST", "/v1/providers/p-1/tasks:batchCreate", "BatchCreateTasks"),
        ("POST", "/v1/providers/p-1/deliveryVehicles?deliveryVehicleId=van-9", "CreateDeliveryVehicle"),
        ("GET", "/v1/providers/p-1/tasks", "ListTasks"),
        ("POST", "/v1/providers/p-1/vehicles:search", "SearchVehicles"),
        ("POST", "/v1/providers/p-1/billableTrips/b-1:report", "ReportBillableTrip"),
        ("GET", "/v1/providers/p-1/vehicles/truck-7:updateAttributes", nil),
        ("PATCH", "/v1/providers/p-1/vehicles/truck-7", nil),
        ("GET", "/v2/providers/p-1/vehicles/truck-7", nil),
        ("GET", "/v1/providers/p-1/vehicles/truck-7/extra", nil),
        ("GET", "/v1/providers/p-1/drivers/d-1", nil),
        ("GET", "/v1/providers/p-1/vehicles/a%2F..%2Fb", nil),
        ("GET", "/v1/providers/p-1/vehicles/%zz", nil),
        ("GET", "/", nil),
    ] as [(String, String, String?)])
    func restOthers(method: String, target: String, name: String?) {
        do {
            let read = try FleetEngineCall(httpMethod: method, target: target)
            #expect(read.method.name == name)
            #expect(read.resource == nil || read.method.name == "ReportBillableTrip")
            #expect(throws: FleetEngineCallRefusal.self) { try FleetEngineSubjectRule().subject(for: read) }
        } catch {
            #expect(name == nil, "\(target): \(error)")
            #expect(error.httpStatus == 404 || error.httpStatus == 400)
        }
    }

    @Test("the table: unique gRPC paths, unique REST routes, every named method on a collection of its own service")
    func tableIsConsistent() {
        #expect(Set(FleetEngineMethod.all.map(\.grpcPath)).count == FleetEngineMethod.all.count)
        #expect(Set(FleetEngineMethod.all.map(\.rest)).count == FleetEngineMethod.all.count)
        for method in FleetEngineMethod.all {
            #expect(FleetEngineMethod.grpc(path: method.grpcPath) == method)
            if case .named(_, let collection) = method.resource { #expect(method.rest.collection == collection) }
        }
    }
}
