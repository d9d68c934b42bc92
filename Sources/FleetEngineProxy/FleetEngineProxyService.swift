// The Fleet Engine proxy's listeners (Unix sockets, loopback TCP), each connection behind a
// connection gate as the token API's, and the queue through which calls run as child tasks of
// the service.

public import FleetTokenService
import FleetTokenStore
import Foundation
public import Logging
public import NIOCore
import NIOPosix
public import ServiceLifecycle
import Synchronization
#if canImport(Glibc)
public import Glibc
#endif

/// Runs the Fleet Engine proxy on every listen address until graceful shutdown; removes its
/// socket files when it stops. Add it to the `ServiceGroup` beside the engine and the token API.
///
/// One address serves gRPC callers (HTTP/2 with prior knowledge, told by the connection
/// preface) and REST callers (HTTP/1.1). Connections past the caps are answered `503` and closed,
/// as the token API's; a connection idle for ``idleTimeout`` is closed (after 5 s when it was
/// accepted while half the overall cap or more was open, as the token API's).
public struct FleetEngineProxyService: Service, CustomStringConvertible {
    /// How long a connection may stay idle by default: 90 s with nothing read or written and no
    /// call waiting for its answer (a call may wait longer: a rejected token's retry takes two
    /// upstream attempts and a fetch).
    public static let idleTimeout: TimeAmount = .seconds(90)

    let proxy: FleetEngineProxy
    let idleTimeout: TimeAmount
    let addresses: [ListenAddress]
    let socketMode: mode_t
    let gate: ConnectionGate
    let logger: Logger
    let onListening: @Sendable (ListenAddress) -> Void

    /// The proxy on `addresses`; Unix sockets get `socketMode` (default 0660). `onListening` is
    /// called once per address when it accepts connections (a port 0 is reported with the port
    /// bound). `connectionLimits` caps this service's connections, as the token API's, or
    /// `sharedCaps` when given (one budget with the token API of the same process); a connection
    /// with no call waiting for its answer is closed once idle for `idleTimeout`.
    public init(proxy: FleetEngineProxy, addresses: [ListenAddress], socketMode: mode_t = 0o660,
                connectionLimits: APIConnectionLimits = APIConnectionLimits(), sharedCaps: SharedConnectionCaps? = nil,
                idleTimeout: TimeAmount = Self.idleTimeout,
                logger: Logger, onListening: @escaping @Sendable (ListenAddress) -> Void = { _ in }) {
        self.proxy = proxy
        self.idleTimeout = idleTimeout
        self.addresses = addresses
        self.socketMode = socketMode
        self.gate = sharedCaps?.gate ?? ConnectionGate(limits: connectionLimits, component: "Fleet Engine proxy", logger: logger)
        self.logger = logger
        self.onListening = onListening
    }

    /// `FleetEngineProxyService(addresses → endpoint)`.
    public var description: String {
        "FleetEngineProxyService(\(addresses.map(\.description).joined(separator: ", ")) → \(proxy.configuration.endpoint))"
    }

    /// Checks every Unix socket path before anything listens.
    /// - Throws: ``TokenAPIError``.
    public func prepare() throws(TokenAPIError) {
        for case .unix(let path) in addresses { try SocketPath.check(path) }
    }

    /// Serves until graceful shutdown or cancellation, then closes the proxy's connections to
    /// Fleet Engine for good: a proxy serves one run (make a new ``FleetEngineProxy`` to serve again).
    public func run() async throws {
        try prepare()
        let calls = ProxyCallQueue()
        let connections = OpenConnections()
        defer { proxy.upstream.close() }
        _ = gate.caps
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { await calls.run() }
            var servers: [any Channel] = []
            for address in addresses {
                let server = try await bind(address, calls: calls, connections: connections)
                servers.append(server)
            }
            let bound = servers
            // At graceful shutdown: no new connections; open ones finish the call they have
            // (HTTP/2: GOAWAY, HTTP/1.1: close after the answer), then the queue ends.
            await withTaskCancellationHandler {
                await withGracefulShutdownHandler {
                    for server in bound { try? await server.closeFuture.get() }
                    await connections.quiesceAndWait(upTo: .seconds(10))
                    calls.finish()
                } onGracefulShutdown: {
                    for server in bound { server.close(promise: nil) }
                }
            } onCancel: {
                for server in bound { server.close(promise: nil) }
                connections.closeAll()
                calls.finish()
            }
        }
        for case .unix(let path) in addresses { unlink(path) }
    }

    private func bind(_ address: ListenAddress, calls: ProxyCallQueue, connections: OpenConnections) async throws -> any Channel {
        let unixSocket: Bool
        let transport: ProxyTransport
        switch address {
        case .unix: (unixSocket, transport) = (true, .unix)
        case .tcp(let host, _): (unixSocket, transport) = (false, .tcp(host: host))
        }
        let (proxy, gate, idleTimeout) = (proxy, gate, idleTimeout)
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try Self.setUp(channel, unixSocket: unixSocket, transport: transport, proxy: proxy, calls: calls,
                                   gate: gate, connections: connections, idleTimeout: idleTimeout)
                }
            }
        switch address {
        case .unix(let path):
            let staging = try SocketStaging(path: path)
            let server: any Channel
            do {
                server = try await bootstrap.bind(unixDomainSocketPath: staging.stagedPath).get()
            } catch {
                staging.discard()
                throw error
            }
            if let problem = staging.place(mode: socketMode) {
                server.close(promise: nil)
                logger.critical("the Fleet Engine proxy's socket could not be put in place", metadata: ["path": "\(path)", "error": "\(problem)"])
                throw TokenAPIError(.socketNotPlaced, path, "the Fleet Engine proxy's socket could not be moved to \(path): \(problem); check the socket directory's owner and mode")
            }
            logger.notice("Fleet Engine proxy listening", metadata: ["address": "\(address)", "upstream": "\(proxy.configuration.endpoint)"])
            onListening(address)
            return server
        case .tcp(let host, let port):
            let server = try await bootstrap.childChannelOption(.socketOption(.tcp_nodelay), value: 1).bind(host: host, port: port).get()
            let bound = ListenAddress.tcp(host: host, port: server.localAddress?.port ?? port)
            logger.notice("Fleet Engine proxy listening", metadata: ["address": "\(bound)", "upstream": "\(proxy.configuration.endpoint)"])
            onListening(bound)
            return server
        }
    }

    /// A new connection: through the gate, then the protocol sniffer; on its event loop.
    private static func setUp(_ channel: any Channel, unixSocket: Bool, transport: ProxyTransport, proxy: FleetEngineProxy,
                              calls: ProxyCallQueue, gate: ConnectionGate, connections: OpenConnections, idleTimeout: TimeAmount) throws {
        let identity = unixSocket ? ConnectionPeer.identity(channel) : nil
        let peer = ConnectionPeer.of(channel, unixSocket: unixSocket, identity: identity)
        let admission = gate.admit(peer)
        guard case .admitted(let busy) = admission else {
            let message = "token-agent's Fleet Engine proxy has as many connections open as its caps allow (per client or overall): reuse a connection, or retry shortly"
            let body = "{\"error\":{\"code\":503,\"message\":\"\(message)\",\"status\":\"UNAVAILABLE\"}}"
            // gRPC callers speak HTTP/2 from the first byte: they get a GOAWAY with the message.
            try channel.pipeline.syncOperations.addHandler(RefusedConnectionHandler(
                RefusedConnectionHandler.answer(json: body), http2Answer: RefusedConnectionHandler.http2Answer(message: message), gate: gate))
            return
        }
        connections.add(channel)
        channel.closeFuture.whenComplete { _ in
            gate.release(peer)
            connections.remove(channel)
        }
        let waiting = CallsAwaitingAnswers()
        let context = ProxyCallContext(calls: calls, proxy: proxy, transport: transport, peer: identity, waiting: waiting)
        let pipeline = channel.pipeline.syncOperations
        // Accepted while half the overall cap or more is open: the token API's short idle
        // timeout, so that idle connections cannot keep the last slots for long.
        let busyTimeout = TimeAmount.seconds(APIConnectionLimits.busyIdleTimeout.components.seconds)
        try pipeline.addHandler(IdleStateHandler(allTimeout: busy ? min(idleTimeout, busyTimeout) : idleTimeout))
        try pipeline.addHandler(IdleConnectionCloser(waiting))
        try pipeline.addHandler(ProtocolSniffer(context))
    }
}

/// Calls waiting to run: each runs as a child task of the service's `run()`.
final class ProxyCallQueue: Sendable {
    typealias Call = @Sendable () async -> Void
    private let stream: AsyncStream<Call>
    private let continuation: AsyncStream<Call>.Continuation

    init() {
        (stream, continuation) = AsyncStream.makeStream(of: Call.self)
    }

    /// Queues `call`; false when the queue has finished (the service is stopping).
    func submit(_ call: @escaping Call) -> Bool {
        if case .terminated = continuation.yield(call) { return false }
        return true
    }

    /// Runs every call submitted, each in a child task, until ``finish()``; then waits for them.
    func run() async {
        await withDiscardingTaskGroup { group in
            for await call in stream { group.addTask { await call() } }
        }
    }

    func finish() { continuation.finish() }
}

/// The proxy's open connections, so that a shutdown can let each finish its call and close.
final class OpenConnections: Sendable {
    private let channels = Mutex<[ObjectIdentifier: any Channel]>([:])

    func add(_ channel: any Channel) { channels.withLock { $0[ObjectIdentifier(channel)] = channel } }
    func remove(_ channel: any Channel) { channels.withLock { _ = $0.removeValue(forKey: ObjectIdentifier(channel)) } }

    /// Closes every connection now.
    func closeAll() {
        for channel in channels.withLock({ Array($0.values) }) { channel.close(promise: nil) }
    }

    /// Asks every connection to close once its calls are answered (HTTP/2: GOAWAY; HTTP/1.1:
    /// after the answer in progress), waits up to `limit`, then closes what is left.
    func quiesceAndWait(upTo limit: Duration) async {
        let open = channels.withLock { Array($0.values) }
        for channel in open { channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent()) }
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline, !channels.withLock({ $0.isEmpty }) {
            try? await Task.sleep(for: .milliseconds(50))
        }
        for channel in channels.withLock({ Array($0.values) }) { channel.close(promise: nil) }
    }
}
