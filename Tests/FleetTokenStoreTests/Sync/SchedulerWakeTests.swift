// The scheduler's sleep ends when its reading of the time says it should, however long the loop
// took between reading the time and starting the sleep. Found by the soak's power-cut part on a
// loaded machine: a test clock moved in that gap, and the loop slept that much too long.

import FleetTokenStoreTesting
import Foundation
import Logging
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("Scheduler wake-up measured from its reading of the time", .paced)
struct SchedulerWakeTests {
    /// A wall clock that, once armed, moves the test clock forward right after its `nth` reading
    /// of one moment: time passing between that reading and whatever the reader does next, as
    /// on a busy machine that preempts the reader there.
    final class DelayedReader: Sendable {
        private struct Arm { let moment: Date; var readsLeft: Int; let jump: Duration }
        private let time: TestTime
        private let arm = Mutex<Arm?>(nil)

        init(_ time: TestTime) { self.time = time }

        func arm(afterReading nth: Int, of moment: Date, jump: Duration) {
            arm.withLock { $0 = Arm(moment: moment, readsLeft: nth, jump: jump) }
        }

        var fired: Bool { arm.withLock { $0 == nil } }

        var wall: @Sendable () -> Date {
            { [self] in
                let reading = time.now
                let jump = arm.withLock { arm -> Duration? in
                    guard var armed = arm, armed.moment == reading else { return nil }
                    armed.readsLeft -= 1
                    arm = armed.readsLeft == 0 ? nil : armed
                    return armed.readsLeft == 0 ? armed.jump : nil
                }
                if let jump {
                    // The clock moves on: every sleep due on the way ends, as in advance(by:).
                    let target = time.clock.now.advanced(by: jump)
                    while time.clock.resumeNextDue(notAfter: target) {}
                }
                return reading
            }
        }
    }

    @Test("time that passes between the loop's reading of the clock and its sleep does not delay a refresh that came due meanwhile")
    func refreshNotDelayedByTheGap() async throws {
        let time = TestTime()
        let reader = DelayedReader(time)
        let fetcher = ScriptedFetcher.minting(time)
        let key = try TokenKey.vehicle("truck-7")
        let engine = TokenSyncEngine(repository: InMemoryTokenRepository(), fetcher: fetcher, logger: Logger(label: "test"),
                                     clock: time.clock, now: reader.wall, random: { 0.5 })
        let running = Task { try await engine.run() }
        defer { running.cancel() }
        await engine.track([key])
        #expect(await eventually(within: 30) { fetcher.count(key) == 1 })
        #expect(await engine.settle())

        // The loop sleeps at most 30 s at a time: moving the clock 30 s wakes it. At +30 s its
        // first reading of the wall clock is the clock-step check, its second the moment it pops
        // due keys and times its sleep by; right after that one, 3,000 s pass: the one-hour
        // token's soft point (80% of the lifetime, less the jitter) is behind.
        reader.arm(afterReading: 2, of: time.now.addingTimeInterval(30), jump: .seconds(3000))
        await time.advance(by: 30)
        #expect(await eventually(within: 30) { reader.fired }, "the loop read the wall clock twice after waking")

        // No further move of the clock: the refresh that came due must start on its own.
        #expect(await eventually(within: 30) { fetcher.count(key) == 2 },
                "the key was not refreshed: the loop's sleep was timed from after the gap, not from its reading")
        running.cancel()
        _ = try? await running.value
    }
}
