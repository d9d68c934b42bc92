// Service layer: caps on the token API's concurrent connections, overall and per peer, within
// the process's open-files limit minus a reserve for the store, the provider client and logs.
// Without them, idle clients could take every descriptor: the measured defect was a cached-token
// GET timing out and SQLite failing with "unable to open database file" (issue 26 item 5).

#if canImport(Glibc)
import Glibc
#endif
import Foundation
import HummingbirdCore
import Logging
import NIOCore
import Synchronization

/// Caps on the token API's concurrent connections, given to ``TokenAPIService``.
///
/// A connection past a cap is answered `503 Service Unavailable` with `Retry-After: 1` and
/// closed at once, before its request is read, so that it never holds a descriptor. The overall
/// cap in force is the smaller of ``maxConnections`` and what the open-files limit
/// (`RLIMIT_NOFILE`, soft) leaves once the descriptors open when the API starts and
/// ``descriptorReserve`` more are set aside: the store's SQLite files, the provider client's
/// connections and the logs must always find a descriptor.
///
/// A peer is the client's IP address on TCP (every loopback client is `127.0.0.1`: one peer)
/// and the client's user (`SO_PEERCRED`) on a Unix socket.
public struct APIConnectionLimits: Sendable, Equatable {
    /// The default overall cap: 4,096 connections.
    public static let defaultMaxConnections = 4096
    /// The default reserve: 64 descriptors.
    public static let defaultDescriptorReserve = 64
    /// The idle timeout of connections accepted while half the overall cap or more is in use
    /// (others get the API's usual 30 s): 5 s.
    public static let busyIdleTimeout: Duration = .seconds(5)

    /// Most connections open at once, over every listen address. Default 4,096.
    public var maxConnections: Int
    /// Most connections open at once from one peer; nil (the default): half the overall cap in
    /// force, so that no single client can take every slot.
    public var maxConnectionsPerPeer: Int?
    /// Descriptors kept free beyond those open when the API starts. Default 64.
    public var descriptorReserve: Int

    /// Caps of `maxConnections` overall and `maxConnectionsPerPeer` per peer (nil: half the
    /// overall cap in force), keeping `descriptorReserve` descriptors free.
    public init(maxConnections: Int = defaultMaxConnections, maxConnectionsPerPeer: Int? = nil,
                descriptorReserve: Int = defaultDescriptorReserve) {
        self.maxConnections = maxConnections
        self.maxConnectionsPerPeer = maxConnectionsPerPeer
        self.descriptorReserve = descriptorReserve
    }

    /// The caps in force for a process whose open-files limit is `openFilesLimit` (nil:
    /// unlimited) and which has `openDescriptors` open. Every cap is at least 1.
    public func caps(openFilesLimit: Int?, openDescriptors: Int) -> APIConnectionCaps {
        let configured = max(1, maxConnections)
        let available = openFilesLimit.map { $0 - openDescriptors - max(0, descriptorReserve) }
        let overall: Int
        let reason: String
        if let available, let openFilesLimit, available < configured {
            overall = max(1, available)
            reason = "open-files limit \(openFilesLimit) minus \(openDescriptors) descriptors open at start minus a reserve of \(descriptorReserve) for the store, the provider client and logs (configured \(configured))"
        } else {
            overall = configured
            reason = "configured" + (openFilesLimit.map { " (open-files limit \($0))" } ?? "")
        }
        let perPeer = min(max(1, maxConnectionsPerPeer ?? overall / 2), overall)
        return APIConnectionCaps(overall: overall, perPeer: perPeer, busyThreshold: max(1, overall / 2),
                                 limitedByOpenFiles: available.map { $0 < configured } ?? false, reason: reason)
    }

    /// The caps in force in this process now: its soft `RLIMIT_NOFILE` and the entries of
    /// `/proc/self/fd`.
    public func capsInForce() -> APIConnectionCaps {
        caps(openFilesLimit: ProcessDescriptors.openFilesLimit(), openDescriptors: ProcessDescriptors.openCount())
    }
}

/// The connection caps in force, from ``APIConnectionLimits/caps(openFilesLimit:openDescriptors:)``.
public struct APIConnectionCaps: Sendable, Equatable, CustomStringConvertible {
    /// Most connections open at once, over every listen address.
    public let overall: Int
    /// Most connections open at once from one peer.
    public let perPeer: Int
    /// From this many open connections on, a new one gets the short idle timeout
    /// (``APIConnectionLimits/busyIdleTimeout``).
    public let busyThreshold: Int
    /// The open-files limit, not the configured cap, set ``overall``.
    public let limitedByOpenFiles: Bool
    /// Why ``overall`` is what it is, for the log.
    public let reason: String

    /// `overall=N per_peer=M (reason)`.
    public var description: String { "overall=\(overall) per_peer=\(perPeer) (\(reason))" }
}

/// The process's descriptors.
enum ProcessDescriptors {
    /// The soft `RLIMIT_NOFILE`; nil when unlimited or unknown.
    static func openFilesLimit() -> Int? {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur != rlim_t.max else { return nil }
        return Int(clamping: limit.rlim_cur)
    }

    /// Descriptors open now (the entries of /proc/self/fd but the one reading it); 0 if unknown.
    static func openCount() -> Int {
        guard let directory = opendir("/proc/self/fd") else { return 0 }
        defer { closedir(directory) }
        var count = 0
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name != "." && name != ".." { count += 1 }
        }
        return max(0, count - 1)
    }
}

/// Whom a connection counts against for the per-peer cap.
enum ConnectionPeer: Hashable, Sendable, CustomStringConvertible {
    /// A TCP client's IP address.
    case address(String)
    /// A Unix-socket client's user.
    case user(uid_t)
    /// A Unix-socket client whose credentials could not be read: one shared bucket.
    case unixSocket

    var description: String {
        switch self {
        case .address(let address): address
        case .user(let uid): "uid \(uid)"
        case .unixSocket: "unix socket"
        }
    }

    /// The peer of an accepted connection; on the channel's event loop.
    static func of(_ channel: any Channel, unixSocket: Bool) -> ConnectionPeer {
        of(channel, unixSocket: unixSocket, identity: unixSocket ? identity(channel) : nil)
    }

    /// The peer of an accepted connection whose caller's `identity` was read already.
    static func of(_ channel: any Channel, unixSocket: Bool, identity: PeerIdentity?) -> ConnectionPeer {
        guard unixSocket else { return .address(channel.remoteAddress?.ipAddress ?? "unknown") }
        return identity.map { .user($0.uid) } ?? .unixSocket
    }

    /// A Unix-socket caller's identity: `SO_PEERCRED`, and `SO_PEERGROUPS` for its
    /// supplementary groups. On the event loop the options are read synchronously and the
    /// futures are complete when returned, so their callbacks run before this returns.
    static func identity(_ channel: any Channel) -> PeerIdentity? {
        guard channel.eventLoop.inEventLoop, let provider = channel as? any SocketOptionProvider else { return nil }
        let credentials: EventLoopFuture<PeerCredentials> = provider.unsafeGetSocketOption(level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(SO_PEERCRED))
        var found: PeerCredentials?
        credentials.assumeIsolated().whenSuccess { found = $0 }
        guard let found else { return nil }
        // Linux's SO_PEERGROUPS (59): the groups fill the front of a zeroed buffer, sorted, and
        // the length is not returned: trailing zeros are the buffer's (group 0, sorted first,
        // is kept when other groups follow it; a caller whose only supplementary group is 0
        // loses it, failing closed). More than 64 groups fail with ERANGE: then only the
        // primary group counts.
        let groupsFuture: EventLoopFuture<PeerGroups> = provider.unsafeGetSocketOption(level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(59))
        var groups: [gid_t] = []
        groupsFuture.assumeIsolated().whenSuccess { list in
            let all = withUnsafeBytes(of: list) { Array($0.bindMemory(to: gid_t.self)) }
            groups = all.lastIndex(where: { $0 != 0 }).map { Array(all[...$0]) } ?? []
        }
        return PeerIdentity(uid: found.uid, gid: found.gid, pid: found.pid, groups: groups)
    }
}

/// Room for 64 supplementary group ids, as `getsockopt(SO_PEERGROUPS)` fills it.
struct PeerGroups: Sendable {
    var ids: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64,
              UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64)
        = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
}

/// Linux's `struct ucred` (which Glibc's module map leaves out without `_GNU_SOURCE`), as
/// `getsockopt(SO_PEERCRED)` fills it: three 32-bit fields.
struct PeerCredentials: Sendable {
    var pid: Int32 = 0
    var uid: uid_t = 0
    var gid: gid_t = 0
}

/// Counts the API's open connections, overall and per peer, over every listener of one
/// ``TokenAPIService``, and admits or refuses each new one.
final class ConnectionGate: Sendable {
    enum Admission: Equatable {
        /// Admitted; `busy`: with the short idle timeout.
        case admitted(busy: Bool)
        /// Refused: the overall cap (`open` connections) is reached.
        case refusedOverall(open: Int)
        /// Refused: the peer's cap (`open` connections from it) is reached.
        case refusedPerPeer(open: Int)
    }

    private struct State {
        var caps: APIConnectionCaps?
        var open = 0
        var byPeer: [ConnectionPeer: Int] = [:]
        var refusedSinceLog = 0
        var lastRefusalLog: ContinuousClock.Instant?
        var lingering = 0
    }

    /// Refused connections that may wait for their request at once (each holds a descriptor
    /// beyond the caps, for at most ``refusalLinger``): a few, well within the reserve.
    static let maxLingering = 8
    /// How long a refused connection waits for its request to be read before it closes: reading
    /// it first lets the close end in a FIN, not a reset that could overtake the 503.
    static let refusalLinger = TimeAmount.milliseconds(100)

    let limits: APIConnectionLimits
    private let logger: Logger
    private let state = Mutex(State())
    /// The identity of each open Unix-socket connection's caller, read when it was accepted.
    private let identities = Mutex<[ObjectIdentifier: PeerIdentity]>([:])

    init(limits: APIConnectionLimits, logger: Logger) {
        self.limits = limits
        self.logger = logger
    }

    /// The caps in force, resolved (and logged) the first time: when the first listener starts,
    /// after the agent raised its open-files limit and opened its store.
    var caps: APIConnectionCaps {
        if let caps = state.withLock({ $0.caps }) { return caps }
        let resolved = limits.capsInForce()
        let first = state.withLock { state -> Bool in
            guard state.caps == nil else { return false }
            state.caps = resolved
            return true
        }
        if first {
            logger.notice("token API connection caps in force", metadata: [
                "overall": "\(resolved.overall)", "per_peer": "\(resolved.perPeer)", "reason": "\(resolved.reason)",
                "busy_idle_timeout": "\(APIConnectionLimits.busyIdleTimeout.components.seconds) s from \(resolved.busyThreshold) open",
            ])
            if resolved.limitedByOpenFiles && resolved.overall < 64 {
                logger.warning("the open-files limit leaves the token API few connections: raise it (systemd: LimitNOFILE=)",
                               metadata: ["overall": "\(resolved.overall)", "reason": "\(resolved.reason)"])
            }
        }
        return state.withLock { $0.caps! }
    }

    /// Admits a new connection from `peer` (counting it) or refuses it (counting nothing).
    func admit(_ peer: ConnectionPeer) -> Admission {
        let caps = caps
        let now = ContinuousClock.now
        let (admission, report) = state.withLock { state -> (Admission, Int?) in
            let fromPeer = state.byPeer[peer, default: 0]
            let admission: Admission
            if state.open >= caps.overall {
                admission = .refusedOverall(open: state.open)
            } else if fromPeer >= caps.perPeer {
                admission = .refusedPerPeer(open: fromPeer)
            } else {
                let busy = state.open >= caps.busyThreshold
                state.open += 1
                state.byPeer[peer] = fromPeer + 1
                return (.admitted(busy: busy), nil)
            }
            // One warning per 10 s at most, with how many were refused since the last one.
            state.refusedSinceLog += 1
            guard state.lastRefusalLog.map({ now - $0 >= .seconds(10) }) ?? true else { return (admission, nil) }
            defer { state.refusedSinceLog = 0 }
            state.lastRefusalLog = now
            return (admission, state.refusedSinceLog)
        }
        if let refused = report {
            let which = if case .refusedOverall = admission { "overall" } else { "per peer" }
            logger.warning("token API connections refused at the cap (answered 503)", metadata: [
                "cap": "\(which)", "overall": "\(caps.overall)", "per_peer": "\(caps.perPeer)", "peer": "\(peer)", "refused": "\(refused)",
            ])
        }
        return admission
    }

    /// The caller on the open connection `connection` (a Unix socket's), if known.
    func identity(of connection: ObjectIdentifier) -> PeerIdentity? {
        identities.withLock { $0[connection] }
    }

    fileprivate func remember(_ identity: PeerIdentity, for connection: ObjectIdentifier) {
        identities.withLock { $0[connection] = identity }
    }

    fileprivate func forget(_ connection: ObjectIdentifier) {
        identities.withLock { _ = $0.removeValue(forKey: connection) }
    }

    /// Forgets a connection admitted from `peer`.
    func release(_ peer: ConnectionPeer) {
        state.withLock { state in
            state.open -= 1
            let left = state.byPeer[peer, default: 1] - 1
            state.byPeer[peer] = left > 0 ? left : nil
        }
    }

    /// Takes one of the few slots for a refused connection waiting for its request; false: close it at once.
    func beginLinger() -> Bool {
        state.withLock { state in
            guard state.lingering < Self.maxLingering else { return false }
            state.lingering += 1
            return true
        }
    }

    /// Gives back a slot taken by ``beginLinger()``.
    func endLinger() {
        state.withLock { $0.lingering -= 1 }
    }

    /// Open connections now, overall and from `peer`.
    func openConnections(from peer: ConnectionPeer) -> (overall: Int, peer: Int) {
        state.withLock { ($0.open, $0.byPeer[peer, default: 0]) }
    }

    /// An HTTP/1 server whose connections pass this gate first; `configuration`'s idle timeout
    /// for connections accepted below the busy threshold, the shorter busy one above it.
    /// Resolves (and logs) the caps now, as the listener starts.
    func http1(configuration: HTTP1Channel.Configuration, unixSocket: Bool) -> HTTPServerBuilder {
        _ = caps
        var shortened = configuration
        let short = TimeAmount.nanoseconds(Int64(APIConnectionLimits.busyIdleTimeout.components.seconds) * 1_000_000_000)
        shortened.idleTimeout = configuration.idleTimeout.map { min($0, short) } ?? short
        let busy = shortened
        return HTTPServerBuilder { responder in
            GatedHTTP1Channel(normal: HTTP1Channel(responder: responder, configuration: configuration),
                              busy: HTTP1Channel(responder: responder, configuration: busy), gate: self, unixSocket: unixSocket)
        }
    }
}

/// Hummingbird's HTTP/1 child channel behind a ``ConnectionGate``: an admitted connection is
/// set up as usual and released when it closes; a refused one gets a handler in front of the
/// HTTP codec that answers 503 and closes it.
struct GatedHTTP1Channel: ServerChildChannel {
    typealias Value = HTTP1Channel.Value

    let normal: HTTP1Channel
    let busy: HTTP1Channel
    let gate: ConnectionGate
    let unixSocket: Bool

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        guard channel.eventLoop.inEventLoop else {
            return channel.eventLoop.flatSubmit { self.setup(channel: channel, logger: logger) }
        }
        let identity = unixSocket ? ConnectionPeer.identity(channel) : nil
        let peer = ConnectionPeer.of(channel, unixSocket: unixSocket, identity: identity)
        let admission = gate.admit(peer)
        guard case .admitted(let isBusy) = admission else {
            let caps = gate.caps
            do {
                try channel.pipeline.syncOperations.addHandler(RefusedConnectionHandler(Self.refusal(admission, caps: caps), gate: gate))
            } catch {
                channel.close(promise: nil)
            }
            return normal.setup(channel: channel, logger: logger)
        }
        let gate = gate
        let connection = ObjectIdentifier(channel)
        if let identity { gate.remember(identity, for: connection) }
        channel.closeFuture.whenComplete { _ in
            gate.release(peer)
            if identity != nil { gate.forget(connection) }
        }
        return (isBusy ? busy : normal).setup(channel: channel, logger: logger)
    }

    func handle(value: Value, logger: Logger) async {
        await normal.handle(value: value, logger: logger)
    }

    /// The whole `503` answer to a refused connection.
    static func refusal(_ admission: ConnectionGate.Admission, caps: APIConnectionCaps) -> String {
        let message = switch admission {
        case .refusedPerPeer:
            "this client already has \(caps.perPeer) connections open to the token agent, its cap per peer (max-api-connections-per-peer): close idle connections or reuse one, and retry"
        default:
            "the token agent has \(caps.overall) connections open, its cap (max-api-connections, within the open-files limit): retry shortly"
        }
        let body = "{\"error\":\(JSONText.quoted(message))}"
        return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + body
    }
}

/// In front of the HTTP codec of a refused connection: writes the 503 answer as soon as the
/// connection is active and closes. When one of the gate's few linger slots is free it first
/// waits (at most ``ConnectionGate/refusalLinger``) for the client's request and reads it: a
/// socket closed with unread data sends a reset, which the client may see instead of the 503.
final class RefusedConnectionHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let answer: String
    private let gate: ConnectionGate
    private var written: EventLoopFuture<Void>?
    private var lingering = false
    private var deadline: Scheduled<Void>?

    init(_ answer: String, gate: ConnectionGate) {
        self.answer = answer
        self.gate = gate
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { refuse(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        refuse(context)
        context.fireChannelActive()
    }

    /// The request (or what came of it): dropped; the answer is out, so close now.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        closeWhenWritten(context)
    }

    func channelInactive(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
        if lingering {
            lingering = false
            gate.endLinger()
        }
        context.fireChannelInactive()
    }

    private func refuse(_ context: ChannelHandlerContext) {
        guard written == nil else { return }
        let promise = context.eventLoop.makePromise(of: Void.self)
        written = promise.futureResult
        context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(string: answer)), promise: promise)
        guard gate.beginLinger() else { return closeWhenWritten(context) }
        lingering = true
        deadline = context.eventLoop.assumeIsolated().scheduleTask(in: ConnectionGate.refusalLinger) { self.closeWhenWritten(context) }
    }

    private func closeWhenWritten(_ context: ChannelHandlerContext) {
        guard let written else { return }
        written.assumeIsolated().whenComplete { _ in
            if context.channel.isActive { context.close(promise: nil) }
        }
    }
}

@available(*, unavailable)
extension RefusedConnectionHandler: Sendable {}
