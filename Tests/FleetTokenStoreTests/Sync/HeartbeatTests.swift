// Issue 18: the scheduler loop's heartbeat, which the agent turns into systemd's WATCHDOG=1.
// The rule is plain arithmetic on elapsed time; the engine test drives the loop with a test
// clock, so no test waits for the interval itself.

import FleetTokenStoreTesting
import Foundation
import Logging
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("Scheduler heartbeat", .paced)
struct HeartbeatTests {
    @Test("beats at once, then only when the interval has passed; says how long the loop may sleep")
    func rule() {
        let beats = Mutex(0)
        var heartbeat = SchedulerHeartbeat(interval: .seconds(10)) { beats.withLock { $0 += 1 } }
        #expect(heartbeat.beatIfDue(at: .seconds(100)) == .seconds(10))
        #expect(beats.withLock { $0 } == 1)
        #expect(heartbeat.beatIfDue(at: .seconds(103)) == .seconds(7))
        #expect(heartbeat.beatIfDue(at: .milliseconds(109_999)) == .milliseconds(1))
        #expect(beats.withLock { $0 } == 1)
        #expect(heartbeat.beatIfDue(at: .seconds(110)) == .seconds(10))
        #expect(beats.withLock { $0 } == 2)
        // A loop that was held up beats once when it turns again, not once per missed interval.
        #expect(heartbeat.beatIfDue(at: .seconds(200)) == .seconds(10))
        #expect(beats.withLock { $0 } == 3)
    }

    @Test("the running engine's scheduler beats once per interval of its clock, with nothing to refresh; not after it stops")
    func engineBeats() async throws {
        let dir = Scratch()
        let time = TestTime()
        let store = try openStore(dir.file("tokens.sqlite"))
        let fetcher = ScriptedFetcher.minting(time)
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: Logger(label: "test"), clock: time.clock, now: time.wall)
        let beats = Mutex(0)
        await engine.setHeartbeat(every: .seconds(5)) { beats.withLock { $0 += 1 } }
        let running = Task { try await engine.run() }
        #expect(await eventually(within: 30) { beats.withLock { $0 } == 1 }, "the first beat as the loop starts")
        for expected in 2...5 {
            // The loop asleep first: a clock moved before it sleeps would not wake it.
            #expect(await engine.settle())
            await time.advance(by: 5)
            #expect(await eventually(within: 30) { beats.withLock { $0 } == expected }, "beat \(expected)")
        }
        // Less than an interval: no beat.
        #expect(await engine.settle())
        await time.advance(by: 4)
        #expect(await engine.settle())
        #expect(beats.withLock { $0 } == 5)
        running.cancel()
        _ = try? await running.value
        await time.advance(by: 60)
        #expect(await engine.settle(), "nothing runs: the loop has ended")
        #expect(beats.withLock { $0 } == 5, "a stopped engine stops beating")
        store.close()
    }
}
