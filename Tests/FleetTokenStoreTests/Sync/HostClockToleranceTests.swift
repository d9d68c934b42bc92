// Hosts sharing a store judge each other's failures across small clock differences (issue 27
// item 10): a failure another host recorded a few seconds "in our future" is that host's clock,
// not a step of ours, and its backoff holds; the bound is the one the lease protocol tolerates.

import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("Backoff across hosts whose clocks differ a little", .paced)
struct HostClockToleranceTests {
    let key = try! TokenKey.vehicle("shared-backoff")

    @Test("the rule: a failure recorded up to two thirds of the lease duration after now is honoured; later, the clock was stepped back")
    func rule() {
        let t = TestTime.defaultStart
        let failure = RefreshFailureState(consecutiveFailures: 1, nextAttemptAt: t + 20, lastErrorKind: "httpStatus",
                                          lastFailureAt: t)
        let policy = RefreshPolicy()
        #expect(policy.hostClockTolerance == 20) // the lease (30 s) is renewed every 10 s
        #expect(RefreshMachine(policy: policy).isBackingOff(failure, at: t))
        #expect(RefreshMachine(policy: policy).isBackingOff(failure, at: t - 5)) // a host 5 s behind
        #expect(RefreshMachine(policy: policy).isBackingOff(failure, at: t - 20))
        #expect(!RefreshMachine(policy: policy).isBackingOff(failure, at: t - 20.5)) // a step back
        #expect(!RefreshMachine(policy: policy).isBackingOff(failure, at: t - 3600))
        #expect(!RefreshMachine(policy: policy).isBackingOff(failure, at: t + 20)) // over
        var longLease = RefreshPolicy()
        longLease.leaseDuration = 90
        #expect(longLease.hostClockTolerance == 60)
        #expect(RefreshMachine(policy: longLease).isBackingOff(failure, at: t - 50))
    }

    /// Host A (clock `time`) fails `key` with `503, Retry-After 20` on a fresh store in `dir`,
    /// and returns the stored failure.
    func failOnHostA(_ dir: Scratch, time: TestTime) async throws -> RefreshFailureState {
        let store = try openStore(dir.file("tokens.sqlite"))
        let failing = ScriptedFetcher { _, _ throws(TokenProviderError) in throw .httpStatus(code: 503, retryAfter: 20) }
        let engine = TokenSyncEngine(repository: store, fetcher: failing, logger: Logger(label: "host-a"),
                                     clock: time.clock, now: time.wall, random: { 0.5 })
        await #expect(throws: TokenUnavailable.self) { try await engine.token(for: key) }
        return try #require(try await store.entry(for: key)?.failure)
    }

    @Test("a host 5 s behind honours another host's backoff, then fetches once it is over by its own clock")
    func hostBehindHonoursTheBackoff() async throws {
        let dir = Scratch()
        let hostA = TestTime()
        let failure = try await failOnHostA(dir, time: hostA)
        #expect(failure.lastFailureAt == hostA.now)

        let hostB = TestTime(start: TestTime.defaultStart - 5) // host B's clock is 5 s behind
        let fetcher = ScriptedFetcher.minting(hostB)
        let engine = TokenSyncEngine(repository: try openStore(dir.file("tokens.sqlite")), fetcher: fetcher,
                                     logger: Logger(label: "host-b"), clock: hostB.clock, now: hostB.wall, random: { 0.5 })
        let error = await #expect(throws: TokenUnavailable.self) { try await engine.token(for: key) }
        #expect(error?.nextAttemptAt == failure.nextAttemptAt)
        #expect(fetcher.total == 0, "host B ignored host A's backoff")

        await hostB.advance(by: failure.nextAttemptAt.timeIntervalSince(hostB.now) + 0.01)
        _ = try await engine.token(for: key)
        #expect(fetcher.total == 1)
    }

    @Test("beyond the bound a failure in our future means our clock was stepped back: the backoff is over")
    func beyondTheBoundIsAStep() async throws {
        let dir = Scratch()
        let hostA = TestTime()
        _ = try await failOnHostA(dir, time: hostA)

        let hostB = TestTime(start: TestTime.defaultStart - 30)
        let fetcher = ScriptedFetcher.minting(hostB)
        let engine = TokenSyncEngine(repository: try openStore(dir.file("tokens.sqlite")), fetcher: fetcher,
                                     logger: Logger(label: "host-b"), clock: hostB.clock, now: hostB.wall, random: { 0.5 })
        _ = try await engine.token(for: key)
        #expect(fetcher.total == 1)
    }
}
