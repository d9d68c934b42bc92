// Sync layer: how a long-running loop (the scheduler, the group commit) learns there is work,
// without a polling sleep and without a task of its own.
import Synchronization

/// A latch one loop waits on: ``signal()`` ends the current or next wait; cancelling the
/// waiting task ends it too. Signals before a wait are not lost; several collapse into one.
final class WakeSignal: Sendable {
    private struct State: Sendable {
        var signalled = false
        var waiter: CheckedContinuation<Void, Never>?
    }

    private let state = Mutex(State())

    init() {}

    /// Ends the wait in progress, or the next one.
    func signal() {
        let waiter = state.withLock { state in
            state.signalled = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    /// Whether a signal is waiting to be taken.
    var isSignalled: Bool { state.withLock { $0.signalled } }

    /// Whether a signal came since the last call; clears it.
    func take() -> Bool {
        state.withLock { state in
            defer { state.signalled = false }
            return state.signalled
        }
    }

    /// Returns once signalled (the signal stays set: ``take()`` clears it) or cancelled. One waiter at a time.
    func wait() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let now = state.withLock { state in
                    if state.signalled || Task.isCancelled { return true }
                    state.waiter = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { state in
                defer { state.waiter = nil }
                return state.waiter
            }
            waiter?.resume()
        }
    }
}
