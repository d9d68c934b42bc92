// ChangeFeedRunner, the loop both stores' change feeds run, with a scripted watch and a manual
// clock: the pause after a failure, the `.unknown` after a gap, one loop at a time, closing.
// (The real watches: CrossProcessTests and the contract's change feed for SQLite,
// FleetTokenPostgresTests for PostgreSQL.)

import FleetTokenStoreTesting
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// A watch whose turns a test scripts: each turn fails, or watches until ``endWatch()`` (or
/// the loop's cancellation) ends it; past the script, every turn watches.
private final class ScriptedWatch: ChangeFeedWatch {
    enum Step { case fail, watch }
    struct Failure: Error {}

    private struct State {
        var steps: [Step]
        var turns = 0
        var failures: [Bool] = []
        var resumptions = 0
        var loopsEnded = 0
    }

    private let state: Mutex<State>
    private let ending = WakeSignal()

    init(_ steps: [Step]) { state = Mutex(State(steps: steps)) }

    var turns: Int { state.withLock { $0.turns } }
    /// Each failure reported, as `again`.
    var failures: [Bool] { state.withLock { $0.failures } }
    var resumptions: Int { state.withLock { $0.resumptions } }
    var loopsEnded: Int { state.withLock { $0.loopsEnded } }

    /// Ends the watch under way, with nothing missed.
    func endWatch() { ending.signal() }

    func watchOnce(_ turn: ChangeFeedRunner.Turn) async throws {
        let step = state.withLock { state -> Step in
            state.turns += 1
            return state.steps.isEmpty ? .watch : state.steps.removeFirst()
        }
        guard step == .watch else { throw Failure() }
        turn.watching()
        await ending.wait()
        _ = ending.take()
    }

    func watchFailed(_ error: any Error, again: Bool) { state.withLock { $0.failures.append(again) } }
    func watchResumed() { state.withLock { $0.resumptions += 1 } }
    func loopEnded() { state.withLock { $0.loopsEnded += 1 } }
}

@Suite("ChangeFeedRunner: the loop of both stores' change feeds", .paced)
struct ChangeFeedRunnerTests {
    let clock = ManualClock()

    func runner(maximum: Duration = .seconds(4)) -> ChangeFeedRunner {
        ChangeFeedRunner(pacing: .init(takeOverCheck: .seconds(1), retryInitial: .seconds(1), retryMaximum: maximum), clock: clock)
    }

    /// Lets the paused loop's clock run to `pause`, checking that the next turn (number `turn`)
    /// begins only at its end.
    private func passPause(_ pause: Duration, beforeTurn turn: Int, _ watch: ScriptedWatch) async {
        #expect(await eventually { watch.turns == turn - 1 && clock.sleeperCount == 1 }, "no pause before turn \(turn)")
        await clock.advance(by: pause - .milliseconds(1))
        #expect(watch.turns == turn - 1 && clock.sleeperCount == 1, "turn \(turn) began before its pause of \(pause) ended")
        await clock.advance(by: .milliseconds(1))
        #expect(await eventually { watch.turns == turn }, "turn \(turn) did not begin after its pause of \(pause)")
    }

    @Test("a failed watch starts again after a pause doubling up to the maximum; the watch after it brings one .unknown; a watch in force starts the pauses over")
    func pausesAndGaps() async {
        let runner = runner()
        let watch = ScriptedWatch([.fail, .fail, .fail, .fail, .watch, .fail, .watch])
        let recorder = StreamRecorder(runner.broadcaster.subscribe())
        let loop = Task { await runner.run(watch) }
        defer { loop.cancel() }
        for (index, seconds) in [1, 2, 4, 4].enumerated() {
            await passPause(.seconds(seconds), beforeTurn: index + 2, watch)
        }
        #expect(await eventually { recorder.elements == [.unknown] }, "\(recorder.elements)")
        // Said once per outage: the first failure of each, then "again".
        #expect(watch.failures == [false, true, true, true])
        #expect(watch.resumptions == 1)

        // The next outage pauses a second first again, and ends in one more .unknown.
        watch.endWatch()
        await passPause(.seconds(1), beforeTurn: 7, watch)
        #expect(await eventually { recorder.elements == [.unknown, .unknown] }, "\(recorder.elements)")
        #expect(watch.failures == [false, true, true, true, false])
        #expect(watch.resumptions == 2)

        // A watch that ends with nothing missed is followed at once, without a pause or .unknown.
        watch.endWatch()
        #expect(await eventually { watch.turns == 8 })
        #expect(clock.sleeperCount == 0)
        loop.cancel()
        await loop.value
        #expect(recorder.elements == [.unknown, .unknown])
        #expect(watch.loopsEnded == 1)
    }

    @Test("one loop at a time: a second run() waits and takes over when the first ends; an announced start brings .unknown; close() ends loop and streams")
    func oneLoopAtATime() async {
        let runner = runner()
        let watch = ScriptedWatch([])
        let recorder = StreamRecorder(runner.broadcaster.subscribe())
        let first = Task { await runner.run(watch, announcingStart: true) }
        defer { first.cancel() }
        #expect(await eventually { watch.turns == 1 && recorder.elements == [.unknown] }, "\(recorder.elements)")
        #expect(runner.isRunning)

        let second = Task { await runner.run(watch) }
        defer { second.cancel() }
        #expect(await eventually { clock.sleeperCount == 1 }, "the second loop does not wait for its turn")
        await clock.advance(by: .seconds(1))
        #expect(await eventually { clock.sleeperCount == 1 })
        #expect(watch.turns == 1, "two loops watch at once")

        first.cancel()
        await first.value
        #expect(watch.loopsEnded == 1)
        await clock.advance(by: .seconds(1))
        #expect(await eventually { watch.turns == 2 }, "the second loop did not take over")
        // Not announced: its start is no gap.
        #expect(recorder.elements == [.unknown])

        runner.close()
        watch.endWatch()
        await second.value
        #expect(watch.loopsEnded == 2)
        #expect(!runner.isRunning)
        // Closed: a new stream is over at once, and so is run().
        var late = runner.broadcaster.subscribe().makeAsyncIterator()
        #expect(await late.next() == nil)
        await runner.run(watch)
        #expect(watch.turns == 2)
    }
}
