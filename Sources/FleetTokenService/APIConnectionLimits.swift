// Service layer: caps on the token API's concurrent connections, overall and per peer, within
// the process's open-files limit minus a reserve for the store, the provider client and logs.
// Without them, idle clients could take every descriptor: the measured defect was a cached-token
// GET timing out and SQLite failing with "unable to open database file" (issue 26 item 5).
// The gate that enforces them is ConnectionGate.swift.

public import Logging
#if canImport(Glibc)
import Glibc
#endif

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
    package static let busyIdleTimeout: Duration = .seconds(5)

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
    package func caps(openFilesLimit: Int?, openDescriptors: Int) -> APIConnectionCaps {
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
    package func capsInForce() -> APIConnectionCaps {
        caps(openFilesLimit: ProcessDescriptors.openFilesLimit(), openDescriptors: ProcessDescriptors.openCount())
    }
}

/// The connection caps in force, from ``APIConnectionLimits/caps(openFilesLimit:openDescriptors:)``.
package struct APIConnectionCaps: Sendable, Equatable, CustomStringConvertible {
    /// Most connections open at once, over every listen address.
    package let overall: Int
    /// Most connections open at once from one peer.
    package let perPeer: Int
    /// From this many open connections on, a new one gets the short idle timeout
    /// (``APIConnectionLimits/busyIdleTimeout``).
    package let busyThreshold: Int
    /// The open-files limit, not the configured cap, set ``overall``.
    package let limitedByOpenFiles: Bool
    /// Why ``overall`` is what it is, for the log.
    package let reason: String

    /// `overall=N per_peer=M (reason)`.
    package var description: String { "overall=\(overall) per_peer=\(perPeer) (\(reason))" }
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

/// One set of connection caps for every service of a process that takes ``APIConnectionLimits``
/// (the token API and the Fleet Engine proxy): the open-files limit is the process's, and its
/// reserve for the store, the provider client and the logs holds only when every listener draws
/// on one budget. Services given separate limits would each count the descriptors free as theirs.
///
/// The caps in force (overall and per peer) apply to the connections of all of them together.
public final class SharedConnectionCaps: Sendable {
    package let gate: ConnectionGate

    /// Caps `limits` over every listener of the services given this value; `component` names
    /// them in the log lines about the caps.
    public init(limits: APIConnectionLimits = APIConnectionLimits(), component: String = "token API and Fleet Engine proxy", logger: Logger) {
        gate = ConnectionGate(limits: limits, component: component, logger: logger)
    }
}
