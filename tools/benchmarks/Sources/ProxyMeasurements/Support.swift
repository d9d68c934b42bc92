// What fleet-engine-proxy-measurements runs: the upstream stand-in, the clients, the rounds.

import BenchmarkSupport
import Foundation
import NIOCore
import NIOHPACK
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

func option(_ flag: String) -> String? {
    guard let index = CommandLine.arguments.firstIndex(of: flag), index + 1 < CommandLine.arguments.count else { return nil }
    return CommandLine.arguments[index + 1]
}

func rounded(_ value: Double, _ places: Int = 3) -> Double {
    let scale = pow(10, Double(places))
    return (value * scale).rounded() / scale
}

// MARK: - The upstream

let vehicleName = "providers/p/vehicles/bench-1"
let deliveryVehicleName = "providers/p/deliveryVehicles/bench-dv"

/// A protobuf message with one length-delimited field (`field`, a string).
func message(field: UInt8, _ text: String) -> [UInt8] {
    let bytes = Array(text.utf8)
    precondition(bytes.count < 128)
    return [field << 3 | 2, UInt8(bytes.count)] + bytes
}

/// gRPC's length-prefixed frame around `message`.
func grpcFrame(_ message: [UInt8]) -> ByteBuffer {
    var buffer = ByteBuffer()
    buffer.writeInteger(UInt8(0))
    buffer.writeInteger(UInt32(message.count))
    buffer.writeBytes(message)
    return buffer
}

/// The upstream's answers: a Vehicle (name, field 1) and a delivery vehicle's JSON.
let vehicleAnswer = grpcFrame(message(field: 1, vehicleName))
let deliveryVehicleAnswer = ByteBuffer(string: #"{"name":"\#(deliveryVehicleName)","currentRouteSegment":"","navigationStatus":"NAVIGATION_STATUS_UNSPECIFIED"}"#)

/// One HTTP/2 stream of the upstream: answered once its request has ended.
final class UpstreamStream: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload
    private var grpc = false

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .headers(let frame):
            grpc = frame.headers.first(name: "content-type")?.hasPrefix("application/grpc") == true
            if frame.endStream { answer(context) }
        case .data(let frame):
            if frame.endStream { answer(context) }
        default:
            break
        }
    }

    private func answer(_ context: ChannelHandlerContext) {
        if grpc {
            context.write(wrapOutboundOut(.headers(.init(headers: [":status": "200", "content-type": "application/grpc"]))), promise: nil)
            context.write(wrapOutboundOut(.data(.init(data: .byteBuffer(vehicleAnswer)))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.headers(.init(headers: ["grpc-status": "0"], endStream: true))), promise: nil)
        } else {
            let headers: HPACKHeaders = [":status": "200", "content-type": "application/json", "content-length": "\(deliveryVehicleAnswer.readableBytes)"]
            context.write(wrapOutboundOut(.headers(.init(headers: headers))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.data(.init(data: .byteBuffer(deliveryVehicleAnswer), endStream: true))), promise: nil)
        }
    }
}

/// An HTTP/1.1 request to the upstream: the delivery vehicle's JSON.
final class UpstreamHTTP1: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .end = unwrapInboundIn(data) else { return }
        var headers = HTTPHeaders()
        headers.add(name: "content-type", value: "application/json")
        headers.add(name: "content-length", value: "\(deliveryVehicleAnswer.readableBytes)")
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(deliveryVehicleAnswer))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }
}

/// HTTP/2 with prior knowledge or HTTP/1.1, by the connection's first bytes.
final class UpstreamSniffer: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
    private var buffered: ByteBuffer?

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        if var earlier = buffered {
            earlier.writeBuffer(&bytes)
            bytes = earlier
        }
        let seen = bytes.readableBytesView.prefix(Self.preface.count)
        let matches = seen.elementsEqual(Self.preface.prefix(seen.count))
        if matches && seen.count < Self.preface.count {
            buffered = bytes
            return
        }
        buffered = nil
        do {
            let pipeline = context.pipeline.syncOperations
            if matches {
                _ = try pipeline.configureHTTP2Pipeline(mode: .server, connectionConfiguration: .init(), streamConfiguration: .init()) { stream in
                    stream.eventLoop.makeCompletedFuture { try stream.pipeline.syncOperations.addHandler(UpstreamStream()) }
                }
            } else {
                try pipeline.configureHTTPServerPipeline()
                try pipeline.addHandler(UpstreamHTTP1())
            }
        } catch {
            context.close(promise: nil)
            return
        }
        context.fireChannelRead(wrapInboundOut(bytes))
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }
}

// MARK: - The clients

/// Collects one HTTP/2 stream's answer; fails unless it is `:status` 200 and, on gRPC, `grpc-status` 0.
final class StreamAnswer: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    private let promise: EventLoopPromise<Void>
    private var status: String?
    private var grpcStatus: String?
    private var done = false

    init(_ promise: EventLoopPromise<Void>) { self.promise = promise }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .headers(let frame):
            if let value = frame.headers.first(name: ":status") { status = value }
            if let value = frame.headers.first(name: "grpc-status") { grpcStatus = value }
            if frame.endStream { finish() }
        case .data(let frame):
            if frame.endStream { finish() }
        default:
            break
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        guard !done else { return }
        done = true
        promise.fail(MeasurementError("the stream closed before its answer"))
    }

    private func finish() {
        guard !done else { return }
        done = true
        if status == "200" && grpcStatus == "0" {
            promise.succeed(())
        } else {
            promise.fail(MeasurementError("answer :status \(status ?? "none"), grpc-status \(grpcStatus ?? "none")"))
        }
    }
}

/// One call: started on the client's event loop, its future completed there.
typealias Call = @Sendable () -> EventLoopFuture<Void>

/// A gRPC GetVehicle over `multiplexer`'s connection with `headers`.
func grpcCall(_ multiplexer: NIOHTTP2Handler.StreamMultiplexer, loop: any EventLoop, headers: HPACKHeaders) -> Call {
    let body = grpcFrame(message(field: 3, vehicleName))
    return {
        let answer = loop.makePromise(of: Void.self)
        multiplexer.createStreamChannel { stream in
            stream.eventLoop.makeCompletedFuture { try stream.pipeline.syncOperations.addHandler(StreamAnswer(answer)) }
        }.whenComplete { result in
            switch result {
            case .failure(let error):
                answer.fail(error)
            case .success(let stream):
                stream.write(HTTP2Frame.FramePayload.headers(.init(headers: headers)), promise: nil)
                stream.writeAndFlush(HTTP2Frame.FramePayload.data(.init(data: .byteBuffer(body), endStream: true)), promise: nil)
            }
        }
        return answer.futureResult
    }
}

/// An HTTP/2 connection to `port` on loopback; its stream multiplexer.
func http2Connection(port: Int, group: any EventLoopGroup) async throws -> NIOHTTP2Handler.StreamMultiplexer {
    try await ClientBootstrap(group: group)
        .channelOption(.socketOption(.tcp_nodelay), value: 1)
        .connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.configureHTTP2Pipeline(
                    mode: .client, connectionConfiguration: .init(), streamConfiguration: .init()) { stream in stream.close() }
            }
        }
}

/// The answer awaited on an HTTP/1.1 connection (one request at a time).
final class HTTP1Answer: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = HTTPClientResponsePart
    /// Set and read on the connection's event loop only.
    var pending: EventLoopPromise<Void>?
    private var status: UInt = 0

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            status = head.status.code
        case .body:
            break
        case .end:
            let promise = pending
            pending = nil
            if status == 200 { promise?.succeed(()) } else { promise?.fail(MeasurementError("HTTP \(status)")) }
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        pending?.fail(MeasurementError("the connection closed before the answer"))
        pending = nil
    }
}

/// A keep-alive HTTP/1.1 connection to `port` on loopback sending `head` for each call.
func http1Call(port: Int, group: any EventLoopGroup, head: HTTPRequestHead) async throws -> Call {
    let answer = HTTP1Answer()
    let channel = try await ClientBootstrap(group: group)
        .channelOption(.socketOption(.tcp_nodelay), value: 1)
        .connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHTTPClientHandlers()
                try channel.pipeline.syncOperations.addHandler(answer)
                return channel
            }
        }
    return {
        let promise = channel.eventLoop.makePromise(of: Void.self)
        answer.pending = promise
        channel.write(HTTPClientRequestPart.head(head), promise: nil)
        channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        return promise.futureResult
    }
}

/// Loop-confined samples of a run of calls.
final class Samples: @unchecked Sendable {
    var nanoseconds: [[UInt64]]
    init(sides: Int) { nanoseconds = Array(repeating: [], count: sides) }
}

/// `count` calls of each of `calls`, alternating one by one, one after another, on `loop`; each
/// call's time in nanoseconds, per side.
func alternate(_ calls: [Call], count: Int, on loop: any EventLoop) async throws -> [[UInt64]] {
    let samples = Samples(sides: calls.count)
    let progress = Progress()
    let finished = loop.makePromise(of: Void.self)
    let total = count * calls.count
    @Sendable func end(_ error: (any Error)?) {
        guard !progress.ended else { return }
        progress.ended = true
        if let error { finished.fail(error) } else { finished.succeed(()) }
    }
    @Sendable func step(_ index: Int) {
        guard !progress.ended else { return }
        guard index < total else { return end(nil) }
        let side = index % calls.count
        let began = monotonicNanoseconds()
        calls[side]().whenComplete { result in
            switch result {
            case .failure(let error):
                end(error)
            case .success:
                samples.nanoseconds[side].append(monotonicNanoseconds() - began)
                progress.completed += 1
                step(index + 1)
            }
        }
    }
    // A call that never gets its answer would hold the whole run forever (seen once, through
    // nginx's gRPC relay on a machine loaded by another measurement): end with what was lost.
    let watchdog = loop.scheduleRepeatedTask(initialDelay: Progress.patience, delay: Progress.patience) { task in
        if progress.completed == progress.completedAtLastLook {
            let index = progress.completed
            end(MeasurementError("call \(index + 1) of \(total) (side \(index % calls.count + 1) of \(calls.count)) had no answer within \(Progress.patience.nanoseconds / 1_000_000_000) s"))
        }
        progress.completedAtLastLook = progress.completed
        if progress.ended { task.cancel() }
    }
    loop.execute { step(0) }
    defer { watchdog.cancel() }
    try await finished.futureResult.get()
    return samples.nanoseconds
}

/// How far ``alternate(_:count:on:)`` has come; confined to its event loop.
final class Progress: @unchecked Sendable {
    /// The longest a call may go without an answer before the run ends with an error.
    static let patience = TimeAmount.seconds(15)
    var completed = 0
    var completedAtLastLook = -1
    var ended = false
}

/// What rounds of alternating calls came to.
struct PairFigures: Sendable {
    /// The median of the rounds' ratios of p50s (proxy over direct).
    let ratio: Double
    /// The rounds' ratios at the 25th and 75th percentile.
    let quartiles: [Double]
    /// Each round's ratio.
    let eachRound: [Double]
    /// The median of the rounds' p50s through the proxy, in microseconds.
    let proxyP50: Double
    /// The median of the rounds' p50s straight to the upstream, in microseconds.
    let directP50: Double
}

/// Rounds of alternating calls after a warm-up, each round's ratio of the two sides' p50s.
func paired(proxy: @escaping Call, direct: @escaping Call, rounds: Int, callsPerRound: Int, loop: any EventLoop) async throws -> PairFigures {
    _ = try await alternate([proxy, direct], count: 200, on: loop)  // warm-up: connections, token, caches
    var ratios: [Double] = []
    var proxyP50s: [Double] = []
    var directP50s: [Double] = []
    for round in 0..<rounds {
        // Which side goes first alternates too.
        let first = round % 2 == 0
        let samples = try await alternate(first ? [proxy, direct] : [direct, proxy], count: callsPerRound, on: loop)
        // `Double($0)`: `map(Double.init)` picks `init(bitPattern:)` here.
        let proxyP50 = median(samples[first ? 0 : 1].map { Double($0) }) / 1000
        let directP50 = median(samples[first ? 1 : 0].map { Double($0) }) / 1000
        ratios.append(proxyP50 / directP50)
        proxyP50s.append(proxyP50)
        directP50s.append(directP50)
    }
    return PairFigures(ratio: rounded(median(ratios)),
                       quartiles: [rounded(quantile(ratios, 0.25)), rounded(quantile(ratios, 0.75))],
                       eachRound: ratios.map { rounded($0) },
                       proxyP50: rounded(median(proxyP50s)), directP50: rounded(median(directP50s)))
}

/// Loop-confined counters of the throughput run.
final class Tally: @unchecked Sendable {
    var calls = 0
    var failures = 0
    var firstFailure: String?
}

/// `callers` gRPC callers on connections of their own to `port`, each looping calls until
/// `seconds` have passed after a warm-up second: calls per second and failures.
func throughput(port: Int, headers: HPACKHeaders, callers: Int, seconds: Double, group: any EventLoopGroup) async throws -> (perSecond: Double, failures: Int, firstFailure: String?) {
    var loops: [any EventLoop] = []
    var calls: [Call] = []
    for _ in 0..<callers {
        let loop = group.next()
        let multiplexer = try await http2Connection(port: port, group: loop)
        loops.append(loop)
        calls.append(grpcCall(multiplexer, loop: loop, headers: headers))
    }
    let tallies = (0..<callers).map { _ in Tally() }
    let counting = ManagedAtomicFlag()
    let stop = ManagedAtomicFlag()
    var finished: [EventLoopFuture<Void>] = []
    for index in 0..<callers {
        let loop = loops[index], call = calls[index], tally = tallies[index]
        let done = loop.makePromise(of: Void.self)
        @Sendable func step() {
            guard !stop.isSet else { return done.succeed(()) }
            call().whenComplete { result in
                switch result {
                case .success:
                    if counting.isSet { tally.calls += 1 }
                    step()
                case .failure(let error):
                    // A failed call ends this caller (its connection may be gone, and a call that
                    // fails at once would otherwise recurse without bound); the run reports it.
                    tally.failures += 1
                    if tally.firstFailure == nil { tally.firstFailure = "\(error)" }
                    done.succeed(())
                }
            }
        }
        loop.execute { step() }
        finished.append(done.futureResult)
    }
    try await Task.sleep(for: .seconds(1))
    counting.set()
    let began = monotonicNanoseconds()
    try await Task.sleep(for: .seconds(seconds))
    counting.clear()
    let elapsed = Double(monotonicNanoseconds() - began) / 1e9
    stop.set()
    for future in finished { try await future.get() }
    // Read on the loops: each tally was written there.
    var total = 0, failures = 0
    var firstFailure: String?
    for index in 0..<callers {
        let tally = tallies[index]
        let (count, failed, first) = try await loops[index].submit { (tally.calls, tally.failures, tally.firstFailure) }.get()
        total += count
        failures += failed
        firstFailure = firstFailure ?? first
    }
    return (Double(total) / elapsed, failures, firstFailure)
}

/// A flag set and read from any thread.
final class ManagedAtomicFlag: Sendable {
    private let value = Atomic<Bool>(false)
    var isSet: Bool { value.load(ordering: .acquiring) }
    func set() { value.store(true, ordering: .releasing) }
    func clear() { value.store(false, ordering: .releasing) }
}

/// The file `name` of each thread of `pid` (`/proc/PID/task/TID/name`), read whole.
func threadFiles(of pid: pid_t, _ name: String) -> [String] {
    ((try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []).map { procFile("/proc/\(pid)/task/\($0)/\(name)") }
}

/// Context switches of every thread of `pid` so far (voluntary: a thread that blocked and was
/// woken again; each hop of a call between threads costs one when the other thread was idle).
func contextSwitches(of pid: pid_t) -> (voluntary: Int, involuntary: Int) {
    var voluntary = 0, involuntary = 0
    for status in threadFiles(of: pid, "status") {
        for line in status.split(separator: "\n") {
            let parts = line.split(separator: ":")
            guard parts.count == 2, let value = Int(parts[1].trimmingCharacters(in: .whitespaces)) else { continue }
            if parts[0] == "voluntary_ctxt_switches" { voluntary += value }
            if parts[0] == "nonvoluntary_ctxt_switches" { involuntary += value }
        }
    }
    return (voluntary, involuntary)
}

/// CPU time of all of `pid`'s threads so far, in nanoseconds (the scheduler's own count, in
/// `/proc/PID/task/TID/schedstat`: finer than the clock ticks of `/proc/PID/stat`).
func cpuNanoseconds(of pid: pid_t) -> Int {
    threadFiles(of: pid, "schedstat").reduce(0) { $0 + ($1.split(separator: " ").first.flatMap { Int($0) } ?? 0) }
}

/// `work`'s result, and the CPU time `pid` spent meanwhile divided by `calls`, in microseconds.
func cpuPerCall<T>(of pid: pid_t, calls: Double, _ work: () async throws -> T) async rethrows -> (T, Double) {
    let before = cpuNanoseconds(of: pid)
    let result = try await work()
    return (result, Double(cpuNanoseconds(of: pid) - before) / calls / 1000)
}

// MARK: - The token a direct caller attaches


// MARK: - The nginx relay

/// Debian's nginx in the foreground, one process, relaying to the upstream stand-in: gRPC
/// (HTTP/2 with prior knowledge) on ``grpcPort`` by `grpc_pass`, REST (HTTP/1.1) on ``restPort``
/// by `proxy_pass`, both with kept-alive upstream connections and no access log.
final class NginxRelay {
    let grpcPort: Int
    let restPort: Int
    let version: String
    private let child: Child

    /// nginx's process (one, `master_process off`), for its CPU time per call.
    var pid: pid_t { child.pid }

    /// Starts nginx and waits until both ports accept; nil when nginx is not installed.
    static func start(upstreamPort: Int, scratch: String) async throws -> NginxRelay? {
        guard let nginx = DebianNginx.executable else { return nil }
        let (grpcPort, restPort) = (try freeLoopbackPort(), try freeLoopbackPort())
        let child = try DebianNginx.start(nginx, in: scratch + "/nginx", main: "master_process off; worker_processes 1;", http: """
            upstream fleet_grpc { server 127.0.0.1:\(upstreamPort); keepalive 16; keepalive_requests 100000000; }
              upstream fleet_rest { server 127.0.0.1:\(upstreamPort); keepalive 16; keepalive_requests 100000000; }
              server { listen 127.0.0.1:\(grpcPort) http2; location / { grpc_pass grpc://fleet_grpc; } }
              server { listen 127.0.0.1:\(restPort); location / { proxy_pass http://fleet_rest; proxy_http_version 1.1; proxy_set_header Connection ""; } }
            """, ports: [grpcPort, restPort])
        return NginxRelay(grpcPort: grpcPort, restPort: restPort, version: DebianNginx.version(nginx), child: child)
    }

    private init(grpcPort: Int, restPort: Int, version: String, child: Child) {
        (self.grpcPort, self.restPort, self.version, self.child) = (grpcPort, restPort, version, child)
    }

    func stop() { child.stop() }
}
