// Storage layer: ChangeFeedRunner, the loop both stores' change feeds run (SQLite's poller,
// ChangeMonitor; PostgreSQL's listener, in FleetTokenPostgres): one loop at a time, a failed
// watch started again after a pause that doubles, and `.unknown` to every subscriber when a
// watch begins after a gap. Each store brings its own watch (ChangeFeedWatch).
import Synchronization

/// One store's way of watching for changes other connections commit, run again and again by
/// ``ChangeFeedRunner``.
package protocol ChangeFeedWatch: Sendable {
    /// Watches once, reporting changes through `turn`'s runner, and calls
    /// ``ChangeFeedRunner/Turn/watching(afterGap:)`` once what commits from then on is reported.
    /// Returning ends the watch with nothing missed: the runner starts the next one at once.
    /// - Throws: Why the watch failed; the runner pauses, then starts the next one, whose
    ///   subscribers get `.unknown` once it watches.
    func watchOnce(_ turn: ChangeFeedRunner.Turn) async throws

    /// A watch failed; `again` when the one before it failed too (the same outage).
    func watchFailed(_ error: any Error, again: Bool)

    /// A watch is in force after one or more failed.
    func watchResumed()

    /// The runner's loop is ending (cancelled, or the feed closed), before another may start.
    func loopEnded()
}

extension ChangeFeedWatch {
    package func watchResumed() {}
    package func loopEnded() {}
}

/// Runs a store's change feed: its subscribers (a ``StoreChangeBroadcaster``), the one loop
/// that watches at a time (a second caller of ``run(_:announcingStart:)`` waits and takes over
/// when the first ends), and what happens between watches: a pause after a failure, doubling
/// up to a maximum, and `.unknown` when a watch begins after one failed, since what committed
/// meanwhile cannot be itemized.
package final class ChangeFeedRunner: Sendable {
    /// How the loop waits.
    package struct Pacing: Sendable {
        /// How often a second loop looks whether the first one has ended.
        package var takeOverCheck: Duration
        /// The pause after a failed watch; it doubles with each further failure.
        package var retryInitial: Duration
        /// The longest pause.
        package var retryMaximum: Duration

        package init(takeOverCheck: Duration, retryInitial: Duration, retryMaximum: Duration) {
            self.takeOverCheck = takeOverCheck
            self.retryInitial = retryInitial
            self.retryMaximum = retryMaximum
        }
    }

    private struct State: Sendable {
        var running = false
        var closed = false
    }

    /// The feed's subscribers: watches emit to it.
    package let broadcaster = StoreChangeBroadcaster()
    private let state = Mutex(State())
    private let pacing: Pacing
    private let clock: any Clock<Duration>

    package init(pacing: Pacing, clock: any Clock<Duration>) {
        self.pacing = pacing
        self.clock = clock
    }

    /// Whether a loop is under way.
    package var isRunning: Bool { state.withLock { $0.running } }

    /// Whether ``close()`` was called.
    package var isClosed: Bool { state.withLock { $0.closed } }

    /// Ends every subscriber's stream; a running loop returns after its watch, and no loop
    /// starts again.
    package func close() {
        state.withLock { $0.closed = true }
        broadcaster.finish()
    }

    /// Watches with `watch` until the calling task is cancelled or the feed closes. With
    /// `announcingStart`, subscribers get `.unknown` once the first watch is in force (what
    /// committed before it began cannot be itemized).
    package func run(_ watch: some ChangeFeedWatch, announcingStart: Bool = false) async {
        guard await takeTurn() else { return }
        defer {
            // Before the next loop may start: it resumes where this one leaves the watch.
            watch.loopEnded()
            state.withLock { $0.running = false }
        }
        let turn = Turn(broadcaster: broadcaster, pacing: pacing, gap: announcingStart, resumed: { watch.watchResumed() })
        while !Task.isCancelled && !isClosed {
            do {
                try await watch.watchOnce(turn)
                turn.ended()
            } catch {
                if Task.isCancelled || isClosed { return }
                let pause = turn.failed { again in watch.watchFailed(error, again: again) }
                do { try await clock.sleep(for: pause) } catch { return }
            }
        }
    }

    /// Becomes the loop, or waits for the one under way to end; false once the feed closed.
    private func takeTurn() async -> Bool {
        while true {
            let role = state.withLock { state -> (closed: Bool, runs: Bool) in
                if state.closed { return (true, false) }
                if state.running { return (false, false) }
                state.running = true
                return (false, true)
            }
            if role.closed { return false }
            if role.runs { return true }
            do { try await clock.sleep(for: pacing.takeOverCheck) } catch { return false }
        }
    }

    /// One loop's state between its watches: whether the next watch follows a gap, whether the
    /// last one failed, and the pause after the next failure.
    package final class Turn: Sendable {
        private struct State: Sendable {
            var gap: Bool
            var failing = false
            var pause: Duration
        }

        private let state: Mutex<State>
        private let broadcaster: StoreChangeBroadcaster
        private let pacing: Pacing
        private let resumed: @Sendable () -> Void

        fileprivate init(broadcaster: StoreChangeBroadcaster, pacing: Pacing, gap: Bool, resumed: @escaping @Sendable () -> Void) {
            self.state = Mutex(State(gap: gap, pause: pacing.retryInitial))
            self.broadcaster = broadcaster
            self.pacing = pacing
            self.resumed = resumed
        }

        /// The watch is in force: what commits from now on is reported. Subscribers get
        /// `.unknown` when something committed before may have been missed: after a failed
        /// watch, at an announced start, or when the watch says it began late (`afterGap`).
        package func watching(afterGap: Bool = false) {
            let (gap, failed) = state.withLock { state -> (Bool, Bool) in
                defer { state = State(gap: false, pause: pacing.retryInitial) }
                return (state.gap || afterGap, state.failing)
            }
            if failed { resumed() }
            // What committed while nobody watched cannot be itemized: subscribers re-read.
            if gap { broadcaster.emit(.unknown) }
        }

        /// A watch ended with nothing missed.
        fileprivate func ended() {
            state.withLock { $0 = State(gap: false, pause: pacing.retryInitial) }
        }

        /// A watch failed: reports it through `report` (with whether the one before failed
        /// too) and returns the pause before the next.
        fileprivate func failed(_ report: (_ again: Bool) -> Void) -> Duration {
            let (again, pause) = state.withLock { state -> (Bool, Duration) in
                defer {
                    state.gap = true
                    state.failing = true
                    state.pause = min(state.pause * 2, pacing.retryMaximum)
                }
                return (state.failing, state.pause)
            }
            report(again)
            return pause
        }
    }
}
