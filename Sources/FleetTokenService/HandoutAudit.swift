// Service layer: the audit line of the token API: which caller (uid, pid) received which
// subject's token, by fingerprint, once per caller, subject and token.

import FleetTokenStore
import Logging
import Synchronization

/// Logs (`info`) each token handed to an identified caller once per caller, subject and token.
///
/// Remembers handouts in a fixed table of ``slotCount`` hashes, allocated once: a handout
/// takes the slot its hash picks, so another handout that lands there later makes it be logged
/// again (a line may repeat, never be missed). Its memory is the same after one request or a
/// million, and nothing is left to give back when a wave of subjects has gone (a set of the
/// last 10,000 handouts kept 0.8 MiB of storage and their strings after the wave: heaptrack on
/// the bounded-state benchmark).
final class HandoutAudit: Sendable {
    /// Slots in the table (64-bit hashes: 128 KiB).
    static let slotCount = 16_384
    private let slots = Mutex<[UInt64]>(Array(repeating: 0, count: HandoutAudit.slotCount))
    private let logger: Logger

    init(logger: Logger) {
        self.logger = logger
    }

    /// Logs that `peer` received `key`'s token with `fingerprint`, unless already logged.
    func record(_ peer: PeerIdentity, key: TokenKey, fingerprint: String) {
        guard remember(uid: peer.uid, pid: peer.pid, key: key, fingerprint: fingerprint) else { return }
        logger.info("token handed to a local client", metadata: [
            "uid": "\(peer.uid)", "pid": "\(peer.pid)", "key": "\(key)", "fingerprint": "\(fingerprint)",
        ])
    }

    /// Puts the handout in its slot; true when the slot did not already hold it (log it).
    func remember(uid: UInt32, pid: Int32, key: TokenKey, fingerprint: String) -> Bool {
        var hasher = Hasher()
        hasher.combine(uid)
        hasher.combine(pid)
        hasher.combine(key)
        hasher.combine(fingerprint)
        // 0 marks an empty slot. Hasher is seeded per process, so no caller can aim a handout
        // at another's slot (or forge a match: that needs all 64 bits).
        let hash = UInt64(bitPattern: Int64(hasher.finalize())) | 1
        let index = Int(truncatingIfNeeded: hash >> 1) & (Self.slotCount - 1)
        return slots.withLock { slots in
            guard slots[index] != hash else { return false }
            slots[index] = hash
            return true
        }
    }

    /// The table's size, in slots (for tests that it does not grow).
    var capacity: Int { slots.withLock { $0.capacity } }
}
