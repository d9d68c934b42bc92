// The token API connection's idle rule with plain values: Hummingbird's rule, now kept by the
// held-token handler (which sees every request, held or routed).

@testable import FleetTokenService
import NIOCore
import Testing
import TestSupportKit

@Suite("token API connection idle rule", .paced)
struct ConnectionIdleRuleTests {
    let start = NIODeadline.uptimeNanoseconds(1_000_000_000_000)
    func at(_ seconds: Int64) -> NIODeadline { start + .seconds(seconds) }

    @Test("an untouched connection closes at the timeout; activity moves the deadline")
    func untouched() {
        var rule = ConnectionIdleRule(timeout: .seconds(30), now: start)
        #expect(rule.firstCheck() == at(30))
        #expect(rule.check(now: at(29)) == .checkAgain(at: at(30)))
        #expect(rule.check(now: at(30)) == .close)
        rule.read(head: true, end: true, now: at(10))
        #expect(rule.check(now: at(30)) == .waitForAnswer, "read whole, answer pending: never idle")
        #expect(rule.answered(now: at(12)) == at(42))
        #expect(rule.check(now: at(30)) == .checkAgain(at: at(42)))
        #expect(rule.check(now: at(42)) == .close)
    }

    @Test("a request still being read is idle once its parts stop coming (a stalled body does not hold the connection)")
    func stalledRequest() {
        var rule = ConnectionIdleRule(timeout: .seconds(5), now: start)
        rule.read(head: true, now: at(1))
        rule.read(now: at(3))
        #expect(rule.beingRead && rule.inProgress == 1)
        #expect(rule.check(now: at(5)) == .checkAgain(at: at(8)))
        #expect(rule.check(now: at(8)) == .close)
    }

    @Test("pipelined requests: the deadline starts when the last answer ends, not the first")
    func pipelined() {
        var rule = ConnectionIdleRule(timeout: .seconds(5), now: start)
        rule.read(head: true, end: true, now: at(1))
        rule.read(head: true, end: true, now: at(1))
        #expect(rule.answered(now: at(2)) == nil, "one answer still to come")
        #expect(rule.check(now: at(20)) == .waitForAnswer)
        #expect(rule.answered(now: at(21)) == at(26))
        #expect(rule.check(now: at(25)) == .checkAgain(at: at(26)))
        // An answer with no request (a parse error's 400) never takes the count below zero.
        #expect(rule.answered(now: at(30)) == at(35))
        #expect(rule.inProgress == 0)
    }

    @Test("a request still being read behind one waiting for its answer: when that answer ends, the check starts again, and the stalled request is idle")
    func stalledBehindWaiting() {
        var rule = ConnectionIdleRule(timeout: .seconds(5), now: start)
        rule.read(head: true, end: true, now: at(1))           // R1, read whole, its answer slow
        #expect(rule.check(now: at(6)) == .waitForAnswer)       // the check stops here
        rule.read(head: true, now: at(7))                       // R2's head; its body never comes
        #expect(rule.answered(now: at(8)) == at(12), "R1's answer ends: check again at R2's last part + 5 s")
        #expect(rule.check(now: at(12)) == .close)
    }
}
