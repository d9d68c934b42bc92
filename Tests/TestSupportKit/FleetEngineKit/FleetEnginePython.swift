// Google's official Fleet Engine clients from PyPI, in a virtual environment made once per
// build folder (or the one FTS_FLEETENGINE_PYTHON names), and a small script driving them: the
// proxy's tests call the agent with the very code Fleet Engine's users run.

import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Google's Fleet Engine Python clients, unmodified, from PyPI.
package enum FleetEnginePython {
    /// The packages, at the versions ../shared/FLEET-ENGINE-API.md was read from.
    package static let packages = ["google-maps-fleetengine==0.6.1", "google-maps-fleetengine-delivery==0.6.1"]

    /// The interpreter of a virtual environment holding ``packages``: `FLEET_ENGINE_PYTHON`
    /// when set (`.ci/run` makes it), else `~/.cache/fleet-token-store/fleetengine-venv`, made
    /// now if missing or made for other pins (one process makes it, under a lock; about a
    /// minute). Blocks: call it off the cooperative pool.
    package static func interpreter() throws -> String {
        if let given = ProcessInfo.processInfo.environment["FLEET_ENGINE_PYTHON"], !given.isEmpty { return given }
        let cache = FileManager.default.homeDirectoryForCurrentUser.appendingPathComponent(".cache/fleet-token-store").path
        try FileManager.default.createDirectory(atPath: cache, withIntermediateDirectories: true)
        let venv = cache + "/fleetengine-venv"
        let python = venv + "/bin/python3"
        let ready = venv + ".ready"
        let pins = packages.joined(separator: " ")
        func isReady() -> Bool { (try? String(contentsOfFile: ready, encoding: .utf8)) == pins }
        if isReady() { return python }
        let lock = open(venv + ".lock", O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        guard lock >= 0 else { throw ProcessFailure(message: "cannot open \(venv).lock") }
        defer { close(lock) }
        flock(lock, LOCK_EX)
        defer { flock(lock, LOCK_UN) }
        if isReady() { return python }
        try? FileManager.default.removeItem(atPath: ready)
        try run("/usr/bin/env", ["python3", "-m", "venv", "--clear", venv])
        try run(python, ["-m", "pip", "install", "--quiet", "--disable-pip-version-check"] + packages)
        try pins.write(toFile: ready, atomically: true, encoding: .utf8)
        return python
    }

    private static func run(_ executable: String, _ arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        let output = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw ProcessFailure(message: "\(executable) \(arguments.joined(separator: " ")) failed: \(String(decoding: output, as: UTF8.self))")
        }
    }

    /// A script calling Fleet Engine through the proxy with Google's clients, no credentials:
    /// `python3 script MODE TARGET NAME COUNT [PARALLEL [DEADLINE_SECONDS]]`, MODE `grpc-vehicle` (GetVehicle),
    /// `grpc-trip` (GetTrip), `grpc-search` (SearchVehicles, fleet-wide) or `rest-delivery`
    /// (GetDeliveryVehicle); TARGET `unix:PATH` or `127.0.0.1:PORT`. Prints one JSON line per
    /// call: `{"ok": true, "name": …}` or `{"ok": false, "code": "PERMISSION_DENIED", "message": …}`.
    package static let script = #"""
import json, sys
from concurrent.futures import ThreadPoolExecutor

mode, target, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
parallel = int(sys.argv[5]) if len(sys.argv) > 5 else 1

def result_of(call):
    try:
        answer = call()
        return {"ok": True, "name": getattr(answer, "name", "")}
    except Exception as error:  # google.api_core.exceptions.GoogleAPICallError and transport errors
        # The clients retry UNAVAILABLE until their deadline: then the last error is the cause.
        if type(error).__name__ == "RetryError" and getattr(error, "cause", None) is not None:
            error = error.cause
        code = getattr(error, "grpc_status_code", None)
        code = code.name if code is not None else type(error).__name__
        return {"ok": False, "code": code, "message": str(getattr(error, "message", error))}

# Each call's deadline (the clients' default is 15 s): the tests judge answers, not speed, and a
# loaded 2-core machine once took longer for a call, a rejection and the retry's fetch. The
# clients retry UNAVAILABLE until it passes.
timeout = float(sys.argv[6]) if len(sys.argv) > 6 else 60.0

# What a caller may send besides: routing metadata (passed on) and a credential of its own
# (dropped: the proxy puts the resource's token in its place).
metadata = [("x-goog-request-params", "provider_id=providers/p"), ("authorization", "Bearer caller-credential")]

if mode.startswith("grpc"):
    import grpc
    channel = grpc.insecure_channel(target)
    if mode in ("grpc-vehicle", "grpc-search"):
        from google.maps import fleetengine_v1
        from google.maps.fleetengine_v1.services.vehicle_service.transports import VehicleServiceGrpcTransport
        client = fleetengine_v1.VehicleServiceClient(transport=VehicleServiceGrpcTransport(channel=channel))
        if mode == "grpc-vehicle":
            call = lambda: client.get_vehicle(request={"name": name}, metadata=metadata, timeout=timeout)
        else:
            call = lambda: client.search_vehicles(request={"parent": name, "pickup_radius_meters": 400, "count": 1}, metadata=metadata, timeout=timeout)
    else:
        from google.maps import fleetengine_v1
        from google.maps.fleetengine_v1.services.trip_service.transports import TripServiceGrpcTransport
        client = fleetengine_v1.TripServiceClient(transport=TripServiceGrpcTransport(channel=channel))
        call = lambda: client.get_trip(request={"name": name}, metadata=metadata, timeout=timeout)
else:
    from google.auth.credentials import AnonymousCredentials
    from google.maps import fleetengine_delivery_v1
    from google.maps.fleetengine_delivery_v1.services.delivery_service.transports import DeliveryServiceRestTransport
    transport = DeliveryServiceRestTransport(host=target, url_scheme="http", credentials=AnonymousCredentials())
    client = fleetengine_delivery_v1.DeliveryServiceClient(transport=transport)
    call = lambda: client.get_delivery_vehicle(name=name, metadata=metadata, timeout=timeout)

with ThreadPoolExecutor(max_workers=parallel) as pool:
    for result in pool.map(lambda _: result_of(call), range(count)):
        print(json.dumps(result), flush=True)
"""#
}
