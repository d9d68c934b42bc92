// Service layer: where the API listens (Unix sockets, loopback TCP), the
// socket file's safety rules, and the service that runs the listeners beside the engine.

public import FleetTokenStore
public import Foundation
import Hummingbird
public import Logging
import NIOCore
public import ServiceLifecycle
#if canImport(Glibc)
import Glibc
#endif

/// Where the token API listens: `unix:PATH` or `HOST:PORT` (`[v6]:PORT`).
public enum ListenAddress: Sendable, Equatable, CustomStringConvertible {
    /// A Unix domain socket at this path.
    case unix(path: String)
    /// A TCP address.
    case tcp(host: String, port: Int)

    /// Parses `unix:PATH` or `HOST:PORT`.
    /// - Throws: ``TokenAPIError`` for anything else, or a non-loopback host unless
    ///   `allowNonLoopback`.
    public init(parsing text: String, allowNonLoopback: Bool = false) throws(TokenAPIError) {
        if text.hasPrefix("unix:") {
            let path = String(text.dropFirst(5))
            guard !path.isEmpty else { throw TokenAPIError(.invalidAddress, text, "listen address \"\(text)\": give the socket's path, e.g. unix:/run/tokens/api.sock") }
            self = .unix(path: path)
            return
        }
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port) else {
            throw TokenAPIError(.invalidAddress, text, "listen address \"\(text)\": write unix:PATH or HOST:PORT (127.0.0.1:8787)")
        }
        let hostPart = text[..<colon]
        let bracketed = hostPart.hasPrefix("[") && hostPart.hasSuffix("]") && hostPart.count >= 2
        let host = bracketed ? String(hostPart.dropFirst().dropLast()) : String(hostPart)
        // A bare IPv6 address needs brackets (its colons would be taken for the port's).
        guard !host.isEmpty, bracketed || !host.contains(":"), !bracketed || host.contains(":") else {
            throw TokenAPIError(.invalidAddress, text, "listen address \"\(text)\": write HOST:PORT with an IPv4 address, localhost or [IPv6] (127.0.0.1:8787, [::1]:8787)")
        }
        guard LoopbackHost.isLoopback(host) || allowNonLoopback else {
            throw TokenAPIError(.nonLoopbackAddress, text, "listen address \"\(text)\": the token API hands out tokens without authentication, so it listens on loopback only; allow non-loopback addresses only if a firewall guards \(host)")
        }
        self = .tcp(host: host, port: port)
    }

    /// `unix:PATH` or `HOST:PORT`.
    public var description: String {
        switch self {
        case .unix(let path): "unix:\(path)"
        case .tcp(let host, let port): host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        }
    }
}

/// A token API set-up problem, said for an operator: thrown by
/// ``ListenAddress/init(parsing:allowNonLoopback:)`` and ``TokenAPIService/prepare()``.
///
/// Its ``description`` says what is wrong and what to do; the tools and tests of this package
/// also tell the cases apart by `code`.
public struct TokenAPIError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong. More codes may come: match them with `==`, keep a `default`.
    package struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Value: String, Sendable {
            case invalidAddress, nonLoopbackAddress, socketDirectoryMissing, socketDirectoryUnsafe, notASocket, socketInUse, socketNotPlaced
        }

        fileprivate let value: Value

        /// The listen address is neither `unix:PATH` nor `HOST:PORT`.
        package static let invalidAddress = Code(value: .invalidAddress)
        /// A TCP address off loopback, not allowed.
        package static let nonLoopbackAddress = Code(value: .nonLoopbackAddress)
        /// The socket's directory does not exist.
        package static let socketDirectoryMissing = Code(value: .socketDirectoryMissing)
        /// The socket's directory belongs to another user or is writable by everyone.
        package static let socketDirectoryUnsafe = Code(value: .socketDirectoryUnsafe)
        /// Something other than a socket is at the socket's path.
        package static let notASocket = Code(value: .notASocket)
        /// Another process answers on the socket.
        package static let socketInUse = Code(value: .socketInUse)
        /// The socket, bound in private, could not be given its mode or moved to its path.
        package static let socketNotPlaced = Code(value: .socketNotPlaced)

        /// The code's name, e.g. `socketInUse`.
        package var description: String { value.rawValue }
    }

    /// What is wrong.
    package let code: Code
    /// The listen address as given, or the socket's path, at fault.
    public let address: String
    /// What is wrong and what to do.
    public let description: String

    package init(_ code: Code, _ address: String, _ description: String) {
        self.code = code
        self.address = address
        self.description = description
    }
}

/// Runs the token API on every listen address, until graceful shutdown; removes its socket
/// files when it stops. Add it to the `ServiceGroup` beside the engine.
public struct TokenAPIService: Service {
    let api: TokenAPI
    let engine: TokenSyncEngine
    let addresses: [ListenAddress]
    let socketMode: mode_t
    let logger: Logger
    let onListening: @Sendable (ListenAddress) -> Void
    /// Connection caps over every address (APIConnectionLimits.swift).
    let connectionGate: ConnectionGate

    /// A service for `api` on `addresses`; Unix sockets get `socketMode` (default 0660).
    /// `onListening` is called once per address when it accepts connections (a port 0 is
    /// reported with the port bound). `connectionLimits` caps the connections open at once, over
    /// every address and per peer (see ``APIConnectionLimits``); `sharedCaps`, when given, instead
    /// (caps drawn on with another service of the process, such as the Fleet Engine proxy).
    public init(api: TokenAPI, engine: TokenSyncEngine, addresses: [ListenAddress], socketMode: mode_t = 0o660,
                connectionLimits: APIConnectionLimits = APIConnectionLimits(), sharedCaps: SharedConnectionCaps? = nil,
                logger: Logger, onListening: @escaping @Sendable (ListenAddress) -> Void = { _ in }) {
        self.api = api
        self.engine = engine
        self.addresses = addresses
        self.socketMode = socketMode
        self.logger = logger
        self.onListening = onListening
        self.connectionGate = sharedCaps?.gate ?? ConnectionGate(limits: connectionLimits, logger: logger)
    }

    /// Checks every Unix socket path before anything listens: the directory, and no live agent
    /// on it. A stale socket file (its agent died) is left for the listener to replace.
    /// - Throws: ``TokenAPIError``.
    public func prepare() throws(TokenAPIError) {
        for case .unix(let path) in addresses { try SocketPath.check(path) }
    }

    /// Serves until graceful shutdown or cancellation.
    public func run() async throws {
        try prepare()
        let storeWrites = api.storeWrites
        let events = engine.events()
        // A socket that could not be put in place makes the service fail (and the agent stop)
        // rather than run unreachable.
        let (placementFailures, placementFailed) = AsyncStream.makeStream(of: TokenAPIError.self)
        defer { placementFailed.finish() }
        try await withThrowingDiscardingTaskGroup { group in
            // Cancelled at graceful shutdown (iterating a stream ends when its task is cancelled).
            group.addTask {
                try await cancelWhenGracefulShutdown { for await failure in placementFailures { throw failure } }
            }
            // Ends at graceful shutdown: the service group stops the engine only after this service.
            group.addTask { await cancelWhenGracefulShutdown { for await event in events { storeWrites.record(event) } } }
            // The invalidation limiter forgets a burst while nothing else is asked (state that
            // requests made must not outlive them).
            let limiter = api.limiter
            group.addTask { await cancelWhenGracefulShutdown { await limiter.sweepUntilCancelled() } }
            // Each application shuts down gracefully with the service group (finishing the
            // requests it has).
            for address in addresses {
                switch address {
                case .unix(let path):
                    let staging = try SocketStaging(path: path)
                    let gate = connectionGate
                    let app = application(api.router(for: .unix, peers: { gate.identity(of: $0) }), api.heldTokenRoute(.unix), address,
                                          bind: .unixDomainSocket(path: staging.stagedPath), staging: staging,
                                          placementFailed: placementFailed)
                    group.addTask {
                        defer { staging.discard() }
                        try await app.runService()
                    }
                case .tcp(let host, let port):
                    let app = application(api.router(for: .tcp(host: host)), api.heldTokenRoute(.tcp(host: host)), address, bind: .hostname(host, port: port), staging: nil,
                                          placementFailed: placementFailed)
                    group.addTask { try await app.runService() }
                }
            }
        }
        for case .unix(let path) in addresses { unlink(path) }
    }

    private func application(_ router: Router<TokenAPIRequestContext>, _ heldTokens: HeldTokenRoute, _ address: ListenAddress, bind: BindAddress,
                             staging: SocketStaging?,
                             placementFailed: AsyncStream<TokenAPIError>.Continuation) -> some ApplicationProtocol {
        let logger = logger
        let mode = socketMode
        let report = onListening
        var quiet = logger
        quiet.logLevel = max(logger.logLevel, .notice)
        return Application(
            router: router,
            // Slow or idle clients are dropped after 30 s; a request head is capped at 16 KiB
            // and 100 fields (the API's requests need a handful). Connections past the caps
            // (overall, per peer) are answered 503 and closed: APIConnectionLimits.swift.
            server: connectionGate.http1(configuration: .init(
                idleTimeout: .seconds(30),
                httpDecoderConfiguration: .init(maxHeaderFieldSize: 8 * 1024, maxHeaderListSize: 16 * 1024, maxHeaderFieldCount: 100)),
                unixSocket: { if case .unix = address { true } else { false } }(), heldTokens: heldTokens),
            configuration: .init(address: bind, serverName: nil, backlog: 1024),
            onServerRunning: { channel in
                switch address {
                case .unix(let path):
                    if let problem = staging?.place(mode: mode) {
                        logger.critical("the token API's socket could not be put in place: nobody can reach it", metadata: ["path": "\(path)", "error": "\(problem)"])
                        placementFailed.yield(TokenAPIError(.socketNotPlaced, path, "the token API's socket could not be moved to \(path): \(problem); check the socket directory's owner and mode"))
                        return
                    }
                    report(address)
                case .tcp(let host, _):
                    report(.tcp(host: host, port: channel.localAddress?.port ?? 0))
                }
            },
            logger: quiet)
    }
}

extension TokenAPIService: CustomStringConvertible {
    /// The listen addresses only: ServiceLifecycle logs services by their description, and the
    /// whole allow list of thousands of subjects does not belong in one log line.
    public var description: String { "TokenAPIService(\(addresses.map(\.description).joined(separator: ", ")))" }
}
