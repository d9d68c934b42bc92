// A graceful shutdown (SIGTERM, `systemctl stop`, a restart) with Fleet Engine callers
// connected: HTTP/2 callers are told to go with GOAWAY, a call in flight is answered, and the
// connections close once their calls are, not at the shutdown's 10 s limit. Before, nothing told
// an HTTP/2 caller to go: an idle gRPC connection held every stop for those 10 s and was then
// cut without a GOAWAY.

@testable import FleetEngineProxy
import FleetTokenStoreTesting
import Foundation
import Logging
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix
import ServiceLifecycle
import Synchronization
import TestSupportKit
import Testing

@Suite("Fleet Engine proxy: graceful shutdown", .paced)
struct ProxyShutdownTests {
    @Test("at a graceful shutdown an HTTP/2 caller gets GOAWAY, its call in flight is answered, and its connection closes without waiting for the 10 s limit")
    func goAwayAtShutdown() async throws {
        let rig = try await InProcessProxy.make(label: "proxy-shutdown-test")
        defer { rig.close() }
        let port = Mutex(0)
        let service = FleetEngineProxyService(proxy: rig.proxy, addresses: [.tcp(host: "127.0.0.1", port: 0)], logger: rig.logger,
                                              onListening: { address in
                                                  if case .tcp(_, let bound) = address { port.withLock { $0 = bound } }
                                              })
        let services = ServiceGroup(configuration: .init(services: [rig.engine, service], logger: rig.logger))
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await services.run() }
            var bound = 0
            for _ in 0..<1_000 where bound == 0 {
                try await Task.sleep(for: .milliseconds(10))
                bound = port.withLock { $0 }
            }
            try #require(bound != 0, "the proxy did not listen")

            let loop = MultiThreadedEventLoopGroup.singleton.any()
            let goAways = GoAwayRecorder()
            let (connection, streams) = try await ClientBootstrap(group: loop).connect(host: "127.0.0.1", port: bound).flatMap { channel in
                channel.eventLoop.makeCompletedFuture {
                    let multiplexer = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
                        mode: .client, connectionConfiguration: .init(), streamConfiguration: .init()) { $0.close() }
                    try channel.pipeline.syncOperations.addHandler(goAways)
                    return (channel, multiplexer)
                }
            }.get()
            defer { connection.close(promise: nil) }

            // One call answered: the connection is in use, then idle.
            let first = try await Self.getVehicle("v-1", port: bound, on: streams)
            #expect(first.first(name: "grpc-status") == "0", "\(first)")

            // A second call in flight when the shutdown starts: Fleet Engine answers it 1 s later.
            rig.fake.delayAnswers(by: .seconds(1))
            async let second = Self.getVehicle("v-1", port: bound, on: streams)
            for _ in 0..<500 where rig.fake.calls.count < 2 { try await Task.sleep(for: .milliseconds(10)) }
            try #require(rig.fake.calls.count == 2, "the second call reached Fleet Engine")
            let stopping = ContinuousClock.now
            await services.triggerGracefulShutdown()

            let answered = try await second
            #expect(answered.first(name: "grpc-status") == "0", "the call in flight was answered: \(answered)")
            try await connection.closeFuture.get()
            let closedAfter = ContinuousClock.now - stopping
            // The shutdown's limit is 10 s; the connection closes once its last call is answered.
            #expect(closedAfter < .seconds(8), "the connection closed \(closedAfter) after the shutdown began")
            let seen = goAways.errorCodes
            #expect(!seen.isEmpty && seen.allSatisfy { $0 == .noError }, "GOAWAY frames: \(seen)")
            try await group.next()
            #expect(ContinuousClock.now - stopping < .seconds(8), "the service stopped without waiting for the 10 s limit")
        }
    }

    /// GetVehicle for `id` on a new stream of `streams`: the answer's trailers (or its headers
    /// when they end the stream).
    static func getVehicle(_ id: String, port: Int, on streams: NIOHTTP2Handler.StreamMultiplexer) async throws -> HPACKHeaders {
        let loop = MultiThreadedEventLoopGroup.singleton.any()
        let answer = loop.makePromise(of: HPACKHeaders.self)
        let stream = try await streams.createStreamChannel { stream in
            stream.eventLoop.makeCompletedFuture { try stream.pipeline.syncOperations.addHandler(LastHeaders(answer)) }
        }.get()
        var headers = HPACKHeaders()
        for (name, value) in [(":method", "POST"), (":scheme", "http"), (":authority", "127.0.0.1:\(port)"),
                              (":path", "/maps.fleetengine.v1.VehicleService/GetVehicle"), ("content-type", "application/grpc"),
                              ("te", "trailers"), ("x-goog-request-params", "provider_id=providers/p")] {
            headers.add(name: name, value: value)
        }
        stream.write(HTTP2Frame.FramePayload.headers(.init(headers: headers, endStream: false)), promise: nil)
        let body = GRPCTestMessage.framed(GRPCTestMessage.string(field: 3, "providers/p/vehicles/\(id)"))
        try await stream.writeAndFlush(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(body), endStream: true))).get()
        let timer = loop.scheduleTask(in: .seconds(15)) { answer.fail(ChannelError.ioOnClosedChannel) }
        defer { timer.cancel() }
        return try await answer.futureResult.get()
    }
}

/// Completes `answer` with the HEADERS frame that ends the stream; fails it if the stream closes first.
private final class LastHeaders: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload

    private let answer: EventLoopPromise<HPACKHeaders>

    init(_ answer: EventLoopPromise<HPACKHeaders>) { self.answer = answer }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .headers(let frame) = unwrapInboundIn(data), frame.endStream { answer.succeed(frame.headers) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        answer.fail(ChannelError.ioOnClosedChannel)
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
