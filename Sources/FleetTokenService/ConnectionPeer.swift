// Service layer: whom a token API connection counts against for the per-peer cap (a TCP
// client's address, a Unix-socket caller's user), and the caller's identity as the kernel says.

#if canImport(Glibc)
package import Glibc
#endif
package import NIOCore

/// Whom a connection counts against for the per-peer cap.
package enum ConnectionPeer: Hashable, Sendable, CustomStringConvertible {
    /// A TCP client's IP address.
    case address(String)
    /// A Unix-socket client's user.
    case user(uid_t)
    /// A Unix-socket client whose credentials could not be read: one shared bucket.
    case unixSocket

    package var description: String {
        switch self {
        case .address(let address): address
        case .user(let uid): "uid \(uid)"
        case .unixSocket: "unix socket"
        }
    }

    /// The peer of an accepted connection; on the channel's event loop.
    package static func of(_ channel: any Channel, unixSocket: Bool) -> ConnectionPeer {
        of(channel, unixSocket: unixSocket, identity: unixSocket ? identity(channel) : nil)
    }

    /// The peer of an accepted connection whose caller's `identity` was read already.
    package static func of(_ channel: any Channel, unixSocket: Bool, identity: PeerIdentity?) -> ConnectionPeer {
        guard unixSocket else { return .address(channel.remoteAddress?.ipAddress ?? "unknown") }
        return identity.map { .user($0.uid) } ?? .unixSocket
    }

    /// A Unix-socket caller's identity: `SO_PEERCRED`, and `SO_PEERGROUPS` for its
    /// supplementary groups. On the event loop the options are read synchronously and the
    /// futures are complete when returned, so their callbacks run before this returns.
    package static func identity(_ channel: any Channel) -> PeerIdentity? {
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
