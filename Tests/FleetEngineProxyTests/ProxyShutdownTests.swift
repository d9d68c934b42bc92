// A graceful shutdown (SIGTERM, `systemctl stop`, a restart) with Fleet Engine callers
// connected: HTTP/2 callers are told to go with GOAWAY, a call in flight is answered, and the
// connections close once their calls are, not at the shutdown's 10 s limit. Before, nothing told
// an HTTP/2 caller to go: an idle gRPC connection held every stop for those 10 s and was then
// cut without a GOAWAY.

@testable import FleetEngineProxy
import FleetTokenStoreTesting
import Foundation
import NIOCore
import NIOHPACK
import NIOHTTP2
import Synchronization
import TestSupportKit
import Testing

@Suite("Fleet Engine proxy: graceful shutdown", .paced)
struct ProxyShutdownTests {
    @Test("at a graceful shutdown an HTTP/2 caller gets GOAWAY, its call in flight is answered, and its connection closes without waiting for the 10 s limit")
    func goAwayAtShutdown() async throws {
        let rig = try await InProcessProxy.make(label: "proxy-shutdown-test")
        defer { rig.close() }
        try await rig.withServiceGroup { port, services in
            let goAways = GoAwayRecorder()
            let connection = try await HTTP2TestConnection.open(port: port, connectionHandler: goAways)
            defer { connection.close() }

            // One call answered: the connection is in use, then idle.
            let first = try await Self.getVehicle("v-1", on: connection)
            #expect(first.first(name: "grpc-status") == "0", "\(first)")

            // A second call in flight when the shutdown starts: Fleet Engine answers it 1 s later.
            rig.fake.delayAnswers(by: .seconds(1))
            async let second = Self.getVehicle("v-1", on: connection)
            for _ in 0..<500 where rig.fake.calls.count < 2 { try await Task.sleep(for: .milliseconds(10)) }
            try #require(rig.fake.calls.count == 2, "the second call reached Fleet Engine")
            let stopping = ContinuousClock.now
            await services.triggerGracefulShutdown()

            let answered = try await second
            #expect(answered.first(name: "grpc-status") == "0", "the call in flight was answered: \(answered)")
            try await connection.channel.closeFuture.get()
            let closedAfter = ContinuousClock.now - stopping
            // The shutdown's limit is 10 s; the connection closes once its last call is answered.
            #expect(closedAfter < .seconds(8), "the connection closed \(closedAfter) after the shutdown began")
            let seen = goAways.errorCodes
            #expect(!seen.isEmpty && seen.allSatisfy { $0 == .noError }, "GOAWAY frames: \(seen)")
        }
    }

    /// GetVehicle for `id` on a new stream of `connection`: the answer's trailers.
    static func getVehicle(_ id: String, on connection: HTTP2TestConnection) async throws -> HPACKHeaders {
        let answer = connection.channel.eventLoop.makePromise(of: HPACKHeaders.self)
        let stream = try await connection.startCall("VehicleService", "GetVehicle", extraHeaders: [("x-goog-request-params", "provider_id=providers/p")],
                                                    answer: answer, atEnd: true)
        let body = GRPCTestMessage.framed(GRPCTestMessage.string(field: 3, "providers/p/vehicles/\(id)"))
        try await stream.writeAndFlush(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(body), endStream: true))).get()
        return try await HTTP2TestConnection.awaitAnswer(answer, within: 15)
    }
}

/// The error codes of the GOAWAY frames the connection received (the client's inline multiplexer
/// hands the connection's own frames on to the next handler).
private final class GoAwayRecorder: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTP2Frame

    private let seen = Mutex<[HTTP2ErrorCode]>([])

    var errorCodes: [HTTP2ErrorCode] { seen.withLock { $0 } }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .goAway(_, let code, _) = unwrapInboundIn(data).payload { seen.withLock { $0.append(code) } }
        context.fireChannelRead(data)
    }
}
