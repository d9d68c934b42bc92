// What the proxy answers from a request's shape alone, through the service on a real listener:
// a gRPC method it does not know (a streaming one among them) at once, without waiting for a body
// a streaming client may never end; a REST path not in the token API's normal form, refused as
// the token API refuses it, before anything is fetched or sent.

@testable import FleetEngineProxy
import FleetTokenService
import FleetTokenStoreTesting
import Foundation
import MetricsTestKit
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix
import TestSupportKit
import Testing

@Suite("Fleet Engine proxy: answers from the request's shape", .paced)
struct ProxyRequestShapeTests {
    /// The proxy's service on 127.0.0.1 (a fake Fleet Engine behind it, a scripted provider),
    /// running while `body` runs with its port, the fake and the fetcher.
    static func withService(_ body: @Sendable (Int, FakeFleetEngine, ScriptedFetcher) async throws -> Void) async throws {
        let rig = try await InProcessProxy.make(label: "proxy-shape-test")
        defer { rig.close() }
        try await rig.withService { port in try await body(port, rig.fake, rig.fetcher) }
    }

    @Test("a gRPC method the proxy does not know is answered UNIMPLEMENTED at its headers, while the caller's stream is still open")
    func unknownMethodAnsweredAtHeaders() async throws {
        try await Self.withService { port, fake, _ in
            let connection = try await HTTP2TestConnection.open(port: port)
            defer { connection.close() }
            let answer = connection.channel.eventLoop.makePromise(of: HPACKHeaders.self)
            // The request's headers, and no end: a streaming caller sends messages as it goes.
            _ = try await connection.startCall("VehicleService", "StreamVehicleLocations", answer: answer, atEnd: false)
            let got = try await HTTP2TestConnection.awaitAnswer(answer, within: 5)
            #expect(got.first(name: "grpc-status") == "12", "UNIMPLEMENTED: \(got)")
            #expect(got.first(name: "grpc-message")?.contains("StreamVehicleLocations") == true, "\(got)")
            #expect(fake.calls.isEmpty)
        }
    }

    @Test("a REST path not in normal form is refused 400 before any fetch or call, as the token API refuses it", arguments: [
        "/v1/providers/p/vehicles/truck%2D7", "/v1/providers/p/vehicles/./truck-7", "/v1/providers/p//vehicles/truck-7",
        "/v1/providers/p/vehicles/truck-7%zz",
    ])
    func restTargetInNormalForm(target: String) async throws {
        try await Self.withService { port, fake, fetcher in
            // Off the cooperative pool: the proxy's fetch on a miss runs a task there.
            let answer = try await offCooperativePool {
                try RawHTTP.send(.tcp(port: port), "GET", target, host: "127.0.0.1:\(port)", headers: [("x-goog-api-client", "gl-python/3.11")], timeout: 10)
            }
            #expect(answer.status == 400, "\(answer)")
            #expect(answer.body.contains("normal form"), "\(answer.body)")
            #expect(fake.calls.isEmpty && fetcher.total == 0)
            // The same call in normal form goes through.
            let normal = try await offCooperativePool {
                try RawHTTP.send(.tcp(port: port), "GET", "/v1/providers/p/vehicles/truck-7", host: "127.0.0.1:\(port)",
                                 headers: [("x-goog-api-client", "gl-python/3.11")], timeout: 10)
            }
            #expect(normal.status == 200, "\(normal)")
        }
    }
}

extension ProxyRequestShapeTests {
    @Test("a REST call with an absolute-form target is named by the target's authority, not its Host (RFC 9112 3.2.2): another host is refused 421, loopback goes through")
    func absoluteFormTarget() async throws {
        try await Self.withService { port, fake, fetcher in
            let path = "/v1/providers/p/vehicles/truck-7"
            let google = [("x-goog-api-client", "gl-python/3.11")]
            let elsewhere = try await offCooperativePool {
                try RawHTTP.send(.tcp(port: port), "GET", "http://rebind.attacker.example" + path, host: "127.0.0.1:\(port)", headers: google, timeout: 10)
            }
            #expect(elsewhere.status == 421, "\(elsewhere)")
            #expect(fake.calls.isEmpty && fetcher.total == 0)
            let here = try await offCooperativePool {
                try RawHTTP.send(.tcp(port: port), "GET", "http://127.0.0.1:\(port)" + path, host: "rebind.attacker.example", headers: google, timeout: 10)
            }
            #expect(here.status == 200, "\(here)")
            #expect(fake.calls.count == 1)
        }
    }

    // Found by a review: each body was capped (16 MiB) but not their sum, and HTTP/2 lets a
    // connection open 100 streams: one local process sending bodies it never ended made the
    // agent hold 1.6 GiB per connection, up to the out-of-memory killer.
    @Test("the request bodies held at once are bounded over all streams and connections: past the budget a call is refused RESOURCE_EXHAUSTED / 503, and what a stream held is given back when it ends")
    func requestBodyBudget() async throws {
        let rig = try await InProcessProxy.make(label: "proxy-body-budget-test", requestBodyBudget: 1 << 20)
        defer { rig.close() }
        let budget = rig.proxy.bodyBudget
        try await rig.withService { port in
            let connection = try await HTTP2TestConnection.open(port: port)
            defer { connection.close() }
            let chunk = ByteBuffer(repeating: 0x41, count: 600 << 10)
            // A body never ended holds 600 KiB of the 1 MiB.
            let first = connection.channel.eventLoop.makePromise(of: HPACKHeaders.self)
            let open = try await connection.startCall("VehicleService", "UpdateVehicle", answer: first, atEnd: false)
            try await open.writeAndFlush(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(chunk), endStream: false))).get()
            #expect(await eventually(within: 10) { budget.bytesHeld == 600 << 10 }, "held \(budget.bytesHeld)")
            // Another 600 KiB, on another stream: past the budget.
            let second = connection.channel.eventLoop.makePromise(of: HPACKHeaders.self)
            let refused = try await connection.startCall("VehicleService", "UpdateVehicle", answer: second, atEnd: false)
            // (The refusal may close the stream before this write completes.)
            try? await refused.writeAndFlush(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(chunk), endStream: false))).get()
            let got = try await HTTP2TestConnection.awaitAnswer(second, within: 10)
            #expect(got.first(name: "grpc-status") == "8", "RESOURCE_EXHAUSTED: \(got)")
            #expect(budget.bytesHeld == 600 << 10, "the refused call holds nothing: \(budget.bytesHeld)")
            // The first stream ends (the caller gives up): its bytes are given back.
            #expect(open.isActive && connection.channel.isActive, "the first stream is still open: \(open.isActive) \(connection.channel.isActive)")
            // (Its close reports the stream's end, a cancel by RST_STREAM, as an error.)
            try? await open.close()
            #expect(await eventually(within: 10) { budget.bytesHeld == 0 }, "held \(budget.bytesHeld) after the stream closed")
            // Calls answered give back what they held, REST included.
            for _ in 0..<3 {
                let body = "{\"name\":\"" + String(repeating: "x", count: 300 << 10) + "\"}"
                let request = "PUT /v1/providers/p/vehicles/truck-7 HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nx-goog-api-client: gl-python/3.11\r\n"
                    + "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n" + body
                let answer = try await offCooperativePool {
                    String(decoding: try RawHTTP.exchange(.tcp(port: port), Array(request.utf8), timeout: 20), as: UTF8.self)
                }
                #expect(answer.hasPrefix("HTTP/1.1 ") && !answer.hasPrefix("HTTP/1.1 503"), "\(answer.prefix(300))")
            }
            #expect(await eventually(within: 10) { budget.bytesHeld == 0 }, "held \(budget.bytesHeld) after the REST calls")
        }
        #expect(rig.fake.calls.allSatisfy { $0.method != "UpdateVehicle" || $0.wire == "rest" }, "no gRPC body past the budget was sent")
    }

    // Found by a review: the 413 was written and the connection closed at once, with the body
    // still coming; the kernel reset the connection for the unread bytes, and a client that
    // sends its whole body before reading (urllib3, requests) saw the reset, not the 413.
    @Test("a REST body past the cap sent whole before reading: the client reads the 413, not a reset")
    func oversizedBodySentWholeReadsThe413() async throws {
        let rig = try await InProcessProxy.make(label: "proxy-oversize-linger-test")
        defer { rig.close() }
        try await rig.withService { port in
            let answer = try await offCooperativePool { () throws -> String in
                let fd = try RawHTTP.connect(.tcp(port: port), timeout: 20)
                defer { close(fd) }
                let size = ProxyRequestRules.maxBodyBytes + 1024 * 1024
                let head = "PUT /v1/providers/p/vehicles/truck-7 HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nx-goog-api-client: gl-python/3.11\r\n"
                    + "Content-Type: application/json\r\nContent-Length: \(size)\r\n\r\n"
                guard RawHTTP.writeAll(fd, Array(head.utf8)) else { throw ProcessFailure(message: "write of the head: \(String(cString: strerror(errno)))") }
                let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 1 << 20)
                var sent = 0
                while sent < size {
                    let count = min(chunk.count, size - sent)
                    guard RawHTTP.writeAll(fd, Array(chunk[..<count])) else {
                        throw ProcessFailure(message: "write after \(sent) bytes of the body: \(String(cString: strerror(errno)))")
                    }
                    sent += count
                }
                shutdown(fd, Int32(SHUT_WR))
                return String(decoding: try RawHTTP.readToEnd(fd), as: UTF8.self)
            }
            #expect(answer.hasPrefix("HTTP/1.1 413"), "\(answer.prefix(200))")
        }
    }

    @Test("a body past the 16 MiB cap is refused (REST 413 at its Content-Length, gRPC RESOURCE_EXHAUSTED as its DATA passes the cap), counted in the metric and access-logged under its method like every other call")
    func oversizedBodiesCountedAndLogged() async throws {
        let metrics = TestMetrics()
        let log = LogRecorder(level: .info)
        let rig = try await InProcessProxy.make(label: "proxy-oversize-test", metrics: metrics, log: log)
        defer { rig.close() }
        try await rig.withService { port in
            // REST: refused at the head, by its Content-Length, before any of the body is read.
            let rest = try await offCooperativePool {
                try RawHTTP.send(.tcp(port: port), "PUT", "/v1/providers/p/vehicles/truck-7", host: "127.0.0.1:\(port)",
                                 headers: [("x-goog-api-client", "gl-python/3.11"), ("Content-Length", "\(ProxyRequestRules.maxBodyBytes + 1)")],
                                 timeout: 10)
            }
            #expect(rest.status == 413, "\(rest)")

            // gRPC: refused when the DATA frames pass the cap.
            let connection = try await HTTP2TestConnection.open(port: port)
            defer { connection.close() }
            let answer = connection.channel.eventLoop.makePromise(of: HPACKHeaders.self)
            let stream = try await connection.startCall("VehicleService", "UpdateVehicle", answer: answer, atEnd: false)
            let chunk = ByteBuffer(repeating: 0x41, count: 1 << 20)
            // 17 MiB in 1 MiB frames, as flow control lets them go; the answer may come before the last.
            for index in 0..<17 {
                let frame = HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(chunk), endStream: index == 16))
                do { try await stream.writeAndFlush(frame).get() } catch { break }
            }
            let got = try await HTTP2TestConnection.awaitAnswer(answer, within: 10)
            #expect(got.first(name: "grpc-status") == "8", "RESOURCE_EXHAUSTED: \(got)")
        }
        #expect(rig.fake.calls.isEmpty && rig.fetcher.total == 0, "nothing was fetched or sent")
        let counted = { (wire: String, code: String) in
            (try? metrics.expectCounter("fleet_tokens_proxy_requests_total",
                                        [("protocol", wire), ("method", "UpdateVehicle"), ("code", code)]).totalValue) ?? 0
        }
        #expect(counted("rest", "413") == 1)
        #expect(counted("grpc", "RESOURCE_EXHAUSTED") == 1)
        let calls = log.entries.filter { $0.message.description == "Fleet Engine call" }.map { $0.metadata.mapValues { "\($0)" } }
        #expect(calls.contains { $0["code"] == "413" && $0["method"] == "UpdateVehicle" && $0["protocol"] == "rest" }, "\(calls)")
        #expect(calls.contains { $0["code"] == "RESOURCE_EXHAUSTED" && $0["method"] == "UpdateVehicle" }, "\(calls)")
    }
}
