// The development issuer's record of when it issued each subject's tokens (GET /stats/issued)
// keeps the latest times only: a demo agent left running grew it by one value per refresh of
// each subject, for as long as it ran. Plain values.

@testable import DevTokenIssuer
import Foundation
import Testing

@Suite("The development issuer's counters", .paced)
struct IssuerCountersTests {
    @Test("issue times are kept per subject up to a bound, the latest ones")
    func issueTimesBounded() {
        let counters = Counters(recordingTokens: false)
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        let issues = Counters.issuedTimesKept + 500
        for index in 0..<issues {
            counters.noteIssued(kind: "vehicle", subject: "a", at: start + Double(index), token: "t")
        }
        counters.noteIssued(kind: "trip", subject: "b", at: start, token: "t")
        let times = counters.issuedAt.withLock { $0 }
        #expect(times["vehicle/a"]?.count == Counters.issuedTimesKept)
        #expect(times["vehicle/a"]?.last == (start + Double(issues - 1)).timeIntervalSince1970, "the latest kept")
        #expect(times["vehicle/a"]?.first == (start + 500).timeIntervalSince1970, "the oldest dropped")
        #expect(times["trip/b"]?.count == 1)
        #expect(counters.issued.withLock { $0 } == issues + 1, "every issue still counted")
    }
}
