import Dispatch
import Foundation
import GRDB
import Logging
import Synchronization

/// The full integrity check deferred from start-up (``IntegrityCheckTiming/whenNeeded``): run
/// once, at utility priority, on its own read-only connection, so serving never waits for it.
///
/// Damage found here cannot be acted on while the store is open (the pool is in use), so it is
/// logged as an error telling the operator to restart, and marked so the next open checks
/// first and moves the store aside.
final class BackgroundIntegrityCheck: Sendable {
    private let connection: DatabaseQueue
    private let finished = DispatchSemaphore(value: 0)
    private let state = Mutex<(finding: String?, stopped: Bool)>((nil, false))
    /// How long after opening the check begins.
    static let startDelay: TimeInterval = 2

    /// Starts the check; nil when its connection cannot be opened (then nothing is checked,
    /// which is logged).
    init?(files: StoreFiles, busyTimeout: TimeInterval, logger: Logger) {
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
        // Started a little later, so it does not compete with start-up itself, and a short
        // writable open (an admin command) closes before it begins.
        DispatchQueue.global(qos: .utility).asyncAfter(deadline: .now() + Self.startDelay) { [self] in
            defer { finished.signal() }
            // An interrupt only stops a running statement: a stop that came first must be seen here.
            guard !state.withLock({ $0.stopped }) else { return }
            do {
                try connection.read { db in try IntegrityCheck.run(db, path: files.path) }
            } catch {
                let reason = TokenStoreError(error, path: files.path)
                if case .corrupt(_, let detail) = reason {
                    state.withLock { $0.finding = detail }
                    let marked = files.markForCheck()
                    logger.error("token store is damaged (found by the background integrity check): restart the process; the next start moves the store aside and starts a fresh one (tokens will be refetched)", metadata: [
                        "store": .string(files.path), "detail": .string(detail),
                        "marked_for_check": .stringConvertible(marked),
                    ])
                } else if !state.withLock({ $0.stopped }) {
                    // When stopped, the interruption is ours and nothing was learned.
                    logger.warning("token store background integrity check did not finish", metadata: [
                        "store": .string(files.path), "reason": .string(reason.description),
                    ])
                }
            }
        }
    }

    /// What the check found, once it has finished; nil while running or when the store is sound.
    var finding: String? { state.withLock { $0.finding } }

    /// Blocks the calling thread up to `timeout` for the check to finish; true if it did.
    func waitUntilFinished(timeout: TimeInterval) -> Bool {
        guard finished.wait(timeout: .now() + timeout) == .success else { return false }
        finished.signal()  // Leave it signalled for other waiters and for `stop()`.
        return true
    }

    /// Interrupts the check if still running, waits for it, and closes its connection.
    func stop() {
        state.withLock { $0.stopped = true }
        // Interrupt until the check ends: one sent between its statements would be lost.
        while true {
            connection.interrupt()
            if finished.wait(timeout: .now() + .milliseconds(20)) == .success { break }
        }
        finished.signal()
        try? connection.close()
    }
}
