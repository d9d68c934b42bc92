// HandoutAudit: the token API's audit line once per caller, subject and token, in a table of
// fixed size (pure: no agent, no socket).

@testable import FleetTokenService
import FleetTokenStore
import Logging
import Testing

@Suite("HandoutAudit: once per caller, subject and token, in fixed memory", .paced)
struct HandoutAuditTests {
    @Test("a handout is logged the first time only; a new token, caller or pid is logged again")
    func once() throws {
        let audit = HandoutAudit(logger: Logger(label: "test"))
        let key = try TokenKey.vehicle("truck-7")
        #expect(audit.remember(uid: 1000, pid: 40, key: key, fingerprint: "fp-1"))
        #expect(!audit.remember(uid: 1000, pid: 40, key: key, fingerprint: "fp-1"))
        #expect(audit.remember(uid: 1000, pid: 40, key: key, fingerprint: "fp-2"), "a refreshed token")
        #expect(audit.remember(uid: 1000, pid: 41, key: key, fingerprint: "fp-2"), "another process")
        #expect(audit.remember(uid: 1001, pid: 41, key: key, fingerprint: "fp-2"), "another user")
        #expect(audit.remember(uid: 1001, pid: 41, key: try .trip("truck-7"), fingerprint: "fp-2"), "another subject")
    }

    @Test("no handout is missed, and the table does not grow, however many handouts pass")
    func neverMissedFixedMemory() throws {
        let audit = HandoutAudit(logger: Logger(label: "test"))
        let capacity = audit.capacity
        #expect(capacity >= HandoutAudit.slotCount)
        // Every distinct handout is new: each must say "log it".
        for index in 0..<60_000 {
            #expect(audit.remember(uid: 1000, pid: 7, key: try .trip("dyn-\(index)"), fingerprint: "fp-\(index)"), "handout \(index) missed")
        }
        #expect(audit.capacity == capacity)
        // Repeats of recent handouts are mostly remembered (a later one may have taken the slot).
        let repeated = (59_000..<60_000).count { index in
            !audit.remember(uid: 1000, pid: 7, key: try! .trip("dyn-\(index)"), fingerprint: "fp-\(index)")
        }
        #expect(repeated > 900, "\(repeated) of the last 1,000 handouts remembered")
    }
}
