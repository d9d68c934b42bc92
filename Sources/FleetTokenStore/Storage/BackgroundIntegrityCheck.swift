// Storage layer: the full integrity check deferred from start-up, run in the background.

import Dispatch
import Foundation
import GRDB
import GRDBSQLite
import Logging
import Synchronization

/// The full integrity check deferred from start-up (``IntegrityCheckTiming/whenNeeded``): run
/// once, at utility priority, on its own read-only connection, so serving never waits for it.
///
/// Damage found here cannot be acted on while the store is open (the pool is in use), so it is
/// logged as an error telling the operator to restart, and marked so the next open checks
/// first and moves the store aside.
///
/// The check runs inside ``run(clock:)``, the repository's long-running work (a child task of
/// the engine's `run()`), on a utility-priority thread so the cooperative pool is not held.
/// ``stop()`` never waits: a check that has not begun never will, and a running one is ended by
/// SQLite's progress handler at its next few thousand instructions and closes its own connection.
/// Cancelling ``run(clock:)`` is not a stop: an interrupted check is pending again, and the
/// next run does it whole.
final class BackgroundIntegrityCheck: Sendable {
    private enum Phase { case pending, running, stopping, finished, stopped }

    private let connection: DatabaseQueue
    private let files: StoreFiles
    private let logger: Logger
    /// Signalled once the check will not run any more, for ``waitUntilFinished(timeout:)``.
    private let finished = DispatchSemaphore(value: 0)
    private let state = Mutex<(phase: Phase, finding: String?, ran: Bool, beginnings: Int)>((.pending, nil, false, 0))
    /// Read by SQLite's progress handler on the check's thread: true ends the running statement.
    private let stopRequested = Atomic<Bool>(false)
    /// The running ``run(clock:)`` was cancelled: like a stop for the statement, but the check
    /// stays to be done. Also read by the progress handler.
    private let interrupted = Atomic<Bool>(false)
    /// How long after opening the check begins.
    static let startDelay: TimeInterval = 2

    /// Prepares the check (``run(clock:)`` runs it); nil when its connection cannot be opened
    /// (then nothing is checked, which is logged).
    init?(files: StoreFiles, busyTimeout: TimeInterval, logger: Logger) {
        self.files = files
        self.logger = logger
        var config = Configuration()
        config.readonly = true
        config.busyMode = .timeout(busyTimeout)
        config.label = "FleetTokenStore.integrityCheck"
        do {
            connection = try DatabaseQueue(path: files.path, configuration: config)
        } catch {
            logger.warning("token store background integrity check could not start", metadata: [
                "store": .string(files.path), "reason": .string(TokenStoreError(error, path: files.path).description),
            ])
            return nil
        }
    }

    /// Runs the check once, ``startDelay`` after this call on `clock` (so it does not compete
    /// with start-up itself), unless stopped first. Cancelling the calling task before the
    /// check begins skips it; during the check, interrupts it.
    func run(clock: any Clock<Duration>) async {
        do { try await clock.sleep(for: .milliseconds(Int64(Self.startDelay * 1000))) } catch { return }
        // A cancellation noted after an earlier run's check ended is not this run's.
        state.withLock { state in
            if state.phase == .pending { interrupted.store(false, ordering: .relaxed) }
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                // Minutes of blocking SQLite work on a large store: not on the cooperative pool.
                DispatchQueue.global(qos: .utility).async { [self] in
                    check()
                    done.resume()
                }
            }
        } onCancel: {
            interrupted.store(true, ordering: .relaxed)
        }
    }

    /// True when a stop or a cancellation asks the running statement to end.
    private var shouldEnd: Bool {
        stopRequested.load(ordering: .relaxed) || interrupted.load(ordering: .relaxed)
    }

    private func check() {
        let begins = state.withLock { state in
            // Stopped before it began (stop() closed the connection and signalled), running
            // in another run, or cancelled before it began (it stays pending).
            guard state.phase == .pending, !interrupted.load(ordering: .relaxed) else { return false }
            state.phase = .running
            state.beginnings += 1
            return true
        }
        guard begins else { return }
        var completed = false
        defer { end(completed: completed) }
        do {
            try connection.read { db in
                // Every statement of this connection asks this handler every 1,000 virtual-machine
                // steps whether to go on, so a stop is never lost between two statements.
                sqlite3_progress_handler(db.sqliteConnection, 1000, { context in
                    guard let context else { return 0 }
                    let check = Unmanaged<BackgroundIntegrityCheck>.fromOpaque(context).takeUnretainedValue()
                    return check.shouldEnd ? 1 : 0
                }, Unmanaged.passUnretained(self).toOpaque())
                defer { sqlite3_progress_handler(db.sqliteConnection, 0, nil, nil) }
                try IntegrityCheck.run(db, path: files.path)
            }
            completed = true
        } catch {
            let reason = TokenStoreError(error, path: files.path)
            if reason.code == .corrupt, let detail = reason.detail {
                completed = true
                state.withLock { $0.finding = detail }
                let marked = files.markForCheck()
                logger.error("token store is damaged (found by the background integrity check): restart the process; the next start moves the store aside and starts a fresh one (tokens will be refetched)", metadata: [
                    "store": .string(files.path), "detail": .string(detail),
                    "marked_for_check": .stringConvertible(marked),
                ])
            } else if !shouldEnd {
                // When stopped or cancelled, the interruption is ours and nothing was learned.
                logger.warning("token store background integrity check did not finish", metadata: [
                    "store": .string(files.path), "reason": .string(reason.description),
                ])
            }
        }
    }

    /// The check has ended: close the connection if the store was closed meanwhile; back to
    /// pending when only a cancellation cut it short.
    private func end(completed: Bool) {
        let (closeHere, over) = state.withLock { state in
            let stopping = state.phase == .stopping
            if stopping {
                state.phase = .stopped
            } else if completed || stopRequested.load(ordering: .relaxed) {
                state.phase = .finished
            } else {
                state.phase = .pending
                interrupted.store(false, ordering: .relaxed)
            }
            state.ran = completed
            return (stopping, state.phase != .pending)
        }
        if closeHere { try? connection.close() }
        if over { finished.signal() }
    }

    /// What the check found, once it has finished; nil while running or when the store is sound.
    var finding: String? { state.withLock { $0.finding } }

    /// True once the check has run to its end (found damage or not), false while pending or
    /// running and when it was stopped first.
    var hasRun: Bool { state.withLock { $0.ran } }

    /// How many times the check has begun (more than once only after a cancelled run).
    var beginnings: Int { state.withLock { $0.beginnings } }

    /// Blocks the calling thread up to `timeout` for the check to finish; true if it did.
    /// Only for callers that chose to wait (``SQLiteTokenRepository/backgroundIntegrityFinding(waitingUpTo:)``).
    func waitUntilFinished(timeout: TimeInterval) -> Bool {
        guard finished.wait(timeout: .now() + timeout) == .success else { return false }
        finished.signal()  // Leave it signalled for other waiters.
        return true
    }

    /// Ends the check without waiting: a pending check will not begin (its connection is closed
    /// here); a running one is interrupted and closes its connection as it returns.
    func stop() {
        stopRequested.store(true, ordering: .relaxed)
        let previous = state.withLock { state in
            let previous = state.phase
            switch previous {
            case .pending, .finished: state.phase = .stopped
            case .running: state.phase = .stopping
            case .stopping, .stopped: break
            }
            return previous
        }
        switch previous {
        case .pending:
            try? connection.close()
            finished.signal()
        case .finished:
            try? connection.close()
        case .running, .stopping, .stopped:
            break
        }
    }
}
