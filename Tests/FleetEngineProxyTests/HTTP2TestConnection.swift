// An HTTP/2 connection to the proxy under test, opened as a gRPC client opens one (prior
// knowledge), and gRPC calls started on it frame by frame, for tests that need what a client
// library hides: a stream left open, a body past the cap, the connection's own GOAWAY frames.

import Foundation
import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOPosix

struct HTTP2TestConnection {
    let channel: any Channel
    let streams: NIOHTTP2Handler.StreamMultiplexer
    let port: Int

    /// Connects to 127.0.0.1:`port`; `connectionHandler`, when given, sees the frames of the
    /// connection itself (stream 0: SETTINGS, PING, GOAWAY).
    static func open(port: Int, connectionHandler: (any ChannelHandler & Sendable)? = nil) async throws -> HTTP2TestConnection {
        let (channel, streams) = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(host: "127.0.0.1", port: port).flatMap { channel in
                channel.eventLoop.makeCompletedFuture {
                    let streams = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
                        mode: .client, connectionConfiguration: .init(), streamConfiguration: .init()) { $0.close() }
                    if let connectionHandler { try channel.pipeline.syncOperations.addHandler(connectionHandler) }
                    return (channel, streams)
                }
            }.get()
        return HTTP2TestConnection(channel: channel, streams: streams, port: port)
    }

    func close() { channel.close(promise: nil) }

    /// A new stream with the headers of a gRPC call to `method` of `service` sent (flushed, the
    /// stream not ended). `answer` completes with the answer's first HEADERS frame, or with the
    /// one that ends the stream when `atEnd` (a call's trailers); it fails if the stream closes first.
    func startCall(_ service: String, _ method: String, extraHeaders: [(String, String)] = [],
                   answer: EventLoopPromise<HPACKHeaders>, atEnd: Bool) async throws -> any Channel {
        let stream = try await streams.createStreamChannel { stream in
            stream.eventLoop.makeCompletedFuture { try stream.pipeline.syncOperations.addHandler(AnswerHeaders(answer, atEnd: atEnd)) }
        }.get()
        var headers = HPACKHeaders()
        for (name, value) in [(":method", "POST"), (":scheme", "http"), (":authority", "127.0.0.1:\(port)"),
                              (":path", "/maps.fleetengine.v1.\(service)/\(method)"), ("content-type", "application/grpc"),
                              ("te", "trailers")] + extraHeaders {
            headers.add(name: name, value: value)
        }
        try await stream.writeAndFlush(HTTP2Frame.FramePayload.headers(.init(headers: headers, endStream: false))).get()
        return stream
    }

    /// What `answer` completes with, failing it first after `seconds`.
    static func awaitAnswer(_ answer: EventLoopPromise<HPACKHeaders>, within seconds: Int64) async throws -> HPACKHeaders {
        let timer = answer.futureResult.eventLoop.scheduleTask(in: .seconds(seconds)) { answer.fail(ChannelError.ioOnClosedChannel) }
        defer { timer.cancel() }
        return try await answer.futureResult.get()
    }
}

/// Completes `answer` with the stream's first HEADERS frame, or with the one ending the stream
/// when `atEnd`; fails it when the stream closes first.
private final class AnswerHeaders: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload

    private let answer: EventLoopPromise<HPACKHeaders>
    private let atEnd: Bool

    init(_ answer: EventLoopPromise<HPACKHeaders>, atEnd: Bool) {
        self.answer = answer
        self.atEnd = atEnd
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .headers(let frame) = unwrapInboundIn(data), !atEnd || frame.endStream { answer.succeed(frame.headers) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        answer.fail(ChannelError.ioOnClosedChannel)
    }
}
