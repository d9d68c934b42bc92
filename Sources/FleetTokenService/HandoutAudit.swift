// Service layer: the audit line of the token API: which caller (uid, pid) received which
// subject's token, by fingerprint, once per caller, subject and token.

import FleetTokenStore
import Logging
import Synchronization

/// Logs (`info`) each token handed to an identified caller once per caller, subject and token.
/// Remembers at most ``capacity`` handouts: past it, it starts over (a handout may then be
/// logged twice, never missed), so its memory does not grow with requests.
final class HandoutAudit: Sendable {
    private struct Handout: Hashable {
        let uid: UInt32
        let pid: Int32
        let key: TokenKey
        let fingerprint: String
    }

    static let capacity = 10_000
    private let seen = Mutex<Set<Handout>>([])
    private let logger: Logger

    init(logger: Logger) {
        self.logger = logger
    }

    /// Logs that `peer` received `key`'s token with `fingerprint`, unless already logged.
    func record(_ peer: PeerIdentity, key: TokenKey, fingerprint: String) {
        let handout = Handout(uid: peer.uid, pid: peer.pid, key: key, fingerprint: fingerprint)
        let first = seen.withLock { seen in
            if seen.count >= Self.capacity { seen.removeAll(keepingCapacity: true) }
            return seen.insert(handout).inserted
        }
        guard first else { return }
        logger.info("token handed to a local client", metadata: [
            "uid": "\(peer.uid)", "pid": "\(peer.pid)", "key": "\(key)", "fingerprint": "\(fingerprint)",
        ])
    }
}
