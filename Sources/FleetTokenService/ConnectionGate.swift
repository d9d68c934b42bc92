// Service layer: the token API's connection gate: counts open connections, overall and per
// peer, against the caps in force (APIConnectionLimits) and admits or refuses each new one.

import HummingbirdCore
package import Logging
import NIOCore
import Synchronization

/// Counts the API's open connections, overall and per peer, over every listener of one
/// ``TokenAPIService``, and admits or refuses each new one.
package final class ConnectionGate: Sendable {
    package enum Admission: Equatable {
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

    package let limits: APIConnectionLimits
    /// Whose connections these are, for the log ("token API", "Fleet Engine proxy").
    private let component: String
    private let logger: Logger
    private let state = Mutex(State())
    /// The identity of each open Unix-socket connection's caller, read when it was accepted.
    private let identities = Mutex<[ObjectIdentifier: PeerIdentity]>([:])

    package init(limits: APIConnectionLimits, component: String = "token API", logger: Logger) {
        self.limits = limits
        self.component = component
        self.logger = logger
    }

    /// The caps in force, resolved (and logged) the first time: when the first listener starts,
    /// after the agent raised its open-files limit and opened its store.
    package var caps: APIConnectionCaps {
        if let caps = state.withLock({ $0.caps }) { return caps }
        let resolved = limits.capsInForce()
        let first = state.withLock { state -> Bool in
            guard state.caps == nil else { return false }
            state.caps = resolved
            return true
        }
        if first {
            logger.notice("\(component) connection caps in force", metadata: [
                "overall": "\(resolved.overall)", "per_peer": "\(resolved.perPeer)", "reason": "\(resolved.reason)",
                "busy_idle_timeout": "\(APIConnectionLimits.busyIdleTimeout.components.seconds) s from \(resolved.busyThreshold) open",
            ])
            if resolved.limitedByOpenFiles && resolved.overall < 64 {
                logger.warning("the open-files limit leaves the \(component) few connections: raise it (systemd: LimitNOFILE=)",
                               metadata: ["overall": "\(resolved.overall)", "reason": "\(resolved.reason)"])
            }
        }
        return state.withLock { $0.caps! }
    }

    /// Admits a new connection from `peer` (counting it) or refuses it (counting nothing).
    package func admit(_ peer: ConnectionPeer) -> Admission {
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
            logger.warning("\(component) connections refused at the cap (answered 503)", metadata: [
                "cap": "\(which)", "overall": "\(caps.overall)", "per_peer": "\(caps.perPeer)", "peer": "\(peer)", "refused": "\(refused)",
            ])
        }
        return admission
    }

    /// The caller on the open connection `connection` (a Unix socket's), if known.
    func identity(of connection: ObjectIdentifier) -> PeerIdentity? {
        identities.withLock { $0[connection] }
    }

    func remember(_ identity: PeerIdentity, for connection: ObjectIdentifier) {
        identities.withLock { $0[connection] = identity }
    }

    func forget(_ connection: ObjectIdentifier) {
        identities.withLock { _ = $0.removeValue(forKey: connection) }
    }

    /// Forgets a connection admitted from `peer`.
    package func release(_ peer: ConnectionPeer) {
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
    /// for connections accepted below the busy threshold, the shorter busy one above it;
    /// `heldTokens` answers held tokens on each connection's event loop, and then keeps the idle
    /// timeouts (Hummingbird's connection handler, which does not see those requests, keeps none).
    /// Resolves (and logs) the caps now, as the listener starts.
    func http1(configuration: HTTP1Channel.Configuration, unixSocket: Bool, heldTokens: HeldTokenRoute?) -> HTTPServerBuilder {
        _ = caps
        let short = TimeAmount.nanoseconds(Int64(APIConnectionLimits.busyIdleTimeout.components.seconds) * 1_000_000_000)
        let idleTimeouts = (normal: configuration.idleTimeout, busy: configuration.idleTimeout.map { min($0, short) } ?? short)
        var (normal, busy) = (configuration, configuration)
        (normal.idleTimeout, busy.idleTimeout) = heldTokens == nil ? (idleTimeouts.normal, idleTimeouts.busy) : (nil, nil)
        let (normalConfiguration, busyConfiguration) = (normal, busy)
        return HTTPServerBuilder { responder in
            GatedHTTP1Channel(normal: HTTP1Channel(responder: responder, configuration: normalConfiguration),
                              busy: HTTP1Channel(responder: responder, configuration: busyConfiguration), gate: self, unixSocket: unixSocket,
                              heldTokens: heldTokens, idleTimeouts: idleTimeouts)
        }
    }
}
